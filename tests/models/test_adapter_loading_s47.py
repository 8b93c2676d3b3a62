"""``skyrl.models.lora``: a saved adapter directory on a base model it was not trained on
(one line naming the folder, the layer and the two shapes, not PEFT's size-mismatch wall or a
silent merge of part of the adapters), and a bf16 merge rounded once, not twice."""

from __future__ import annotations

import pytest
import torch
from lora_adapters import trained_adapters  # tests/ is on sys.path
from transformers import AutoModelForCausalLM

import skyrl
from skyrl.config import ConfigError
from skyrl.config.root import LoraConfig
from skyrl.eval_cli import evaluate
from skyrl.models.lora import (
    ADAPTER,
    add_adapters,
    merge_adapter_dir,
    merged_weight,
    write_adapter_dir,
)
from skyrl.models.tiny import build_tiny_model

LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])


def _adapter(tmp_path, named_base: str | None = None):
    """An adapter trained on the tiny model (hidden size 64, 2 layers); its
    adapter_config.json names ``named_base`` (default: that model)."""
    base = build_tiny_model()
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base), LORA)
    return write_adapter_dir(
        tmp_path / "final_adapter", trained_adapters(model), LORA, named_base or base
    ), base


def test_an_adapter_of_other_sizes_names_the_folder_the_layer_and_both_shapes(tmp_path):
    # was: PEFT's RuntimeError listing 8 "size mismatch for ..." lines
    adapter, base = _adapter(tmp_path)
    other = build_tiny_model(hidden_size=96, intermediate_size=192, head_dim=48)
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, other, other, tmp_path / "merged", key="model.path")
    # q_proj's A is [rank, hidden] = [4, 64] trained, [4, 96] here; every one of the
    # 2 layers x 2 targets x (A, B) = 8 tensors differs (v_proj's B: [1 x 32, 4] vs [1 x 48, 4])
    assert (err.value.key, err.value.message) == (
        "model.path",
        f"{adapter}: its adapters do not fit the base model {other} (its adapter_config.json "
        f"names {base}): model.layers.0.self_attn.q_proj.lora_A is [4, 64] in the adapter, "
        "[4, 96] in the base model (and 7 more); they were trained on another model",
    )
    assert not (tmp_path / "merged").exists()


def test_an_adapter_of_more_layers_is_refused_not_merged_in_part(tmp_path):
    # was: no error; PEFT dropped layer 1's adapters without a word and the export held half
    adapter, base = _adapter(tmp_path)
    one_layer = build_tiny_model(num_hidden_layers=1)
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, one_layer, one_layer, tmp_path / "merged")
    # layer 1's q_proj and v_proj: the first named, 1 more
    assert err.value.message == (
        f"{adapter}: its adapters do not fit the base model {one_layer} (its "
        f"adapter_config.json names {base}): it adapts model.layers.1.self_attn.q_proj, which "
        "the base model lacks (and 1 more); they were trained on another model"
    )
    assert not (tmp_path / "merged").exists()


def test_skyrl_eval_of_an_adapter_whose_base_has_other_sizes_is_a_config_error(tmp_path):
    # the adapter_config.json names a model of other sizes (a base rebuilt, a config edited):
    # was a RuntimeError traceback out of skyrl-eval
    other = build_tiny_model(hidden_size=96, intermediate_size=192, head_dim=48)
    adapter, _ = _adapter(tmp_path, named_base=other)
    with pytest.raises(ConfigError) as err:
        evaluate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={adapter}"]), tmp_path)
    assert err.value.key == "eval.checkpoint"
    assert err.value.message.startswith(f"{adapter}: its adapters do not fit the base model ")
    assert "lora_A is [4, 64] in the adapter, [4, 96] in the base model" in err.value.message
    # the adapter directory given as the model itself: the error names model.path
    with pytest.raises(ConfigError) as err:
        evaluate(skyrl.compose(["experiment=smoke", f"model.path={adapter}"]), tmp_path)
    assert err.value.key == "model.path"
    assert "lora_A is [4, 64] in the adapter, [4, 96] in the base model" in err.value.message


def test_a_bf16_merge_is_the_fp32_merge_rounded_once():
    base = build_tiny_model()
    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "down_proj"])
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base), lora)
    trained_adapters(model)
    model = model.to(torch.bfloat16)  # what DeepSpeed's bf16 engine holds
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and ADAPTER in m.lora_A]
    assert len(layers) == 2 * 2  # two layers, two targets each
    twice_off = 0
    for layer in layers:
        w = layer.base_layer.weight.detach()
        a, b = layer.lora_A[ADAPTER].weight.double(), layer.lora_B[ADAPTER].weight.double()
        reference = w.double() + (8 / 4) * (b @ a)  # alpha / rank = 2, in fp64
        merged = merged_weight(w, layer)
        assert merged.dtype == torch.bfloat16
        # one round-to-nearest into bf16 (8 significant bits): within 2^-8 of the value
        error = (merged.double() - reference).abs()
        assert bool((error <= 2**-8 * reference.abs()).all())
        # PEFT's delta, rounded to bf16 before the sum is rounded: a wider error (12% of the
        # elements of the tiny model's layers here), which this bound would catch
        peft = w + layer.get_delta_weight(ADAPTER).to(w.dtype)
        twice_off += int(((peft.double() - reference).abs() > 2**-8 * reference.abs()).sum())
    assert twice_off > 0


@pytest.fixture
def gpt2_dir(tmp_path):
    """A tiny GPT-2 (another architecture: no ``model.layers.N.self_attn.q_proj``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=512)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    return str(tmp_path / "gpt2")


def test_an_adapter_of_another_architecture_is_one_line(tmp_path, gpt2_dir):
    # was: PEFT's NoMatchingPeftModuleError traceback
    adapter, _ = _adapter(tmp_path)
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, gpt2_dir, gpt2_dir, tmp_path / "merged")
    assert err.value.message.startswith(
        f"{adapter}: its adapters do not fit the base model {gpt2_dir} (its "
    )
    assert "NoMatchingPeftModuleError: Target modules {" in err.value.message
    assert err.value.message.endswith("; they were trained on another model")


def test_a_lora_checkpoint_exported_onto_another_architecture_is_a_weights_mismatch(
    tmp_path, gpt2_dir
):
    # skyrl-eval eval.checkpoint=<LoRA checkpoint> model.path=<another model> turns a
    # WeightsMismatchError into one line (eval.checkpoint: ...; model.path must name the model
    # the run trained); this one was PEFT's NoMatchingPeftModuleError traceback
    from skyrl.models.lora import is_adapter_name, peft_config
    from skyrl.trainer.checkpoint import WeightsMismatchError, export_checkpoint_hf

    model = add_adapters(AutoModelForCausalLM.from_pretrained(build_tiny_model()), LORA)
    trained_adapters(model)
    ckpt = tmp_path / "global_step_1"  # as the policy worker saves a LoRA checkpoint
    (ckpt / "policy" / "state").mkdir(parents=True)
    peft_config(LORA).save_pretrained(str(ckpt / "policy"))
    adapters = {n: p.detach() for n, p in model.named_parameters() if is_adapter_name(n)}
    torch.save({"module": adapters}, ckpt / "policy" / "state" / "mp_rank_00_model_states.pt")
    with pytest.raises(WeightsMismatchError) as err:
        export_checkpoint_hf(ckpt, gpt2_dir, gpt2_dir, tmp_path / "out")
    assert str(err.value).startswith(
        f"{ckpt}: its LoRA adapters do not fit {gpt2_dir}: NoMatchingPeftModuleError: "
        "Target modules {"
    )
