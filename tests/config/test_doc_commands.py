"""Every ``skyrl-train`` command line the README, docs/ and the recipes' READMEs show in a
code block composes and validates as the CLI checks it (``precheck_command_line``): a
renamed key or option fails here. A ``$ skyrl-train`` line followed by an ``error:`` line
shows a mistake on purpose: the check must print that very line. The ``skyrl-eval``,
``skyrl-serve`` and ``python -m skyrl`` lines, and commands in indented blocks (the README's
sweeps), compose and validate too, and a script a line runs exists."""

from __future__ import annotations

import re
import shlex
from itertools import pairwise
from pathlib import Path

import pytest

from skyrl.config import register_configs
from skyrl.config.precheck import precheck_command_line

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS += sorted((REPO / "recipes").glob("*/README.md"))


def command_lines() -> list[tuple[str, list[str]]]:
    """``(file:line, arguments)`` of each ``skyrl-train`` (or ``make train TRAIN_ARGS=``) line
    in a fenced code block of ``DOCS``."""
    found = []
    for path in DOCS:
        in_block = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.startswith("```"):
                in_block = not in_block
                continue
            command = in_block and line.startswith(("skyrl-train ", "make train "))
            words = shlex.split(line, comments=True) if command else []
            if words[:1] == ["skyrl-train"]:
                args = words[1:]
            elif words[:2] == ["make", "train"] and words[2:3] != []:
                args = shlex.split(words[2].removeprefix("TRAIN_ARGS="))
            else:
                continue
            found.append((f"{path.relative_to(REPO)}:{number}", args))
    return found


COMMANDS = command_lines()


def shown_errors() -> list[tuple[str, list[str], str]]:
    """``(file:line, arguments, error line)`` of each ``$ skyrl-train`` line that a line
    starting ``error:`` follows, in ``DOCS``, whose composition alone finds it (no data.)."""
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for number, (line, after) in enumerate(pairwise(lines), start=1):
            if line.startswith("$ skyrl-train ") and after.startswith("error: "):
                args = shlex.split(line)[2:]
                if not any(a.startswith("data.") for a in args):  # the pre-flight's, not ours
                    found.append((f"{path.relative_to(REPO)}:{number}", args, after))
    return found


def test_the_docs_show_commands():
    wheres = [where for where, _ in COMMANDS]
    assert sum(w.startswith("README.md:") for w in wheres) >= 5
    for recipe in ("dapo", "dr_grpo", "gsm8k_grpo", "multi_turn_tools", "ppo_critic"):
        assert any(w.startswith(f"recipes/{recipe}/README.md:") for w in wheres), recipe
    assert len(ERRORS) >= 2  # the README's misspelled key and indivisible batch


ERRORS = shown_errors()


@pytest.mark.parametrize(("where", "args", "line"), ERRORS, ids=[where for where, *_ in ERRORS])
def test_a_documented_mistake_prints_the_line_shown(where, args, line):
    register_configs()
    assert precheck_command_line(args) == line, where


@pytest.mark.parametrize(("where", "args"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_line_composes_and_validates(where, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a sweep's default dir is checked for earlier jobs
    register_configs()
    assert precheck_command_line(args) is None, f"{where}: skyrl-train {shlex.join(args)}"


CLIS = ("skyrl-train", "skyrl-eval", "skyrl-serve")
"""Entry points that take the same overrides (``skyrl-eval``/``-serve`` read ``eval.*``/``serve.*``)."""


def shown_lines() -> list[tuple[str, bool, str]]:
    """``(file:line, fenced, text)`` of every line of a fenced or indented code block."""
    found = []
    for path in [*DOCS, REPO / "recipes" / "README.md"]:
        fenced = False
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if line.startswith("```"):
                fenced = not fenced
            elif fenced or line.startswith("    "):
                found.append((f"{path.relative_to(REPO)}:{number}", fenced, line.strip()))
    return found


def other_commands() -> list[tuple[str, list[str]]]:
    """``(file:line, overrides)`` of the command lines ``command_lines`` leaves out: ``skyrl-eval``,
    ``skyrl-serve`` and ``python -m skyrl`` lines, and commands in indented blocks."""
    found = []
    for where, fenced, text in shown_lines():
        words = shlex.split(text, comments=True) if text.startswith(CLIS + ("python ",)) else []
        if words[:3] == ["python", "-m", "skyrl"]:
            args = words[3:]
        elif words[:1] in (["skyrl-eval"], ["skyrl-serve"]):
            args = words[1:]
        elif words[:1] == ["skyrl-train"] and not fenced:  # fenced ones: test_doc_commands
            args = words[1:]
        else:
            continue
        if args != ["..."]:  # the README's "same entry point" line
            found.append((where, [re.sub(r"<([\w ]+)>", r"\1", a) for a in args]))  # <run>: run
    return found


OTHER_COMMANDS = other_commands()


def test_the_docs_show_other_commands():
    wheres = " ".join(where for where, _ in OTHER_COMMANDS)
    assert wheres.count("README.md:") >= 8  # 2 sweeps, 4 skyrl-eval, 2 skyrl-serve lines
    assert "recipes/custom_loss/README.md:" in wheres and "recipes/react_agent/README.md:" in wheres


@pytest.mark.parametrize(
    ("where", "args"), OTHER_COMMANDS, ids=[where for where, _ in OTHER_COMMANDS]
)
def test_another_documented_command_line_composes_and_validates(
    where, args, tmp_path, monkeypatch, repo_on_path
):
    monkeypatch.chdir(tmp_path)  # a sweep's default dir is checked for earlier jobs
    register_configs()
    assert precheck_command_line(args) is None, f"{where}: {shlex.join(args)}"


SCRIPTS = [
    (where, word)
    for where, _, text in shown_lines()
    if text.startswith(("bash ", "python recipes/"))
    for word in shlex.split(text, comments=True)[1:2]
]


@pytest.mark.parametrize(("where", "script"), SCRIPTS, ids=[where for where, _ in SCRIPTS])
def test_a_documented_script_exists(where, script):
    assert (REPO / script).is_file(), f"{where}: {script}"


@pytest.fixture
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository root on ``sys.path``, as ``python -m skyrl`` from the root has it (the
    recipes' ``imports:`` and ``generator.agent``)."""
    monkeypatch.syspath_prepend(str(REPO))


README = (REPO / "README.md").read_text()


def test_the_readme_quotes_the_dropped_prompts_plan_row_as_printed(tmp_path):
    from preflight_helpers import cfg_for, write_jsonl

    from skyrl.config.preflight import preflight

    # the README's example: 2 over-long train prompts dropped, none of the eval prompts
    long = "word " * 200  # ~200 tokens, over max_prompt_length=64
    train = write_jsonl(tmp_path / "train.jsonl", ["short", long, "also short", long])
    evals = write_jsonl(tmp_path / "eval.jsonl", ["short", "also short"])
    cfg = cfg_for(
        "data.source=files",
        f"data.train_files=[{train}]",
        f"data.eval_files=[{evals}]",
        "generator.max_prompt_length=64",
        "data.overlong_prompts=drop",
    )
    rows = dict(preflight(cfg, for_run=False).plan_rows())
    assert f"`over-long prompts  {rows['over-long prompts']}`" in README


def test_the_readme_lora_target_modules_default_is_a_value_that_composes():
    register_configs()
    shown = re.search(r"`\.target_modules`: (?:a list, )?`([^`]+)` by default", README)
    assert shown, "README: the LoRA section names target_modules' default"
    args = ["model.lora.rank=16", f"model.lora.target_modules={shown.group(1)}"]
    assert precheck_command_line(args) is None
