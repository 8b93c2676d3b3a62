"""Build the engine that ``generator.backend`` names, one or several behind a client."""

from __future__ import annotations

from skyrl.config.generator import GeneratorConfig


def _engine_kwargs(cfg: GeneratorConfig, model_path: str, tokenizer_path: str | None) -> dict:
    kwargs = {"model_path": model_path, "tokenizer_path": tokenizer_path}
    if cfg.backend == "hf":
        kwargs["max_batch_size"] = getattr(cfg, "max_batch_size", 64)
    else:
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
):
    """One engine in-process, or ``num_engines`` behind a client: Ray actors by default (always
    when the engines get GPUs of their own, ``generator.num_gpus_per_engine``)."""
    cls = engine_class(cfg.backend)
    kwargs = _engine_kwargs(cfg, model_path, tokenizer_path)
    if cfg.num_gpus_per_engine > 0:
        use_ray = True
    if cfg.num_engines == 1 and not use_ray:
        return cls(**kwargs)
    from skyrl.inference.client import EngineClient, RayEngineHandle

    if use_ray is None or use_ray:
        engines = [
            RayEngineHandle.start(cls, kwargs, num_gpus=cfg.num_gpus_per_engine)
            for _ in range(cfg.num_engines)
        ]
    else:
        engines = [cls(**kwargs) for _ in range(cfg.num_engines)]
    return EngineClient(engines)
