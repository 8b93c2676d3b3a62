"""The micro-batch token budget a run uses (``skyrl.batch.budget.micro_batch_tokens``)."""

from __future__ import annotations

import skyrl
from skyrl.batch.budget import DEFAULT_MICRO_BATCH_TOKENS, micro_batch_tokens
from skyrl.config.validate import validate
from skyrl.trainer.plan import format_plan, make_plan


def budget(*overrides: str) -> int:
    return micro_batch_tokens(validate(skyrl.compose(list(overrides))))


def test_unset_budget_is_the_default_or_the_longest_sequence():
    assert DEFAULT_MICRO_BATCH_TOKENS == 2048
    assert budget() == 2048  # the main job: 128 + 64 = 192-token sequences, ~10 per micro batch
    long = ["generator.max_prompt_length=1024", "generator.max_generate_length=1536"]
    assert budget(*long) == 2560  # a sequence longer than the default still fits one
    assert budget("trainer.micro_batch_max_tokens=96") == 96  # set: used as it is


def test_the_plan_shows_the_budget_in_use():
    plan = format_plan(make_plan(validate(skyrl.compose(["experiment=smoke"]))))
    assert "micro batch budget      2048 tokens (max sequence 152)" in plan
