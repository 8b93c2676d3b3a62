"""Property-based fuzz of the command line: random override lists built from the schema.

Every list either validates, and then ``skyrl-train <overrides> trainer.dry_run=true``
prints the plan and returns, or it ends with exactly one ``error:`` line on stderr (the
pre-flight's ``warning:`` lines aside) and exit code 2, no traceback, from an exception
that reports bad input (``cli_errors.is_bad_input``): a TypeError of ours turned into a
tidy line fails the test, and so does an unknown key that passes. ``skyrl.cli.main`` runs
in-process; composing costs a few hundred ms on a 2-core machine and a dry run about two
seconds, so the example count is small (``SKYRL_CLI_FUZZ_EXAMPLES`` raises it). The counts
of cases tried, validated and refused are printed at the end.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
import types
import typing
from collections import Counter
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import skyrl.api
import skyrl.cli
from skyrl.config import precheck
from skyrl.config.cli_errors import is_bad_input
from skyrl.config.root import GROUP_SCHEMAS, SkyRLConfig

CONF_DIR = Path(skyrl.cli.__file__).parent / "conf"
OFF_LIMITS = {"trainer.dry_run", "trainer.output_dir", "imports"}
"""Keys the fuzz never touches: the run must stay a dry run writing only under tmp, and
``imports`` would import whatever module name it drew."""


def _schema_paths(cls: type, prefix: str) -> dict[str, object]:
    """Dotted path -> declared type of every field under ``cls``, nested dataclasses too."""
    paths: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        path, kind = f"{prefix}{f.name}", typing.get_type_hints(cls)[f.name]
        paths[path] = kind
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            paths |= _schema_paths(kind, f"{path}.")
    return paths


def _all_paths() -> dict[str, object]:
    paths = _schema_paths(SkyRLConfig, "")
    for group, schemas in GROUP_SCHEMAS.items():  # the generator options add their own fields
        for schema in schemas.values():
            paths |= _schema_paths(schema, f"{group}.")
    return paths


SCHEMA_PATHS = _all_paths()
LEAVES = {
    path: kind
    for path, kind in SCHEMA_PATHS.items()
    if path not in OFF_LIMITS and not (isinstance(kind, type) and dataclasses.is_dataclass(kind))
}
NODES = sorted(
    path
    for path, kind in SCHEMA_PATHS.items()
    if path not in GROUP_SCHEMAS and isinstance(kind, type) and dataclasses.is_dataclass(kind)
)
"""Dataclass fields below a group (``trainer.policy_optimizer``), set whole or interpolated."""
GROUP_OPTIONS = {
    group.name: sorted(p.stem for p in group.glob("*.yaml"))
    for group in CONF_DIR.iterdir()
    if group.is_dir() and group.name != "hydra" and not group.name.startswith("_")
}
WORDS = ["nope", "", "grpo", "rloo", "gae", "gspo", "ppo", "token_mean", "k3", "fixed"]
WORDS += ["cosine", "auto", "broadcast", "object_store", "shared_memory", "bf16", "fp32"]
WORDS += ["hf", "vllm"]
WORDS += ["files", "fake", "reasoning_gym", "filter", "tensorboard", "console", "math"]
IDENT = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True).filter(lambda k: k != "hydra")
"""A made-up key (``hydra`` is Hydra's own node, not the schema's)."""


def _unwrap(kind: object) -> tuple[object, bool]:
    """``(int, True)`` for ``int | None``; ``(kind, False)`` otherwise."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0], True
    return kind, False


def _typed_value(kind: object) -> st.SearchStrategy[str]:
    """A value of the declared type, in range or not."""
    base, optional = _unwrap(kind)
    origin = typing.get_origin(base)
    if base is bool:
        values: st.SearchStrategy[str] = st.sampled_from(["true", "false"])
    elif base is int:
        values = st.integers(-3, 300).map(str) | st.sampled_from(["0", "1", "2147483648"])
    elif base is float:
        values = st.floats(-2, 2, allow_nan=False).map(repr) | st.sampled_from(["0", "1e-6"])
    elif base is str:
        values = st.sampled_from(WORDS)
    elif origin is list:
        (item,) = typing.get_args(base)
        values = st.lists(_typed_value(item), max_size=3).map(lambda xs: f"[{','.join(xs)}]")
    elif origin is dict:
        values = st.sampled_from(["{}", "{a:1}", "{a:{b:[1,2]}}"])
    else:
        raise AssertionError(f"no value strategy for {kind}")
    return values | st.just("null") if optional else values


WRONG_VALUES = st.sampled_from(["abc", "1.5", "[1,2]", "{a:1}", "null", "true", "''", "1,2"])
INTERPOLATIONS = st.sampled_from(sorted(LEAVES)).map(lambda path: f"${{{path}}}") | st.sampled_from(
    ["${nope.x}", "${trainer.seed", "${oc.env:SKYRL_FUZZ_UNSET}", "${oc.env:HOME}", "${.}"]
)
GARBAGE = st.text(alphabet="ab=,[]{}$'\" .:~+", max_size=6)


@st.composite
def _misspelled(draw: st.DrawFn) -> str:
    path = draw(st.sampled_from(sorted(LEAVES)))
    head, _, leaf = path.rpartition(".")
    i = draw(st.integers(0, len(leaf) - 1))
    edit = draw(st.sampled_from(["drop", "double", "swap"]))
    if edit == "drop":
        leaf = leaf[:i] + leaf[i + 1 :]
    elif edit == "double":
        leaf = leaf[:i] + leaf[i] + leaf[i:]
    else:
        leaf = leaf[:i] + leaf[i + 1 : i + 2] + leaf[i] + leaf[i + 2 :]
    return f"{head}.{leaf}" if head else leaf


@dataclasses.dataclass(frozen=True)
class Override:
    line: str
    unknown_key: bool = False
    """The key is in no schema (nor under a free-form mapping): the command line must fail."""


@st.composite
def _key_override(draw: st.DrawFn) -> Override:
    kind = draw(st.sampled_from(["real", "real", "real", "node", "unknown", "misspelled", "free"]))
    if kind == "real":
        key = draw(st.sampled_from(sorted(LEAVES)))
        value = draw(_typed_value(LEAVES[key]) | WRONG_VALUES | INTERPOLATIONS | GARBAGE)
    elif kind == "node":
        key = draw(st.sampled_from(NODES))
        node_values = st.sampled_from(["{}", "{lr:1}", "{nope:1}", "5", "[]", "null"])
        value = draw(node_values | INTERPOLATIONS | st.sampled_from([f"${{{n}}}" for n in NODES]))
    elif kind == "unknown":
        group = draw(st.sampled_from(["", *GROUP_SCHEMAS, "trainer.policy_optimizer"]))
        key = f"{group}.{draw(IDENT)}" if group else draw(IDENT)
        value = draw(_typed_value(int) | WRONG_VALUES)
    elif kind == "misspelled":
        key, value = draw(_misspelled()), draw(_typed_value(int) | WRONG_VALUES)
    else:
        key, value = f"environment.kwargs.{draw(IDENT)}", draw(_typed_value(int) | WRONG_VALUES)
    prefix = draw(st.sampled_from(["", "", "", "+", "++", "~"]))
    line = draw(st.sampled_from([f"~{key}", f"~{key}={value}"])) if prefix == "~" else None
    return Override(
        line or f"{prefix}{key}={value}",
        unknown_key=kind in ("unknown", "misspelled") and key not in SCHEMA_PATHS,
    )


@st.composite
def _group_override(draw: st.DrawFn) -> Override:
    group = draw(st.sampled_from(sorted(GROUP_OPTIONS)))
    option = draw(st.sampled_from([*GROUP_OPTIONS[group], "nope", f"{GROUP_OPTIONS[group][0]}x"]))
    form = draw(st.sampled_from(["{g}={o}", "{g}={o}", "+{g}={o}", "~{g}", "{g}=null"]))
    return Override(form.format(g=group, o=option))


OVERRIDE_LISTS = st.lists(_key_override() | _group_override(), min_size=1, max_size=3)


class ProblemRecorder:
    """Watches the two places an ``error:`` line comes from: the precheck (compose and
    validate) and the Hydra task ``skyrl.cli.run`` (validate again, the pre-flight, the plan)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.problems: list[tuple[str, BaseException]] = []
        command_line_problem, run = precheck.command_line_problem, skyrl.cli.run

        def recorded_precheck(argv: list[str]) -> Exception | None:
            problem = command_line_problem(argv)
            if problem is not None:
                self.problems.append(("precheck", problem))
            return problem

        def recorded_run(cfg):
            try:
                return run(cfg)
            except Exception as exc:
                self.problems.append(("dry run", exc))
                raise

        monkeypatch.setattr(precheck, "command_line_problem", recorded_precheck)
        monkeypatch.setattr(skyrl.cli, "run", recorded_run)


def test_every_command_line_validates_or_is_one_error_line(tmp_path, capsys, monkeypatch):
    counts: Counter[str] = Counter()
    recorder = ProblemRecorder(monkeypatch)
    monkeypatch.setattr(skyrl.api, "_run", _no_real_run)
    fixed = [
        "trainer.dry_run=true",
        f"trainer.output_dir={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "hydra.output_subdir=null",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]

    @settings(
        max_examples=int(os.environ.get("SKYRL_CLI_FUZZ_EXAMPLES", "50")),
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: minutes here,
        suppress_health_check=[HealthCheck.too_slow],  # and a drawn case has <= 3 overrides
    )
    @given(drawn=OVERRIDE_LISTS)
    def check(drawn: list[Override]) -> None:
        recorder.problems.clear()
        overrides = [o.line for o in drawn]
        code = _run_main(monkeypatch, [*overrides, *fixed])
        out, err = capsys.readouterr()
        shown = f"overrides: {overrides}\nexit: {code}\nstdout:\n{out[-2000:]}\nstderr:\n{err}"
        counts[_judge(drawn, code, out, err, recorder.problems, shown)] += 1

    check()
    with capsys.disabled():
        print(
            f"\ncli fuzz: {counts.total()} cases tried, {counts['validated']} validated, "
            f"{counts['precheck'] + counts['dry run']} refused with one error line "
            f"({counts['precheck']} by the precheck, {counts['dry run']} by the dry run)"
        )
    assert counts["validated"] > 0 and counts["precheck"] > 0, counts


def _judge(
    drawn: list[Override],
    code: object,
    out: str,
    err: str,
    problems: list[tuple[str, BaseException]],
    shown: str,
) -> str:
    """Assert the outcome is one of the two allowed; ``validated`` or who refused it."""
    assert "Traceback" not in out + err, shown
    if code in (None, 0):
        assert not any(o.unknown_key for o in drawn), f"an unknown key passed\n{shown}"
        assert not problems and "skyrl run plan" in out, shown
        return "validated"
    assert code == 2 and len(problems) == 1, shown
    where, problem = problems[0]
    assert is_bad_input(problem), f"{where}: {_traceback(problem)}\n{shown}"
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    return where


def _no_real_run(checked, output_dir):
    raise AssertionError("the fuzz started a real run")


def _run_main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> object:
    """``skyrl-train argv`` in-process; its exit code (None when it returned)."""
    monkeypatch.setattr(sys, "argv", ["skyrl-train", *argv])
    try:
        skyrl.cli.main()
    except SystemExit as exc:
        return exc.code
    finally:
        GlobalHydra.instance().clear()
    return None


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
