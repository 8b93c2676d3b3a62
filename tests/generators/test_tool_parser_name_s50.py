"""``generator.tool_parser`` naming no parser vLLM has is refused before anything starts:
``skyrl-serve`` started with it and answered every request that declared tools with a 500,
and a tools env fell back to its text protocol with a warning."""

from __future__ import annotations

import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.config.preflight import preflight
from skyrl.config.validate import validate
from skyrl.generators.tool_calls import check_tool_parser


def test_a_misspelt_parser_is_refused_with_the_closest_name():
    with pytest.raises(ConfigError) as err:
        check_tool_parser("hermez")
    assert err.value.key == "generator.tool_parser"
    message = str(err.value)
    assert message.startswith(
        "generator.tool_parser: unknown tool parser 'hermez' (did you mean 'hermes'?); vLLM has "
    )
    assert "qwen3_xml" in message and "llama3_json" in message  # the names to choose from


@pytest.mark.parametrize("name", ["hermes", "qwen3_xml", "llama3_json"])
def test_a_registered_parser_passes(name):
    check_tool_parser(name)


def test_the_pre_flight_of_a_run_refuses_it():
    cfg = validate(skyrl.compose(["experiment=smoke", "generator.tool_parser=hermez"]))
    with pytest.raises(ConfigError) as err:
        preflight(cfg, for_run=False)
    assert err.value.key == "generator.tool_parser"
