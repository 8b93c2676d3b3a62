"""The text-environment interface and its registry.

An environment sees text, not tokens: ``init`` returns the opening chat
messages, ``step`` takes the assistant's text for one turn and returns the
next observation messages, the reward, and whether the episode is over. The
generator owns tokenization, time limits and fault handling (a raising or
slow env gives reward 0 and counts in ``env/errors``).
"""

from __future__ import annotations

import importlib
import inspect
import math
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skyrl.config.errors import ConfigError, did_you_mean, is_int

Message = dict[str, str]
"""A chat message: ``{"role": ..., "content": ...}``."""


@dataclass
class StepResult:
    """What one ``env.step`` returns."""

    observations: list[Message]
    """Messages appended after the assistant turn (tool or user role); empty when done."""
    reward: float
    """Reward of this step (the trajectory's reward is the last step's): a finite real number
    (anything ``float()`` takes but text: an int, a bool, a numpy or 0-d torch scalar)."""
    done: bool
    """True when the episode is over: a bool (Python's, or a numpy or 0-d torch bool)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form diagnostics."""


def step_result_problem(result: object) -> str | None:
    """What makes ``result`` unusable as a ``StepResult`` (None: nothing): not one, a reward
    that is not a finite real number, a ``done`` that is not a bool, observations that are not
    messages with string ``role`` and ``content``. The generator checks every step (a NaN
    reward would make every advantage of its group NaN; ``StepResult(obs, False, 1.0)``, done
    and reward swapped, ended the episode with reward 0, and a ``None`` done ran it to
    ``max_turns``) and ends the trajectory as an env error."""
    if not isinstance(result, StepResult):
        return f"returned a {type(result).__name__}, not a StepResult"
    if not _is_bool(result.done):
        return f"done is {reprlib.repr(result.done)}, not True or False"
    reward = result.reward
    try:  # float() of text parses it: "1.0" is a mistake, not a reward
        value = None if isinstance(reward, str | bytes) else float(reward)
    except (TypeError, ValueError):
        value = None
    if value is None:
        return f"reward is {reprlib.repr(reward)}, not a number"
    if not math.isfinite(value):
        return f"reward is {value}, not a finite number"
    return messages_problem(result.observations, "observations")


def _is_bool(value: object) -> bool:
    """A bool: Python's, numpy's (``np.bool_``, a 0-d array) or a 0-d torch bool tensor."""
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    return str(dtype) in ("bool", "torch.bool") and getattr(value, "ndim", None) == 0


def messages_problem(messages: object, name: str) -> str | None:
    """What makes ``messages`` (called ``name``) not a list of chat messages with string
    ``content`` and a ``role`` of ``ROLES`` (None: nothing)."""
    from skyrl.data.prompts import ROLES

    if not isinstance(messages, list):
        return f"{name} is a {type(messages).__name__}, not a list of messages"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            return f"{name}[{i}] is a {type(message).__name__}, not a message"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"{name}[{i}][{key!r}] is {reprlib.repr(message.get(key))}, not a string"
        if message["role"] not in ROLES:
            role = reprlib.repr(message["role"])
            return f"{name}[{i}]['role'] is {role}, not one of {', '.join(ROLES)}"
    return None


class TextEnv:
    """Base class: override ``init`` (optional) and ``step``."""

    required_extras: tuple[str, ...] = ()
    """Row fields (``PromptRow.extras``) the env reads, e.g. the answer it grades against: a
    row without one, or with null, NaN or an empty or blank string, is refused when the prompts
    load."""

    def __init__(self, max_observation_chars: int = 2048, **unknown: Any):
        """``unknown``: what no constructor of the subclass took (a subclass passes its
        leftover ``**kwargs`` on), refused: a misspelt ``environment.kwargs`` key would
        otherwise do nothing, silently."""
        if unknown:
            raise UnknownEnvArguments(type(self), sorted(unknown))
        if not is_int(max_observation_chars) or max_observation_chars < 1:
            raise ConfigError(  # make_checked_env says where it was set
                "max_observation_chars",
                f"must be a whole number of characters >= 1, got {max_observation_chars!r}",
            )
        self.max_observation_chars = max_observation_chars

    def init(
        self, prompt: str | list[Message], extras: dict[str, Any]
    ) -> tuple[list[Message], dict]:
        """Start an episode; return the opening messages and info."""
        self.extras = extras
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}], {}
        return [dict(m) for m in prompt], {}

    def step(self, action_text: str) -> StepResult:
        raise NotImplementedError

    def tool_schemas(self) -> list[dict] | None:
        """The env's tools as JSON-schema (OpenAI) tools, for the chat template to declare
        (``skyrl.generators.tool_calls``); None: no native tools."""
        return None

    def use_native_tools(
        self, parse: Callable[[str], list[dict]] | None, why_not: str | None
    ) -> None:
        """Called before ``init`` when ``tool_schemas`` is not None: ``parse`` (reply text ->
        ``[{"name", "arguments"}]``) when the tools are native, else None with the reason
        (the env falls back to a text protocol, or raises if it cannot)."""

    def close(self) -> None:
        """Release resources (processes, files)."""

    def truncate(self, text: str) -> str:
        """Cut observation text to ``max_observation_chars``, marking the cut."""
        limit = self.max_observation_chars
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n...[truncated {len(text) - limit} chars]"


class UnknownEnvArguments(TypeError):
    """An env's constructors, the subclass's down to ``TextEnv``'s, took none of ``names``.
    The message names them, the closest argument they take, and every one they take."""

    def __init__(self, cls: type, names: list[str]):
        self.names = names
        taken = constructor_arguments(cls)
        listed = ", ".join(repr(n) for n in names)
        hint = did_you_mean(names[0], taken) if len(names) == 1 else ""
        plural = "s" if len(names) > 1 else ""
        super().__init__(
            f"{cls.__name__} takes no argument{plural} {listed}{hint}; it takes: "
            + ", ".join(taken)
        )


def constructor_arguments(cls: type) -> list[str]:
    """The keyword arguments ``cls``'s constructor takes: its own and, while each passes
    ``**kwargs`` on, its bases' (up to ``TextEnv``), sorted."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]  # without self
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if klass is TextEnv or not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return sorted(names)


ENV_REGISTRY: dict[str, type[TextEnv]] = {}


def register_env(name: str, *, override: bool = False) -> Callable[[type[TextEnv]], type[TextEnv]]:
    """Class decorator: make an environment available as ``environment.name=<name>``.

    A name taken by another class is refused unless ``override=True``; the built-ins are
    registered first, so a user's ``math`` clashes now rather than being replaced by
    ``MathEnv`` on the first lookup. The same class again (same module and qualified name:
    a notebook cell run again) replaces the old one."""

    def wrap(cls: type[TextEnv]) -> type[TextEnv]:
        if not cls.__module__.startswith("skyrl.envs."):  # a built-in's own: no recursion
            import skyrl.envs.builtin  # noqa: F401  (registers the built-ins)
        old = ENV_REGISTRY.get(name)
        if old is not None and not override and _class_path(old) != _class_path(cls):
            raise ValueError(
                f"environment {name!r} is already registered as {_class_path(old)}; pass "
                f"override=True to replace it with {_class_path(cls)}"
            )
        ENV_REGISTRY[name] = cls
        return cls

    return wrap


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def env_class(name: str | None = None, target: str | None = None) -> type[TextEnv]:
    """The class for a registered ``name`` or an import path ``target`` (which wins)."""
    if target:
        module, _, attr = target.rpartition(".")
        return getattr(importlib.import_module(module), attr)
    import skyrl.envs.builtin  # noqa: F401  (registers the built-ins)

    if name not in ENV_REGISTRY:
        raise KeyError(f"unknown environment {name!r}; registered: {sorted(ENV_REGISTRY)}")
    return ENV_REGISTRY[name]


def make_checked_env(cfg) -> TextEnv:
    """One env from an ``EnvironmentConfig``, with every way that fails raised as a
    ``ConfigError`` naming its key: a ``_target_`` that does not import, an unknown ``name``,
    a constructor that rejects ``kwargs`` (an unknown key: ``environment.kwargs.<key>``), a
    ``_target_`` that builds something without the methods the loop calls (``LOOP_CALLS``:
    not a ``TextEnv``). The pre-flight check calls this before anything starts; the caller
    closes the env."""
    key = "environment._target_" if cfg._target_ else "environment.name"
    if not cfg._target_:
        import skyrl.envs.builtin  # noqa: F401  (registers the built-ins)

        if cfg.name not in ENV_REGISTRY:
            names = sorted(ENV_REGISTRY)
            raise ConfigError(
                key,
                f"unknown environment {cfg.name!r}{did_you_mean(cfg.name, names)}; registered: "
                f"{', '.join(names)} (or set environment._target_ to an import path)",
            )
    try:
        factory = make_env_factory(cfg)
    except Exception as exc:  # ImportError, AttributeError, "Empty module name", a broken module
        problem = f"cannot import {cfg._target_!r}: {exc}"
    else:
        try:
            env = factory()
        except ConfigError as exc:  # the env names the key, or the argument (no dot) it took
            key, problem = exc.key, exc.message
            if "." not in key:
                key = (
                    f"environment.kwargs.{key}"
                    if key in (cfg.kwargs or {})
                    else f"environment.{key}"
                )
        except UnknownEnvArguments as exc:
            only = exc.names[0] if len(exc.names) == 1 else None
            key, problem = "environment.kwargs" + (f".{only}" if only else ""), str(exc)
        except Exception as exc:
            key = "environment.kwargs" if isinstance(exc, TypeError) else key
            problem = f"cannot build the environment: {type(exc).__name__}: {exc}"
        else:
            not_an_env = _not_an_env(env, cfg._target_ or cfg.name)
            if not_an_env is None:
                return env
            if callable(getattr(env, "close", None)):
                env.close()
            problem = not_an_env
    raise ConfigError(key, problem)  # raised here, outside the handlers: no exception context


LOOP_CALLS = ("init", "step", "tool_schemas", "close")
"""The methods the agent loop calls on every env (``TextEnv`` has them all)."""


def _not_an_env(env: object, source: str) -> str | None:
    """Why ``env``, built from ``source``, cannot serve the agent loop (None: it can): a
    method of ``LOOP_CALLS`` it lacks, which the loop would call on every trajectory."""
    missing = [name for name in LOOP_CALLS if not callable(getattr(env, name, None))]
    if not missing:
        return None
    return (
        f"{source} built a {type(env).__name__}, which has no {', '.join(missing)} (the agent "
        "loop calls them): make it a subclass of skyrl.envs.TextEnv"
    )


def make_env_factory(cfg) -> Callable[[], TextEnv]:
    """A zero-argument constructor of fresh envs from an ``EnvironmentConfig``: its ``kwargs``,
    ``max_observation_chars`` and ``dataset`` when the constructor takes them (``data=
    reasoning_gym`` reads ``dataset`` too, for envs that do not), and the ``tool_*`` fields and
    ``timeout_s`` for a tools env (``ToolEnv`` or a subclass, whatever its name). A ``TextEnv``
    whose own ``__init__`` takes no ``max_observation_chars`` (``def __init__(self):
    super().__init__()``) gets it set on the built env, so ``truncate`` still keeps to it."""
    cls = env_class(cfg.name, cfg._target_)
    kwargs = dict(cfg.kwargs or {})
    set_limit = not _takes_argument(cls, "max_observation_chars")
    if not set_limit:
        kwargs.setdefault("max_observation_chars", cfg.max_observation_chars)
    if cfg.dataset is not None and _takes_argument(cls, "dataset"):
        kwargs.setdefault("dataset", cfg.dataset)
    if _is_tool_env(cls):  # ``tools``, a subclass of its own name, or ToolEnv by _target_
        kwargs.setdefault("tool_timeout_s", cfg.tool_timeout_s)
        kwargs.setdefault("tool_memory_bytes", cfg.tool_memory_bytes)
        kwargs.setdefault("tool_format", cfg.tool_format)
        kwargs.setdefault("step_timeout_s", cfg.timeout_s)

    def build() -> TextEnv:
        env = cls(**kwargs)
        if set_limit and isinstance(env, TextEnv):
            env.max_observation_chars = cfg.max_observation_chars
        return env

    return build


def _is_tool_env(factory: Callable) -> bool:
    from skyrl.envs.tool_env import ToolEnv

    return isinstance(factory, type) and issubclass(factory, ToolEnv)


def _takes_argument(factory: Callable, name: str) -> bool:
    """``factory(name=...)`` is taken: a ``TextEnv`` whose constructors name ``name``; any other
    factory that names it or takes ``**kwargs``."""
    if isinstance(factory, type) and issubclass(factory, TextEnv):
        return name in constructor_arguments(factory)
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)
