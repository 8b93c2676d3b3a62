"""Multi-turn tool use: the model calls tools over several turns, rewarded on its final answer.

Protocol (told to the model in the system message):
``<calculator>2 * (3 + 4)</calculator>`` or ``<python>print(6 * 7)</python>``
calls a tool and the result comes back as a ``tool`` message;
``<answer>42</answer>`` ends the episode and is graded against
``extras["answer"]`` with math-verify. A turn with neither ends the episode
and is graded as a whole (``#### x`` / ``\\boxed{x}`` also count).
"""

from __future__ import annotations

import re

from skyrl.envs.base import StepResult, TextEnv, register_env
from skyrl.envs.grading import grade
from skyrl.envs.tools import calculator, run_python

SYSTEM_PROMPT = (
    "You can use tools. Write <calculator>expression</calculator> or "
    "<python>code</python> to call one; its output comes back to you. "
    "When done, write <answer>final answer</answer>."
)

_CALL = re.compile(r"<(calculator|python)>(.*?)</\1>", re.DOTALL)


@register_env("tools")
class ToolEnv(TextEnv):
    """Calculator + Python tools; reward on the final answer."""

    def __init__(
        self,
        tool_timeout_s: float = 5.0,
        tool_memory_bytes: int = 512 << 20,
        system_prompt: str = SYSTEM_PROMPT,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.tool_timeout_s = tool_timeout_s
        self.tool_memory_bytes = tool_memory_bytes
        self.system_prompt = system_prompt

    def init(self, prompt, extras):
        messages, info = super().init(prompt, extras)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        self.tool_calls = 0
        return messages, info

    def step(self, action_text: str) -> StepResult:
        if "<answer>" not in action_text:
            call = _CALL.search(action_text)
            if call:
                self.tool_calls += 1
                tool, arg = call.group(1), call.group(2)
                out = (
                    calculator(arg)
                    if tool == "calculator"
                    else run_python(arg, self.tool_timeout_s, self.tool_memory_bytes)
                )
                obs = [{"role": "tool", "content": self.truncate(out)}]
                return StepResult(obs, 0.0, False, {"tool": tool})
        reward = grade(action_text, self.extras["answer"])
        return StepResult([], reward, True, {"tool_calls": self.tool_calls})
