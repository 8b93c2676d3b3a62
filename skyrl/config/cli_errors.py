"""Turn Hydra / OmegaConf / skyrl config errors into one readable line.

The command line should answer a typo with ``error: trainer.lr_typo: unknown
key (did you mean 'lr'?)``, not a traceback wall. Everything here only formats;
it decides nothing about validity.
"""

from __future__ import annotations

import dataclasses
import difflib

from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from skyrl.config.errors import ConfigError


def one_line_error(exc: BaseException) -> str:
    """A single line that names the offending key (and a suggestion when there is one)."""
    if isinstance(exc, ConfigError):
        return f"error: {exc.key}: {exc.message}"
    if isinstance(exc, MissingConfigException):
        return _missing_option(exc)
    cause = exc if isinstance(exc, OmegaConfBaseException) else exc.__cause__
    if isinstance(cause, ConfigError):
        return one_line_error(cause)
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        return _omegaconf_error(cause)
    if isinstance(exc, OverrideParseException):
        return f"error: cannot parse override: {_first_line(str(exc))}"
    return f"error: {_first_line(str(exc))}"


def _omegaconf_error(exc: OmegaConfBaseException) -> str:
    key = exc.full_key or ""  # one_line_error only calls this when it is set
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        leaf = key.rsplit(".", 1)[-1]
        hint = _suggest(leaf, _field_names(getattr(exc, "object_type", None)))
        return f"error: {key}: unknown key{hint}"
    return f"error: {key}: {_first_line(exc.msg or '')}"


def _missing_option(exc: MissingConfigException) -> str:
    missing = exc.missing_cfg_file or ""
    options = sorted(o for o in (exc.options or []) if not o.endswith("_schema"))
    if "/" in missing and options:
        group, name = missing.rsplit("/", 1)
        hint = _suggest(name, options)
        return f"error: {group}={name}: no such option in group '{group}'{hint}; available: {', '.join(options)}"
    return f"error: {_first_line(str(exc))}"


def _field_names(object_type: object) -> list[str]:
    if isinstance(object_type, type) and dataclasses.is_dataclass(object_type):
        return [f.name for f in dataclasses.fields(object_type)]
    return []


def _suggest(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip() or "unknown error"
