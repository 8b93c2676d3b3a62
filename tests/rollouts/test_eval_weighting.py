"""``eval_metrics``: pass@1, pass@k and reward_mean overall and per source, hand-derived."""

from __future__ import annotations

import pytest

from skyrl.generators.output import GeneratorOutput
from skyrl.rollouts.evaluation import eval_metrics


def _output(prompts: list[tuple[str, list[float]]]) -> GeneratorOutput:
    """One single-turn row per sample; prompt i is uid ``eval<i>`` of the source given."""
    rows = [(f"eval{i}", src, r) for i, (src, rewards) in enumerate(prompts) for r in rewards]
    return GeneratorOutput(
        prompt_token_ids=[[1, 2] for _ in rows],
        response_token_ids=[[5] for _ in rows],
        loss_masks=[[1] for _ in rows],
        rollout_logprobs=[[0.0] for _ in rows],
        rewards=[r for *_, r in rows],
        uids=[u for u, *_ in rows],
        trajectory_ids=[f"{u}/{k}" for k, (u, *_) in enumerate(rows)],
        is_last_step=[True] * len(rows),
        data_sources=[s for _, s, _ in rows],
        stop_reasons=["stop"] * len(rows),
        policy_versions=[[(0, 0)] for _ in rows],
    )


def test_two_sources_with_unequal_prompt_counts():
    """The overall numbers are means over prompts (and samples for the reward), not a mean of
    the per-source means."""
    out = _output([("a", [1.0, 0.0]), ("b", [0.0, 0.0]), ("b", [0.0, 0.0]), ("b", [1.0, 1.0])])
    m = eval_metrics(out, 2)
    # a: one prompt, c=1 of n=2: pass@1 = 1/2; pass@2 = 1 - C(1,2)/C(2,2) = 1 - 0/1 = 1
    assert m["eval/a/pass@1"] == 0.5
    assert m["eval/a/pass@2"] == 1.0
    assert m["eval/a/reward_mean"] == 0.5
    # b: c = 0, 0, 2 of 2: pass@1 = (0 + 0 + 1) / 3, pass@2 = (0 + 0 + 1) / 3; reward 2/6
    assert m["eval/b/pass@1"] == pytest.approx(1 / 3, abs=1e-15)
    assert m["eval/b/pass@2"] == pytest.approx(1 / 3, abs=1e-15)
    assert m["eval/b/reward_mean"] == pytest.approx(1 / 3, abs=1e-15)
    # all 4 prompts: pass@1 = (0.5 + 0 + 0 + 1) / 4 = 0.375 (a mean of sources: 0.41666...)
    assert m["eval/pass@1"] == 0.375
    # pass@2 = (1 + 0 + 0 + 1) / 4 = 0.5 (a mean of sources: 0.6666...)
    assert m["eval/pass@2"] == 0.5
    assert m["eval/reward_mean"] == 3 / 8  # 3 full-credit samples of 8
