"""The micro-batch token budget a run uses (``skyrl.batch.budget.micro_batch_tokens``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import skyrl
from skyrl.batch import budget as budget_module
from skyrl.batch.budget import (
    DEFAULT_MICRO_BATCH_TOKENS,
    GPU_MAX_DEFAULT_TOKENS,
    gpu_micro_batch_tokens,
    micro_batch_tokens,
)
from skyrl.config.errors import ConfigError
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


SMOLLM2_SHAPE = SimpleNamespace(
    hidden_size=576, num_hidden_layers=30, vocab_size=49152, max_position_embeddings=131072
)
# activation estimate per token in bf16: 34 x 576 x 2 B x 30 layers = 1,175,040
# + logits 3 x 49152 x 4 B = 589,824 -> 1,764,864 B
GIB = 2**30


def gpu_budget(free_bytes: int, *overrides: str, model=SMOLLM2_SHAPE) -> int:
    cfg = validate(skyrl.compose(["trainer.precision=bf16", *overrides]))
    return gpu_micro_batch_tokens(cfg, model, free_bytes)


def test_unset_budget_on_a_gpu_grows_to_the_ceiling_when_memory_allows():
    assert GPU_MAX_DEFAULT_TOKENS == 32768
    # half of 139 GiB = 74.6e9 B; 32768 x 1,764,864 = 57.8e9 fits
    assert gpu_budget(139 * GIB) == 32768


def test_unset_budget_on_a_gpu_is_the_largest_power_of_two_that_fits_half_the_free_memory():
    # half of 16 GiB = 8.59e9 B: 4096 x 1,764,864 = 7.23e9 fits, 8192 -> 14.46e9 does not
    assert gpu_budget(16 * GIB) == 4096
    # fp32 doubles the layers' part: 34 x 576 x 4 x 30 + 589,824 = 2,939,904 B per token;
    # 2048 -> 6.02e9 fits 8.59e9, 4096 -> 12.04e9 does not
    assert gpu_budget(16 * GIB, "trainer.precision=fp32") == 2048


def test_unset_budget_on_a_gpu_is_not_held_to_the_models_context():
    # SmolLM2's context is 8192; a packed row's sequences attend only to themselves, so the
    # context bounds each sequence (the pre-flight), not the row: 32768 fits as above
    smollm2 = SimpleNamespace(**{**vars(SMOLLM2_SHAPE), "max_position_embeddings": 8192})
    assert gpu_budget(139 * GIB, model=smollm2) == 32768


def test_unset_budget_on_a_gpu_never_drops_below_the_cpu_default_or_the_longest_sequence():
    assert gpu_budget(1 * GIB) == 2048  # 2048 x 1,764,864 = 3.6e9 > 0.54e9, kept anyway
    long = ["generator.max_prompt_length=1024", "generator.max_generate_length=1536"]
    assert gpu_budget(1 * GIB, *long) == 2560
    # 2560-token sequences: 4096 x 1,764,864 = 7.23e9 fits 8.59e9, the next power of two up
    assert gpu_budget(16 * GIB, *long) == 4096


def test_a_set_budget_is_used_as_it_is_on_a_gpu_too():
    assert gpu_budget(139 * GIB, "trainer.micro_batch_max_tokens=96") == 96


def test_the_plan_says_gpu_ranks_choose_an_unset_budget():
    cfg = validate(skyrl.compose(["experiment=smoke", "trainer.num_gpus_per_worker=1"]))
    plan = format_plan(make_plan(cfg))
    assert "micro batch budget      2048-32768 tokens, by each GPU rank's free memory" in plan


TINY_SHAPE = SimpleNamespace(
    hidden_size=64, num_hidden_layers=2, vocab_size=512, max_position_embeddings=4096
)
# fp32, per token: 34 x 64 x 4 B x 2 layers + 3 x 512 x 4 B = 17408 + 6144 = 23552 B


def budget_error(monkeypatch, *overrides: str):
    monkeypatch.setattr(budget_module, "machine_memory_bytes", lambda: 100_000_000)
    cfg = validate(skyrl.compose(["trainer.dp_size=2", *overrides]))
    with pytest.raises(ConfigError) as err:
        budget_module.check_micro_batch_budget(cfg, TINY_SHAPE)
    return err.value


def test_a_longest_sequence_over_the_memory_estimate_is_named_whatever_the_budget(monkeypatch):
    # Longest sequence 1976 + 24 = 2000 tokens: 2 ranks x 2000 x 23552 B = 94.2 MB, over half
    # of a 100 MB machine. A sequence longer than the budget is a micro batch of its own, so
    # no budget fits: the unset budget (2048) and a set one of 2000 were refused as
    # "trainer.micro_batch_max_tokens ... lower it", and lowering it to 1000 was then refused
    # as generator.max_generate_length. The sequence length is the key to change.
    long = ["generator.max_prompt_length=1976", "generator.max_generate_length=24"]
    for budget_set in ([], ["trainer.micro_batch_max_tokens=2000"]):
        error = budget_error(monkeypatch, *long, *budget_set)
        assert error.key == "generator.max_generate_length"
        assert error.message == (
            "a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
            "1976 + 24 = 2000 tokens makes micro batches of at least that many tokens, which "
            "need about 0.1 GiB of activations on 2 rank(s), over 50% of this "
            "machine's 0.1 GiB; shorten generator.max_prompt_length + "
            "generator.max_generate_length or set trainer.gradient_checkpointing=true"
        )
    # 1000 + 24 = 1024 tokens: 2 x 1024 x 23552 = 48.2 MB fits; a 2048 budget (96.5 MB) does
    # not, and lowering it helps
    short = ["generator.max_prompt_length=1000", "generator.max_generate_length=24"]
    error = budget_error(monkeypatch, *short)
    assert error.key == "trainer.micro_batch_max_tokens"
    assert error.message.startswith("2048 tokens per micro batch need about 0.1 GiB")
    assert error.message.endswith("set it lower or set trainer.gradient_checkpointing=true")
