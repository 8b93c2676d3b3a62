"""``data.seed`` with ``data.source=reasoning_gym`` is checked against the seeds the generators
get: a numpy-seeded one (``pool_matrix``) refuses a seed outside [0, 2**32), and that
ValueError was reported as ``environment.dataset: reasoning-gym: Seed must be between 0 and
2**32 - 1``, naming a key that was right."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import skyrl
from skyrl.config import ConfigError
from skyrl.config.validate import validate
from skyrl.data import check_prompts
from skyrl.models import build_tiny_model

# experiment=smoke: 8 train and 4 eval prompts. Train entry i is seeded data.seed + i; eval
# draws up to 16 x 4 = 64 entries from data.seed + 1_000_003, the highest at data.seed +
# 1_000_003 + 63 = data.seed + 1_000_066 <= 2**32 - 1, so data.seed < 4_294_967_296 -
# 1_000_066 = 4_293_967_230.
LIMIT = 4_293_967_230


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def _cfg(seed: int):
    return validate(
        skyrl.compose(
            [
                "experiment=smoke",
                "data=reasoning_gym",
                "environment=reasoning_gym",
                "environment.dataset=pool_matrix",
                f"data.seed={seed}",
                "generator.max_prompt_length=2048",  # pool_matrix's questions: ~550 tokens
            ]
        )
    )


@pytest.mark.parametrize("seed", [-1, LIMIT])
def test_a_seed_the_generators_cannot_take_names_data_seed(tok, seed):
    with pytest.raises(ConfigError) as err:
        check_prompts(_cfg(seed), "train", tok)
    assert (err.value.key, err.value.message) == (
        "data.seed",
        f"must be in [0, {LIMIT}) with data.source=reasoning_gym, got {seed}: its generators "
        "are seeded with data.seed up to data.seed + 1000066, and some (numpy's) take only "
        "0 to 2**32 - 1",
    )


@pytest.mark.parametrize("seed", [0, LIMIT - 1])
def test_the_seeds_at_the_ends_of_the_range_generate(tok, seed):
    cfg = _cfg(seed)
    assert check_prompts(cfg, "train", tok).num_prompts == 8
    assert check_prompts(cfg, "eval", tok).num_prompts == 4
