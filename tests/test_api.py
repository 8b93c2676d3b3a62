"""``skyrl.api``'s Ray: sized for each run, in a process that runs several (a sweep's jobs
under the basic launcher, a notebook's skyrl.train calls). Ray's functions are faked: no
cluster starts here."""

from __future__ import annotations

import os

import pytest
import ray
from omegaconf import OmegaConf

import skyrl
from skyrl import api
from skyrl.config.errors import ConfigError
from skyrl.config.validate import validate


class FakeRay:
    """A local Ray that is up or not, with its CPUs and address; what was called, in order."""

    def __init__(self, cpus: float | None = None, address: str = "10.0.0.1:6379"):
        self.cpus, self.address, self.calls = cpus, address, []

    def install(self, monkeypatch) -> FakeRay:
        monkeypatch.setattr(ray, "is_initialized", lambda: self.cpus is not None)
        monkeypatch.setattr(ray, "init", self.init)
        monkeypatch.setattr(ray, "shutdown", self.shutdown)
        monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": float(self.cpus)})
        context = type("Context", (), {"gcs_address": property(lambda _: self.address)})
        monkeypatch.setattr(ray, "get_runtime_context", context)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        return self

    def init(self, num_cpus=None, **kwargs):
        self.calls.append(("init", num_cpus))
        self.cpus, self.address = num_cpus, f"10.0.0.{len(self.calls)}:6379"

    def shutdown(self):
        self.calls.append(("shutdown",))
        self.cpus = None


def typed(*overrides: str):
    return validate(skyrl.compose(["experiment=smoke", *overrides]))


@pytest.fixture(autouse=True)
def _nothing_started(monkeypatch):
    monkeypatch.setattr(api, "_started_ray_address", None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def test_a_later_run_needing_more_cpus_restarts_the_ray_skyrl_started(monkeypatch):
    fake = FakeRay().install(monkeypatch)
    # dp 1: 1 policy rank x 2 CPUs = 2 reserved; started with 2 + the driver = 3 (> 2 cores)
    api._ray_for_run(typed("trainer.dp_size=1"))
    assert fake.calls == [("init", 3)]
    # dp 2: 2 x 2 = 4 reserved > 3: restarted with 4 + 1 = 5
    api._ray_for_run(typed("trainer.dp_size=2"))
    assert fake.calls == [("init", 3), ("shutdown",), ("init", 5)]
    # ppo: policy and critic, 2 x 2 each = 8 reserved (the reference shares the policy's)
    api._ray_for_run(typed("algorithm=ppo"))
    assert fake.calls[-2:] == [("shutdown",), ("init", 9)]
    api._ray_for_run(typed("trainer.dp_size=1"))  # 2 <= 9: kept
    assert len(fake.calls) == 5


def test_a_ray_the_caller_started_is_used_when_it_fits(monkeypatch):
    # the test suite's session cluster (tests/conftest.py: num_cpus=8) takes ppo at dp 2 (8)
    fake = FakeRay(cpus=8).install(monkeypatch)
    api._ray_for_run(typed("algorithm=ppo"))
    assert fake.calls == []


def test_a_ray_the_caller_started_too_small_is_one_line_and_left_alone(monkeypatch):
    fake = FakeRay(cpus=3).install(monkeypatch)
    with pytest.raises(ConfigError) as err:
        api._ray_for_run(typed("trainer.dp_size=2"))
    assert fake.calls == []  # not ours to shut down
    assert err.value.key == "trainer.dp_size"
    # 2 ranks x 2 CPUs for the policy = 4 > 3
    assert err.value.message == (
        "the run reserves 4 Ray CPUs (trainer.dp_size=2 x trainer.num_cpus_per_worker=2 for "
        "the policy), but the Ray this process is connected to, started outside skyrl, has "
        "3: start it with more CPUs, or lower trainer.dp_size or trainer.num_cpus_per_worker"
    )


def test_the_message_names_every_group_and_the_engine_actors(monkeypatch):
    FakeRay(cpus=3).install(monkeypatch)
    with pytest.raises(ConfigError) as err:
        api._ray_for_run(typed("algorithm=ppo", "generator.num_engines=2"))
    # 2 x 2 for the policy + 2 x 2 for the critic + 2 engines x 1 = 10
    assert err.value.message.startswith(
        "the run reserves 10 Ray CPUs (trainer.dp_size=2 x trainer.num_cpus_per_worker=2 for "
        "the policy and critic + generator.num_engines=2 x 1 for the engines), "
    )


def test_a_ray_started_again_by_the_caller_is_theirs(monkeypatch):
    fake = FakeRay().install(monkeypatch)
    api._ray_for_run(typed("trainer.dp_size=1"))  # skyrl's, at 10.0.0.1
    fake.cpus, fake.address = 2, "10.0.0.9:6379"  # the caller shut it down and started their own
    with pytest.raises(ConfigError):
        api._ray_for_run(typed("trainer.dp_size=2"))
    assert fake.calls == [("init", 3)]


def test_a_cluster_at_ray_address_is_used_as_it_is(monkeypatch):
    fake = FakeRay(cpus=1).install(monkeypatch)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    api._ray_for_run(typed("trainer.dp_size=2"))  # an autoscaling cluster may grow
    assert fake.calls == []


def test_compose_takes_a_mapping_of_overrides():
    listed = skyrl.compose(["experiment=smoke", "trainer.total_steps=3"])
    assert skyrl.compose({"experiment": "smoke", "trainer.total_steps": 3}) == listed
    # a nested mapping is merged into its node: the rest of trainer keeps config.yaml's values
    nested = skyrl.compose(OmegaConf.create({"trainer": {"total_steps": 3, "epochs": 2}}))
    assert (nested.trainer.total_steps, nested.trainer.epochs) == (3, 2)
    assert nested.trainer.train_batch_size == 8  # skyrl/conf/config.yaml


def test_compose_takes_a_saved_overrides_yaml_and_numpy_numbers():
    # .hydra/overrides.yaml holds overrides verbatim, ${...} included: list() of the loaded
    # ListConfig resolved each one as an interpolation of the list (an error)
    listed = ["experiment=smoke", "generator.eval_sampling.seed=${trainer.seed}"]
    assert skyrl.compose(OmegaConf.create(listed)) == skyrl.compose(listed)
    # a notebook's np.logspace / np.arange values: numpy's repr is np.float64(1e-06)
    import numpy as np

    values = {"trainer.policy_optimizer.lr": np.float64(1e-6), "trainer.total_steps": np.int64(3)}
    plain = skyrl.compose(["trainer.policy_optimizer.lr=1e-06", "trainer.total_steps=3"])
    assert skyrl.compose(values) == plain


def test_compose_renders_mapping_values_so_hydra_reads_them_back():
    values = {
        "trainer.output_dir": "runs/it's [a]=b,c\\",  # a quote, brackets, a trailing backslash
        "data.train_files": ["a b.jsonl", "c'd.jsonl"],
        "trainer.policy_optimizer.lr": 1e-06,
        "trainer.total_steps": None,
        "trainer.dry_run": True,
        "generator.sampling": {"top_p": 0.5, "stop": ["\n\n", "}"]},
    }
    cfg = skyrl.compose({"data.source": "files", **values})
    assert cfg.trainer.output_dir == "runs/it's [a]=b,c\\"
    assert list(cfg.data.train_files) == ["a b.jsonl", "c'd.jsonl"]
    assert cfg.trainer.policy_optimizer.lr == 1e-06
    assert cfg.trainer.total_steps is None and cfg.trainer.dry_run is True
    assert cfg.generator.sampling.top_p == 0.5
    assert list(cfg.generator.sampling.stop) == ["\n\n", "}"]


def test_compose_refuses_a_string_naming_the_forms_it_takes():
    with pytest.raises(TypeError) as err:
        skyrl.compose("experiment=smoke")
    assert str(err.value) == (
        "skyrl.compose takes a list of 'key=value' override strings, e.g. "
        "['experiment=smoke'], or a mapping {key: value}; got the str 'experiment=smoke'"
    )


@pytest.mark.parametrize("as_", [OmegaConf.create, dict])
def test_train_refuses_a_config_compose_did_not_make(tmp_path, as_):
    saved = OmegaConf.to_container(skyrl.compose(["experiment=smoke"]))  # a loaded yaml's shape
    with pytest.raises(TypeError) as err:
        skyrl.train(as_(saved), tmp_path / "run")
    assert str(err.value).startswith("skyrl.train takes a config made by skyrl.compose(...)")
    assert not (tmp_path / "run").exists()  # refused before anything was written
