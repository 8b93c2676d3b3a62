"""Turn Hydra / OmegaConf / skyrl config errors into one readable line.

The command line should answer a typo with ``error: trainer.lr_typo: unknown
key (did you mean 'lr'?)``, not a traceback wall. Everything here only formats;
it decides nothing about validity. Any exception gets its line, a bug in skyrl
too; ``is_bad_input`` tells the two apart (the command-line fuzz test relies on it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from skyrl.config.errors import ConfigError, did_you_mean
from skyrl.config.structure import unknown_key_hint

BAD_INPUT_ERRORS = (
    ConfigError,
    OmegaConfBaseException,
    OverrideParseException,
    ConfigCompositionException,  # MissingConfigException too
)
"""What a bad command line or config raises."""

SKYRL_DIR = Path(__file__).resolve().parents[1]


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
        if exc.override:
            return f"error: {exc.override}: cannot parse this override: {parse_reason(exc)}"
        return f"error: cannot parse override: {parse_reason(exc)}"
    if isinstance(exc, ConfigCompositionException):
        return f"error: {_with_advice(str(exc))}"
    return f"error: {_first_line(str(exc))}"


def parse_reason(exc: OverrideParseException) -> str:
    """What Hydra's parser said is wrong, without its pointer to the grammar's docs or its
    repeating of the override (a character the lexer refuses: which one, and where)."""
    lines, override = exc.message.splitlines(), exc.override or ""
    lexer = "LexerNoViableAltException: "
    if len(lines) > 1 and lines[0].startswith(lexer) and lines[1].strip() == "^":
        at = len(lines[1].rstrip()) - 1 - len(lexer)  # Hydra's caret under the character
        if 0 <= at < len(override):
            return f"unexpected {override[at]!r} at character {at + 1}"
    reasons = [
        line.strip()
        for line in lines
        if line.strip().strip("^")
        and not line.startswith(("See https://", "Error parsing override", lexer))
    ]
    return "; ".join(reasons) or "not a 'key=value' override"


def _with_advice(text: str) -> str:
    """Hydra's message on one line: its first line, then the fix-it advice of the lines after
    it (``add --multirun``, ``remove + prefix``), joined with ``; ``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    first, advice = lines[0], [line for line in lines[1:] if not line.startswith("See https://")]
    if not advice:
        return first
    return f"{first}{' ' if first.endswith('.') else ': '}{'; '.join(advice)}"


def is_bad_input(exc: BaseException) -> bool:
    """Whether ``exc`` reports bad input rather than a bug that ``one_line_error`` dressed up
    as one line. Bad input: one of ``BAD_INPUT_ERRORS``, or anything Hydra or OmegaConf raise
    on their own (Hydra refuses ``trainer=null`` with a ``ValueError``). A bug: any other
    exception raised in skyrl's code, also where it is only the context of an expected one
    (OmegaConf re-raises a ``TypeError`` from a schema's ``__post_init__`` as a
    ``ConfigTypeError``, so the type alone would hide it)."""
    return not any(not isinstance(e, BAD_INPUT_ERRORS) and _raised_in_skyrl(e) for e in _chain(exc))


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _raised_in_skyrl(exc: BaseException) -> bool:
    """Whether a frame below the one that caught ``exc`` runs skyrl's code."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ else None
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(SKYRL_DIR):
            return True
        tb = tb.tb_next
    return False


def _omegaconf_error(exc: OmegaConfBaseException) -> str:
    key = exc.full_key or ""  # one_line_error only calls this when it is set
    if isinstance(exc, (ConfigKeyError, ConfigAttributeError)):
        parent = key.rpartition(".")[0]
        object_type = getattr(exc, "object_type", None)
        hint = unknown_key_hint(key, object_type)
        if object_type is dict and parent:  # a free-form mapping: new keys take a +
            hint = f" ({parent} is a free-form mapping: add a key with +{key}=...)"
        return f"error: {key}: unknown key{hint}"
    return f"error: {key}: {_first_line(exc.msg or '')}"


def _missing_option(exc: MissingConfigException) -> str:
    missing = exc.missing_cfg_file or ""
    options = sorted(o for o in (exc.options or []) if not o.endswith("_schema"))
    if "/" in missing and options:
        group, name = missing.rsplit("/", 1)
        hint = did_you_mean(name, options)
        return f"error: {group}={name}: no such option in group '{group}'{hint}; available: {', '.join(options)}"
    return f"error: {_first_line(str(exc))}"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text.strip() or "unknown error"
