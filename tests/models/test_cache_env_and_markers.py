"""Model caches read their settings when used and trust only complete folders:
``SKYRL_TINY_CACHE`` set after import (a notebook cell) is where the tiny model goes, and a
SmolLM2 conversion marker that is not an object, or whose files were deleted, means "convert
again"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl.models import smollm2, tiny
from skyrl.models.resolve import ModelNotFoundError, resolve_model_path


def fake_build_into(tmp_path: Path):
    """A stand-in for ``tiny._build_into``: a folder with a config and the ``done`` file, only
    under ``tmp_path`` (a build elsewhere, into the shared cache, fails the test instead)."""

    def build(out: Path, arch: str, seed: int, vocab_size: int, overrides: dict) -> None:
        if tmp_path not in out.parents:
            pytest.fail(f"built into {out}, not under the test's SKYRL_TINY_CACHE")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "done").write_text("ok")

    return build


def test_the_tiny_cache_env_var_set_after_import_is_used(tmp_path, monkeypatch):
    # before: DEFAULT_CACHE was read once at import, so the build went to the old folder
    monkeypatch.setattr(tiny, "_build_into", fake_build_into(tmp_path))
    monkeypatch.setenv("SKYRL_TINY_CACHE", str(tmp_path / "later"))
    path = Path(tiny.build_tiny_model())
    assert path.parent == tmp_path / "later" and (path / "done").is_file()
    monkeypatch.setenv("SKYRL_TINY_CACHE", str(tmp_path / "again"))
    assert Path(tiny.build_tiny_model()).parent == tmp_path / "again"


def test_an_unwritable_tiny_cache_set_after_import_is_the_one_named(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(tiny, "_build_into", fake_build_into(tmp_path))
    monkeypatch.setenv("SKYRL_TINY_CACHE", str(tmp_path / "afile"))
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("skyrl-tiny")
    assert str(err.value) == (
        f"model.path='skyrl-tiny': cannot build the tiny model in {tmp_path}/afile "
        f"(FileExistsError: [Errno 17] File exists: '{tmp_path}/afile'); "
        "set SKYRL_TINY_CACHE to a writable folder"
    )


def fake_convert(record: Path):
    """A stand-in for ``convert_gguf``: records its call, writes a config and weights."""

    def convert(gguf: Path, out_dir: Path) -> None:
        with open(record, "a") as f:
            f.write("converted\n")
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_text("weights")

    return convert


@pytest.mark.parametrize("content", ["null", "[]", '"v2"', "2"])
def test_a_marker_that_is_not_an_object_means_not_converted(tmp_path, monkeypatch, content):
    # before: json `null` -> AttributeError: 'NoneType' object has no attribute 'get'
    record = tmp_path / "calls"
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert(record))
    out = tmp_path / "m"
    out.mkdir()
    (out / smollm2.MARKER).write_text(content)
    assert smollm2.is_converted(out) is False
    assert smollm2.ensure_converted(out, gguf=Path("x.gguf")) == out
    assert record.read_text().split() == ["converted"]
    assert smollm2.is_converted(out)


def test_weights_deleted_by_hand_are_converted_again(tmp_path, monkeypatch):
    record = tmp_path / "calls"
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert(record))
    out = tmp_path / "m"
    smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    marker = json.loads((out / smollm2.MARKER).read_text())
    assert marker["files"] == ["config.json", "model.safetensors"]  # what the build wrote
    (out / "model.safetensors").unlink()

    assert smollm2.is_converted(out) is False  # before: True, and the run failed to load it
    smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    assert record.read_text().split() == ["converted", "converted"]
    assert (out / "model.safetensors").read_text() == "weights"


def test_a_tokenizer_file_deleted_by_hand_is_saved_again(tmp_path, monkeypatch):
    saved = []

    def save(gguf: Path, out_dir: Path) -> None:
        saved.append(gguf)
        (out_dir / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(smollm2, "save_tokenizer", save)
    out = smollm2.ensure_tokenizer(tmp_path / "tok", gguf=Path("x.gguf"))
    (out / "tokenizer.json").unlink()
    smollm2.ensure_tokenizer(tmp_path / "tok", gguf=Path("x.gguf"))
    assert saved == [Path("x.gguf"), Path("x.gguf")] and (out / "tokenizer.json").is_file()


def test_a_marker_without_its_file_list_is_converted_again_once(tmp_path, monkeypatch):
    # a conversion from before the marker listed its files cannot tell deleted weights: it is
    # converted again, once (the new marker lists them)
    record = tmp_path / "calls"
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert(record))
    monkeypatch.setattr(smollm2, "wheel_version", lambda: "0.1")
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    older = {"format": smollm2.FORMAT_VERSION, "wheel_version": "0.1"}
    (out / smollm2.MARKER).write_text(json.dumps(older))
    for _ in range(2):
        smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    assert record.read_text().split() == ["converted"]
