"""``skyrl-serve`` with its engines in Ray actors starts a local Ray with room for them, as
``skyrl-eval`` does (``skyrl.api.ray_for_engines``). Before, it started Ray with the machine's
cores only (2 here): a third engine actor of 1 CPU was never placed, and every request routed
to it waited forever."""

from __future__ import annotations

import os

import pytest
from test_api import FakeRay

import skyrl
from skyrl import api
from skyrl.workers.distributed import find_free_port


class EngineStarted(Exception):
    """Raised by the fake engine factory: the server got as far as starting its engines."""


@pytest.mark.parametrize(
    ("overrides", "cpus"),
    [
        (["generator.num_engines=3"], 4),  # 3 engines x 1 CPU + the driver (the cores: 2)
        (["generator.num_engines=2", "generator.num_cpus_per_engine=3"], 7),  # 2 x 3 + 1
    ],
)
def test_the_server_starts_ray_with_room_for_its_engines(monkeypatch, overrides, cpus):
    from skyrl.inference import factory
    from skyrl.serve.cli import serve

    monkeypatch.setattr(api, "_started_ray_address", None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    fake = FakeRay().install(monkeypatch)

    def make_engine(*args, **kwargs):
        raise EngineStarted

    monkeypatch.setattr(factory, "make_engine", make_engine)
    cfg = skyrl.compose(["experiment=smoke", f"serve.port={find_free_port()}", *overrides])
    with pytest.raises(EngineStarted):
        serve(cfg)
    assert fake.calls == [("init", cpus)]
