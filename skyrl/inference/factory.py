"""Build the engine that ``generator.backend`` names (``skyrl.inference.backends``), one or
several behind a client."""

from __future__ import annotations

import contextlib
import dataclasses

from skyrl.config.generator import GeneratorConfig
from skyrl.config.root import LoraConfig
from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec
from skyrl.inference.base import InferenceEngine
from skyrl.inference.client import EngineClient, RayEngineHandle


def engine_spec(
    cfg: GeneratorConfig,
    model_path: str,
    tokenizer_path: str | None = None,
    lora: LoraConfig | None = None,
    trust_remote_code: bool = False,
) -> EngineSpec:
    """The engine class ``generator.backend`` names and its constructor kwargs: the backend's,
    plus ``lora`` (a dict of ``LoraConfig`` fields) when given and ``trust_remote_code=True``
    when set (``model.trust_remote_code``). Both are left out otherwise, so an engine class
    without those arguments serves a plain model."""
    cls, kwargs = ENGINE_BACKENDS.get(cfg.backend)(cfg, model_path, tokenizer_path)
    if lora is not None:
        kwargs = {**kwargs, "lora": dataclasses.asdict(lora)}
    if trust_remote_code:
        kwargs = {**kwargs, "trust_remote_code": True}
    return EngineSpec(cls, kwargs)


def make_engine(
    cfg: GeneratorConfig,
    model_path: str,
    tokenizer_path: str | None = None,
    use_ray: bool | None = None,
    lora: LoraConfig | None = None,
    trust_remote_code: bool = False,
) -> EngineClient:
    """The client over ``num_engines`` engines: one in-process engine by default, Ray actors
    when there are several (unless ``use_ray=False``) and always when the engines get CPUs or
    GPUs of their own (``generator.num_cpus_per_engine``, ``num_gpus_per_engine``).

    ``lora``: the engines serve the policy's LoRA adapter (``skyrl.models.lora.engine_lora``);
    ``trust_remote_code``: the engines run the model's own code (``model.trust_remote_code``).
    See ``engine_spec``."""
    cls, kwargs = engine_spec(cfg, model_path, tokenizer_path, lora, trust_remote_code)
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
        engines = []
        try:
            for _ in range(cfg.num_engines):
                engines.append(cls(**kwargs))
        except BaseException:  # those built would hold their model (and KV cache) until exit
            for engine in engines:
                with contextlib.suppress(Exception):
                    engine.shutdown()
            raise
    return EngineClient(engines)
