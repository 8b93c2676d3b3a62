"""LoRA adapters (PEFT) for the policy: wrapping a model, the names adapters travel under,
the adapter directory both engines and exports read, and the compose-time module check.

Names. Inside a PEFT model an adapter weight is ``base_model.model.<module>.lora_A.default.weight``
and the layer it adapts keeps its weight at ``<module>.base_layer.weight``. On the wire
(weight sync) and on disk (``adapter_model.safetensors``) adapter tensors use PEFT's saved
names, without the adapter name: ``base_model.model.<module>.lora_A.weight``; that is what
``PeftModel.from_pretrained`` and vLLM's LoRA loader read. Merged weights use the plain HF
names of the base model (``<module>.weight``).

peft is imported inside the functions that need it, so validating a config imports none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl.config.errors import ConfigError, exception_line
from skyrl.config.root import LoraConfig, SkyRLConfig
from skyrl.models.fingerprint import BASE_FINGERPRINT, base_difference, base_fingerprint

if TYPE_CHECKING:
    import torch
    from torch import nn

ADAPTER = "default"
"""The adapter's name inside the PEFT model (one adapter per model)."""
PEFT_PREFIX = "base_model.model."
ALL_LINEAR = "all-linear"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_RECORD = "skyrl_base.json"
"""In an adapter directory written with its base model (a run's ``final_adapter``):
``{BASE_FINGERPRINT: base_fingerprint(base)}``, the base its adapters were trained on (PEFT and
vLLM read only the files they know). Absent: a base without safetensors, an older run's
adapters, adapters from elsewhere; then nothing is checked."""


def engine_lora(cfg: SkyRLConfig) -> LoraConfig | None:
    """The adapter config the inference engines serve: set with LoRA and
    ``trainer.lora_sync=adapter``; None (engines hold plain weights) otherwise."""
    lora = cfg.model.lora
    return lora if lora.enabled and cfg.trainer.lora_sync == "adapter" else None


def peft_config(lora: LoraConfig, target_modules: list[str] | None = None, inference: bool = False):
    """PEFT's ``LoraConfig`` for ``lora`` (``target_modules`` overrides the configured ones)."""
    import peft

    targets: str | list[str] = list(target_modules or lora.target_modules)
    if targets == [ALL_LINEAR]:
        targets = ALL_LINEAR
    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        inference_mode=inference,
    )


def add_adapters(model: nn.Module, lora: LoraConfig, inference: bool = False):
    """``model`` with fresh adapters (B = 0: the same outputs as ``model``), a
    ``peft.PeftModel``; only the adapter parameters require grad."""
    import peft

    return peft.get_peft_model(model, peft_config(lora, inference=inference))


def is_adapter_name(name: str) -> bool:
    """An adapter tensor, under its PEFT parameter name or its wire name."""
    return ".lora_A." in name or ".lora_B." in name


def wire_name(param_name: str) -> str:
    """``...lora_A.default.weight`` -> ``...lora_A.weight`` (PEFT's saved name)."""
    for part in ("lora_A", "lora_B"):
        param_name = param_name.replace(f".{part}.{ADAPTER}.", f".{part}.")
    return param_name


def param_name(wire: str) -> str:
    """The inverse of ``wire_name``: the parameter name inside a PEFT model."""
    for part in ("lora_A", "lora_B"):
        wire = wire.replace(f".{part}.", f".{part}.{ADAPTER}.")
    return wire


def base_name(param_name: str) -> str:
    """The HF name of a base-model parameter of a PEFT model (``<module>.weight``)."""
    return param_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def adapted_modules(wire_names: Iterable[str]) -> list[str]:
    """The full names in the base model (``model.layers.0.mlp.down_proj``) of the modules that
    adapter tensors named ``wire_names`` adapt: as ``target_modules``, PEFT matches each to
    exactly that module (a last name alone, ``c_proj``, would put adapters on every layer of
    that name, GPT-2's attention output as well as its MLP's)."""
    modules = set()
    for name in wire_names:
        for part in (".lora_A.", ".lora_B."):
            if part in name:
                modules.add(name.split(part)[0].removeprefix(PEFT_PREFIX))
    return sorted(modules)


def write_adapter_dir(
    path: str | Path,
    tensors: dict[str, torch.Tensor],
    lora: LoraConfig,
    base_model: str | None = None,
) -> Path:
    """A PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``)
    from wire-named ``tensors``: what ``PeftModel.from_pretrained`` and vLLM load; with
    ``base_model``, its fingerprint in ``BASE_RECORD``."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = peft_config(lora, target_modules=adapted_modules(tensors), inference=True)
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(out))
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, out / ADAPTER_WEIGHTS)
    fingerprint = base_fingerprint(str(base_model)) if base_model else None  # None: no safetensors
    (out / BASE_RECORD).unlink(missing_ok=True)  # an earlier write's, of another base
    if fingerprint:
        (out / BASE_RECORD).write_text(json.dumps({BASE_FINGERPRINT: fingerprint}) + "\n")
    return out


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())


def is_adapter_dir(path: str | Path) -> bool:
    """A PEFT adapter directory (a run's ``final_adapter``): ``adapter_config.json`` and no
    model ``config.json``."""
    folder = Path(path).expanduser()
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def merge_adapter_dir(
    adapter_dir: str | Path,
    base_model: str,
    tokenizer: str,
    out_dir: str | Path,
    trust_remote_code: bool = False,
    key: str = "eval.checkpoint",
) -> Path:
    """A ``from_pretrained`` directory at ``out_dir`` (with ``tokenizer``'s files): the model
    at ``base_model`` with the adapter directory ``adapter_dir`` merged in, in fp32 (merged
    in bf16, a small update is mostly lost to rounding). An adapter directory without
    readable weights, one that records another base (``check_adapter_base``), or adapters that
    do not fit ``base_model`` (``load_adapter_dir``), raise ``ConfigError`` under ``key``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from skyrl.models.resolve import IN_MEMORY

    check_adapter_weights(adapter_dir, key)
    remote = {"trust_remote_code": trust_remote_code}
    base = AutoModelForCausalLM.from_pretrained(
        base_model, dtype=torch.float32, **remote, **IN_MEMORY
    )
    adapted = load_adapter_dir(base, adapter_dir, base_model, key)  # a misfit: layer, shapes
    check_adapter_base(adapter_dir, base_model, key)  # they fit: the base they were trained on?
    merged = adapted.merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer, **remote).save_pretrained(out_dir)
    return Path(out_dir)


def check_adapter_base(adapter_dir: str | Path, base_model: str, key: str) -> None:
    """``ConfigError`` under ``key`` naming ``adapter_dir`` and ``base_model`` when the adapter
    directory records (``BASE_RECORD``) another base than ``base_model``: the adapters fit one
    of the same shapes (another fine-tune), or of other dtypes or untargeted shapes, without an
    error. A directory without the record passes."""
    record = Path(adapter_dir).expanduser() / BASE_RECORD
    if not record.is_file():
        return
    try:
        saved = dict(json.loads(record.read_text())[BASE_FINGERPRINT])
    except (OSError, ValueError, TypeError, KeyError) as exc:  # ValueError: bad JSON or UTF-8
        raise ConfigError(key, f"{record} is not a base record ({exception_line(exc)})") from None
    differs = base_difference(saved, base_model)
    if differs is not None:
        raise ConfigError(
            key,
            f"{adapter_dir}: its adapters were trained on another base model than {base_model}, "
            f"which has {differs} (its {BASE_RECORD} records the base); the "
            f"base_model_name_or_path of its {ADAPTER_CONFIG} must name the model the run trained",
        )


def load_adapter_dir(base: nn.Module, adapter_dir: str | Path, base_model: str, key: str):
    """``base`` (the model at ``base_model``) with the adapters of the adapter directory
    ``adapter_dir`` loaded, a ``peft.PeftModel`` (``PeftModel.from_pretrained``'s two steps:
    adapter layers from its ``adapter_config.json``, then its weights). Adapters that do not fit
    ``base`` raise ``ConfigError`` under ``key`` naming the directory, the first layer that
    differs and its two shapes: PEFT ended in a wall of size mismatches, and dropped the weights
    of a layer the model lacks without a word (a merge of half the adapters)."""
    from peft import PeftConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    config = PeftConfig.from_pretrained(str(adapter_dir))
    config.inference_mode = True
    # PEFT sets it to ``base``'s path, warning when it differs (a hub id resolved to a local
    # folder): the name is read here, and the check below says what matters, the shapes
    named, config.base_model_name_or_path = config.base_model_name_or_path, None
    try:
        model = get_peft_model(base, config)
    except ValueError as exc:  # not one of its target modules in the model
        problem: str | None = exception_line(exc)
    else:
        weights = load_file(Path(adapter_dir).expanduser() / ADAPTER_WEIGHTS)
        problem = _adapter_misfit(model, weights)
        if problem is None:
            set_peft_model_state_dict(model, weights)
            return model
    names = f" (its {ADAPTER_CONFIG} names {named})" if named and named != str(base_model) else ""
    raise ConfigError(
        key,
        f"{adapter_dir}: its adapters do not fit the base model {base_model}{names}: {problem}; "
        "they were trained on another model",
    )


def _adapter_misfit(model: nn.Module, weights: dict[str, torch.Tensor]) -> str | None:
    """The first way the wire-named adapter ``weights`` do not fit the adapter layers of the
    PEFT ``model`` (None: they fit): a layer the model lacks, a shape that differs, a layer
    the adapter's ``target_modules`` match that it has no weights for."""
    params = {wire_name(n): p for n, p in model.named_parameters() if is_adapter_name(n)}

    def first(names: list[str]) -> tuple[str, str]:  # the name in the model, how many more
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        return names[0].removeprefix(PEFT_PREFIX).removesuffix(".weight"), more

    lacking = adapted_modules(n for n in weights if is_adapter_name(n) and n not in params)
    if lacking:
        name, more = first(lacking)
        return f"it adapts {name}, which the base model lacks{more}"
    resized = [n for n in weights if n in params and weights[n].shape != params[n].shape]
    if resized:
        (name, more), n = first(resized), resized[0]
        return (
            f"{name} is {list(weights[n].shape)} in the adapter, {list(params[n].shape)} in "
            f"the base model{more}"
        )
    unfilled = adapted_modules(n for n in params if n not in weights)
    if unfilled:
        name, more = first(unfilled)
        return f"its target_modules match {name}, with no weights for it{more}"
    return None


def merged_weight(weight: torch.Tensor, layer: Any) -> torch.Tensor:
    """``weight``, the base weight of the PEFT LoRA layer ``layer``, with its adapter merged
    in: ``W + (alpha / r) * B @ A`` computed in fp32 and cast once to ``weight``'s dtype, the
    bf16 value nearest the fp32 merge. PEFT's ``get_delta_weight`` rounds the update to a
    bf16 model's dtype and the sum is rounded again: on the tiny model a quarter of the merged
    bf16 weights differed from the once-rounded merge, an eighth by more than one bf16
    rounding (2^-8 relative)."""
    from peft.utils import transpose

    a = layer.lora_A[ADAPTER].weight.float()
    b = layer.lora_B[ADAPTER].weight.float()
    delta = transpose(b @ a, layer.fan_in_fan_out) * layer.scaling[ADAPTER]
    return (weight.float() + delta).to(weight.dtype)


def check_adapter_weights(adapter_dir: str | Path, key: str) -> None:
    """``adapter_dir`` holds a readable ``adapter_model.safetensors`` (its header read, no
    tensors): PEFT took a directory without one for a hub repo id ("Repo id must be in the
    form ...") and a file cut short failed in safetensors' traceback. Raises ``ConfigError``
    under ``key`` naming the file."""
    from safetensors import SafetensorError, safe_open

    weights = Path(adapter_dir).expanduser() / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ConfigError(
            key, f"{adapter_dir}: no {ADAPTER_WEIGHTS} (an export cut short, or a partial copy)"
        )
    try:
        with safe_open(str(weights), framework="pt"):
            pass
    except (OSError, SafetensorError) as exc:
        raise ConfigError(
            key,
            f"{weights} cannot be read ({exception_line(exc)}): a file cut short (a run killed "
            "while exporting, a partial copy)",
        ) from None


def linear_module_names(model: nn.Module) -> list[str]:
    """Dotted names of every linear layer of ``model`` except its output layer: PEFT's
    ``all-linear`` (``nn.Linear`` and transformers' ``Conv1D``, GPT-2's transposed linear)."""
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, Conv1D)) and module is not output
    ]


def check_target_modules(lora: LoraConfig, model_dir: str, trust_remote_code: bool) -> None:
    """Every ``model.lora.target_modules`` entry names a linear layer of the model at
    ``model_dir`` (PEFT's rule: the full name or its last components); the model is built on
    the meta device from its config, no weights read. Raises ``ConfigError`` naming the entry."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if list(lora.target_modules) == [ALL_LINEAR]:
        return
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    linear = linear_module_names(model)
    suffixes = sorted({name.rsplit(".", 1)[-1] for name in linear})
    for i, target in enumerate(lora.target_modules):
        if not any(name == target or name.endswith(f".{target}") for name in linear):
            raise ConfigError(
                f"model.lora.target_modules[{i}]",
                f"{target!r} names no linear layer of {type(model).__name__} (the output "
                f"layer takes no adapter); its linear layers: {', '.join(suffixes)}",
            )
