"""Engine backends by name: ``generator.backend`` picks the entry of ``ENGINE_BACKENDS``.

An entry is a function ``(GeneratorConfig, model_path, tokenizer_path) -> EngineSpec``: the
engine class and its constructor kwargs, not an engine. ``make_engine`` then builds the
engine in-process or inside a Ray actor; only the class and the kwargs travel to the actor
(the class by import path, so its module must be importable there as it is here). The
built-in ``hf`` and ``vllm`` entries import their engine module only when called, so
importing this registry (validation does) imports neither transformers nor vLLM.

A recipe adds a backend without touching ``skyrl/``, typically around a built-in engine::

    from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec, hf_engine_kwargs
    from skyrl.inference.hf import HFEngine

    class MyEngine(HFEngine): ...

    @ENGINE_BACKENDS.register("my_engine")
    def my_engine(cfg, model_path, tokenizer_path):
        return EngineSpec(MyEngine, hf_engine_kwargs(cfg, model_path, tokenizer_path))

and selects it with ``generator=hf generator.backend=my_engine imports=[my.module]``: the
generator group option decides the schema (here ``HFGeneratorConfig``), the backend name
which engine reads it.

With LoRA and ``trainer.lora_sync=adapter`` ``make_engine`` adds ``lora=`` (the fields of
``model.lora``) to the kwargs; an engine class that takes no ``lora`` argument is refused
at validation (use ``trainer.lora_sync=merged`` for it). With ``model.trust_remote_code``
it adds ``trust_remote_code=True`` (``skyrl.inference.factory.engine_spec``): the built-in
engines pass it to transformers / vLLM; a recipe's engine class for such a model must take
it too (a subclass of a built-in one does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from skyrl.config.generator import GeneratorConfig, HFGeneratorConfig, VLLMGeneratorConfig
from skyrl.registry import Registry


class EngineSpec(NamedTuple):
    """What ``make_engine`` needs to build one engine: ``cls(**kwargs)``."""

    cls: type
    """The engine class (implements ``skyrl.inference.base.InferenceEngine``)."""
    kwargs: dict[str, Any]
    """Its constructor keyword arguments (picklable: they may go to a Ray actor)."""


EngineBackend = Callable[[GeneratorConfig, str, "str | None"], EngineSpec]
"""``(generator config, model_path, tokenizer_path) -> EngineSpec``."""

ENGINE_BACKENDS: Registry[EngineBackend] = Registry("engine backend")
"""``generator.backend`` name -> ``EngineBackend``."""


def _wrong_schema(backend: str, cfg: GeneratorConfig) -> TypeError:
    return TypeError(
        f"engine backend {backend!r} reads the fields of generator={backend}; "
        f"got a {type(cfg).__name__}"
    )


def hf_engine_kwargs(
    cfg: GeneratorConfig, model_path: str, tokenizer_path: str | None
) -> dict[str, Any]:
    """``HFEngine``'s constructor kwargs from an ``HFGeneratorConfig`` (``generator=hf``)."""
    if not isinstance(cfg, HFGeneratorConfig):
        raise _wrong_schema("hf", cfg)
    return {
        "model_path": model_path,
        "tokenizer_path": tokenizer_path,
        "max_batch_size": cfg.max_batch_size,
    }


def vllm_engine_kwargs(
    cfg: GeneratorConfig, model_path: str, tokenizer_path: str | None
) -> dict[str, Any]:
    """``VLLMEngine``'s constructor kwargs from a ``VLLMGeneratorConfig`` (``generator=vllm``)."""
    if not isinstance(cfg, VLLMGeneratorConfig):
        raise _wrong_schema("vllm", cfg)
    return {
        "model_path": model_path,
        "tokenizer_path": tokenizer_path,
        "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "block_size": cfg.block_size,
        "max_model_len": cfg.max_seq_len,
    }


@ENGINE_BACKENDS.register("hf")
def hf_backend(cfg: GeneratorConfig, model_path: str, tokenizer_path: str | None) -> EngineSpec:
    """transformers in-process (``skyrl.inference.hf.HFEngine``)."""
    from skyrl.inference.hf import HFEngine

    return EngineSpec(HFEngine, hf_engine_kwargs(cfg, model_path, tokenizer_path))


@ENGINE_BACKENDS.register("vllm")
def vllm_backend(cfg: GeneratorConfig, model_path: str, tokenizer_path: str | None) -> EngineSpec:
    """vLLM (``skyrl.inference.vllm_engine.VLLMEngine``)."""
    from skyrl.inference.vllm_engine import VLLMEngine

    return EngineSpec(VLLMEngine, vllm_engine_kwargs(cfg, model_path, tokenizer_path))
