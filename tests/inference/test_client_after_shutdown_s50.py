"""EngineClient after ``shutdown()``: a second shutdown does nothing and any other call is
one line naming it, as each engine says it (a control call raised the thread pool's "cannot
schedule new futures after shutdown", a second shutdown too, and a request to an engine
actor said "actor died unexpectedly")."""

import pytest
import torch

from skyrl.config.generator import HFGeneratorConfig
from skyrl.inference import SamplingParams, make_engine
from skyrl.inference.client import EngineClient, RayEngineHandle
from skyrl.inference.hf import HFEngine
from skyrl.inference.local import generate_batch
from skyrl.models import build_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=2)


def test_calls_after_shutdown_name_the_call_and_a_second_shutdown_does_nothing():
    client = make_engine(HFGeneratorConfig(num_engines=2), build_tiny_model(), use_ray=False)
    [[completion]] = generate_batch(client, [[1, 2, 3]], GREEDY)
    assert len(completion.token_ids) == 2
    client.shutdown()
    client.shutdown()  # nothing left to stop: no error
    calls = {
        "generate": lambda: generate_batch(client, [[1, 2, 3]], GREEDY),
        "update_weights": lambda: client.update_weights({"model.norm.weight": torch.ones(64)}),
        "receive_weights": lambda: client.receive_weights([]),
        "join_weight_sync": lambda: client.join_weight_sync("127.0.0.1", 1, 1, 3, "gloo"),
        "reset_prefix_cache": client.reset_prefix_cache,
        "sleep": client.sleep,
        "wake_up": client.wake_up,
    }
    for what, call in calls.items():
        with pytest.raises(RuntimeError, match=rf"^engine client: {what} after shutdown\(\)$"):
            call()


def test_a_request_after_shutdown_of_an_engine_actor_says_shutdown_not_died(ray_cluster):
    path = build_tiny_model()
    client = EngineClient([RayEngineHandle.start(HFEngine, {"model_path": path}, num_cpus=0.1)])
    [[completion]] = generate_batch(client, [[1, 2, 3]], GREEDY)
    assert len(completion.token_ids) == 2
    client.shutdown()
    client.shutdown()
    with pytest.raises(RuntimeError, match=r"^engine client: generate after shutdown\(\)$"):
        generate_batch(client, [[1, 2, 3]], GREEDY)
