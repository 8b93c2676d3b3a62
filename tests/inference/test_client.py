"""EngineClient: prompt affinity, least-loaded routing, results in order, weight fan-out."""

import torch

from skyrl.config.generator import HFGeneratorConfig
from skyrl.inference import SamplingParams, make_engine
from skyrl.inference.client import EngineClient
from skyrl.inference.local import LocalEngine, generate_batch
from skyrl.models import build_tiny_model


def test_two_engines_route_and_match_single():
    path = build_tiny_model()
    cfg = HFGeneratorConfig(num_engines=2)
    client = make_engine(cfg, path, use_ray=False)
    assert isinstance(client, EngineClient)
    single = make_engine(HFGeneratorConfig(), path)
    prompts = [[1, 380, 201, 20 + i] for i in range(4)]
    keys = ["a", "b", "a", "c"]
    sp = SamplingParams(temperature=0.0, max_tokens=6)
    out = generate_batch(client, prompts, sp, route_keys=keys)
    ref = generate_batch(single, prompts, sp)
    assert [g[0].token_ids for g in out] == [g[0].token_ids for g in ref]
    assert client.assignment == {"a": 0, "b": 1, "c": 0} or client.load == [2, 1]
    assert client.route("a") == client.assignment["a"]
    new = [
        (n, torch.zeros_like(p))
        for n, p in single.engines[0].model.named_parameters()
        if "lm_head" in n
    ]
    client.update_weights(new)
    for e in client.engines:
        assert torch.all(e.model.lm_head.weight == 0)
    client.shutdown()
    single.shutdown()


class _DyingEngine(LocalEngine):
    """An engine whose process exits at the first request, as an out-of-memory kill would."""

    def _serve_until(self, done):
        while not done.done():
            if self.take(block=True):
                import os

                os._exit(1)


def test_a_dead_engine_actor_is_one_clear_error(ray_cluster):
    import pytest

    from skyrl.inference.client import EngineDiedError, RayEngineHandle

    handle = RayEngineHandle.start(_DyingEngine, {}, num_cpus=0.1)
    with pytest.raises(
        EngineDiedError, match="^inference engine actor died during generate: "
    ) as e:
        generate_batch(handle, [[1, 2]], SamplingParams())
    assert e.value.__cause__ is None
