"""What the ``AsyncRollouts`` tests share: the smoke config for the stream, an in-process
engine that answers at once (or late: ``TimedEngine``), and waits bounded in time."""

from __future__ import annotations

import threading
import time

from transformers import AutoTokenizer

import skyrl
from skyrl.config.validate import validate
from skyrl.models.resolve import with_local_model_paths


def async_cfg(*overrides: str):
    return with_local_model_paths(
        validate(
            skyrl.compose(
                [
                    "experiment=smoke", "generator.max_generate_length=8",
                    "generator.num_cpus_per_engine=1", "trainer.dp_size=1",
                    "generator.sampling.seed=3", *overrides,
                ]
            )
        )
    )  # fmt: skip


def tokenizer_of(cfg):
    return AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)


class EchoEngine:
    """Answers every request with "7" and EOS at once, in-process."""

    def __init__(self, tok):
        self.ids = tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]
        self.calls = 0

    async def generate(self, prompt_ids, sampling, route_key=None):
        from skyrl.inference.base import Completion

        self.calls += 1
        return Completion(list(self.ids), [-0.1] * len(self.ids), "stop")

    def serve(self, done) -> None:
        pass


def next_batch_within(source, step: int, seconds: float = 20.0):
    """``source.next_batch(step)``, or fail when it does not return within ``seconds``."""
    result: dict = {}

    def take() -> None:
        try:
            result["out"] = source.next_batch(step)
        except BaseException as exc:  # re-raised here, on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"next_batch({step}) did not return in {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["out"]


def wait_until_line_done(source, timeout_s: float = 20.0) -> None:
    """Until every group admitted so far is generated (stand-in for a step's training)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if all(g.done for g in list(source.line)):
                return
        except RuntimeError:  # the source's loop changed the line meanwhile
            continue
        time.sleep(0.01)
    raise AssertionError("the groups in line were not generated")


class TimedEngine(EchoEngine):
    """``EchoEngine`` whose answers to the prompt uids in ``delays_s`` come that many seconds
    late (the others ``default_s`` late), and with the weight-loading calls of a trainer's
    sync (which do nothing)."""

    def __init__(self, tok, delays_s: dict[str, float], default_s: float = 0.0):
        super().__init__(tok)
        self.delays_s, self.default_s = delays_s, default_s

    async def generate(self, prompt_ids, sampling, route_key=None):
        import asyncio

        await asyncio.sleep(self.delays_s.get(route_key, self.default_s))
        return await super().generate(prompt_ids, sampling, route_key)

    def update_weights(self, weights) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass
