"""``--help`` text of the CLIs (``skyrl.config.help``)."""

from skyrl.config.help import (
    GROUPS,
    WIDTH,
    command_help,
    default_options,
    group_options,
    wants_help,
)
from skyrl.config.root import GROUP_SCHEMAS


def test_group_options_are_hydras_less_the_typed_schemas():
    options = group_options()
    assert list(options) == list(GROUPS)
    assert options["generator"] == ["hf", "vllm"]  # hf_schema, vllm_schema left out
    assert "smoke" in options["experiment"]
    for group, schemas in GROUP_SCHEMAS.items():
        assert not set(schemas) & set(options[group]), group


def test_defaults_are_the_root_configs():
    # conf/config.yaml: trainer: deepspeed, generator: vllm, algorithm: grpo, environment:
    # math, data: arithmetic, experiment: null (no default)
    assert default_options() == {
        "trainer": "deepspeed",
        "generator": "vllm",
        "algorithm": "grpo",
        "environment": "math",
        "data": "arithmetic",
    }


def test_help_wraps_long_option_lists_under_their_group():
    text = command_help("skyrl-x", "Does x. " * 30, [("skyrl-x a=1", "one"), ("skyrl-x b=2", "")])
    lines = text.splitlines()
    summary = lines[2 : lines.index("config groups (GROUP=OPTION; * the default):") - 1]
    assert len(summary) > 1 and all(len(line) <= WIDTH for line in summary)
    start = next(i for i, line in enumerate(lines) if line.startswith("  experiment "))
    # the experiment options run past WIDTH: the rest continue aligned under the first option
    column = lines[start].index("custom_loss")
    assert lines[start + 1][:column].strip() == "" and lines[start + 1][column] != " "
    assert "  skyrl-x a=1  one" in lines and "  skyrl-x b=2" in lines


def test_wants_help_reads_hydras_flags():
    assert wants_help(["--help"]) and wants_help(["trainer.seed=1", "-h"])
    assert not wants_help(["--hydra-help"]) and not wants_help(["trainer.seed=1"])
