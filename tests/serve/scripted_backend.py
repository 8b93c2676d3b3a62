"""``generator.backend=scripted`` (``scripted_engine.ScriptedEngine``) for a ``skyrl-serve``
subprocess: ``imports=[scripted_backend]``. Imported only there, so the test session's own
backend registry keeps just the built-ins."""

from __future__ import annotations

from scripted_engine import ScriptedEngine

from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec


@ENGINE_BACKENDS.register("scripted", override=True)
def scripted(cfg, model_path, tokenizer_path):
    return EngineSpec(ScriptedEngine, {"tokenizer": tokenizer_path or model_path})
