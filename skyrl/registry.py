"""``Registry``: a name -> entry table that a recipe extends without touching ``skyrl/``.

The algorithms (``skyrl.algorithms``: losses, estimators), the metric sinks
(``skyrl.tracking.SINKS``) and the engine backends (``skyrl.inference.ENGINE_BACKENDS``)
each keep one. A config names an entry by string; ``skyrl.config.validate`` checks every
such name after importing the config's ``imports``, so a recipe's own registrations count.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named collection of callables of one kind (e.g. policy losses, sink factories)."""

    def __init__(self, kind: str):
        self.kind = kind
        """What an entry is, for error messages: ``unknown <kind> 'x'; registered: ...``."""
        self._entries: dict[str, F] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        """Decorator that registers a callable under ``name``.

        A name taken by another callable is refused unless ``override=True``. The same
        callable again (same module and qualified name: a notebook cell run again, as
        ``skyrl.envs.register_env`` allows) replaces the old one."""

        def decorate(fn: F) -> F:
            old = self._entries.get(name)
            if old is not None and not override and not _same_definition(old, fn):
                raise ValueError(
                    f"{self.kind} {name!r} is already registered as {_path(old)}; pass "
                    f"override=True to replace it with {_path(fn)}"
                )
            self._entries[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> F:
        """The entry registered as ``name``; the error lists the registered names."""
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def unknown(self, name: str) -> str:
        """The message for a name that is not registered: ``unknown <kind> 'x'; registered: ...``."""
        return f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def _same_definition(old: Callable, new: Callable) -> bool:
    """Whether ``new`` is ``old`` or its definition run again (same module and qualified
    name). A callable without a ``__qualname__`` (a ``functools.partial``) only matches
    itself."""
    if old is new:
        return True
    return getattr(old, "__qualname__", None) is not None and _path(old) == _path(new)


def _path(fn: Callable) -> str:
    """``module.qualname`` of ``fn``, or its ``repr`` where it has none."""
    qualname = getattr(fn, "__qualname__", None)
    if qualname is None:
        return repr(fn)
    return f"{getattr(fn, '__module__', None)}.{qualname}"


def import_path(path: str) -> Callable:
    """The callable an import path ``package.module.attr`` names (``attr`` may be dotted:
    ``module.Class.method``). Raises ``ValueError`` with a one-line reason: not a dotted
    path, does not import (the first import error), or not callable."""
    parts = path.split(".")
    if len(parts) < 2 or not all(parts):  # "x", ".x", "a..b", "a.": no module or no attr
        raise ValueError(f"{path!r} is not an import path module.attr")
    error: Exception | None = None
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
            for attr in parts[cut:]:
                target = getattr(target, attr)
        except (ImportError, AttributeError) as exc:
            error = error or exc
            continue
        if not callable(target):
            raise ValueError(f"{path!r} is not callable")
        return target
    raise ValueError(f"{path!r} does not import: {error}")


def unbindable_parameters(target: Callable, num_args: int) -> str | None:
    """``target``'s parameter list (``"a, b"``) when it cannot be called with ``num_args``
    positional arguments, for the line refusing it where it is configured (not at its first
    call, mid-run); None when it can, or when Python cannot read its signature (a builtin:
    the call decides)."""
    import inspect

    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*[None] * num_args)
    except TypeError:
        return ", ".join(signature.parameters)
    return None
