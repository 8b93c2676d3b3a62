"""The tiny model builder: loadable, deterministic, cached, and its chat template renders turns."""

import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.models import build_tiny_model, tiny


def test_loads_and_renders_chat(tmp_path):
    path = build_tiny_model(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok)
    assert model.config.head_dim >= 32 and model.dtype == torch.float32
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>tool\nt<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.decode(tok.encode("What is 12 + 7?")) == "What is 12 + 7?"


def test_deterministic_and_cached(tmp_path, monkeypatch):
    a = build_tiny_model(seed=3)

    def rebuilt(*args, **kwargs):
        raise AssertionError("the cached build was built again")

    with monkeypatch.context() as patched:
        patched.setattr(tiny, "_build_into", rebuilt)
        b = build_tiny_model(seed=3)
    assert a == b
    c = build_tiny_model(tmp_path / "c", seed=3)
    ma = AutoModelForCausalLM.from_pretrained(a)
    mc = AutoModelForCausalLM.from_pretrained(c)
    for (n, p), (_, q) in zip(ma.named_parameters(), mc.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=4))
    assert not torch.equal(other.lm_head.weight, ma.lm_head.weight)


def test_no_two_weight_matrices_are_equal():
    """Each matrix has its own draw, so a test that swaps k and v, gate and up, two
    layers, or the untied embedding and head sees different numbers."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model())
    mats = [(n, p) for n, p in model.named_parameters() if p.dim() >= 2]
    assert len(mats) == 2 * 7 + 2  # q k v o gate up down per layer, embed and head
    for i, (n, p) in enumerate(mats):
        for m, q in mats[i + 1 :]:
            same_shape = p.shape == q.shape
            assert not (same_shape and torch.equal(p, q)), f"{n} == {m}"


def _replace_within_one_folder(monkeypatch):
    """``os.replace`` as between two filesystems: a rename out of another folder than the
    destination's (the system temp dir, another mount) fails with EXDEV."""
    import errno
    import os

    real_replace = os.replace

    def replace(src, dst):
        if os.path.dirname(os.path.abspath(src)) != os.path.dirname(os.path.abspath(dst)):
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_cache_whose_parent_does_not_exist_yet(tmp_path, monkeypatch):
    # SKYRL_TINY_CACHE=/dev/shm/x/cache: the build went to the system temp dir, the rename
    # across filesystems failed, was taken for a lost race, and a missing folder came back
    from skyrl.models import tiny

    _replace_within_one_folder(monkeypatch)
    monkeypatch.setattr(tiny, "DEFAULT_CACHE", tmp_path / "not-yet" / "cache")
    path = Path(build_tiny_model())
    assert path.parent == tmp_path / "not-yet" / "cache"
    assert (path / "done").is_file() and (path / "config.json").is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp folder left


def test_a_builder_that_lost_the_race_keeps_the_winners_build(tmp_path, monkeypatch):
    from skyrl.models import tiny

    monkeypatch.setattr(tiny, "DEFAULT_CACHE", tmp_path / "cache")
    winner = Path(build_tiny_model())
    (winner / "winner").write_text("first")
    # a second builder that started before the winner finished: its rename finds the folder
    tiny._build_into(winner, "qwen2", 0, 512, {})
    assert (winner / "winner").read_text() == "first"
    assert sorted(p.name for p in winner.parent.iterdir()) == [winner.name]


def test_a_failed_rename_without_a_finished_build_is_raised(tmp_path, monkeypatch):
    import errno
    import os

    from skyrl.models import tiny

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    out = tmp_path / "cache" / "qwen2-x"
    with pytest.raises(OSError, match="No space left"):
        tiny._build_into(out, "qwen2", 0, 512, {})
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_the_cache_env_var_is_expanded_and_made_absolute(tmp_path, monkeypatch):
    # SKYRL_TINY_CACHE='~/tiny' (a .env file, a Dockerfile ENV: no shell expands it) built into
    # a folder named "~" in the working directory, and model.path=skyrl-tiny resolved to the
    # relative "~/tiny/qwen2-...", which a worker started elsewhere could not find
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SKYRL_TINY_CACHE", "~/tiny")
    assert tiny.default_cache() == tmp_path / "home" / "tiny"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKYRL_TINY_CACHE", "rel")
    assert tiny.default_cache() == tmp_path / "rel"
    monkeypatch.delenv("SKYRL_TINY_CACHE")
    assert tiny.default_cache() == Path(tempfile.gettempdir()) / "skyrl-tiny"
