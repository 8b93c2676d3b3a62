"""The reconciler on hand-made token ids: a clean chain is one row, a re-tokenized reply
realigns, edited history and re-rendered replies fork, and the counts say so."""

from __future__ import annotations

from skyrl.data.prompts import PromptRow
from skyrl.generators import Trajectory, trajectories_to_output
from skyrl.serve.reconcile import (
    APPEND,
    FIRST,
    FORK,
    REALIGNED,
    Chain,
    RequestRecord,
    fork_counts,
    to_turns,
)  # fmt: skip

# A toy vocabulary: most ids are one letter; 50 = "cd" and 51 = "cde" span letters.
VOCAB = {i: chr(ord("a") + i - 1) for i in range(1, 27)} | {50: "cd", 51: "cde"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def answer(chain: Chain, rendered, sampled, records):
    d = chain.decide(rendered)
    chain.record(d, sampled)
    records.append(RequestRecord(d, list(sampled), [-1.0] * len(sampled), "stop"))
    return d


def rows(records):
    row = PromptRow("q", "toy", {}, uid="u")
    traj = Trajectory(row, "u/0", to_turns(records), 1.0, "stop")
    out = trajectories_to_output([traj], step_wise=False)
    out.validate()
    return out


def test_a_clean_chain_is_one_row_with_observations_masked():
    chain, recs = Chain(decode), []
    # turn 0: prompt [1 2 3] samples [4 5]; turn 1 renders [1 2 3 4 5] + observation [6 7]
    assert answer(chain, [1, 2, 3], [4, 5], recs).kind == FIRST
    assert answer(chain, [1, 2, 3, 4, 5, 6, 7], [8], recs).kind == APPEND
    out = rows(recs)
    assert out.prompt_token_ids == [[1, 2, 3]]
    assert out.response_token_ids == [[4, 5, 6, 7, 8]]
    assert out.loss_masks == [[1, 1, 0, 0, 1]]  # sampled 4 5, observation 6 7, sampled 8
    assert out.rollout_logprobs == [[-1.0, -1.0, 0.0, 0.0, -1.0]]
    assert out.forks == [""] and fork_counts(chain)["agent/forks"] == 0


def test_a_reply_tokenized_differently_realigns_to_the_sampled_tokens():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3, 4], recs)  # "ab" + sampled "c" "d"
    # the agent sends "cd" back and the template tokenizes it as the single id 50
    d = answer(chain, [1, 2, 50, 5], [6], recs)
    assert d.kind == REALIGNED
    assert d.prompt_ids == [1, 2, 3, 4, 5]  # the engine sees what it sampled, then "e"
    out = rows(recs)
    assert out.response_token_ids == [[3, 4, 5, 6]] and out.loss_masks == [[1, 1, 0, 1]]
    assert fork_counts(chain)["agent/realigned"] == 1


def test_a_token_straddling_the_reply_forks_as_rerendered():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3, 4], recs)
    # id 51 = "cde": no token boundary where the text equals "abcd"
    d = answer(chain, [1, 2, 51, 6], [7], recs)
    assert (d.kind, d.reason) == (FORK, "rerendered")


def test_edited_history_forks_into_a_new_row():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2, 3], [4, 5], recs)
    answer(chain, [1, 2, 3, 4, 5, 6], [7], recs)  # append
    # the agent rewrote its system prompt (token 2 -> 9) and kept going: an edit
    d = answer(chain, [1, 9, 3, 4, 5, 6, 7, 8], [10, 11], recs)
    assert (d.kind, d.reason) == (FORK, "edited")
    # then it replaced the last reply with a summary: a re-render
    d = answer(chain, [1, 9, 3, 4, 5, 6, 7, 8, 12, 13], [14], recs)
    assert (d.kind, d.reason) == (FORK, "rerendered")
    out = rows(recs)
    assert out.prompt_token_ids == [
        [1, 2, 3],
        [1, 9, 3, 4, 5, 6, 7, 8],
        [1, 9, 3, 4, 5, 6, 7, 8, 12, 13],
    ]
    assert out.response_token_ids == [[4, 5, 6, 7], [10, 11], [14]]
    assert out.loss_masks == [[1, 1, 0, 1], [1, 1], [1]]
    assert out.forks == ["", "edited", "rerendered"]
    assert out.is_last_step == [False, False, True] and out.rewards == [0.0, 0.0, 1.0]
    counts = fork_counts(chain)
    assert counts == {
        "agent/requests": 4.0, "agent/forks": 2.0, "agent/forks_edited": 1.0,
        "agent/forks_rerendered": 1.0, "agent/realigned": 0.0,
    }  # fmt: skip


def test_step_wise_rows_are_one_per_request_with_the_fork_marked():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3], recs)
    answer(chain, [1, 2, 3, 4], [5], recs)
    answer(chain, [1, 8], [9], recs)
    row = PromptRow("q", "toy", {}, uid="u")
    out = trajectories_to_output([Trajectory(row, "u/0", to_turns(recs), 1.0, "stop")], True)
    out.validate()  # the prefix check is skipped only at the fork
    assert out.prompt_token_ids == [[1, 2], [1, 2, 3, 4], [1, 8]]
    assert out.forks == ["", "", "edited"]
