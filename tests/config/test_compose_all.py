"""Every YAML under conf/ composes with Hydra's compose API and validates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from skyrl.config import register_configs
from skyrl.config.validate import validate

CONF = Path(__file__).resolve().parents[2] / "skyrl" / "conf"
GROUPS = ("trainer", "generator", "algorithm", "environment", "data", "experiment")


def _all_option_overrides() -> list[str]:
    overrides = []
    for path in sorted(CONF.rglob("*.yaml")):
        rel = path.relative_to(CONF)
        if rel.parts[0] in GROUPS:
            overrides.append(
                f"{rel.parts[0]}={rel.with_suffix('').relative_to(rel.parts[0]).as_posix()}"
            )
        elif rel.parts[0] == "hydra":  # hydra/<group>/<option>.yaml: sweeper, callbacks presets
            overrides.append(f"{rel.parent.as_posix()}={rel.stem}")
        else:
            assert rel.as_posix() == "config.yaml", f"unexpected config file outside a group: {rel}"
    return overrides


def test_every_yaml_is_found():
    found = _all_option_overrides()
    # The first options the foundation promises; later issues add more.
    for expected in ("trainer=deepspeed", "generator=hf", "generator=vllm", "algorithm=grpo"):
        assert expected in found


@pytest.mark.parametrize("override", ["<defaults>", *_all_option_overrides()])
def test_compose_and_validate(override: str):
    register_configs()
    overrides = [] if override == "<defaults>" else [override]
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    typed = validate(cfg)
    assert typed.trainer.train_batch_size % typed.trainer.policy_mini_batch_size == 0
    OmegaConf.to_yaml(cfg, resolve=True)  # every interpolation resolves


def test_validate_does_not_mutate():
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(config_name="config")
    before = OmegaConf.to_yaml(cfg)
    validate(cfg)
    assert OmegaConf.to_yaml(cfg) == before
