"""``skyrl-eval`` with its engines in Ray actors (``generator.num_engines`` > 1, or CPUs or GPUs
of their own) starts a local Ray with room for them, as ``skyrl-train`` sizes its Ray
(``skyrl.api._ray_for_run``). Before: Ray started with the machine's cores only (2 here), a
third engine actor of 1 CPU was never placed, and the eval waited for its replies forever
(``skyrl-eval experiment=smoke generator.num_engines=3``: no output for 240 s, then killed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_api import FakeRay

from skyrl import api
from skyrl.config.errors import ConfigError

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")


@pytest.fixture(autouse=True)
def _two_cores_nothing_started(monkeypatch):
    monkeypatch.setattr(api, "_started_ray_address", None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


class EngineStarted(Exception):
    """Raised by the fake engine factory: the eval got as far as starting its engines."""


def ray_when_the_engines_start(monkeypatch, fake: FakeRay, *overrides: str) -> list:
    """The Ray calls ``skyrl.eval_cli.evaluate`` made before it started its engines."""
    import tempfile

    import skyrl
    from skyrl import eval_cli
    from skyrl.inference import factory

    def make_engine(*args, **kwargs):
        raise EngineStarted

    monkeypatch.setattr(factory, "make_engine", make_engine)
    with tempfile.TemporaryDirectory() as out, pytest.raises(EngineStarted):
        eval_cli.evaluate(skyrl.compose(["experiment=smoke", *overrides]), out)
    return fake.calls


@pytest.mark.parametrize(
    ("overrides", "cpus"),
    [
        # 3 engines x 1 CPU + the driver = 4 logical CPUs (the cores: 2)
        (["generator.num_engines=3"], 4),
        # 2 engines x 3 CPUs + 1 = 7
        (["generator.num_engines=2", "generator.num_cpus_per_engine=3"], 7),
        # one engine in an actor of its own 2 CPUs: Ray was not started by skyrl at all (Ray's
        # own init on the first actor, with its dashboard and worker logs)
        (["generator.num_cpus_per_engine=2"], 3),
        # 2 engines x 1 CPU + 1 = 3 > the 2 cores
        (["generator.num_engines=2"], 3),
    ],
)
def test_the_eval_starts_ray_with_room_for_its_engines(monkeypatch, overrides, cpus):
    fake = FakeRay().install(monkeypatch)
    assert ray_when_the_engines_start(monkeypatch, fake, *overrides) == [("init", cpus)]


def test_one_engine_in_process_starts_no_ray(monkeypatch):
    fake = FakeRay().install(monkeypatch)
    assert ray_when_the_engines_start(monkeypatch, fake) == []


def test_a_ray_skyrl_started_too_small_is_restarted_for_the_engines(monkeypatch):
    # a notebook's earlier run (or eval) left skyrl's own Ray of 3 CPUs up
    fake = FakeRay().install(monkeypatch)
    api.start_ray(3)
    ray_when_the_engines_start(monkeypatch, fake, "generator.num_engines=4")
    assert fake.calls == [("init", 3), ("shutdown",), ("init", 5)]  # 4 engines + the driver


def test_a_callers_ray_too_small_for_the_engines_is_one_line(monkeypatch):
    fake = FakeRay(cpus=2).install(monkeypatch)
    with pytest.raises(ConfigError) as err:
        ray_when_the_engines_start(monkeypatch, fake, "generator.num_engines=3")
    assert fake.calls == []  # not ours to shut down
    assert err.value.key == "generator.num_engines"
    assert err.value.message == (
        "its engines reserve 3 Ray CPUs (generator.num_engines=3 x 1 for the engines), but the "
        "Ray this process is connected to, started outside skyrl, has 2: start it with more "
        "CPUs, or lower generator.num_engines or generator.num_cpus_per_engine"
    )


@pytest.mark.slow
def test_skyrl_eval_with_more_engines_than_cores_finishes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [SKYRL_EVAL, "experiment=smoke", "generator.num_engines=3",
         "generator.max_generate_length=4", f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "arithmetic        4       16" in result.stdout  # 4 prompts x 4 samples
    assert (tmp_path / "eval" / "eval_results.json").is_file()
