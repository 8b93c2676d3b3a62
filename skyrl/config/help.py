"""``--help`` of ``skyrl-train``, ``skyrl-eval`` and ``skyrl-serve``: what the command does,
its config groups with their options (the default marked), examples, and where to look next.

Hydra's own help opened with "cli is powered by Hydra.", listed each group's typed schema
(``algorithm_schema``, which no one picks) among its options, and then printed the whole
composed config, ~190 lines that ``--cfg job`` prints on request. It stays behind
``--hydra-help``. The options are Hydra's own listing (so a group option a plugin adds to the
search path shows too, and one in the command line's ``--config-dir``, such as
``DIR/experiment/mine.yaml``) less the schemas; the defaults are the root config's defaults
list.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from importlib.resources import files

from omegaconf import OmegaConf

from skyrl.config.root import GROUP_SCHEMAS

WIDTH = 88
"""Columns the help wraps a group's options to."""

GROUPS = ("algorithm", "data", "environment", "experiment", "generator", "trainer")
"""The groups a run is composed from, in the order the help lists them."""


def group_options(config_dir: str | None = None) -> dict[str, list[str]]:
    """Each group's options, as Hydra lists them for ``skyrl.conf`` (and ``config_dir``, where
    ``--config-dir`` puts it: before the schemas), less the typed schemas."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    from skyrl.config import register_configs

    register_configs()
    search_path = create_config_search_path("pkg://skyrl.conf")
    if config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    loader = ConfigLoaderImpl(config_search_path=search_path)
    return {
        group: [o for o in loader.get_group_options(group) if o not in GROUP_SCHEMAS.get(group, {})]
        for group in GROUPS
    }


def default_options() -> dict[str, str]:
    """``group -> option`` of the root config's defaults list (``experiment`` has none)."""
    root = OmegaConf.to_container(
        OmegaConf.create(files("skyrl.conf").joinpath("config.yaml").read_text())
    )
    assert isinstance(root, dict)
    chosen = {}
    for entry in root.get("defaults", []):
        if not isinstance(entry, dict):
            continue
        for group, option in entry.items():
            if group in GROUPS and option is not None:
                chosen[group] = str(option)
    return chosen


def command_help(
    command: str, summary: str, examples: Sequence[tuple[str, str]], argv: Sequence[str] = ()
) -> str:
    """The help text of ``command``: ``summary``, the groups and their options (``*`` marks
    the default; with those of ``argv``'s ``--config-dir``), the ``examples`` (``(command
    line, what it does)``), and where the keys and Hydra's own flags are described."""
    options, defaults = group_options(_config_dir(argv)), default_options()
    lines = [f"usage: {command} [GROUP=OPTION ...] [KEY=VALUE ...]", ""]
    lines += textwrap.wrap(summary, WIDTH)
    lines += ["", "config groups (GROUP=OPTION; * the default):"]
    width = max(len(group) for group in GROUPS)
    for group in GROUPS:
        shown = " ".join(f"*{o}" if o == defaults.get(group) else o for o in options[group])
        lines += textwrap.wrap(
            shown or "(none)",
            WIDTH,
            initial_indent=f"  {group:<{width}}  ",
            subsequent_indent=" " * (width + 4),
        )
    more = [
        (f"{command} --cfg job [overrides]", "the composed config: every key and its value"),
        ("docs/config-reference.md", "every key: its type, default and meaning"),
        (f"{command} --hydra-help", "Hydra's own flags (-m, --cfg, --info, ...)"),
    ]
    for title, rows in (("examples:", examples), ("more:", more)):
        column = max(len(line) for line, _ in rows)
        lines += ["", title]
        lines += [f"  {line:<{column}}  {what}".rstrip() for line, what in rows]
    return "\n".join(lines)


def _config_dir(argv: Sequence[str]) -> str | None:
    """``argv``'s ``--config-dir``, if it names a folder (Hydra refuses a missing one when it
    runs; the help lists skyrl's options then)."""
    from hydra._internal.utils import get_args_parser

    config_dir = get_args_parser().parse_known_args(list(argv))[0].config_dir
    return config_dir if config_dir is not None and os.path.isdir(config_dir) else None


def wants_help(argv: Sequence[str]) -> bool:
    """Whether the command line asks for ``-h`` / ``--help`` (Hydra's parser reads it). Not when
    a flag has a value Hydra's parser refuses: the command-line check names it in one line."""
    import argparse

    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.exit_on_error = False  # argparse's usage block and exit 2 otherwise
    try:
        args, _ = parser.parse_known_args(list(argv))
    except argparse.ArgumentError:
        return False
    return bool(args.help)
