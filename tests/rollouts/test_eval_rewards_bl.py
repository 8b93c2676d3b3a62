"""A custom driver's (``generator.agent``) NaN, inf or beyond-float32 reward in an eval pass
scores 0 and counts in ``eval/env_errors`` with a warning naming the trajectory, as an env
error does, instead of making pass@1 and reward_mean NaN."""

from __future__ import annotations

import logging
import math

import pytest

from skyrl.config.generator import GeneratorConfig
from skyrl.data.prompts import PromptRow
from skyrl.generators.output import GeneratorOutput
from skyrl.rollouts.evaluation import evaluate_prompts
from skyrl.tracking import metric_names as names


class _Generator:
    """Returns fixed rewards per prompt (single-turn rows), one env error already counted."""

    def __init__(self, rewards: list[list[float]]):
        self.rewards = rewards

    def generate(self, rows, n, sampling):
        samples = [
            (row.uid, k, r)
            for row, rs in zip(rows, self.rewards, strict=True)
            for k, r in enumerate(rs)
        ]
        out = GeneratorOutput(
            prompt_token_ids=[[1, 2] for _ in samples],
            response_token_ids=[[5] for _ in samples],
            loss_masks=[[1] for _ in samples],
            rollout_logprobs=[[0.0] for _ in samples],
            rewards=[r for *_, r in samples],
            uids=[u for u, *_ in samples],
            trajectory_ids=[f"{u}/{k}" for u, k, _ in samples],
            is_last_step=[True] * len(samples),
            data_sources=["s"] * len(samples),
            stop_reasons=["stop"] * len(samples),
            policy_versions=[[(0, 0)] for _ in samples],
        )
        out.metrics = {names.ENV_ERRORS: 1.0}
        return out


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e39])
def test_a_bad_eval_reward_is_an_env_error_not_a_nan_metric(caplog, bad):
    rows = [PromptRow("q0", "s", {}), PromptRow("q1", "s", {})]
    cfg = GeneratorConfig(agent="my.driver", eval_n_samples_per_prompt=2)
    gen = _Generator([[1.0, bad], [bad, 0.0]])
    with caplog.at_level(logging.WARNING, logger="skyrl.rollouts.evaluation"):
        metrics, out = evaluate_prompts(gen, rows, cfg, seed=0)
    # scored 0: eval0 [1, 0] passes 1 of 2, eval1 [0, 0] none
    assert metrics["eval/pass@1"] == 0.25  # (1/2 + 0/2) / 2 prompts
    assert metrics["eval/pass@2"] == 0.5  # (1 + 0) / 2 prompts
    assert metrics["eval/reward_mean"] == 0.25  # (1 + 0 + 0 + 0) / 4 samples
    assert metrics["eval/s/pass@1"] == 0.25
    assert metrics[names.EVAL_ENV_ERRORS] == 3.0  # 1 from the generator + 2 refused
    assert all(math.isfinite(v) for v in metrics.values())
    assert out.rewards == [1.0, 0.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "env_error", "env_error", "stop"]
    (record,) = caplog.records
    assert f"trajectory 'eval0/1' has reward {bad:g} from generator.agent=my.driver" in (
        record.getMessage()
    )
    assert "counted in eval/env_errors (2 of 4 trajectories)" in record.getMessage()


def test_a_reward_at_float32s_limit_is_a_reward():
    rows = [PromptRow("q0", "s", {})]
    cfg = GeneratorConfig(eval_n_samples_per_prompt=1)
    metrics, _ = evaluate_prompts(_Generator([[3.4028234663852886e38]]), rows, cfg, seed=0)
    assert metrics["eval/reward_mean"] == 3.4028234663852886e38
    assert metrics[names.EVAL_ENV_ERRORS] == 1.0  # the generator's own, nothing refused
