"""ToolCallParser: a native (hermes) reply parsed into OpenAI-format calls and
``{"name", "arguments"}``; a malformed call is plain text; an unknown parser names its key."""

import pytest

from skyrl.generators.tool_calls import ToolCallParser, ToolParserUnavailable, load_tool_parser
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


def call(expr: str) -> str:
    return f'<tool_call>\n{{"name": "calc", "arguments": {{"expr": "{expr}"}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def parser():
    return ToolCallParser(build_tiny_tokenizer(), "hermes")


def test_calls_are_parsed_with_the_text_before_them(parser):
    text = "Let me compute.\n" + call("1+2") + "\n" + call("3*4")
    content, calls = parser.parse(text, TOOLS)
    assert content == "Let me compute.\n"
    assert [c["function"] for c in calls] == [
        {"name": "calc", "arguments": '{"expr": "1+2"}'},
        {"name": "calc", "arguments": '{"expr": "3*4"}'},
    ]
    assert all(c["type"] == "function" and c["id"] for c in calls)
    assert parser.calls(text, TOOLS) == [
        {"name": "calc", "arguments": {"expr": "1+2"}},
        {"name": "calc", "arguments": {"expr": "3*4"}},
    ]
    assert parser.parse(call("1"), TOOLS)[0] is None  # nothing but the call: no content


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}\n</tool_call>',  # a } short
        "<tool_call>\nnot json\n</tool_call>",
        "The answer is 3.",
    ],
    ids=["unbalanced", "not_json", "no_call"],
)
def test_a_reply_without_a_well_formed_call_is_plain_text(parser, text):
    assert parser.parse(text, TOOLS) == (text, [])
    assert parser.calls(text, TOOLS) == []


def test_an_unknown_parser_names_its_key():
    with pytest.raises(
        ToolParserUnavailable, match="generator.tool_parser: unknown tool parser 'nope'"
    ):
        load_tool_parser("nope")
    parser = ToolCallParser(build_tiny_tokenizer(), "nope")
    assert "generator.tool_parser" in parser.unavailable()
    with pytest.raises(ToolParserUnavailable, match="'nope'"):
        parser.parse(call("1"), TOOLS)
