"""A small ReAct-style agent written against the OpenAI API, trained as it is.

``rollout(client, row)`` answers an arithmetic question in up to ``MAX_STEPS`` LLM calls,
using a calculator tool. With a model whose chat template renders tools (Qwen2.5, the
tiny test model) the calculator is a native tool: declared in ``tools``, called through
``tool_calls``, answered by ``tool`` messages. When the endpoint refuses tools (SmolLM2's
template has no tool support: a 400 about ``tools``) the agent switches, for the rest of
the process, to the classic text protocol: ``Action: calculator[2 * 7]`` ->
``Observation: 14``. Either way it stops at ``Final Answer: ...``, graded against the row's
answer (1 or 0).

Nothing here knows about training: the same function runs against ``skyrl-serve`` or any
OpenAI-compatible server (``python -m recipes.react_agent.agent --base-url ...``).
"""

from __future__ import annotations

import re

import openai

from skyrl.envs.grading import grade
from skyrl.envs.tools import calculator

MAX_STEPS = 3
MAX_TOKENS = 96
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. 2 * (3 + 4).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
NATIVE_PROMPT = (
    "Solve the problem. Use the calculator tool for arithmetic. End with 'Final Answer: <number>'."
)
TEXT_PROMPT = (
    "Solve the problem step by step. To compute, write 'Action: calculator[<expression>]' "
    "and stop; you will get 'Observation: <result>'. End with 'Final Answer: <number>'."
)
ACTION = re.compile(r"Action:\s*calculator\[(.*?)\]", re.DOTALL)
FINAL = re.compile(r"Final Answer:\s*(.+)")
native_tools = True
"""False once the endpoint refused tools (the model's template cannot render them)."""


def final_answer(text: str | None) -> str | None:
    found = FINAL.search(text or "")
    return found.group(1).strip() if found else None


async def rollout(client: openai.AsyncOpenAI, row) -> float:
    """Reward 1 when the final answer equals the row's answer, else 0."""
    global native_tools
    question = row.prompt if isinstance(row.prompt, str) else row.prompt[-1]["content"]
    model = (await client.models.list()).data[0].id  # "policy" while training
    if native_tools:
        try:
            return await _native(client, model, question, row.extras["answer"])
        except openai.BadRequestError as exc:
            if "tools" not in str(exc):
                raise
            native_tools = False
    return await _text(client, model, question, row.extras["answer"])


async def _native(client, model: str, question: str, answer: str) -> float:
    messages = [{"role": "system", "content": NATIVE_PROMPT}, {"role": "user", "content": question}]
    for _ in range(MAX_STEPS):
        reply = await client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATOR], max_tokens=MAX_TOKENS
        )
        msg = reply.choices[0].message
        if not msg.tool_calls:
            return _score(msg.content, answer)
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": _calculate(call.function.arguments),
                }
            )
    return 0.0


async def _text(client, model: str, question: str, answer: str) -> float:
    messages = [{"role": "system", "content": TEXT_PROMPT}, {"role": "user", "content": question}]
    for _ in range(MAX_STEPS):
        reply = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, stop=["Observation:"]
        )
        text = reply.choices[0].message.content or ""
        action = ACTION.search(text)
        if action is None or final_answer(text) is not None:
            return _score(text, answer)
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"Observation: {calculator(action.group(1))}"},
        ]
    return 0.0


def _calculate(arguments: str) -> str:
    import json

    try:
        return calculator(str(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def _score(text: str | None, answer: str) -> float:
    final = final_answer(text)
    return grade(f"#### {final}", answer) if final is not None else 0.0


def main(argv: list[str] | None = None) -> None:
    """Run the agent once against an endpoint: ``--base-url http://127.0.0.1:8000/v1``; an
    endpoint that does not answer, or answers with an error, ends with one line."""
    import argparse
    import asyncio
    from urllib.parse import urlsplit

    from skyrl.data.prompts import PromptRow

    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--question", default="What is 17 * 23?")
    parser.add_argument("--answer", default="391")
    args = parser.parse_args(argv)
    url = urlsplit(args.base_url)
    if url.scheme not in ("http", "https") or not url.netloc:  # else "no endpoint answers"
        raise SystemExit(
            f"error: --base-url {args.base_url}: not an http:// or https:// URL "
            "(skyrl-serve prints its own, e.g. http://127.0.0.1:8000/v1)"
        )
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="unused")
    row = PromptRow(args.question, "cli", {"answer": args.answer}, uid="cli")
    try:
        reward = asyncio.run(rollout(client, row))
    except openai.APIConnectionError:
        raise SystemExit(
            f"error: --base-url {args.base_url}: no OpenAI-compatible endpoint answers there "
            "(start one with skyrl-serve: see recipes/react_agent/README.md)"
        ) from None
    except openai.APIStatusError as exc:
        raise SystemExit(
            f"error: --base-url {args.base_url}: HTTP {exc.status_code}: {exc.message}"
        ) from None
    print("reward", reward)


if __name__ == "__main__":
    main()
