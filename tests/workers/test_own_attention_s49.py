"""A model that attends in its own code (Bloom, CodeGen, XGLM, Falcon, GPT-J, ...) is refused
before anything starts: neither of skyrl's packed attentions reaches it, so the sequences of a
packed micro batch saw each other.

Before: a tiny Bloom loaded with ``per_sequence`` (its attention silently not used) scored
a sequence packed after another 0.0057 off its logits alone, and the pre-flight passed it;
Falcon, GPT-Neo and GPT-J failed only once the workers started (``KeyError:
'skyrl_per_sequence'``)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, BloomConfig, FalconConfig
from worker_helpers import packed_after_another_gap

import skyrl
from skyrl.config import ConfigError
from skyrl.config.preflight import preflight
from skyrl.config.validate import validate
from skyrl.workers.models import load_causal_lm

TINY_BLOOM = BloomConfig(vocab_size=100, hidden_size=64, n_layer=2, n_head=2)


def bloom_folder(tmp_path) -> str:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(TINY_BLOOM).save_pretrained(tmp_path / "bloom")
    return str(tmp_path / "bloom")


def test_bloom_attends_across_the_packed_row_so_it_is_refused_at_load(tmp_path):
    path = bloom_folder(tmp_path)
    # why: the second of two sequences of 5 packed in one row, against it alone
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.randint(0, 100, (1, 10), generator=torch.Generator().manual_seed(1))
    assert packed_after_another_gap(model, ids) > 1e-3

    with pytest.raises(ValueError, match=r"\(bloom\) computes attention in its own code"):
        load_causal_lm(path, "fp32")


@pytest.mark.parametrize("mode", ["per_sequence", "masked"])
@pytest.mark.parametrize(
    "config",
    [
        TINY_BLOOM,
        FalconConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2),
    ],
    ids=["bloom", "falcon"],
)
def test_the_preflight_refuses_a_model_that_attends_in_its_own_code(tmp_path, config, mode):
    config.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").touch()  # the pre-flight reads no weights
    path = str(tmp_path / "model")
    cfg = validate(
        skyrl.compose(
            [
                "experiment=smoke",
                "data=fake",
                "environment.name=unused",
                f"model.path={path}",
                f"trainer.packed_attention={mode}",
            ]
        )
    )
    with pytest.raises(ConfigError) as refused:
        preflight(cfg, for_run=False)
    assert (refused.value.key, refused.value.message) == (
        "model.path",
        f"{path} ({config.model_type}) computes attention in its own code, which neither of "
        "skyrl's packed attentions (trainer.packed_attention) reaches: the sequences packed in "
        "one micro batch would see each other: the workers would compute another model's "
        "logprobs",
    )
