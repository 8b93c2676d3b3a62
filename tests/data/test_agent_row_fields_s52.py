"""An external agent (``generator.agent=<module>.<async function>``) grades its own rows:
the environment never runs, so the pre-flight does not refuse a row for lacking a field the
environment would grade against (``answer`` for the default ``math`` env). A dataset of, say,
code tasks with ``tests`` and no ``answer`` stopped every agent run at its dry run with
"no 'answer' (environment 'math' grades against it)". The built-in loop still needs it."""

from __future__ import annotations

import json
import sys

import pytest
from transformers import AutoTokenizer

import skyrl
from skyrl.config import ConfigError
from skyrl.config.validate import validate
from skyrl.data import load_checked_prompts
from skyrl.models import build_tiny_model

AGENT = """
async def rollout(client, row):
    return float(row.extras["tests"] == "pass")
"""


@pytest.fixture
def code_tasks(tmp_path, monkeypatch):
    (tmp_path / "code_agent_s52.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "code_agent_s52", raising=False)
    path = tmp_path / "code.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"Write f{i}", "tests": "pass"}) + "\n" for i in range(2))
    )
    return str(path)


def check(train_file: str, *overrides: str) -> list:
    """The rows the pre-flight keeps of ``train_file`` in the smoke experiment."""
    base = ["experiment=smoke", "data.source=files", f"data.train_files=[{train_file}]"]
    cfg = validate(skyrl.compose([*base, *overrides]))
    return load_checked_prompts(cfg, "train", AutoTokenizer.from_pretrained(build_tiny_model()))


def test_an_external_agent_takes_rows_without_the_envs_fields(code_tasks):
    rows = check(code_tasks, "generator.agent=code_agent_s52.rollout")
    assert [(r.prompt, r.extras) for r in rows] == [
        ("Write f0", {"tests": "pass"}),
        ("Write f1", {"tests": "pass"}),
    ]


def test_the_built_in_loop_still_needs_them(code_tasks):
    with pytest.raises(ConfigError) as caught:
        check(code_tasks)
    assert caught.value.key == "data.train_files[0]"
    assert "row 1: no 'answer' (environment 'math' grades against it)" in caught.value.message
