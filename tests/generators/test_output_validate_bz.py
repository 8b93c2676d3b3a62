"""``GeneratorOutput.validate`` on step-wise outputs: linear work, and the turn it names."""

import pytest

from skyrl.generators.output import GeneratorOutput


class CountingId(str):
    """A trajectory id that counts its (in)equality comparisons."""

    compared = 0

    def __eq__(self, other):
        CountingId.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other):
        CountingId.compared += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def step_wise_output(num_trajectories: int, turns: int, id_type=str) -> GeneratorOutput:
    """One prompt per trajectory; turn k's prompt is turn k-1's prompt + response + [7]."""
    out = GeneratorOutput([], [], [], [], [], [], [], [], [], [], [], step_wise=True)
    for t in range(num_trajectories):
        context = [1, 2, 3]
        for k in range(turns):
            last = k == turns - 1
            out.prompt_token_ids.append(list(context))
            out.response_token_ids.append([5, 6])
            out.loss_masks.append([1, 1])
            out.rollout_logprobs.append([0.0, 0.0])
            out.rewards.append(1.0 if last else 0.0)
            out.uids.append(f"u{t}")
            out.trajectory_ids.append(id_type(f"u{t}/0"))
            out.is_last_step.append(last)
            out.data_sources.append("d")
            out.stop_reasons.append("stop")
            out.policy_versions.append([(0, 0)])
            out.forks.append("")
            context = context + [5, 6, 7]
    return out


def test_validate_compares_trajectory_ids_a_constant_number_of_times_per_row():
    out = step_wise_output(num_trajectories=20, turns=10, id_type=CountingId)  # 200 rows
    CountingId.compared = 0
    out.validate()
    # per row: against the previous trajectory id, the next row's and the previous row's id:
    # 3 * 200 - 2 = 598 (no next row for the last, no previous one for the first). Naming
    # the turn by counting every earlier row of the batch added 19900 - (0 + 10 + ... + 190)
    # = 19900 - 1900 = 18000 more: quadratic in the batch's rows.
    assert CountingId.compared <= 3 * len(out)


def test_a_broken_prefix_names_the_turn_within_its_trajectory():
    out = step_wise_output(num_trajectories=3, turns=5)
    out.prompt_token_ids[5 + 3][0] = 99  # trajectory 1 (rows 5-9), its turn 3
    with pytest.raises(ValueError, match=r"'u1/0': turn 3's prompt does not extend turn 2's"):
        out.validate()
