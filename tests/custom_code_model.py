"""A tiny model with its own code, for the ``model.trust_remote_code`` tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def custom_code_model(tiny_model_path: str, folder: Path) -> str:
    """The tiny Qwen2 as a model with its own code (``auto_map``): ``CustomForCausalLM`` (and
    its body ``CustomModel``), which transformers loads only with ``trust_remote_code=True``."""
    shutil.copytree(tiny_model_path, folder)
    (folder / "configuration_custom.py").write_text(
        "from transformers import Qwen2Config\n\n\n"
        "class CustomConfig(Qwen2Config):\n    model_type = 'custom_qwen'\n"
    )
    (folder / "modeling_custom.py").write_text(
        "from transformers import Qwen2ForCausalLM, Qwen2Model\n\n"
        "from .configuration_custom import CustomConfig\n\n\n"
        "class CustomModel(Qwen2Model):\n    config_class = CustomConfig\n\n\n"
        "class CustomForCausalLM(Qwen2ForCausalLM):\n    config_class = CustomConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="custom_qwen",
        architectures=["CustomForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_custom.CustomConfig",
            "AutoModel": "modeling_custom.CustomModel",  # vLLM's Transformers backend uses it
            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)
