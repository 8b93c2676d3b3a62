"""Zero-variance group filtering/replacement, DAPO overlong penalty and filtering, pass@k."""

from __future__ import annotations

import pytest

from skyrl.generators.output import GeneratorOutput
from skyrl.rollouts import dynamic_sampling as ds
from skyrl.rollouts.evaluation import eval_metrics, pass_at_k


def _output(groups: dict[str, list[float]], lengths=None, stops=None) -> GeneratorOutput:
    """One single-turn row per sample; ``lengths`` = generated tokens per sample."""
    rows = [(uid, k, r) for uid, rewards in groups.items() for k, r in enumerate(rewards)]
    lengths = lengths or [3] * len(rows)
    stops = stops or ["stop"] * len(rows)
    return GeneratorOutput(
        prompt_token_ids=[[1, 2] for _ in rows],
        response_token_ids=[[5] * n for n in lengths],
        loss_masks=[[1] * n for n in lengths],
        rollout_logprobs=[[0.0] * n for n in lengths],
        rewards=[r for _, _, r in rows],
        uids=[u for u, _, _ in rows],
        trajectory_ids=[f"{u}/{k}" for u, k, _ in rows],
        is_last_step=[True] * len(rows),
        data_sources=["a" if u < "c" else "b" for u, _, _ in rows],
        stop_reasons=stops,
        policy_versions=[[(0, 0)] for _ in rows],
    )


def test_informative_groups_are_those_with_unequal_rewards():
    out = _output({"a": [1, 0], "b": [1, 1], "c": [0, 0], "d": [0, 0.5]})
    assert ds.informative_uids(out) == ["a", "d"]
    kept = ds.keep_groups(out, ["d", "a"])
    assert kept.uids == ["d", "d", "a", "a"] and kept.rewards == [0, 0.5, 1, 0]
    kept.validate()


def test_replace_swaps_flat_groups_for_renamed_copies_of_informative_ones():
    out = _output({"a": [1, 0], "b": [1, 1], "c": [0, 0]})
    new, replaced = ds.replace_flat_groups(out, seed=0)
    assert replaced == 2 and len(new) == 6
    new.validate()  # trajectory ids follow the new uids
    groups = ds.group_rows(new)
    assert len(groups) == 3 and all(len(rows) == 2 for rows in groups.values())
    assert all(sorted(new.rewards[i] for i in rows) == [0, 1] for rows in groups.values())
    flat_only = _output({"b": [1, 1]})
    assert ds.replace_flat_groups(flat_only, seed=0) == (flat_only, 0)  # nothing to copy from


def test_overlong_penalty_ramps_over_the_buffer():
    # max 10 tokens, buffer 4: the ramp starts after 6 tokens.
    # lengths 5, 6, 8, 10 -> over 0, 0, 2, 4 -> penalties 0, 0, -2/4*0.5, -4/4*0.5
    out = _output({"a": [1, 1], "b": [0, 1]}, lengths=[5, 6, 8, 10])
    mean = ds.overlong_penalty(out, max_generate_length=10, buffer_len=4, factor=0.5)
    assert out.rewards == [1, 1, -0.25, 0.5]
    assert mean == pytest.approx((0 + 0 - 0.25 - 0.5) / 4)


def test_overlong_filter_masks_every_row_of_a_truncated_trajectory():
    out = _output({"a": [1, 0]}, lengths=[2, 3], stops=["stop", "length"])
    assert ds.mask_truncated(out) == 1
    assert out.loss_masks == [[1, 1], [0, 0, 0]]


def test_pass_at_k_unbiased_estimator():
    # n=4, c=1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    with pytest.raises(ValueError, match="k=5, n=4"):
        pass_at_k(4, 1, 5)


def test_eval_metrics_per_source_and_overall():
    # source a: prompts a (1 of 2 pass), b (2 of 2); source b: prompt c (0 of 2)
    out = _output({"a": [1, 0], "b": [1, 1], "c": [0, 0.5]})
    m = eval_metrics(out, k=2)
    assert m["eval/a/pass@1"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["eval/a/pass@2"] == pytest.approx((1.0 + 1.0) / 2)
    assert m["eval/b/pass@1"] == 0.0  # 0.5 is partial credit, not a pass
    assert m["eval/pass@1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert m["eval/reward_mean"] == pytest.approx(3.5 / 6)
