"""EngineClient with several engines: an engine's failure names the engine (its index in
``EngineClient.engines``, from 0) and keeps its type; the first failure raises without
waiting for engines still blocked (in a collective, say)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from skyrl.inference.base import SamplingParams
from skyrl.inference.client import EngineClient, EngineDiedError


class _Engine:
    """Control calls that pass, raise ``error``, or block until ``release`` is set."""

    def __init__(self, error: Exception | None = None, block: bool = False):
        self.error, self.block = error, block
        self.release = threading.Event()
        self.returned = False

    def _act(self, *args) -> None:
        if self.block:
            self.release.wait(30)
            self.returned = True
        if self.error is not None:
            raise self.error

    update_weights = receive_weights = _act

    def sleep(self) -> None:
        self._act()

    def wake_up(self) -> None:
        self._act()

    def join_weight_sync(self, *args) -> None:
        self._act()

    async def generate(self, prompt_ids, sampling, route_key=None):
        raise ValueError(f"hf engine: {len(prompt_ids)} tokens refused")

    def shutdown(self) -> None:
        self.release.set()


def test_a_failing_engine_of_two_is_named_by_index_and_keeps_its_type():
    client = EngineClient([_Engine(), _Engine(ValueError("update_weights: bad shape"))])
    with pytest.raises(ValueError) as e:
        client.update_weights({})
    assert str(e.value) == "engine 1 of 2 failed: update_weights: bad shape"
    died = EngineDiedError("inference engine actor died during sleep: killed")
    client = EngineClient([_Engine(died), _Engine()])
    with pytest.raises(EngineDiedError) as d:
        client.sleep()
    assert str(d.value) == "engine 0 of 2 failed: inference engine actor died during sleep: killed"
    client.shutdown()


def test_a_single_engine_keeps_its_own_message():
    client = EngineClient([_Engine(RuntimeError("wake_up: no memory"))])
    with pytest.raises(RuntimeError) as e:
        client.wake_up()
    assert str(e.value) == "wake_up: no memory"


def test_a_keyerror_keeps_its_text_and_gets_the_engine_as_a_note():
    """``str(KeyError(m))`` is ``repr(m)``: rewriting its argument would quote the prefix."""
    client = EngineClient([_Engine(), _Engine(KeyError("w"))])
    with pytest.raises(KeyError) as e:
        client.update_weights({})
    assert str(e.value) == "'w'"
    assert e.value.__notes__ == ["engine 1 of 2 failed: 'w'"]


def test_the_first_failure_raises_while_another_engine_is_still_blocked():
    """Engine 0 waits in the broadcast (30 s here; gloo's timeout, 600 s, in a run) while
    engine 1 failed: before, the client waited for engine 0 first."""
    blocked = _Engine(block=True)
    client = EngineClient([blocked, _Engine(RuntimeError("receive_weights: lost the sender"))])
    with pytest.raises(RuntimeError, match=r"^engine 1 of 2 failed: receive_weights: lost"):
        client.receive_weights([])
    assert not blocked.returned  # raised while engine 0 still waited
    blocked.release.set()
    client.shutdown()


def test_a_failed_request_names_its_engine():
    client = EngineClient([_Engine(), _Engine()])
    with pytest.raises(ValueError) as e:  # a new key goes to the least loaded: engine 0
        asyncio.run(client.generate([1, 2, 3], SamplingParams(), route_key="a"))
    assert str(e.value) == "engine 0 of 2 failed: hf engine: 3 tokens refused"
