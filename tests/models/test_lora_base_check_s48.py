"""A LoRA run's adapters fit one base model: exporting or evaluating a LoRA checkpoint (its
trainer state's ``BASE_FINGERPRINT``) or a ``final_adapter`` (its ``BASE_RECORD``) onto another
base, one of the same shapes among them (another fine-tune, seed 1 here), is refused in one line
naming the adapters and the base and saying how the base differs; before, the adapters were
merged into it without a word (a wrong model). Adapters that record no base pass as before."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from lora_adapters import trained_adapters  # tests/ is on sys.path
from transformers import AutoModelForCausalLM

import skyrl
from skyrl.config import ConfigError
from skyrl.config.root import LoraConfig
from skyrl.eval_cli import evaluate
from skyrl.models.fingerprint import BASE_FINGERPRINT, base_fingerprint
from skyrl.models.lora import (
    ADAPTER_CONFIG,
    BASE_RECORD,
    add_adapters,
    is_adapter_name,
    merge_adapter_dir,
    peft_config,
    write_adapter_dir,
)
from skyrl.models.tiny import build_tiny_model
from skyrl.trainer.checkpoint import (
    TRAINER_STATE,
    WeightsMismatchError,
    export_checkpoint_hf,
)

LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
OTHER_WEIGHTS = "the same tensor names and shapes but other weights (another fine-tune)"
OTHER_LAYOUT = "other tensor names, dtypes or shapes (another architecture, size or precision)"


@pytest.fixture
def bases(tmp_path) -> tuple[str, str]:
    """The base the adapters are trained on, and another of the same layout (seed 1)."""
    return build_tiny_model(tmp_path / "base"), build_tiny_model(tmp_path / "other", seed=1)


def _trained(base: str):
    return add_adapters(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), LORA)


def _lora_checkpoint(tmp_path, base: str, state: dict | None) -> Path:
    """A LoRA checkpoint as the policy worker saves one (its adapters only) with the trainer
    state ``state`` (None: no ``trainer_state.json``)."""
    model = _trained(base)
    trained_adapters(model)
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_1"
    (ckpt / "policy" / "state").mkdir(parents=True)
    peft_config(LORA).save_pretrained(str(ckpt / "policy"))
    adapters = {n: p.detach() for n, p in model.named_parameters() if is_adapter_name(n)}
    torch.save({"module": adapters}, ckpt / "policy" / "state" / "mp_rank_00_model_states.pt")
    if state is not None:
        (ckpt / TRAINER_STATE).write_text(json.dumps(state))
    return ckpt


def test_a_lora_checkpoint_is_not_exported_onto_another_fine_tune(tmp_path, bases):
    base, other = bases
    ckpt = _lora_checkpoint(tmp_path, base, {"step": 1, BASE_FINGERPRINT: base_fingerprint(base)})
    with pytest.raises(WeightsMismatchError) as err:
        export_checkpoint_hf(ckpt, other, other, tmp_path / "out")
    assert str(err.value) == (
        f"{ckpt}: its LoRA adapters were trained on another base model than {other}, which "
        f"has {OTHER_WEIGHTS}"
    )
    assert not (tmp_path / "out").exists()
    # the same weights in another folder (a moved cache, another node's copy) export
    moved = shutil.copytree(base, tmp_path / "elsewhere")
    assert export_checkpoint_hf(ckpt, str(moved), base, tmp_path / "out") == tmp_path / "out"


def test_a_lora_checkpoint_onto_another_layout_the_adapters_fit_says_so(tmp_path, bases):
    # an MLP of 192, not 128: q_proj and v_proj (hidden 64 in; the adapters' shapes) are
    # unchanged, gate/up/down_proj are not; a layer that does not fit is named first
    base = bases[0]
    ckpt = _lora_checkpoint(tmp_path, base, {"step": 1, BASE_FINGERPRINT: base_fingerprint(base)})
    wider = build_tiny_model(tmp_path / "wider", intermediate_size=192)
    with pytest.raises(WeightsMismatchError) as err:
        export_checkpoint_hf(ckpt, wider, wider, tmp_path / "out")
    assert str(err.value) == (
        f"{ckpt}: its LoRA adapters were trained on another base model than {wider}, which "
        f"has {OTHER_LAYOUT}"
    )
    deeper = build_tiny_model(tmp_path / "deeper", num_hidden_layers=3)
    with pytest.raises(WeightsMismatchError, match=r"do not fit .*deeper: missing \['base_mo"):
        export_checkpoint_hf(ckpt, deeper, deeper, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("state", [None, {"step": 1}], ids=["no_trainer_state", "no_record"])
def test_a_lora_checkpoint_without_the_record_exports_as_before(tmp_path, bases, state):
    ckpt = _lora_checkpoint(tmp_path, bases[0], state)  # saved before the record
    out = export_checkpoint_hf(ckpt, bases[1], bases[1], tmp_path / "out")
    assert (out / "model.safetensors").is_file()


def test_skyrl_eval_of_a_lora_checkpoint_onto_another_fine_tune_is_one_line(tmp_path, bases):
    base, other = bases
    ckpt = _lora_checkpoint(tmp_path, base, {"step": 1, BASE_FINGERPRINT: base_fingerprint(base)})
    cfg = skyrl.compose(["experiment=smoke", f"eval.checkpoint={ckpt}", f"model.path={other}"])
    with pytest.raises(ConfigError) as err:
        evaluate(cfg, tmp_path / "eval")
    assert (err.value.key, err.value.message) == (
        "eval.checkpoint",
        f"{ckpt}: its LoRA adapters were trained on another base model than {other}, which "
        f"has {OTHER_WEIGHTS}; model.path must name the model the run trained",
    )


def _adapter_dir(tmp_path, base: str) -> Path:
    """A run's ``final_adapter`` as the policy worker writes it (``export_hf``)."""
    return write_adapter_dir(
        tmp_path / "final_adapter", trained_adapters(_trained(base)), LORA, base
    )


def test_a_final_adapter_records_its_base_beside_the_peft_files(tmp_path, bases):
    adapter = _adapter_dir(tmp_path, bases[0])
    record = json.loads((adapter / BASE_RECORD).read_text())
    assert record == {BASE_FINGERPRINT: base_fingerprint(bases[0])}
    # a name PEFT does not read: the directory still loads and merges onto its own base
    out = merge_adapter_dir(adapter, bases[0], bases[0], tmp_path / "merged")
    assert (out / "model.safetensors").is_file()


def test_a_final_adapter_is_not_merged_into_another_fine_tune(tmp_path, bases):
    base, other = bases
    adapter = _adapter_dir(tmp_path, base)
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, other, other, tmp_path / "merged", key="model.path")
    assert (err.value.key, err.value.message) == (
        "model.path",
        f"{adapter}: its adapters were trained on another base model than {other}, which has "
        f"{OTHER_WEIGHTS} (its {BASE_RECORD} records the base); the base_model_name_or_path "
        f"of its {ADAPTER_CONFIG} must name the model the run trained",
    )
    assert not (tmp_path / "merged").exists()
    wider = build_tiny_model(tmp_path / "wider", intermediate_size=192)  # q/v_proj: as above
    with pytest.raises(
        ConfigError, match=re.escape(f"which has {OTHER_LAYOUT} (its {BASE_RECORD}")
    ):
        merge_adapter_dir(adapter, wider, wider, tmp_path / "merged")


def test_skyrl_eval_of_a_final_adapter_naming_another_fine_tune_is_one_line(tmp_path, bases):
    # its adapter_config.json edited to name another fine-tune of the architecture
    base, other = bases
    adapter = _adapter_dir(tmp_path, base)
    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    (adapter / ADAPTER_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": other}))
    with pytest.raises(ConfigError) as err:
        evaluate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={adapter}"]), tmp_path)
    assert err.value.key == "eval.checkpoint"
    assert err.value.message.startswith(
        f"{adapter}: its adapters were trained on another base model than {other}, which has "
        f"{OTHER_WEIGHTS} (its {BASE_RECORD} records the base)"
    )


def test_a_final_adapter_without_the_record_merges_as_before(tmp_path, bases):
    adapter = _adapter_dir(tmp_path, bases[0])
    (adapter / BASE_RECORD).unlink()  # an older run's, or adapters from elsewhere
    out = merge_adapter_dir(adapter, bases[1], bases[1], tmp_path / "merged")
    assert (out / "model.safetensors").is_file()


def test_a_final_adapter_with_an_unreadable_record_is_one_line(tmp_path, bases):
    adapter = _adapter_dir(tmp_path, bases[0])
    (adapter / BASE_RECORD).write_text("{")  # a copy cut short
    with pytest.raises(ConfigError) as err:
        merge_adapter_dir(adapter, bases[0], bases[0], tmp_path / "merged")
    assert err.value.key == "eval.checkpoint"
    assert err.value.message.startswith(
        f"{adapter / BASE_RECORD} is not a base record (JSONDecodeError: "
    )


def test_a_checkpoint_whose_adapter_config_says_inference_mode_still_merges_its_adapters(
    tmp_path, bases
):
    # The adapters were found as the parameters PEFT leaves trainable; with inference_mode
    # true in the checkpoint's adapter_config.json PEFT freezes them, none were loaded, and
    # the base was exported unchanged without a word.
    base = bases[0]
    ckpt = _lora_checkpoint(tmp_path, base, None)
    config = ckpt / "policy" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "inference_mode": True}))
    out = export_checkpoint_hf(ckpt, base, base, tmp_path / "out")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    expected = _trained(base)
    adapters = {n: p.detach() for n, p in expected.named_parameters() if is_adapter_name(n)}
    trained = dict(torch.load(ckpt / "policy" / "state" / "mp_rank_00_model_states.pt")["module"])
    expected.load_state_dict(trained, strict=False)
    assert adapters.keys() == trained.keys()
    merged = expected.merge_and_unload().state_dict()
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(exported[name], plain[name])  # the adapters are in
    torch.testing.assert_close(exported[name], merged[name])
