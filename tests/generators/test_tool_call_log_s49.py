"""A native call the parser fails on is logged as ONE line, whatever the error's own text:
pydantic's ``ValidationError`` (a call whose ``name`` is not a string) spans four lines."""

import logging

import pytest

from skyrl.generators.tool_calls import ToolCallParser
from skyrl.models.tiny import build_tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def parser():
    return ToolCallParser(build_tiny_tokenizer(), "hermes")


@pytest.mark.parametrize(("name", "shown"), [("null", "None"), ("5", "5")])
def test_a_call_whose_name_is_not_a_string_is_one_warning_line(parser, caplog, name, shown):
    text = f'<tool_call>\n{{"name": {name}, "arguments": {{"expr": "1"}}}}\n</tool_call>'
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.tool_calls"):
        assert parser.parse(text, TOOLS) == (text, [])
    [warned] = [r.getMessage() for r in caplog.records if r.name == "skyrl.generators.tool_calls"]
    assert "\n" not in warned, warned
    assert warned.startswith(
        "the 'hermes' tool parser failed on a reply (ValidationError: 1 validation error for "
        f"FunctionCall name Input should be a valid string [type=string_type, input_value={shown},"
    ), warned
    assert warned.endswith("); kept as text"), warned
