"""Where ``model.path`` points: the built-in tiny model, a local directory, or an HF id."""

from __future__ import annotations

from pathlib import Path

TINY = "skyrl-tiny"
"""``model.path=skyrl-tiny``: the tiny random model + local tokenizer (smoke runs, tests)."""


def resolve_model_path(path: str) -> str:
    """A path ``from_pretrained`` can load: ``skyrl-tiny`` is built (cached) on first use;
    local directories and HF ids pass through (transformers resolves ids via its cache/hub)."""
    if path == TINY:
        from skyrl.models.tiny import build_tiny_model

        return build_tiny_model()
    local = Path(path).expanduser()
    return str(local.resolve()) if local.exists() else path
