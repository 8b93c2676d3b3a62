"""The one exception type for bad configuration, and the check helper schemas use.

A ``ConfigError`` always names the key it is about. Schemas raise it with the
key relative to their own node (``"train_batch_size"``); the validator prefixes
the path of the node (``"trainer.train_batch_size"``) before it reaches the user.
"""

from __future__ import annotations

import difflib
import math
import os
from pathlib import Path


class ConfigError(ValueError):
    """A configuration value that cannot be used; ``key`` is its dotted path."""

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")

    def under(self, prefix: str) -> ConfigError:
        """The same error with ``prefix.`` put in front of its key."""
        return ConfigError(f"{prefix}.{self.key}" if prefix else self.key, self.message)


EXCEPTION_LINE_CHARS = 300
"""Up to where ``exception_line`` adds a message's later lines to its first."""


def exception_line(exc: BaseException) -> str:
    """``Type: message``: an error from a library (hub, transformers, json) inside a one-line
    message, however many lines it runs to: its first line, whole. A first line that ends in
    ``:`` (transformers' "Couldn't instantiate the backend tokenizer from one of:") says
    nothing alone: the next lines are joined to it until a sentence ends, up to
    ``EXCEPTION_LINE_CHARS`` (cut at a word, then `` ...``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    for line in lines[1:] if text.endswith(":") else []:
        if text.endswith((".", "!", "?")) or len(text) >= EXCEPTION_LINE_CHARS:
            break
        joined = f"{text} {line}"
        if len(joined) > EXCEPTION_LINE_CHARS:
            text = joined[:EXCEPTION_LINE_CHARS].rsplit(" ", 1)[0] + " ..."
            break
        text = joined
    return f"{type(exc).__name__}: {text}"


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``ConfigError(key, message)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(key, message)


def require_dir(folder: Path, key: str) -> None:
    """Raise naming ``key`` unless ``folder`` is, or can be made as, a writable directory:
    the first of it and its parents that exists is a directory we may write into."""
    problem = dir_problem(folder)
    if problem is not None:
        raise ConfigError(key, problem)


def dir_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be used or made as a directory (None: it can): a name the
    filesystem refuses (too long), or the first of it and its parents that exists is a file,
    or a directory we may not write into."""
    for name in reversed((folder, *folder.parents)):
        try:
            name.exists()
        except OSError as exc:  # ENAMETOOLONG: not "absent", which exists() says as False
            return f"{name}: {exc.strerror}"
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def require_choice(value: object, choices: tuple | list, key: str) -> None:
    """Raise unless ``value`` is one of ``choices``, listing them."""
    if value not in choices:
        listed = ", ".join(str(c) for c in choices)
        raise ConfigError(key, f"got {value!r}; expected one of: {listed}")


def did_you_mean(word: str, candidates: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the candidate closest to ``word``, or ``""`` if none is close."""
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def require_finite(schema: object, keys: tuple[str, ...]) -> None:
    """Raise naming the first of ``keys`` whose float value on ``schema`` is inf (nan fails the
    range checks that run first): no float key of a run means anything at infinity."""
    for key in keys:
        value = getattr(schema, key)
        require(math.isfinite(value), key, f"must be finite, got {value}")


def is_int(value: object) -> bool:
    """An integer, not a bool (``True`` is an int to Python, not to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)
