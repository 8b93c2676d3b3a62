"""The plan warns when an asynchronous CPU run asks for more CPUs at once than there are cores."""

from __future__ import annotations

import os

from hydra import compose, initialize_config_module

from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.trainer import plan as plan_module
from skyrl.trainer.plan import format_plan, make_plan

ASYNC = ["trainer.max_staleness=1", "generator.num_cpus_per_engine=1", "trainer.dp_size=1"]


def _config(*overrides: str):
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return validate(compose(config_name="config", overrides=list(overrides)))


def test_a_two_thread_rank_beside_an_engine_on_two_cores_is_flagged(monkeypatch):
    """The main job's rank takes 2 CPUs; with a 1-CPU engine beside it that is 1 x 2 + 1 x 1
    = 3 CPUs at once on 2 cores; 2 - 1 = 1 CPU is left per rank."""
    monkeypatch.setattr(plan_module, "_cores", lambda: 2)
    cfg = _config(*ASYNC, "trainer.num_cpus_per_worker=2")
    plan = make_plan(cfg)
    assert plan.overlap_cpus == (
        "3 CPUs at once (1 policy x 2 + 1 engine x 1) on 2 cores: threads will share cores; "
        "set trainer.num_cpus_per_worker=1"
    )
    assert f"warning                 {plan.overlap_cpus}" in format_plan(plan)


def test_no_warning_when_it_fits_or_runs_synchronously(monkeypatch):
    monkeypatch.setattr(plan_module, "_cores", lambda: 2)
    assert make_plan(_config(*ASYNC, "trainer.num_cpus_per_worker=1")).overlap_cpus is None
    sync = _config("generator.num_cpus_per_engine=1", "trainer.num_cpus_per_worker=2")
    assert make_plan(sync).overlap_cpus is None  # engines and workers take turns
    monkeypatch.setattr(plan_module, "_cores", lambda: 4)
    assert make_plan(_config(*ASYNC, "trainer.num_cpus_per_worker=2")).overlap_cpus is None


def test_with_lora_the_plan_and_the_cpus_have_no_reference_workers():
    # LoRA's reference is the policy with its adapters off: no reference group starts, so the
    # plan must not list one nor Ray reserve CPUs for it: 1 rank x 2 CPUs + the driver = 3
    # (the main job's engine runs in the driver), 5 with a reference rank of 2 CPUs
    from skyrl.api import _logical_cpus

    kl = ("algorithm.use_kl_loss=true", "trainer.colocate_policy_ref=false")
    full, lora = _config(*kl), _config(*kl, "model.lora.rank=8")
    assert make_plan(full).roles["reference"] == "1 x DeepSpeed ZeRO-0 fp32"
    assert make_plan(lora).roles["reference"] == "the policy with its LoRA adapters off"
    assert _logical_cpus(lora) == max(os.cpu_count() or 1, 3)
    assert _logical_cpus(full) == max(os.cpu_count() or 1, 5)


def test_when_no_worker_cpu_count_fits_the_advice_names_what_would(monkeypatch):
    """A rank runs at least one thread (``max(1, int(num_cpus_per_worker))``): when the engines
    leave fewer CPUs than there are ranks, no ``num_cpus_per_worker`` fits. The advice said
    ``set trainer.num_cpus_per_worker=1``, the value already set, which changes nothing."""
    monkeypatch.setattr(plan_module, "_cores", lambda: 2)
    # 2 ranks x 1 + 1 engine x 1 = 3 on 2 cores; 2 - 1 = 1 CPU left for 2 ranks: 1 rank fits
    two_ranks = make_plan(_config(*ASYNC, "trainer.dp_size=2", "trainer.num_cpus_per_worker=1"))
    assert two_ranks.overlap_cpus == (
        "3 CPUs at once (2 policy x 1 + 1 engine x 1) on 2 cores: threads will share cores; "
        "each rank runs at least one thread: lower trainer.dp_size to 1 or the engines' CPUs "
        "(generator.num_engines x generator.num_cpus_per_engine)"
    )
    # 1 rank x 1 + 1 engine x 2 = 3 on 2 cores; the engine alone takes 2 - 2 = 0 left
    big_engine = make_plan(
        _config(*ASYNC, "generator.num_cpus_per_engine=2", "trainer.num_cpus_per_worker=1")
    )
    assert big_engine.overlap_cpus == (
        "3 CPUs at once (1 policy x 1 + 1 engine x 2) on 2 cores: threads will share cores; "
        "the engines alone take 2 of the 2 cores: lower generator.num_engines or "
        "generator.num_cpus_per_engine"
    )


def test_several_engines_at_zero_cpus_count_one_cpu_each(monkeypatch):
    """``num_cpus_per_engine=0`` with several engines runs each in an actor of 1 CPU: async
    training accepts it, and 1 rank x 1 + 2 engines x 1 = 3 CPUs on 2 cores share cores (it
    counted 2 x 0 = 0 engine CPUs and warned of nothing). 2 - 2 = 0 left for the rank."""
    monkeypatch.setattr(plan_module, "_cores", lambda: 2)
    cfg = _config(
        "trainer.max_staleness=1", "trainer.dp_size=1", "trainer.num_cpus_per_worker=1",
        "generator.num_engines=2", "generator.num_cpus_per_engine=0",
    )  # fmt: skip
    assert make_plan(cfg).overlap_cpus == (
        "3 CPUs at once (1 policy x 1 + 2 engine x 1) on 2 cores: threads will share cores; "
        "the engines alone take 2 of the 2 cores: lower generator.num_engines or "
        "generator.num_cpus_per_engine"
    )
