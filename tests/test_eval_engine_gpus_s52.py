"""Engine actors that ask for more GPUs than the local Ray has are refused in one line naming
``generator.num_gpus_per_engine`` (``skyrl.api._ray_for_run``), before any weights are read.
Before: Ray never placed the actor and the eval waited for its replies forever
(``skyrl-eval experiment=smoke generator.num_gpus_per_engine=1`` on this GPU-less machine: no
output for 90 s, then killed by ``timeout``). ``skyrl-train``'s pre-flight refused only a
machine with no GPU at all; two engines of one GPU each on a one-GPU machine hung too."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import ray
from cli_runs import BIN
from test_api import FakeRay, typed

from skyrl import api
from skyrl.config.errors import ConfigError


@pytest.fixture(autouse=True)
def _two_cores_nothing_started(monkeypatch):
    monkeypatch.setattr(api, "_started_ray_address", None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def with_gpus(monkeypatch, fake: FakeRay, gpus: float) -> FakeRay:
    """``fake`` whose Ray has ``gpus`` GPUs besides its CPUs."""
    resources = lambda: {"CPU": float(fake.cpus), "GPU": gpus}  # noqa: E731
    monkeypatch.setattr(ray, "cluster_resources", resources)
    return fake


def test_skyrl_eval_of_engines_on_gpus_the_machine_lacks_is_one_line(tmp_path):
    import torch

    gpus = torch.cuda.device_count()  # 0 here: one engine of 1 GPU is one too many
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray
    env["PYTHONPATH"] = str(Path(__file__).parents[1])
    result = subprocess.run(
        [str(BIN / "skyrl-eval"), "experiment=smoke", "generator.num_gpus_per_engine=1",
         f"generator.num_engines={gpus + 1}", f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=150, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    engines, asked = ("engine", "1 GPU") if gpus == 0 else ("engines", f"{gpus + 1} GPUs")
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: generator.num_gpus_per_engine: its engines ask for {asked} "
        f"(generator.num_engines={gpus + 1} x generator.num_gpus_per_engine=1 for the "
        f"{engines}), but the local Ray has {gpus}: lower generator.num_engines or "
        "generator.num_gpus_per_engine (0 runs the engines on CPUs)"
    )
    assert not (tmp_path / "eval" / "eval_results.json").exists()


def test_engines_that_fit_the_gpus_are_placed(monkeypatch):
    # 2 engines x 0.5 GPU = 1 GPU of 1; 4 engines x 1 of 4
    fake = with_gpus(monkeypatch, FakeRay(cpus=8).install(monkeypatch), 1.0)
    api.ray_for_engines(typed("generator.num_engines=2", "generator.num_gpus_per_engine=0.5"))
    with_gpus(monkeypatch, fake, 4.0)
    api.ray_for_engines(typed("generator.num_engines=4", "generator.num_gpus_per_engine=1"))
    assert fake.calls == []


def test_more_engine_gpus_than_a_callers_ray_has_is_one_line(monkeypatch):
    # a notebook's ray.init(num_gpus=1), two engines of one GPU each
    fake = with_gpus(monkeypatch, FakeRay(cpus=8).install(monkeypatch), 1.0)
    with pytest.raises(ConfigError) as err:
        api.ray_for_engines(typed("generator.num_engines=2", "generator.num_gpus_per_engine=1"))
    assert fake.calls == []
    assert err.value.key == "generator.num_gpus_per_engine"
    # 2 engines x 1 GPU = 2 > 1
    assert err.value.message == (
        "its engines ask for 2 GPUs (generator.num_engines=2 x generator.num_gpus_per_engine=1 "
        "for the engines), but the local Ray has 1: lower generator.num_engines or "
        "generator.num_gpus_per_engine (0 runs the engines on CPUs)"
    )


def test_a_training_run_counts_its_workers_gpus_with_the_engines(monkeypatch):
    # policy dp 2 x 1 GPU + 1 engine x 1 GPU = 3 > 2: the engine would wait forever
    with_gpus(monkeypatch, FakeRay(cpus=16).install(monkeypatch), 2.0)
    overrides = ("trainer.num_gpus_per_worker=1", "generator.num_gpus_per_engine=1")
    with pytest.raises(ConfigError) as err:
        api._ray_for_run(typed(*overrides))
    assert err.value.key == "generator.num_gpus_per_engine"
    assert err.value.message == (
        "the run asks for 3 GPUs (trainer.dp_size=2 x trainer.num_gpus_per_worker=1 for the "
        "policy + generator.num_engines=1 x generator.num_gpus_per_engine=1 for the engine), "
        "but the local Ray has 2: lower generator.num_engines or "
        "generator.num_gpus_per_engine (0 runs the engines on CPUs), or trainer.dp_size or "
        "trainer.num_gpus_per_worker"
    )


def test_a_cluster_at_ray_address_is_left_to_place_them(monkeypatch):
    fake = with_gpus(monkeypatch, FakeRay(cpus=8).install(monkeypatch), 0.0)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # an autoscaling cluster may add GPUs
    api.ray_for_engines(typed("generator.num_gpus_per_engine=1"))
    assert fake.calls == []
