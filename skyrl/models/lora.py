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

if TYPE_CHECKING:
    import torch
    from torch import nn

ADAPTER = "default"
"""The adapter's name inside the PEFT model (one adapter per model)."""
PEFT_PREFIX = "base_model.model."
ALL_LINEAR = "all-linear"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


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
    from wire-named ``tensors``: what ``PeftModel.from_pretrained`` and vLLM load."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = peft_config(lora, target_modules=adapted_modules(tensors), inference=True)
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(out))
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, out / ADAPTER_WEIGHTS)
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
    readable weights raises ``ConfigError`` under ``key`` (``check_adapter_weights``)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from skyrl.models.resolve import IN_MEMORY

    check_adapter_weights(adapter_dir, key)
    remote = {"trust_remote_code": trust_remote_code}
    base = AutoModelForCausalLM.from_pretrained(
        base_model, dtype=torch.float32, **remote, **IN_MEMORY
    )
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer, **remote).save_pretrained(out_dir)
    return Path(out_dir)


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
