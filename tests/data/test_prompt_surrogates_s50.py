"""A prompt holding a lone surrogate (JSON's ``"\\ud83d"``, half of an emoji's UTF-16 pair,
as a truncation leaves it) is refused naming the file, row and character; the pre-flight
blamed the chat template ("TypeError: TextEncodeInput must be Union[...]"), for text that
no tokenizer takes."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import skyrl
from skyrl.config import ConfigError
from skyrl.config.validate import validate
from skyrl.data import PromptDataError, load_checked_prompts, load_prompt_file
from skyrl.models import build_tiny_model

TRUNCATED = '{"prompt": "Count the faces: \\ud83d", "answer": "1"}\n'
"""``json.loads`` gives ``'Count the faces: \\ud83d'``: the surrogate is character 17."""
MESSAGES = (
    '{"prompt": [{"role": "system", "content": "Be brief."}, '
    '{"role": "user", "content": "ok \\udc00 no"}], "answer": "1"}\n'
)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (TRUNCATED, "prompt is not valid Unicode: a lone surrogate '\\ud83d' at character 17"),
        (
            MESSAGES,
            "message 1's content is not valid Unicode: a lone surrogate '\\udc00' at character 3",
        ),
    ],
)
def test_a_lone_surrogate_names_file_row_and_character(tmp_path, line, problem):
    path = tmp_path / "cut.jsonl"
    path.write_text('{"prompt": "fine", "answer": "1"}\n' + line)
    with pytest.raises(PromptDataError) as caught:
        load_prompt_file(path)
    assert str(caught.value) == f"{path}: row 2: {problem} (half of a UTF-16 pair)"


def test_the_pre_flight_names_the_key_and_the_surrogate(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text(TRUNCATED)
    cfg = validate(
        skyrl.compose(["experiment=smoke", "data.source=files", f"data.train_files=[{path}]"])
    )
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    with pytest.raises(ConfigError) as caught:
        load_checked_prompts(cfg, "train", tok)
    problem = "prompt is not valid Unicode: a lone surrogate '\\ud83d' at character 17"
    assert (caught.value.key, caught.value.message) == (
        "data.train_files[0]",
        f"{path}: row 1: {problem} (half of a UTF-16 pair)",
    )


def test_a_whole_surrogate_pair_is_an_emoji_and_loads(tmp_path):
    path = tmp_path / "emoji.jsonl"
    path.write_text('{"prompt": "Count the faces: \\ud83d\\ude00", "answer": "1"}\n')
    assert load_prompt_file(path)[0].prompt == "Count the faces: \U0001f600"
