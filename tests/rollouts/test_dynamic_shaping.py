"""Dynamic sampling edge cases: a group filter whose signature cannot take a group is refused
at the config check (not after the first sampling round); a custom driver's counts are summed
over a step's sampling rounds; the soft overlong penalty counts the tokens the length limit
counts (observations between turns included)."""

from __future__ import annotations

import pytest

from skyrl.config.errors import ConfigError
from skyrl.generators.output import GeneratorOutput
from skyrl.rollouts import dynamic_sampling as ds
from skyrl.rollouts.sync import merge_rollout_metrics
from skyrl.tracking import metric_names as names


@pytest.mark.parametrize(
    "module, params",
    [("g7_two_args", "rewards, uids"), ("g7_keyword_only", "*, group"), ("g7_none", "")],
)
def test_a_filter_that_cannot_take_a_group_is_a_config_error(tmp_path, monkeypatch, module, params):
    """Before: accepted, then ``TypeError: keep() missing 1 required positional argument``
    from inside ``SyncRollouts.collect`` once the first round was generated."""
    (tmp_path / f"{module}.py").write_text(f"def keep({params}):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as exc:
        ds.group_filter(f"{module}.keep")
    assert exc.value.key == "algorithm.dynamic_filter"
    listed = params.replace("*, ", "")  # the parameters' names
    assert exc.value.message == (
        f"{module}.keep takes ({listed}): a group filter takes one argument, the group's "
        "GeneratorOutput, and returns True to keep it"
    )


def test_a_registered_filter_with_a_wrong_signature_is_a_config_error():
    @ds.GROUP_FILTERS.register("test_g7_two_args")
    def two_args(group, cfg):
        return True

    with pytest.raises(ConfigError, match=r"test_g7_two_args takes \(group, cfg\)") as exc:
        ds.group_filter("test_g7_two_args")
    assert exc.value.key == "algorithm.dynamic_filter"


def test_filters_that_take_one_group_are_accepted():
    assert ds.group_filter("reward_variance") is ds.reward_variance
    assert ds.group_filter("builtins.bool") is bool  # a signature Python cannot read: allowed


def _round(metrics: dict[str, float]) -> GeneratorOutput:
    """A sampling round of one prompt ``u`` (source ``a``, 2 samples) with ``metrics``."""
    out = GeneratorOutput(
        [[1], [1]], [[5], [5]], [[1], [1]], [[0.0], [0.0]], [1.0, 0.0], ["u", "u"],
        ["u/0", "u/1"], [True, True], ["a", "a"], ["stop", "stop"], [[(0, 0)], [(0, 0)]],
    )  # fmt: skip
    out.metrics = metrics
    return out


def test_a_custom_drivers_counts_are_summed_over_the_rounds():
    """``Trajectory.counts`` are "summed over the step's trajectories into its metrics": a
    custom driver's count (not ``agent/...``) over two rounds is their sum, not their mean
    (before: (3 + 5) / 2 = 4)."""
    first = _round({"mydriver/tool_calls": 3.0, names.REWARD: 0.5, names.TURNS_MEAN: 1.0})
    second = _round({"mydriver/tool_calls": 5.0, names.REWARD: 1.0, names.TURNS_MEAN: 2.0})
    merged = merge_rollout_metrics([first, second])
    assert merged["mydriver/tool_calls"] == 3.0 + 5.0
    # the means stay means of rounds of equal size: (0.5 + 1.0) / 2, (1 + 2) / 2
    assert merged[names.REWARD] == 0.75 and merged[names.TURNS_MEAN] == 1.5


def _two_turns(step_wise: bool, replies: tuple[int, int], observation: int) -> GeneratorOutput:
    """One trajectory ``u/0``: a 17-token prompt, a reply of ``replies[0]`` tokens, an
    observation of ``observation`` tokens (loss mask 0), a last reply of ``replies[1]``; one
    whole-trajectory row, or one row per turn (the second turn's prompt is the context)."""
    first, last = replies
    prompt = list(range(17))
    if not step_wise:
        response = [5] * first + [9] * observation + [5] * last
        mask = [1] * first + [0] * observation + [1] * last
        rows = [(prompt, response, mask, 1.0, True, [(0, 0), (0, 0)])]
    else:
        second = prompt + [5] * first + [9] * observation
        rows = [
            (prompt, [5] * first, [1] * first, 0.0, False, [(0, 0)]),
            (second, [5] * last, [1] * last, 1.0, True, [(0, 0)]),
        ]
    out = GeneratorOutput(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
        [[0.0] * len(r[1]) for r in rows], [r[3] for r in rows], ["u"] * len(rows),
        ["u/0"] * len(rows), [r[4] for r in rows], ["a"] * len(rows),
        ["budget"] * len(rows), [r[5] for r in rows], step_wise=step_wise,
    )  # fmt: skip
    out.validate()
    return out


@pytest.mark.parametrize("step_wise", [False, True])
@pytest.mark.parametrize(
    "replies, penalty",
    [
        # 9 + 14 (observation) + 7 = 30 tokens after the prompt: all of max_generate_length=30,
        # where the agent loop stopped it ("budget"): 30 - (30 - 10) = 10 over a buffer of 10
        # -> -min(10 / 10, 1) x 0.5 = -0.5 (before: 9 + 7 = 16 sampled tokens, under 20: 0)
        ((9, 7), -0.5),
        # 9 + 14 + 2 = 25: 5 over -> -5 / 10 x 0.5 = -0.25 (before: 11 sampled: 0)
        ((9, 2), -0.25),
        # 2 + 14 + 2 = 18 <= 20: no penalty
        ((2, 2), 0.0),
    ],
)
def test_the_overlong_penalty_counts_what_max_generate_length_counts(step_wise, replies, penalty):
    """``max_generate_length`` bounds every token after the prompt, observations included (the
    agent loop's budget; the external-agent backend's room): the soft overlong penalty ramps
    over the last ``overlong_buffer_len`` of those, so a trajectory the limit cut gets the
    full ``overlong_penalty_factor``, in whole-trajectory and step-wise rows alike."""
    out = _two_turns(step_wise, replies, observation=14)
    mean = ds.overlong_penalty(out, max_generate_length=30, buffer_len=10, factor=0.5)
    assert out.rewards[-1] == pytest.approx(1.0 + penalty, abs=1e-12)
    assert mean == pytest.approx(penalty, abs=1e-12)  # one trajectory
    assert out.rewards[:-1] == [0.0] * (len(out) - 1)  # only the last step carries it
