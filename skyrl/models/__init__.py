"""Model helpers: tiny random models with locally made tokenizers for tests and smoke runs."""

from skyrl.models.tiny import build_tiny_model, build_tiny_tokenizer

__all__ = ["build_tiny_model", "build_tiny_tokenizer"]
