"""The sweep summary's ``reward_first5_mean`` / ``reward_last5_mean`` never share a step: a
job of under 10 rewarded steps compares its first and last half (the middle step of an odd
count in neither), as the end-of-run summary line does; one rewarded step is both."""

from __future__ import annotations

import csv
import json

import pytest
from omegaconf import OmegaConf

from skyrl.sweeps import final_metrics, write_summary
from skyrl.tracking import format_summary


def history(rewards: list[float]) -> list[dict[str, float]]:
    """Eval before training (step 0, no reward), then one record per training step."""
    steps = [{"step": i + 1, "generate/reward_mean": r} for i, r in enumerate(rewards)]
    return [{"step": 0, "eval/pass@1": 0.5}, *steps]


@pytest.mark.parametrize(
    ("rewards", "first", "last"),
    [
        ([0.0, 1.0], 0.0, 1.0),  # 2 // 2 = 1 step each (before: both (0 + 1) / 2 = 0.5)
        ([0.1, 0.2, 0.3, 0.4, 0.5], 0.15, 0.45),  # 2 each: (.1 + .2) / 2, (.4 + .5) / 2
        ([0.0, 0.0, 0.0, 1.0, 1.0, 1.0], 0.0, 1.0),  # 3 each (before: 0.4 and 0.6, 5 each)
        ([i / 10 for i in range(10)], 0.2, 0.7),  # 5 each: (0+.1+.2+.3+.4)/5, (.5+...+.9)/5
        ([i / 10 for i in range(12)], 0.2, 0.9),  # still 5: (.7+.8+.9+1.0+1.1)/5 = 0.9
        ([0.25], 0.25, 0.25),  # the one rewarded step is both
    ],
)
def test_the_first_and_last_windows_never_share_a_step(rewards, first, last):
    metrics = final_metrics(history(rewards))
    assert metrics["steps"] == len(rewards)
    assert metrics["reward_first5_mean"] == pytest.approx(first, abs=1e-12)
    assert metrics["reward_last5_mean"] == pytest.approx(last, abs=1e-12)


def test_the_sweep_columns_match_the_end_of_run_summary_line(tmp_path):
    # 4 steps: the first 2 (0.2 + 0.4) / 2 = 0.3 vs the last 2 (0.6 + 0.8) / 2 = 0.7
    records = history([0.2, 0.4, 0.6, 0.8])
    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(["algorithm=grpo"]), job / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": {"job": {"num": 0}}}), job / ".hydra" / "hydra.yaml")
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    with open(write_summary(tmp_path)[0], newline="") as f:
        (row,) = csv.DictReader(f)

    assert (row["reward_first5_mean"], row["reward_last5_mean"]) == ("0.3", "0.7")
    line = "training reward: first 2 steps 0.300 -> last 2 steps 0.700"
    assert line in format_summary(records, job).splitlines()
