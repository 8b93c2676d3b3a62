"""Every ``conf/algorithm/*.yaml`` preset composes, validates and picks registered parts."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from skyrl.config import register_configs
from skyrl.config.validate import validate

CONF_DIR = Path(__file__).resolve().parents[2] / "skyrl" / "conf"
PRESETS = sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml"))


def _compose(preset: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate(compose("config", overrides=[f"algorithm={preset}"])).algorithm


def test_all_issue_presets_exist():
    assert {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo", "gspo", "cispo"} <= set(
        PRESETS
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_validates(preset):
    algorithm = _compose(preset)
    assert algorithm.advantage_estimator == preset or preset in ("dapo", "ppo", "gspo", "cispo")


def test_preset_choices():
    dapo = _compose("dapo")
    assert (dapo.eps_clip_low, dapo.eps_clip_high, dapo.loss_reduction) == (0.2, 0.28, "token_mean")
    assert dapo.dynamic_sampling == "filter" and dapo.overlong_buffer_len > 0
    assert _compose("dr_grpo").loss_reduction == "seq_mean_token_sum_norm"
    assert _compose("ppo").uses_critic
    assert _compose("gspo").policy_loss == "gspo"
    assert _compose("cispo").policy_loss == "cispo"
