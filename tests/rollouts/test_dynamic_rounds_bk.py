"""Dynamic sampling's further rounds within one step draw prompts the step has not drawn:
past an epoch's end the new shuffle used to hand out the step's prompts again, so one step
trained two groups of the same prompt. The orders below are the loader's seeded shuffles
(``random.Random(seed * 1_000_003 + epoch)``), written out; the draws are derived by hand."""

from __future__ import annotations

import pytest

from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.data import DataConfig
from skyrl.config.environment import EnvironmentConfig
from skyrl.config.generator import GeneratorConfig
from skyrl.config.root import SkyRLConfig
from skyrl.config.trainer import TrainerConfig
from skyrl.data import PromptRow
from skyrl.generators.output import GeneratorOutput
from skyrl.rollouts.dataloader import PromptLoader
from skyrl.rollouts.sync import SyncRollouts

E0 = [4, 1, 5, 2, 0, 3, 7, 6]
E1 = [3, 6, 1, 5, 7, 0, 4, 2]
E2 = [5, 3, 4, 1, 2, 6, 7, 0]
"""Epochs 0-2 of 8 rows with seed 0."""


def _rows(n: int) -> list[PromptRow]:
    return [PromptRow(f"q{i}", "src", {"answer": "1"}) for i in range(n)]


def _indices(loader: PromptLoader, prefix: str, refill: bool) -> list[int]:
    return [i for i, _ in loader.draw(prefix, refill)]


def test_the_written_out_orders_are_the_loaders():
    loader = PromptLoader(_rows(8), batch_size=2, seed=0)
    assert [loader._shuffled(e) for e in range(3)] == [E0, E1, E2]


def _step(loader: PromptLoader, step: int, rounds: int) -> list[list[int]]:
    return [_indices(loader, f"s{step}r{r}", refill=r > 0) for r in range(rounds)]


def test_refills_skip_the_steps_prompts_across_an_epoch_end_and_lose_none():
    loader = PromptLoader(_rows(8), batch_size=2, seed=0)
    # step 0 stays in epoch 0: E0[0:6] in pairs
    assert _step(loader, 0, 3) == [[4, 1], [5, 2], [0, 3]]
    # step 1: E0[6:8] = [7, 6] ends epoch 0. Epoch 1 = E1: 3 taken, 6 passed over (drawn
    # this step), 1 taken -> [3, 1]; then pending [6] + E1[3:] = 6 passed, 5 taken, 7
    # passed, 0 taken -> [5, 0]. Before: [3, 6] then [1, 5]: prompt 6 twice in one step.
    assert _step(loader, 1, 3) == [[7, 6], [3, 1], [5, 0]]
    state = loader.state_dict()
    # E1 consumed up to 0 (position 5, cursor 6); 6 and 7 wait, first in line
    assert (state["epoch"], state["cursor"], state["pending"]) == (1, 6, [6, 7])
    # step 2: the waiting [6, 7], then E1[6:8] = [4, 2]; epoch 1 drew each row once:
    # 3 1 5 0 6 7 4 2. The third round starts epoch 2: E2 without 6, 7, 4, 2 -> [5, 3]
    resumed = PromptLoader(_rows(8), batch_size=2, seed=0)
    resumed.load_state_dict(state)
    assert _step(loader, 2, 3) == _step(resumed, 2, 3) == [[6, 7], [4, 2], [5, 3]]
    assert resumed.state_dict() == loader.state_dict()


def test_a_refill_draws_nothing_when_a_batch_would_repeat_a_prompt():
    """8 prompts, batch 4: two rounds draw all of E0; a third would be E1[0:4] = 3 6 1 5,
    all drawn already. It draws nothing and moves nothing: the next step starts epoch 1."""
    loader = PromptLoader(_rows(8), batch_size=4, seed=0)
    assert _step(loader, 0, 3) == [[4, 1, 5, 2], [0, 3, 7, 6], []]
    assert _indices(loader, "s1r0", refill=False) == [3, 6, 1, 5]


def test_draws_without_refill_are_unchanged():
    """No refill: E0 in order, then E1 (the loader's draws as before)."""
    loader = PromptLoader(_rows(8), batch_size=4, seed=0)
    assert [_indices(loader, "s", refill=False) for _ in range(3)] == [E0[:4], E0[4:], E1[:4]]
    assert loader.state_dict()["pending"] == []


def _flat_output(rows: list[PromptRow]) -> GeneratorOutput:
    """Two samples per prompt, both reward 0: every group is flat (uninformative)."""
    n = 2 * len(rows)
    return GeneratorOutput(
        prompt_token_ids=[[1, 2]] * n,
        response_token_ids=[[5, 6]] * n,
        loss_masks=[[1, 1]] * n,
        rollout_logprobs=[[0.0, 0.0]] * n,
        rewards=[0.0] * n,
        uids=[r.uid for r in rows for _ in range(2)],
        trajectory_ids=[f"{r.uid}/{k}" for r in rows for k in range(2)],
        is_last_step=[True] * n,
        data_sources=["src"] * n,
        stop_reasons=["stop"] * n,
        policy_versions=[[(0, 0)]] * n,
    )


def _source(batch_size: int) -> tuple[SyncRollouts, list[list[str]]]:
    """``SyncRollouts`` over 8 prompts (seed 0), filter mode, at most 3 rounds; ``generate``
    records each round's prompts and returns flat groups, so every step samples 3 rounds
    when it can."""
    cfg = SkyRLConfig(
        trainer=TrainerConfig(train_batch_size=batch_size, policy_mini_batch_size=batch_size),
        generator=GeneratorConfig(n_samples_per_prompt=2, max_generate_length=4),
        algorithm=AlgorithmConfig(dynamic_sampling="filter", max_sample_batches=3),
        environment=EnvironmentConfig(),
        data=DataConfig(),
    )
    source = SyncRollouts.__new__(SyncRollouts)  # no engine: only the rounds
    drawn: list[list[str]] = []

    def generate(rows, seed: int) -> GeneratorOutput:
        drawn.append([r.prompt for r in rows])
        return _flat_output(rows)

    source.cfg = cfg
    source.loader = PromptLoader(_rows(8), batch_size, seed=0)
    source.generate = generate  # type: ignore[method-assign]
    return source, drawn


@pytest.mark.filterwarnings("ignore:step \\d+. dynamic sampling dropped")
def test_a_step_crossing_an_epoch_end_samples_each_prompt_once():
    source, drawn = _source(batch_size=2)
    with pytest.warns(UserWarning, match="after 3 rounds"):
        source.collect(step=0)
    drawn.clear()
    with pytest.warns(UserWarning, match=r"after 3 rounds \(algorithm.max_sample_batches\)"):
        out, _ = source.collect(step=1)
    # as in the loader test: [7, 6], then epoch 1 without 7 and 6: [3, 1], [5, 0]
    assert drawn == [["q7", "q6"], ["q3", "q1"], ["q5", "q0"]]
    # topped up with the first two flat groups: round 0's, prompts 7 and 6
    assert out.uids == ["s1r0p6"] * 2 + ["s1r0p7"] * 2


@pytest.mark.filterwarnings("ignore:step \\d+. dynamic sampling dropped")
def test_rounds_end_when_only_repeats_are_left_and_the_warning_says_why():
    """8 prompts, batch 4: two rounds draw all 8; the third (before: E1[0:4] = 3 6 1 5, every
    one a repeat) is not sampled."""
    source, drawn = _source(batch_size=4)
    with pytest.warns(UserWarning) as caught:
        _, metrics = source.collect(step=0)
    assert drawn == [["q4", "q1", "q5", "q2"], ["q0", "q3", "q7", "q6"]]
    assert metrics["dynamic_sampling/rounds"] == 2.0
    assert (
        "step 0: dynamic sampling: 0 informative groups after 2 rounds (fewer than "
        "trainer.train_batch_size prompts left that the step had not drawn); topped up with "
        "4 flat groups"
    ) in [str(w.message) for w in caught]
