"""An assistant message's tool call ``id`` that is not a string is refused naming the call
(OpenAI requires a string id); a tool message answering a call of an assistant message whose
calls carry no id says so. Before, ``{"id": 5}`` passed, and the tool message after it got
``'5' answers no tool call of messages[1] (its ids: 5)``; calls without ids, ``(its ids:
None)``: the error named the tool message, not the call that lacked its id."""

from __future__ import annotations

import pytest

from skyrl.serve.chat_format import FormatError, normalize_messages


def _conversation(call: dict, answer_id: str = "5") -> list[dict]:
    return [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": answer_id, "content": "4"},
    ]


FUNCTION = {"name": "calculator", "arguments": '{"expression": "2+2"}'}


@pytest.mark.parametrize("bad", [5, "", ["5"]])
def test_a_call_id_that_is_no_string_is_refused_naming_the_call(bad):
    with pytest.raises(FormatError) as err:
        normalize_messages(_conversation({"id": bad, "type": "function", "function": FUNCTION}))
    assert err.value.param == "messages[1].tool_calls[0].id"
    assert str(err.value) == f"must be a non-empty string, got {bad!r}"


def test_an_answer_to_calls_without_ids_says_the_calls_have_none():
    with pytest.raises(FormatError) as err:
        normalize_messages(_conversation({"type": "function", "function": FUNCTION}))
    assert err.value.param == "messages[2].tool_call_id"
    assert str(err.value) == (
        "'5' answers no tool call of messages[1]: its tool calls have no id (give each the "
        "id its tool message names)"
    )


def test_calls_with_string_ids_are_answered():
    call = {"id": "5", "type": "function", "function": FUNCTION}
    out = normalize_messages(_conversation(call))
    assert out[1]["tool_calls"][0]["id"] == "5" and out[2]["tool_call_id"] == "5"
    # a call without an id, answered by a tool message without tool_call_id, still passes
    bare = _conversation({"type": "function", "function": FUNCTION})
    del bare[2]["tool_call_id"]
    assert normalize_messages(bare)[1]["tool_calls"][0]["id"] is None
