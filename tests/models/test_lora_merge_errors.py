"""``skyrl.models.lora.merge_adapter_dir`` on an adapter directory whose weights are missing
or cut short (a run killed while exporting ``final_adapter``, a partial copy): one line naming
the file, under the key that named the adapter, not PEFT's or safetensors' traceback."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

import skyrl
from skyrl.config import ConfigError
from skyrl.config.root import LoraConfig
from skyrl.eval_cli import evaluate
from skyrl.models.lora import (
    ADAPTER_WEIGHTS,
    add_adapters,
    is_adapter_name,
    merge_adapter_dir,
    wire_name,
    write_adapter_dir,
)
from skyrl.models.tiny import build_tiny_model


@pytest.fixture
def adapter_dir(tmp_path):
    base = build_tiny_model()
    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base), lora)
    tensors = {wire_name(n): p for n, p in model.named_parameters() if is_adapter_name(n)}
    return write_adapter_dir(tmp_path / "final_adapter", tensors, lora, base), base


def _cut_short(adapter) -> None:
    weights = adapter / ADAPTER_WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def test_missing_adapter_weights_are_named_not_taken_for_a_hub_repo_id(adapter_dir, tmp_path):
    # was: HFValidationError "Repo id must be in the form 'repo_name' or ..."
    adapter, base = adapter_dir
    (adapter / ADAPTER_WEIGHTS).unlink()
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, base, base, tmp_path / "merged")
    assert (err.value.key, err.value.message) == (
        "eval.checkpoint",
        f"{adapter}: no {ADAPTER_WEIGHTS} (an export cut short, or a partial copy)",
    )
    assert not (tmp_path / "merged").exists()


def test_adapter_weights_cut_short_are_one_line_naming_the_file(adapter_dir, tmp_path):
    # was: safetensors' SafetensorError traceback out of PeftModel.from_pretrained
    adapter, base = adapter_dir
    _cut_short(adapter)
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, base, base, tmp_path / "merged", key="model.path")
    assert err.value.key == "model.path"
    assert err.value.message == (
        f"{adapter / ADAPTER_WEIGHTS} cannot be read (SafetensorError: Error while "
        "deserializing header: incomplete metadata, file not fully covered): a file cut "
        "short (a run killed while exporting, a partial copy)"
    )


def test_skyrl_eval_of_a_torn_final_adapter_is_a_config_error(adapter_dir, tmp_path):
    adapter, _ = adapter_dir
    _cut_short(adapter)
    with pytest.raises(ConfigError) as err:
        evaluate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={adapter}"]), tmp_path)
    assert err.value.key == "eval.checkpoint"
    assert err.value.message.startswith(f"{adapter / ADAPTER_WEIGHTS} cannot be read (")
