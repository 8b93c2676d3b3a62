"""A tokenizer with more tokens than its model's vocabulary, for the checks that refuse one
(``skyrl-train``'s pre-flight, ``skyrl-eval``, ``skyrl-serve``)."""

from __future__ import annotations

from pathlib import Path


def tokenizer_with_added_tokens(tmp_path: Path, num_added: int) -> tuple[str, int]:
    """The tiny model's tokenizer with ``num_added`` tokens added, saved to a folder; returns
    the folder and the tiny model's own ``len(tokenizer)`` (its config's vocab_size too)."""
    from transformers import AutoConfig, AutoTokenizer

    from skyrl.models import resolve

    tiny = resolve.resolve_model_path("skyrl-tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    num_tokens = len(tokenizer)
    assert AutoConfig.from_pretrained(tiny).vocab_size == num_tokens
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(num_added)])
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return str(tmp_path / "tokenizer"), num_tokens
