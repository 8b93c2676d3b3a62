"""ToolCallParser: a native (hermes) reply parsed into OpenAI-format calls and
``{"name", "arguments"}``; a malformed call is plain text; an unknown parser names its key."""

import logging

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


def test_arguments_written_as_a_json_string_are_decoded(parser):
    """OpenAI's format carries arguments as a JSON string, and Qwen2.5's template renders a
    string ``arguments`` as it stands: a model writing ``"arguments": "{\\"expr\\": ...}"``
    means the object. The parser encodes that string once more
    (``'"{\\\\"expr\\\\": \\\\"1+2\\\\"}"'``); ``calls`` decoded it once, to the text
    ``'{"expr": "1+2"}'``, and the tools env refused the call. A string that is not a JSON
    object stays a string."""
    as_string = (
        '<tool_call>\n{"name": "calc", "arguments": "{\\"expr\\": \\"1+2\\"}"}\n</tool_call>'
    )
    assert parser.calls(as_string, TOOLS) == [{"name": "calc", "arguments": {"expr": "1+2"}}]
    plain = '<tool_call>\n{"name": "calc", "arguments": "1+2"}\n</tool_call>'
    assert parser.calls(plain, TOOLS) == [{"name": "calc", "arguments": "1+2"}]
    listed = '<tool_call>\n{"name": "calc", "arguments": "[1, 2]"}\n</tool_call>'
    assert parser.calls(listed, TOOLS) == [{"name": "calc", "arguments": "[1, 2]"}]


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_a_call_the_parser_fails_on_is_one_warning_line(parser, caplog):
    """hermes catches its own failure (a call without ``arguments``: ``KeyError``), logs it
    with a traceback (~15 lines, on every such reply of a training run) and returns the reply
    as text: ``parse`` keeps it as text and logs one line naming the parser and the error."""
    parser.unavailable()  # loads the parser class
    vllm_log = logging.getLogger(parser._cls.__module__)
    seen = Records()
    vllm_log.addHandler(seen)
    text = '<tool_call>\n{"name": "calc"}\n</tool_call>'
    try:
        with caplog.at_level(logging.WARNING, logger="skyrl.generators.tool_calls"):
            assert parser.parse(text, TOOLS) == (text, [])
    finally:
        vllm_log.removeHandler(seen)
    assert [r for r in seen.records if r.exc_info] == []
    warned = [r.getMessage() for r in caplog.records if r.name == "skyrl.generators.tool_calls"]
    assert warned == [
        "the 'hermes' tool parser failed on a reply (KeyError: 'arguments'); kept as text"
    ]
    assert parser.parse(call("1"), TOOLS)[1]  # a good reply afterwards still parses
