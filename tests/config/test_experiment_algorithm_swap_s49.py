"""An experiment run with another ``algorithm=`` option trains that algorithm: the keys the
experiment sets under ``algorithm`` are only the ones it means to change, so none of its own
algorithm's settings stick to the swapped one (``experiment=dr_grpo algorithm=grpo`` is the
documented direct comparison, recipes/dr_grpo/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from skyrl.config import register_configs

CONF = Path(__file__).resolve().parents[2] / "skyrl" / "conf"
ALGORITHMS = sorted(p.stem for p in (CONF / "algorithm").glob("*.yaml"))


def _algorithm(overrides: list[str]) -> dict:
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return OmegaConf.to_container(cfg.algorithm, resolve=True)


def _experiments_with_algorithm() -> list[tuple[str, str]]:
    """``(experiment, its algorithm option)`` for each experiment that picks one."""
    found = []
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text()).get("defaults", []):
            if isinstance(entry, dict) and "override /algorithm" in entry:
                found.append((path.stem, entry["override /algorithm"]))
    return found


def test_dapo_experiment_with_grpo_is_plain_grpo():
    # the DAPO experiment's dynamic sampling and overlong penalty are algorithm=dapo's own
    # settings: with algorithm=grpo a run must not keep filtering groups and penalising length
    swapped = _algorithm(["experiment=dapo", "algorithm=grpo"])
    assert swapped == _algorithm(["algorithm=grpo"])
    assert swapped["dynamic_sampling"] is None
    assert swapped["overlong_buffer_len"] == 0


@pytest.mark.parametrize(("experiment", "option"), _experiments_with_algorithm())
def test_experiment_sets_no_algorithm_key_its_option_already_sets(experiment: str, option: str):
    """A key the experiment repeats from its algorithm option changes nothing for that option
    and sticks, unasked, to every other ``algorithm=`` a user picks with the experiment."""
    text = (CONF / "experiment" / f"{experiment}.yaml").read_text()
    own = yaml.safe_load(text).get("algorithm", {})
    chosen = yaml.safe_load((CONF / "algorithm" / f"{option}.yaml").read_text())
    repeated = sorted(key for key, value in own.items() if chosen.get(key) == value)
    assert repeated == [], f"experiment={experiment} repeats algorithm={option}'s {repeated}"
