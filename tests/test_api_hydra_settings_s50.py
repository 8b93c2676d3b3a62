"""``skyrl.compose`` takes the command line's overrides, but a Hydra setting among them
(``hydra.run.dir=outputs/mine``, copied from a ``skyrl-train`` command line) configures the
Hydra job a command line runs, which compose runs none of: it was dropped without a word,
and ``skyrl.train(cfg)`` wrote to ``outputs/<date>/<time>`` instead."""

from __future__ import annotations

import pytest

import skyrl
from skyrl.config import ConfigError

ADVICE = (
    "a setting of the Hydra job a command line runs (skyrl-train, skyrl-eval), and "
    "skyrl.compose makes the config outside one: it would change nothing; leave it out (the "
    "run directory: skyrl.train(cfg, output_dir=...) or trainer.output_dir)"
)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["experiment=smoke", "hydra.run.dir=outputs/mine"], "hydra.run.dir"),
        ({"experiment": "smoke", "hydra.job.chdir": True}, "hydra.job.chdir"),
        (["hydra/launcher=basic", "experiment=smoke"], "hydra/launcher"),
        (["experiment=smoke", "+hydra/callbacks=sweep_summary"], "hydra/callbacks"),
    ],
)
def test_a_hydra_setting_is_refused_naming_it(overrides, key):
    with pytest.raises(ConfigError) as err:
        skyrl.compose(overrides)
    assert (err.value.key, err.value.message) == (key, ADVICE)


def test_a_key_that_only_starts_with_hydra_is_composed():
    """``hydra`` as a word inside a value or another key is not Hydra's node."""
    cfg = skyrl.compose(["experiment=smoke", "model.path=hydra.run.dir"])
    assert cfg.model.path == "hydra.run.dir"
