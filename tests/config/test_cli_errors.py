"""One line for every error; ``is_bad_input`` tells bad input from a bug dressed up as one."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from skyrl.config import ConfigError, register_configs
from skyrl.config.cli_errors import is_bad_input, one_line_error
from skyrl.config.errors import did_you_mean
from skyrl.config.precheck import command_line_problem
from skyrl.config.trainer import OptimizerConfig


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["+trainer.lrx=1"], "error: trainer.lrx: unknown key"),
        (
            ["environment.kwargs.foo=1"],
            "error: environment.kwargs.foo: unknown key (environment.kwargs is a free-form "
            "mapping: add a key with +environment.kwargs.foo=...)",
        ),
        (["trainer.seed=[1"], "error: cannot parse override: no viable alternative at input '[1'"),
        # Hydra refuses a null group option with a ValueError of its own
        (["trainer=null"], "error: Config group override must be a string or a list. Got NoneType"),
        # found by the fuzz test: the backend check once re-raised inside its except block
        (
            ["~generator"],
            "error: generator.backend: engine backend 'hf' reads the fields of generator=hf; got a GeneratorConfig",
        ),
    ],
)
def test_bad_command_lines_are_bad_input(argv, line):
    register_configs()
    problem = command_line_problem(argv)
    assert problem is not None
    assert (one_line_error(problem), is_bad_input(problem)) == (line, True)


def test_a_type_error_in_a_schema_is_a_bug_even_as_omegaconf_rewraps_it():
    # betas = 5 reaches OptimizerConfig.__post_init__, whose len() raises TypeError;
    # OmegaConf re-raises it as a ConfigTypeError, one of the expected types
    cfg = OmegaConf.create({"n": 5, "opt": OmegaConf.structured(OptimizerConfig)})
    cfg.opt.betas = "${n}"
    with pytest.raises(TypeError) as info:
        OmegaConf.to_object(cfg.opt)
    assert one_line_error(info.value).startswith("error: opt: Could not create instance")
    assert not is_bad_input(info.value)


def test_an_unexpected_exception_raised_in_skyrl_is_a_bug():
    with pytest.raises(TypeError) as info:
        did_you_mean(5, ["lr"])  # type: ignore[arg-type]  # difflib iterates the int
    assert not is_bad_input(info.value)
    assert is_bad_input(ConfigError("trainer.lr", "must be > 0"))
