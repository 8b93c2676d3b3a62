"""The README's sweeps section sizes parallel joblib jobs by the workers each job starts.
It said 2 x ``trainer.dp_size`` whatever the algorithm; a job starts ``dp_size`` workers per
role of its run plan (the README's own sweep, ``experiment=smoke`` with grpo or rloo, one
role: 2 workers, not 4), so the README states the per-role count and names the roles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import skyrl
from skyrl.config.validate import validate
from skyrl.trainer.plan import has_reference_workers, make_plan

README = Path(__file__).resolve().parents[1] / "README.md"


def joblib_claim() -> str:
    """The README's words for how many workers a parallel joblib job starts."""
    text = " ".join(README.read_text().split())
    found = re.search(
        r"hydra/launcher=joblib.*?starts its own local Ray cluster and (.*?workers[^:;,]*)", text
    )
    assert found, "the README no longer says what a joblib job starts"
    return found.group(1)


def worker_actors(overrides: list[str]) -> tuple[int, list[str]]:
    """(dp_size, the roles the run builds DeepSpeed workers for: dp_size actors each)."""
    cfg = validate(skyrl.compose(overrides))
    plan = make_plan(cfg)
    roles = (
        ["policy"]
        + ["reference"] * has_reference_workers(cfg)
        + ["critic"] * cfg.algorithm.uses_critic
    )
    assert sorted(plan.roles) == sorted(roles)  # the plan's "<role> workers" rows
    return plan.dp_size, roles


@pytest.mark.parametrize(
    ("algorithm", "roles"),
    [("grpo", ["policy"]), ("rloo", ["policy"]), ("ppo", ["policy", "reference", "critic"])],
)
def test_the_readme_counts_joblib_workers_per_role(algorithm, roles):
    # the README's sweep runs experiment=smoke (dp_size 2) with grpo and rloo: 2 workers a job
    assert worker_actors(["experiment=smoke", f"algorithm={algorithm}"]) == (2, roles)
    assert joblib_claim() == "`trainer.dp_size` workers per role"
