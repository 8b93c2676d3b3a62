"""A prompt of chat messages whose every ``content`` is blank is refused, naming the file and
row, as a blank string prompt is: it loaded, passed the pre-flight, and the policy was trained
on an empty question (a preprocessing step that lost the question column does this)."""

from __future__ import annotations

import json

import pytest

from skyrl.data import PromptDataError, load_prompt_file


def _write(path, *prompts) -> None:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))


@pytest.mark.parametrize(
    "blank",
    [
        [{"role": "user", "content": ""}],
        [{"role": "system", "content": " "}, {"role": "user", "content": "\n\t"}],
    ],
)
def test_messages_with_only_blank_content_are_refused(tmp_path, blank):
    path = tmp_path / "data.jsonl"
    _write(path, "What is 1 + 1?", blank)
    with pytest.raises(PromptDataError) as exc:
        load_prompt_file(path)
    assert str(exc.value) == (f"{path}: row 2: empty prompt (every message's content is blank)")


def test_a_blank_message_beside_a_question_loads(tmp_path):
    path = tmp_path / "data.jsonl"
    prompt = [{"role": "system", "content": ""}, {"role": "user", "content": "What is 2 + 2?"}]
    _write(path, prompt)
    [row] = load_prompt_file(path)
    assert row.prompt == prompt
