"""The pre-flight refuses a row whose ``answer`` is an empty or blank string, as it refuses
a missing, null or NaN one: one ``ConfigError`` naming the file and the 1-based row.

Before, such a row passed: the math grader then scored every empty final answer
(``<answer></answer>``, ``\\boxed{}``) 1 against it, and every other answer 0."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

import skyrl
from skyrl.config import ConfigError
from skyrl.config.validate import validate
from skyrl.data import load_checked_prompts
from skyrl.envs.grading import grade
from skyrl.models import build_tiny_model


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def files_cfg(path: str, *overrides: str):
    return validate(
        skyrl.compose(
            [
                "experiment=smoke",
                "data.source=files",
                f"data.train_files=[{path}]",
                "data.eval_files=[]",
                *overrides,
            ]
        )
    )


def test_an_empty_gold_would_reward_an_empty_answer():
    """Why an empty gold is refused rather than left to score: it grades wrongly."""
    assert grade("<answer></answer>", "") == 1.0
    assert grade("#### 42", "") == 0.0


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("", "'answer' is empty"),
        ("  \t", "'answer' is blank ('  \\t')"),
        ([], "'answer' is empty ([])"),  # no element to grade against
        ({}, "'answer' is empty ({})"),
    ],
)
@pytest.mark.parametrize(
    "env", [(), ("environment=tools", "environment.tool_format=tags")], ids=["math", "tools"]
)
def test_an_empty_answer_is_refused_naming_file_and_row(tmp_path, tok, answer, problem, env):
    path = tmp_path / "d.jsonl"
    records = [{"prompt": "What is 1 + 1?", "answer": "2"}, {"prompt": "Why?", "answer": answer}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    label = "tools" if env else "math"
    with pytest.raises(ConfigError) as err:
        load_checked_prompts(files_cfg(str(path), *env), "train", tok)
    assert (err.value.key, err.value.message) == (
        "data.train_files[0]",
        f"{path}: row 2: {problem} (environment {label!r} grades against it)",
    )
    assert err.value.__context__ is None


def test_falsy_but_gradable_answers_and_generated_rows_pass(tmp_path, tok):
    """``0`` and ``"0"`` are answers; the generated arithmetic rows are unaffected."""
    path = tmp_path / "d.jsonl"
    records = [{"prompt": "1 - 1?", "answer": 0}, {"prompt": "2 - 2?", "answer": "0"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert len(load_checked_prompts(files_cfg(str(path)), "train", tok)) == 2
    generated = validate(skyrl.compose(["experiment=smoke", "data.num_train_prompts=8"]))
    assert len(load_checked_prompts(generated, "train", tok)) == 8
