"""Name -> function registries for the parts of an RL algorithm.

A recipe adds its own part without touching ``skyrl/``::

    from skyrl.algorithms import POLICY_LOSSES

    @POLICY_LOSSES.register("my_loss")
    def my_loss(...): ...

and selects it with ``algorithm.policy_loss=my_loss`` (listing the recipe
module in the root ``imports`` key so the registration runs before validation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named collection of functions of one kind (e.g. policy losses)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        """Decorator that registers a function under ``name``."""

        def decorate(fn: F) -> F:
            if name in self._entries and not override and self._entries[name] is not fn:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered; pass override=True to replace it"
                )
            self._entries[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> F:
        """The function registered as ``name``; the error lists the registered names."""
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
LOSS_REDUCTIONS: Registry = Registry("loss reduction")
KL_ESTIMATORS: Registry = Registry("KL estimator")
