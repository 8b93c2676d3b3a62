"""``make_engine`` in-process: when one of several engines fails to build, the ones already
built are shut down before the error goes up (before, the first engine stayed alive with its
model and, for vLLM, its KV cache, until the process ended: a retry in the same notebook then
ran out of memory)."""

from __future__ import annotations

import pytest

from skyrl.config.generator import HFGeneratorConfig
from skyrl.inference import factory, make_engine
from skyrl.inference.backends import EngineSpec


class _Built:
    """Stand-in engine: the second one built raises; shutdowns are counted."""

    built = 0
    shut = 0

    def __init__(self) -> None:
        type(self).built += 1
        if type(self).built == 2:
            raise RuntimeError("engine 2 cannot allocate its KV cache")

    def shutdown(self) -> None:
        type(self).shut += 1


def test_engines_built_before_a_failure_are_shut_down(monkeypatch):
    monkeypatch.setattr(factory, "engine_spec", lambda *args: EngineSpec(_Built, {}))
    cfg = HFGeneratorConfig(num_engines=3)
    with pytest.raises(RuntimeError, match="engine 2 cannot allocate"):
        make_engine(cfg, "unused", use_ray=False)
    # engine 1 built, engine 2 raised, engine 3 never built: one shutdown, of engine 1
    assert (_Built.built, _Built.shut) == (2, 1)
