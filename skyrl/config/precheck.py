"""Compose and validate the command line's config once, before Hydra's main runs.

Hydra reports composition errors as several lines plus a hint about
HYDRA_FULL_ERROR; we want one line naming the key. For a multirun, every value
of every sweep is checked (each against the fixed overrides), so a bad value in
job 5 is reported before job 1 starts.
"""

from __future__ import annotations

from hydra import compose, initialize_config_module
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser

from skyrl.config.cli_errors import one_line_error
from skyrl.config.validate import validate

CONFIG_MODULE = "skyrl.conf"
CONFIG_NAME = "config"


def precheck_command_line(argv: list[str]) -> str | None:
    """The one-line error for ``argv``, or None when it composes and validates."""
    problem = command_line_problem(argv)
    return None if problem is None else one_line_error(problem)


def command_line_problem(argv: list[str]) -> Exception | None:
    """What composing and validating ``argv`` raised, or None when it is fine.

    ``cli_errors.is_bad_input`` tells bad input from a bug in skyrl."""
    args, _ = get_args_parser().parse_known_args(argv)
    if (
        args.help
        or args.hydra_help
        or args.info
        or args.shell_completion
        or args.config_path
        or args.config_dir
    ):
        return None  # nothing to compose, or a config tree we do not own
    try:
        candidates = _override_sets(args.overrides, args.multirun)
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            for overrides in candidates:
                validate(compose(config_name=args.config_name or CONFIG_NAME, overrides=overrides))
    except Exception as exc:  # bad input and bugs alike; the caller formats and tells them apart
        return exc
    return None


def _override_sets(overrides: list[str], multirun: bool) -> list[list[str]]:
    """One override list per config to check: the fixed ones plus one sweep value at a time."""
    parsed = OverridesParser.create().parse_overrides(overrides)  # one per line, in order
    pairs = list(zip(overrides, parsed, strict=True))
    plain = [
        line
        for line, o in pairs
        if not o.is_sweep_override() and not o.key_or_group.startswith("hydra")
    ]
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if not multirun or not sweeps:
        return [plain + [line for line, o in pairs if o.is_sweep_override() and not multirun]]
    sets = []
    for sweep in sweeps:
        prefix = (
            "~"
            if sweep.is_delete()
            else ("++" if sweep.is_force_add() else ("+" if sweep.is_add() else ""))
        )
        for value in sweep.sweep_string_iterator():
            sets.append([*plain, f"{prefix}{sweep.get_key_element()}={value}"])
    return sets
