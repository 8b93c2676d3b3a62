"""EngineClient: prompt affinity, least-loaded routing, results in order, weight fan-out."""

import asyncio

import torch

from skyrl.config.generator import HFGeneratorConfig
from skyrl.inference import SamplingParams, make_engine
from skyrl.inference.base import Completion
from skyrl.inference.client import IDLE_KEYS_KEPT, EngineClient
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
    # routed in order, all in flight together: a -> 0 (in flight [1, 0]), b -> 1 ([1, 1]),
    # a -> 0 ([2, 1]), c -> the less busy engine 1 ([2, 2]); all done: nothing in flight
    assert client.assignment == {"a": 0, "b": 1, "c": 1} and client.load == [0, 0]
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


def test_update_weights_takes_a_state_dict():
    from skyrl.inference.hf import HFEngine

    engine = HFEngine(build_tiny_model())
    client = EngineClient([engine])
    client.update_weights({"lm_head.weight": torch.zeros_like(engine.model.lm_head.weight)})
    assert torch.all(engine.model.lm_head.weight == 0)
    client.shutdown()


def _ship_this_module_by_value():
    """Let Ray's workers build this module's engine classes: they cannot import a test module
    (before this, the actors failed to start with "No module named 'test_client'")."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


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

    _ship_this_module_by_value()
    handle = RayEngineHandle.start(_DyingEngine, {}, num_cpus=0.1)
    with pytest.raises(
        EngineDiedError, match="^inference engine actor died during generate: "
    ) as e:
        generate_batch(handle, [[1, 2]], SamplingParams())
    assert e.value.__cause__ is None


class _RefusingEngine(LocalEngine):
    """Refuses every request and every weight update, as an engine refuses bad input."""

    def _serve_until(self, done):
        while not done.done():
            for request in self.take(block=True):
                request.fail(ValueError("hf engine: empty prompt"))

    def update_weights(self, weights):
        raise KeyError("update_weights: unknown parameter 'nope'")

    def shutdown(self):
        pass


def test_an_engine_actors_refusal_is_the_engines_own_error(ray_cluster):
    """Through Ray a refusal was a RayTaskError whose text is a traceback wall ("ray::
    EngineActor.generate() (pid=..., ip=..., actor_id=...)", the actor's frames, then the
    engine's line). It is now the engine's own exception, as in-process, with the actor's
    traceback kept as a note (shown with a traceback, not in the message)."""
    import pytest

    from skyrl.inference.client import RayEngineHandle

    _ship_this_module_by_value()
    handle = RayEngineHandle.start(_RefusingEngine, {}, num_cpus=0.1)
    try:
        with pytest.raises(ValueError) as refused:
            generate_batch(EngineClient([handle]), [[1, 2]], SamplingParams())
        assert type(refused.value) is ValueError
        assert str(refused.value) == "hf engine: empty prompt"
        assert "EngineActor.generate" in "".join(refused.value.__notes__)
        with pytest.raises(KeyError) as unknown:
            handle.update_weights({"nope": torch.zeros(1)})
        assert type(unknown.value) is KeyError
        assert unknown.value.args == ("update_weights: unknown parameter 'nope'",)
    finally:
        handle.shutdown()


def test_an_engine_that_fails_to_start_in_its_actor_says_why(ray_cluster):
    """An engine whose constructor raised in its actor was reported by Ray's first line
    only: "actor died during generate: The actor died because of an error raised in its
    creation task, \\x1b[36mray::EngineActor.__init__()\\x1b[39m (pid=..., ip=..., actor_id=...)":
    the reason (a bad argument, too little memory for vLLM's KV cache) was left out."""
    import pytest

    from skyrl.inference.client import EngineDiedError, RayEngineHandle
    from skyrl.inference.hf import HFEngine

    kwargs = {"model_path": build_tiny_model(), "max_batch_size": 0}
    handle = RayEngineHandle.start(HFEngine, kwargs, num_cpus=0.1)
    try:
        with pytest.raises(EngineDiedError) as died:
            generate_batch(handle, [[1, 2]], SamplingParams())
        assert str(died.value) == (
            "inference engine actor failed to start: "
            "ValueError: hf engine: max_batch_size must be >= 1, got 0"
        )
    finally:
        handle.shutdown()


class _HeldEngine:
    """Answers a request once ``release`` is set (all at once when it is set beforehand);
    records the route key of each request it got."""

    def __init__(self):
        self.keys: list[str | None] = []
        self.release: asyncio.Event | None = None

    async def generate(self, prompt_ids, sampling, route_key=None):
        self.keys.append(route_key)
        if self.release is not None:
            await self.release.wait()
        return Completion([1], [0.0], "stop")


def test_only_keys_in_flight_or_recently_done_are_kept():
    """20 steps x 256 new prompt uids x 2 samples = 5120 keys, each done when its step is: the
    client keeps the newest IDLE_KEYS_KEPT = 4096 finished ones (for later turns), and nothing
    is in flight (the old map held all 5120 keys, load [2560, 2560])."""
    client = EngineClient([_HeldEngine(), _HeldEngine()])

    async def steps():
        for s in range(20):
            uids = [f"s{s}p{j}" for j in range(256)]
            await asyncio.gather(*(client.generate([1], None, u) for u in uids for _ in range(2)))

    asyncio.run(steps())
    assert IDLE_KEYS_KEPT == 4096 and len(client.assignment) == 4096
    assert "s19p255" in client.assignment and "s0p0" not in client.assignment
    assert client.load == [0, 0]


def test_new_keys_go_to_the_engine_with_least_in_flight_and_keys_stay_sticky():
    engines = [_HeldEngine(), _HeldEngine()]
    client = EngineClient(engines)

    async def run():
        # "slow" holds 4 requests on engine 0; "b" runs on engine 1 and finishes
        engines[0].release = asyncio.Event()
        slow = [asyncio.ensure_future(client.generate([1], None, "slow")) for _ in range(4)]
        await asyncio.sleep(0)
        await client.generate([1], None, "b")
        assert client.load == [4, 0] and client.assignment == {"slow": 0, "b": 1}
        # in flight [4, 0]: "c" and "d" go to engine 1 (keys ever assigned, [1, 1], sent
        # "c" to the busy engine 0)
        await asyncio.gather(*(client.generate([1], None, k) for k in ("c", "d")))
        assert client.assignment["c"] == client.assignment["d"] == 1
        engines[0].release.set()
        await asyncio.gather(*slow)
        # nothing in flight; a later turn of "slow" goes back to engine 0 (prefix cache)
        await client.generate([1], None, "slow")
        assert engines[0].keys == ["slow"] * 5 and client.load == [0, 0]
        # 4 prompts x 4 samples at once: 2 prompts, 8 requests, on each engine
        engines[0].release = engines[1].release = asyncio.Event()
        batch = [client.generate([1], None, f"q{i}") for i in range(4) for _ in range(4)]
        held = asyncio.gather(*batch)
        await asyncio.sleep(0)
        assert client.load == [8, 8]
        engines[0].release.set()
        await held

    asyncio.run(run())
