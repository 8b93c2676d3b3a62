"""Build the engine that ``generator.backend`` names (``skyrl.inference.backends``), one or
several behind a client."""

from __future__ import annotations

import dataclasses

from skyrl.config.generator import GeneratorConfig
from skyrl.config.root import LoraConfig
from skyrl.inference.backends import ENGINE_BACKENDS
from skyrl.inference.base import InferenceEngine
from skyrl.inference.client import EngineClient, RayEngineHandle


def make_engine(
    cfg: GeneratorConfig,
    model_path: str,
    tokenizer_path: str | None = None,
    use_ray: bool | None = None,
    lora: LoraConfig | None = None,
) -> EngineClient:
    """The client over ``num_engines`` engines: one in-process engine by default, Ray actors
    when there are several (unless ``use_ray=False``) and always when the engines get CPUs or
    GPUs of their own (``generator.num_cpus_per_engine``, ``num_gpus_per_engine``).

    ``lora``: the engines serve the policy's LoRA adapter (``skyrl.models.lora.engine_lora``);
    the engine class takes it as a ``lora`` dict of ``LoraConfig`` fields."""
    cls, kwargs = ENGINE_BACKENDS.get(cfg.backend)(cfg, model_path, tokenizer_path)
    if lora is not None:
        kwargs = {**kwargs, "lora": dataclasses.asdict(lora)}
    if cfg.num_gpus_per_engine > 0 or cfg.num_cpus_per_engine > 0:
        use_ray = True
    if use_ray is None:
        use_ray = cfg.engines_in_actors
    engines: list[InferenceEngine]
    if use_ray:
        num_cpus = cfg.num_cpus_per_engine or 1
        engines = [
            RayEngineHandle.start(cls, kwargs, num_cpus=num_cpus, num_gpus=cfg.num_gpus_per_engine)
            for _ in range(cfg.num_engines)
        ]
    else:
        engines = [cls(**kwargs) for _ in range(cfg.num_engines)]
    return EngineClient(engines)
