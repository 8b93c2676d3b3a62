"""The config reference, ``docs/config-reference.md``, rendered from the schemas themselves.

Each schema field is documented once, by the string literal right below its
declaration (see ``skyrl/config/*.py``). This module reads those strings from
the source with ``ast``, walks the root schema and every group schema in
``GROUP_SCHEMAS`` (nested dataclasses such as ``trainer.policy_optimizer``
included, with the defaults their factories give), and renders one table per
group plus the group's option YAMLs in ``conf/`` and what each one changes.

    python -m skyrl.config.reference           # rewrite docs/config-reference.md
    python -m skyrl.config.reference --check   # exit 1 when it is stale or a field lacks a doc

A root field that holds a whole group (``trainer``, ``generator``, ...) becomes a
section, introduced by its field doc or else its schema's class docstring.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from skyrl.config.root import GROUP_SCHEMAS, SkyRLConfig

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The ``skyrl`` package directory."""
CONF_DIR = PACKAGE_DIR / "conf"
"""The Hydra config root shipped in the package."""
REPO_ROOT = PACKAGE_DIR.parent
"""The checkout the package lives in (editable install)."""
REFERENCE_PATH = REPO_ROOT / "docs" / "config-reference.md"
"""Where the generated reference is committed."""
REGENERATE = "python -m skyrl.config.reference"
"""The command that rewrites the reference."""
EXPERIMENT_GROUP = "experiment"
"""The group of ``# @package _global_`` experiment YAMLs."""


@dataclass(frozen=True)
class FieldRow:
    """One key of the reference table."""

    key: str
    """Full dotted path, e.g. ``trainer.policy_optimizer.lr``."""
    type: str
    """The annotation as written in the schema source."""
    default: Any
    """The default value (a dataclass instance for a nested node)."""
    doc: str | None
    """The field's doc string collapsed to one line; None when it has none."""


@dataclass(frozen=True)
class GroupOption:
    """One option YAML of a group (``conf/<group>/<name>.yaml``)."""

    group: str
    """The group folder, e.g. ``algorithm``."""
    name: str
    """The option name, e.g. ``dapo``."""
    description: str
    """The YAML's leading comment, as one line."""
    schema: str | None
    """The schema its defaults list names (``hf_schema``); None for experiments."""
    choices: list[str]
    """Group options it selects, as ``group=option`` (experiments)."""
    settings: dict[str, Any]
    """Dotted key -> value for the keys it sets (group options: only those off the schema default)."""


# -- reading the schemas -------------------------------------------------------------


@cache
def _class_ast(cls: type) -> ast.ClassDef:
    """The class statement of ``cls``, parsed from its source."""
    node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(node, ast.ClassDef), f"{cls.__qualname__}: not a class statement"
    return node


@cache
def _own_field_docs(cls: type) -> dict[str, str]:
    """``{field: doc}`` for the fields ``cls`` declares in its own body with a string right below."""
    body = _class_ast(cls).body
    docs = {}
    for stmt, after in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def field_doc(cls: type, name: str) -> str | None:
    """The doc of field ``name`` of ``cls``: the most derived class in the MRO that documents it."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and name in _own_field_docs(klass):
            return _own_field_docs(klass)[name]
    return None


def class_doc(cls: type) -> str | None:
    """The class docstring as written (not the signature ``dataclass`` fills in), one line."""
    doc = ast.get_docstring(_class_ast(cls))
    return " ".join(doc.split()) if doc else None


def _type_name(f: dataclasses.Field) -> str:
    """The annotation as written (a string under ``from __future__ import annotations``)."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def schema_rows(cls: type, prefix: str, instance: Any | None = None) -> list[FieldRow]:
    """Rows for every field of ``cls`` under ``prefix``; nested dataclasses get a row and their fields."""
    instance = cls() if instance is None else instance
    rows = []
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        rows.append(FieldRow(key, _type_name(f), value, field_doc(cls, f.name)))
        if dataclasses.is_dataclass(value):
            rows.extend(schema_rows(type(value), key, value))
    return rows


def group_base(group: str) -> type:
    """The schema every option of ``group`` shares: the root field's annotated type."""
    return typing.get_type_hints(SkyRLConfig)[group]


def root_rows() -> list[FieldRow]:
    """Rows of the root keys that are not whole groups (``model.*``, ``imports``)."""
    rows = schema_rows(SkyRLConfig, "", SkyRLConfig())
    return [r for r in rows if r.key.split(".")[0] not in GROUP_SCHEMAS]


def schema_extra_rows(group: str, schema: type) -> list[FieldRow]:
    """Rows of ``schema`` that its group's base lacks or gives another default."""
    base = {r.key: r.default for r in schema_rows(group_base(group), group)}
    return [
        r
        for r in schema_rows(schema, group)
        if r.key not in base or not _same(base[r.key], r.default)
    ]


def all_rows() -> list[FieldRow]:
    """Every documented key: root keys, each group's base schema and its schema variants."""
    rows = root_rows()
    for group, schemas in GROUP_SCHEMAS.items():
        rows.extend(schema_rows(group_base(group), group))
        for schema in schemas.values():
            if schema is not group_base(group):
                rows.extend(schema_extra_rows(group, schema))
    return rows


def undocumented() -> list[str]:
    """Keys (and group schemas) without a doc string; the reference test requires none."""
    missing = [f"{r.key} ({r.type})" for r in all_rows() if not r.doc]
    for group in GROUP_SCHEMAS:
        if not (field_doc(SkyRLConfig, group) or class_doc(group_base(group))):
            missing.append(f"{group} ({group_base(group).__name__} has no class docstring)")
    return missing


# -- reading the option YAMLs --------------------------------------------------------


def _leading_comment(text: str) -> str:
    """The comment lines at the top of a YAML (without ``# @package``), joined into one line."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("#").strip()
        if not body.startswith("@package"):
            lines.append(body)
    return " ".join(" ".join(lines).split())


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` for every leaf of nested dicts (lists are leaves)."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _choices(defaults: list[Any]) -> tuple[str | None, list[str]]:
    """``(schema name, ["group=option", ...])`` from a YAML's defaults list."""
    schema, choices = None, []
    for entry in defaults:
        if isinstance(entry, str) and entry.endswith("_schema"):
            schema = entry
        elif isinstance(entry, dict):
            for key, value in entry.items():
                group = str(key).removeprefix("override ").strip().lstrip("/")
                choices.append(f"{group}={value}")
    return schema, choices


def _yaml_mapping(text: str) -> dict[str, Any]:
    """A YAML mapping as plain Python containers (an empty file is ``{}``)."""
    data = OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
    if not isinstance(data, dict):
        raise TypeError(f"expected a YAML mapping, got {type(data).__name__}")
    return {str(k): v for k, v in data.items()}


def read_option(path: Path) -> GroupOption:
    """The option YAML at ``conf/<group>/<name>.yaml``; group options keep only non-default keys."""
    group, name = path.parent.name, path.stem
    text = path.read_text()
    data = _yaml_mapping(text)
    schema_name, choices = _choices(data.pop("defaults", []))
    settings = _flatten(data) if data else {}
    if group != EXPERIMENT_GROUP:
        schema = GROUP_SCHEMAS[group].get(schema_name or "", group_base(group))
        defaults = {r.key: r.default for r in schema_rows(schema, "")}
        settings = {
            k: v for k, v in settings.items() if k not in defaults or not _same(defaults[k], v)
        }
    return GroupOption(group, name, _leading_comment(text), schema_name, choices, settings)


def group_options(group: str) -> list[GroupOption]:
    """Every option YAML of ``group``, sorted by name."""
    return [read_option(p) for p in sorted((CONF_DIR / group).glob("*.yaml"))]


def default_choices() -> dict[str, str]:
    """``{group: option}`` that ``conf/config.yaml`` selects by default."""
    data = _yaml_mapping((CONF_DIR / "config.yaml").read_text())
    return {
        str(k): str(v)
        for entry in data.get("defaults", [])
        if isinstance(entry, dict)
        for k, v in entry.items()
        if v is not None
    }


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: ``1 == 1.0``, but ``True != 1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# -- rendering -----------------------------------------------------------------------


def format_value(value: Any) -> str:
    """A default or setting as it would be written in YAML (``null``, ``true``, ``[a, b]``)."""
    if value is None:
        return "null"
    if isinstance(value, str) and value == MISSING:
        return "required"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


_CODE_SPAN = re.compile(r"(``.*?``|`[^`]*`)")
"""An inline code span (single or double backticks)."""


def _prose(text: str) -> str:
    """Text whose ``<placeholder>`` markdown must not take for an HTML tag (code spans kept)."""
    parts = _CODE_SPAN.split(text)
    return "".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    """Prose safe inside a markdown table cell (``|`` escaped too)."""
    return _prose(text).replace("|", "\\|")


def _code(text: str) -> str:
    """``text`` as inline code inside a table cell."""
    return "`" + text.replace("|", "\\|") + "`"


def render_table(rows: list[FieldRow]) -> list[str]:
    """A key / type / default / description table."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for r in rows:
        default = (
            "(nested)" if dataclasses.is_dataclass(r.default) else _code(format_value(r.default))
        )
        doc = _cell(r.doc) if r.doc else "**undocumented**"
        lines.append(f"| {_code(r.key)} | {_code(r.type)} | {default} | {doc} |")
    return lines


def _settings_text(option: GroupOption) -> str:
    """``key=value`` list of an option's settings, or a note when it keeps every default."""
    pairs = [f"{k}={format_value(v)}" for k, v in option.settings.items()]
    return ", ".join(_code(p) for p in pairs) if pairs else "schema defaults"


def render_options(group: str, default: str | None) -> list[str]:
    """The table of a group's option YAMLs and what each one changes."""
    lines = [
        f"Options (`conf/{group}/<option>.yaml`, chosen with `{group}=<option>`):",
        "",
        "| option | description | sets (vs the schema default) |",
        "|---|---|---|",
    ]
    for opt in group_options(group):
        name = f"`{opt.name}` (default)" if opt.name == default else f"`{opt.name}`"
        lines.append(f"| {name} | {_cell(opt.description)} | {_settings_text(opt)} |")
    return lines


def _source_path(cls: type) -> str:
    """Where ``cls`` is defined, relative to the package's parent (``skyrl/config/x.py``)."""
    source = inspect.getsourcefile(cls)
    if source is None:
        raise TypeError(f"{cls.__qualname__} has no source file")
    return Path(source).resolve().relative_to(REPO_ROOT).as_posix()


def render_group(group: str, default: str | None) -> list[str]:
    """The section of one group: intro, base table, schema variants, options."""
    base = group_base(group)
    intro = field_doc(SkyRLConfig, group) or class_doc(base) or ""
    lines = [
        f"## `{group}`",
        "",
        f"{intro} Schema `{base.__name__}` in `{_source_path(base)}`.",
        "",
        *render_table(schema_rows(base, group)),
        "",
    ]
    for name, schema in GROUP_SCHEMAS[group].items():
        if schema is not base:
            lines += [*_render_variant(group, name, schema), ""]
    return lines + render_options(group, default) + [""]


def _render_variant(group: str, name: str, schema: type) -> list[str]:
    """The keys a schema variant (e.g. ``vllm_schema``) adds or gives another default."""
    users = [f"`{group}={o.name}`" for o in group_options(group) if o.schema == name]
    used_by = f", used by {', '.join(users)}" if users else ""
    return [
        f"`{name}` (`{schema.__name__}`{used_by}): {_cell(class_doc(schema) or '')} "
        "Keys it adds, or whose default it changes:",
        "",
        *render_table(schema_extra_rows(group, schema)),
    ]


def _recipe_link(name: str) -> str:
    """A link to ``recipes/<name>/`` when that recipe exists."""
    readme = REPO_ROOT / "recipes" / name / "README.md"
    return f" Recipe: [`recipes/{name}/`](../recipes/{name}/README.md)." if readme.exists() else ""


def render_experiments() -> list[str]:
    """The section listing every ``conf/experiment/*.yaml``."""
    lines = [
        "## `experiment`",
        "",
        "Experiments (`conf/experiment/<name>.yaml`, `# @package _global_`) override groups "
        "and keys anywhere in the config: `skyrl-train experiment=<name>`. "
        "Later command-line overrides win.",
        "",
    ]
    for opt in group_options(EXPERIMENT_GROUP):
        lines += [
            f"### `experiment={opt.name}`",
            "",
            f"{_prose(opt.description)}{_recipe_link(opt.name)}",
        ]
        lines.append("")
        if opt.choices:
            lines.append("- groups: " + ", ".join(f"`{c}`" for c in opt.choices))
        lines += [f"- sets: {_settings_text(opt)}", ""]
    return lines


def main_job_rows() -> list[tuple[str, Any, Any]]:
    """``(key, schema default, value)`` of each key a plain ``skyrl-train`` (``conf/config.yaml``
    with its default group options) sets to something other than the schema default."""
    from hydra import compose, initialize_config_module

    from skyrl.config import register_configs

    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        composed = OmegaConf.to_container(compose("config"), resolve=True)
    assert isinstance(composed, dict)
    rows = root_rows() + [r for g in GROUP_SCHEMAS for r in schema_rows(group_base(g), g)]
    out = []
    for row in rows:
        if dataclasses.is_dataclass(row.default):
            continue  # a nested node: its fields have rows of their own
        value: Any = composed
        for part in row.key.split("."):
            value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
        if value is not MISSING and not _same(value, row.default):
            out.append((row.key, row.default, value))
    return out


def render_main_job() -> list[str]:
    """The section listing what ``conf/config.yaml`` changes from the schema defaults."""
    lines = [
        "## The main job",
        "",
        "A plain `skyrl-train` composes `skyrl/conf/config.yaml`, which picks the group options "
        f"({', '.join(f'`{g}={o}`' for g, o in default_choices().items() if g in GROUP_SCHEMAS)})"
        " and sets these keys "
        "differently from the schema defaults in the tables below:",
        "",
        "| key | schema default | `skyrl-train` |",
        "|---|---|---|",
    ]
    for key, default, value in main_job_rows():
        lines.append(f"| `{key}` | {_code(format_value(default))} | {_code(format_value(value))} |")
    return lines + [""]


HEADER = f"""# Config reference

<!-- Generated by `{REGENERATE}` from the schemas in skyrl/config/ and the YAMLs
in skyrl/conf/. Do not edit by hand: edit the field's doc string and regenerate. -->

Every key of a run, with its type, schema default and meaning, as declared in the
dataclass schemas (what the main job's `config.yaml` sets differently comes first).
Set any key on the command line (`skyrl-train trainer.train_batch_size=32`), pick a
group option (`skyrl-train generator=vllm`),
or start from an experiment (`skyrl-train experiment=smoke`); `skyrl-train --cfg
job` prints the composed config and `trainer.dry_run=true` validates it, checks
what it names (data files and every row, prompt lengths, model paths, env, rollout
driver: the checks a real run starts with) and prints the run plan. Batch sizes count
prompts, not sequences.
"""


def render_reference() -> str:
    """The whole markdown reference."""
    defaults = default_choices()
    groups = list(GROUP_SCHEMAS)
    toc = ["- [the main job](#the-main-job)", "- [root keys](#root-keys)"]
    toc += [f"- [`{g}`](#{g})" for g in [*groups, "experiment"]]
    lines = [HEADER, *toc, "", *render_main_job()]
    lines += ["## Root keys", "", *render_table(root_rows()), ""]
    for group in groups:
        lines += render_group(group, defaults.get(group))
    lines += render_experiments()
    return "\n".join(lines).rstrip() + "\n"


# -- command line --------------------------------------------------------------------


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check(path: Path) -> list[str]:
    """Problems that make ``--check`` fail: a stale file, undocumented fields."""
    problems = [f"field without a doc string: {key}" for key in undocumented()]
    if not path.exists() or path.read_text() != render_reference():
        problems.append(f"{_shown(path)} is stale; run `{REGENERATE}` to regenerate")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Write the reference, or with ``--check`` exit 1 when it is stale."""
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--output", type=Path, default=REFERENCE_PATH, help="file to write")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.output)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for key in undocumented():
        print(f"warning: field without a doc string: {key}", file=sys.stderr)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render_reference())
    print(f"wrote {_shown(args.output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
