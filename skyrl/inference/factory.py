"""Build the engine that ``generator.backend`` names, one or several behind a client."""

from __future__ import annotations

from typing import Any

from skyrl.config.generator import GeneratorConfig, HFGeneratorConfig, VLLMGeneratorConfig
from skyrl.inference.base import InferenceEngine
from skyrl.inference.client import EngineClient, RayEngineHandle


def _engine_kwargs(
    cfg: GeneratorConfig, model_path: str, tokenizer_path: str | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model_path": model_path, "tokenizer_path": tokenizer_path}
    if isinstance(cfg, HFGeneratorConfig):
        kwargs["max_batch_size"] = cfg.max_batch_size
    elif isinstance(cfg, VLLMGeneratorConfig):
        kwargs.update(
            kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tensor_parallel_size=cfg.tensor_parallel_size,
            enforce_eager=cfg.enforce_eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            max_model_len=cfg.max_seq_len,
        )
    return kwargs


def engine_class(backend: str) -> type:
    if backend == "hf":
        from skyrl.inference.hf import HFEngine

        return HFEngine
    from skyrl.inference.vllm_engine import VLLMEngine

    return VLLMEngine


def make_engine(
    cfg: GeneratorConfig,
    model_path: str,
    tokenizer_path: str | None = None,
    use_ray: bool | None = None,
) -> EngineClient:
    """The client over ``num_engines`` engines: one in-process engine by default, Ray actors
    when there are several (unless ``use_ray=False``) and always when the engines get GPUs
    of their own (``generator.num_gpus_per_engine``)."""
    cls = engine_class(cfg.backend)
    kwargs = _engine_kwargs(cfg, model_path, tokenizer_path)
    if cfg.num_gpus_per_engine > 0:
        use_ray = True
    if use_ray is None:
        use_ray = cfg.num_engines > 1
    engines: list[InferenceEngine]
    if use_ray:
        engines = [
            RayEngineHandle.start(cls, kwargs, num_gpus=cfg.num_gpus_per_engine)
            for _ in range(cfg.num_engines)
        ]
    else:
        engines = [cls(**kwargs) for _ in range(cfg.num_engines)]
    return EngineClient(engines)
