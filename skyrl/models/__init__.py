"""Model helpers: where ``model.path`` and ``model.tokenizer_path`` point (hub id, cache,
local dir, offline SmolLM2 fallback), and tiny random models with locally made tokenizers
for tests and smoke runs."""

from skyrl.models.resolve import ModelNotFoundError, resolve_model_path, resolve_tokenizer_path
from skyrl.models.tiny import build_tiny_model, build_tiny_tokenizer

__all__ = [
    "ModelNotFoundError",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "resolve_model_path",
    "resolve_tokenizer_path",
]
