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
        (
            ["trainer.seed=[1"],
            "error: trainer.seed=[1: cannot parse this override: no viable alternative at input '[1'",
        ),
        # before: "error: cannot parse override: mismatched input '<EOF>' ...", naming no override
        (
            ["-m", "trainer.policy_optimizer.lr=1e-5,"],
            "error: trainer.policy_optimizer.lr=1e-5,: cannot parse this override: mismatched "
            "input '<EOF>' expecting {':', BRACKET_OPEN, BRACE_OPEN, FLOAT, INT, BOOL, NULL, "
            "UNQUOTED_CHAR, ID, ESC, WS, QUOTED_VALUE, INTERPOLATION}",
        ),
        # before: "error: cannot parse override: Error parsing override 'trainer.seed'", no reason
        (
            ["trainer.seed"],
            "error: trainer.seed: cannot parse this override: missing EQUAL at '<EOF>'",
        ),
        # before: only Hydra's first line, without its advice (the list, the quotes, --multirun)
        (
            ["trainer.seed=1,2"],
            "error: Ambiguous value for argument 'trainer.seed=1,2': 1. To use it as a list, use "
            "key=[value1,value2]; 2. To use it as string, quote the value: key='value1,value2'; "
            "3. To sweep over it, add --multirun to your command line",
        ),
        # before: only "Could not append to config. An item is already at 'trainer.seed'."
        (
            ["+trainer.seed=3"],
            "error: Could not append to config. An item is already at 'trainer.seed'. Either "
            "remove + prefix: 'trainer.seed=3'; Or add a second + to add or override "
            "'trainer.seed': '++trainer.seed=3'",
        ),
        # Hydra refused a null group option with a ValueError naming no key
        (
            ["trainer=null"],
            "error: trainer: is a config group: its value names one of its options (deepspeed); "
            "got None",
        ),
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
