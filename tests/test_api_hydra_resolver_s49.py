"""``skyrl.compose`` of an override reading Hydra's job config (``${hydra:job.num}``), as a
sweep job's ``.hydra/overrides.yaml`` holds it (the sweep refusals suggest
``trainer.output_dir=.../${hydra:job.num}`` and ``eval.output_file=r_${hydra:job.num}.json``):
the README's way to rerun a run, ``skyrl.compose(OmegaConf.load(<job dir>/.hydra/
overrides.yaml))``, composed it, then ``skyrl.train`` / ``skyrl.evaluate`` raised
``InterpolationResolutionError: HydraConfig was not set``. It is refused at compose, naming
the key and what to write instead."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import skyrl
from skyrl.config import ConfigError

ADVICE = (
    "${hydra:...} resolves only in a job Hydra runs (skyrl-train, skyrl-eval), and "
    "skyrl.compose makes the config outside one: write the value it had (a sweep job's "
    "hydra:job.num is its directory's name)"
)


def test_a_sweep_jobs_saved_overrides_name_the_key(tmp_path):
    # what Hydra writes for `skyrl-train -m ... trainer.output_dir=outs/${hydra:job.num}`
    saved = tmp_path / "overrides.yaml"
    saved.write_text(
        "- experiment=smoke\n- trainer.total_steps=1\n"
        "- trainer.output_dir=outs/$\\{hydra\\:job.num\\}\n"
    )
    with pytest.raises(ConfigError) as caught:
        skyrl.compose(OmegaConf.load(saved))
    assert caught.value.key == "trainer.output_dir"
    assert caught.value.message == "'outs/$\\{hydra\\:job.num\\}': " + ADVICE


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiment=smoke", "eval.output_file=r_${hydra:job.num}.json"],
        {"experiment": "smoke", "eval.output_file": "r_${hydra:job.num}.json"},
    ],
)
def test_a_hydra_interpolation_is_refused_naming_the_key(overrides):
    with pytest.raises(ConfigError) as caught:
        skyrl.compose(overrides)
    assert caught.value.key == "eval.output_file"
    assert caught.value.message.endswith(ADVICE)


def test_other_interpolations_still_compose():
    cfg = skyrl.compose(["experiment=smoke", "trainer.output_dir=outs/${trainer.seed}"])
    assert cfg.trainer.output_dir == "outs/42"
