"""Multi-turn tool use: the model calls tools over several turns, rewarded on its final answer.

Two ways to call the tools (``environment.tool_format``; ``auto`` picks the first the
model's chat template supports, ``skyrl.generators.tool_calls``):

- native: ``calculator`` and ``python`` are JSON-schema tools (``TOOLS``) the chat
  template declares; the model calls them in its own format (Qwen2.5:
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "2 * 7"}}</tool_call>``),
  parsed by vLLM's tool parser; each call's result comes back as a ``tool`` message.
- tags (templates without tool support): told in the system message (added after a row's
  own system text, as the native prompt is),
  ``<calculator>2 * (3 + 4)</calculator>`` or ``<python>print(6 * 7)</python>`` calls a
  tool and the result comes back as a ``tool`` message: one call a turn, the reply's first
  closed tag (the system message asks for one; later tags in the reply are not run).

``<answer>42</answer>`` ends the episode and is graded against ``extras["answer"]`` with
math-verify. A turn with no call and no answer ends the episode and is graded as a whole
(``#### x`` / ``\\boxed{x}`` also count).

The calls of one reply (native: every call; tags: the first) run one after another under
one deadline, ``STEP_MARGIN_S`` before the generator's limit on the whole step
(``environment.timeout_s``): each gets ``tool_timeout_s`` or what is left, and those past
the deadline are not run, so slow calls come back as timeouts instead of the step being
cancelled (reward 0, an env error).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from skyrl.config.environment import tool_deadline_problem
from skyrl.config.errors import ConfigError, is_int
from skyrl.envs.base import StepResult, TextEnv, register_env
from skyrl.envs.grading import grade, last_answer_tag
from skyrl.envs.tools import calculator, run_python

SYSTEM_PROMPT = (
    "You can use tools. Write <calculator>expression</calculator> or "
    "<python>code</python> to call one; its output comes back to you. "
    "When done, write <answer>final answer</answer>."
)

NATIVE_SYSTEM_PROMPT = (
    "You can use the calculator and python tools; their output comes back to you. "
    "When done, write <answer>final answer</answer>."
)

STEP_MARGIN_S = 1.0
"""Time a step keeps back from its limit (at most a tenth of it) after its tool calls' deadline,
to start and stop the last call's process and return before the generator cancels the step."""


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly, e.g. 2 * (3 + 4).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python program in a sandbox; returns what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    },
]
"""The tools in the native format (OpenAI / chat-template JSON schema)."""
_ARGUMENT = {"calculator": "expression", "python": "code"}
MIN_TOOL_MEMORY_BYTES = 16 << 20
"""Smallest ``tool_memory_bytes`` (as ``environment.tool_memory_bytes``): an interpreter needs it."""


@register_env("tools")
class ToolEnv(TextEnv):
    """Calculator + Python tools; reward on the final answer."""

    required_extras = ("answer",)

    def __init__(
        self,
        tool_timeout_s: float = 5.0,
        tool_memory_bytes: int = 512 << 20,
        system_prompt: str | None = None,
        tool_format: str = "auto",
        step_timeout_s: float = 10.0,
        **kwargs,
    ):
        """``step_timeout_s``: the generator's limit on one ``step`` (``environment.timeout_s``),
        which all the calls of one reply share; ``tool_timeout_s`` must be below it. A bad
        argument raises a ``ConfigError`` keyed by its name (``make_checked_env`` says where
        it was set: ``environment.<name>`` or ``environment.kwargs.<name>``)."""
        super().__init__(**kwargs)
        bad = _argument_problem(
            tool_timeout_s, tool_memory_bytes, system_prompt, tool_format, step_timeout_s
        )
        if bad is not None:
            raise ConfigError(*bad)
        problem = tool_deadline_problem(tool_timeout_s, step_timeout_s)
        if problem is not None:
            raise ConfigError("tool_timeout_s", problem)
        self.tool_timeout_s = tool_timeout_s
        self.step_timeout_s = step_timeout_s
        self.tool_memory_bytes = tool_memory_bytes
        self.custom_system_prompt = system_prompt
        self.tool_format = tool_format
        self.parse: Callable[[str], list[dict]] | None = None
        """The native tool-call parser (None: the tag protocol)."""

    def tool_schemas(self) -> list[dict] | None:
        return None if self.tool_format == "tags" else TOOLS

    def use_native_tools(self, parse, why_not) -> None:
        if parse is None and self.tool_format == "native":
            raise ValueError(f"tool_format=native, but {why_not}; use auto or tags")
        self.parse = parse

    @property
    def system_prompt(self) -> str:
        if self.custom_system_prompt is not None:
            return self.custom_system_prompt
        return NATIVE_SYSTEM_PROMPT if self.parse is not None else SYSTEM_PROMPT

    def init(self, prompt, extras):
        """The row's messages with the tools prompt: the system message, or added after the
        row's own system text (a blank line between) when it has one."""
        messages, info = super().init(prompt, extras)
        added = self.system_prompt
        if added and messages and messages[0]["role"] == "system":
            own = messages[0]["content"]
            if added not in own:
                messages[0]["content"] = f"{own}\n\n{added}" if own else added
        elif added:
            messages.insert(0, {"role": "system", "content": added})
        self.tool_calls = 0
        return messages, info

    def run_tool(self, tool: str, arg: str, timeout_s: float | None = None) -> str:
        """One call's output; ``timeout_s`` (default ``tool_timeout_s``) limits ``python``."""
        if tool == "calculator":
            return calculator(arg)
        timeout_s = self.tool_timeout_s if timeout_s is None else timeout_s
        return run_python(arg, timeout_s, self.tool_memory_bytes)

    def step(self, action_text: str) -> StepResult:
        if last_answer_tag(action_text) is None:  # a mention of the tag is not an answer
            calls = self._calls(action_text, _CallClock(self.step_timeout_s))
            if calls:
                self.tool_calls += len(calls)
                obs = [{"role": "tool", "content": self.truncate(out)} for _, out in calls]
                return StepResult(obs, 0.0, False, {"tool": calls[0][0]})
        reward = grade(action_text, self.extras["answer"])
        return StepResult([], reward, True, {"tool_calls": self.tool_calls})

    def _calls(self, text: str, clock: _CallClock) -> list[tuple[str, str]]:
        """``(tool, output)`` of each call in the reply: every native call, or the first tag."""
        if self.parse is None:
            tag = _first_tag_call(text)
            return [(tag[0], self._run_by(clock, *tag))] if tag else []
        out = []
        for call in self.parse(text):
            name, args = call["name"], call["arguments"]
            if name not in _ARGUMENT:
                out.append((name, f"error: no tool named {name!r} (tools: calculator, python)"))
            elif not isinstance(args, dict) or not isinstance(args.get(_ARGUMENT[name]), str):
                out.append((name, f"error: {name} takes {{{_ARGUMENT[name]!r}: string}}"))
            else:
                out.append((name, self._run_by(clock, name, args[_ARGUMENT[name]])))
        return out

    def _run_by(self, clock: _CallClock, tool: str, arg: str) -> str:
        """One call, limited to ``tool_timeout_s`` and the step's deadline (not run past it)."""
        left_s = clock.left_s()
        if left_s <= 0:
            budget_s = round(clock.budget_s, 2)
            return f"error: not run: this turn's tool calls used up their {budget_s:g} s"
        return self.run_tool(tool, arg, min(self.tool_timeout_s, left_s))


def _argument_problem(
    tool_timeout_s, tool_memory_bytes, system_prompt, tool_format, step_timeout_s
) -> tuple[str, str] | None:
    """``(argument, problem)`` of the first of ``ToolEnv``'s arguments it cannot use, if any:
    ``environment.kwargs`` reach it untyped (the config's own fields are checked already)."""
    for name, seconds in (("tool_timeout_s", tool_timeout_s), ("step_timeout_s", step_timeout_s)):
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
            return name, f"must be a number of seconds > 0, got {seconds!r}"
    if not is_int(tool_memory_bytes) or tool_memory_bytes < MIN_TOOL_MEMORY_BYTES:
        return "tool_memory_bytes", (
            f"must be a whole number of bytes >= 16 MiB ({MIN_TOOL_MEMORY_BYTES}), "
            f"got {tool_memory_bytes!r}"
        )
    if system_prompt is not None and not isinstance(system_prompt, str):
        return "system_prompt", f"must be text or null, got {system_prompt!r}"
    if tool_format not in ("auto", "native", "tags"):
        return "tool_format", f"must be auto, native or tags, got {tool_format!r}"
    return None


def _first_tag_call(text: str) -> tuple[str, str] | None:
    """``(tool, argument)`` of the first ``<calculator>..</calculator>`` or ``<python>..</python>``
    that is closed (up to its first close), if any. Read in one pass: a reply of many unclosed
    tags is not rescanned from each, as a regular expression's search would."""
    calls = []
    for tool in _ARGUMENT:
        start = text.find(f"<{tool}>")  # a later open closes only if this one does
        end = text.find(f"</{tool}>", start + len(f"<{tool}>")) if start != -1 else -1
        if end != -1:
            calls.append((start, tool, text[start + len(f"<{tool}>") : end]))
    return min(calls)[1:] if calls else None


class _CallClock:
    """The deadline of one step's tool calls: ``STEP_MARGIN_S`` (at most a tenth of the
    step's limit) before the generator's limit on the step, counted from now."""

    def __init__(self, step_timeout_s: float):
        self.budget_s = step_timeout_s - min(STEP_MARGIN_S, step_timeout_s / 10)
        self.deadline = time.monotonic() + self.budget_s

    def left_s(self) -> float:
        return self.deadline - time.monotonic()
