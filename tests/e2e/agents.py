"""External agents for the tests, written against the `openai` client only (plus
``prompt_messages``): what a user's harness looks like."""

from __future__ import annotations

import asyncio

from skyrl.serve.harness import prompt_messages


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


async def model_id(client) -> str:
    return (await client.models.list()).data[0].id


async def two_turns(client, row) -> float:
    """Ask, then ask again with the reply in the history; reward: vowels in the second reply."""
    model = await model_id(client)
    messages = prompt_messages(row)
    first = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    second = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
    return vowel_share(second.choices[0].message.content or "")


async def one_turn(client, row) -> float:
    """One request; reward: vowels in the reply."""
    reply = await client.chat.completions.create(
        model=await model_id(client), messages=prompt_messages(row), max_tokens=8
    )
    return vowel_share(reply.choices[0].message.content or "")


async def edits_history(client, row) -> float:
    """The second request drops the first reply and says something else: a fork."""
    model = await model_id(client)
    messages = prompt_messages(row)
    await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    messages += [{"role": "assistant", "content": "(summary)"}, {"role": "user", "content": "go"}]
    reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    return vowel_share(reply.choices[0].message.content or "")


async def raises(client, row) -> float:
    await one_turn(client, row)
    raise RuntimeError("the agent crashed")


async def hangs(client, row) -> float:
    await asyncio.sleep(3600)
    return 1.0


async def garbage(client, row):
    """Sends a body that is not JSON (the endpoint answers 400), then returns no number."""
    import httpx

    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{client.base_url}chat/completions",
            content=b"{not json",
            headers={"Authorization": f"Bearer {client.api_key}"},
        )
    assert r.status_code == 400, r.text
    return "not a reward"


def last_reply_vowels(row, messages) -> float:
    """A ``generator.agent_reward_fn``: vowels in the conversation's last message."""
    return vowel_share(messages[-1]["content"] or "") if messages else 0.0


async def cold(client, row) -> float:
    """Asks for temperature 0.2, which differs from the training sampling."""
    reply = await client.chat.completions.create(
        model=await model_id(client), messages=prompt_messages(row), max_tokens=4, temperature=0.2
    )
    return vowel_share(reply.choices[0].message.content or "")


async def logged_two_turns(client, row) -> float:
    """``two_turns`` that also appends, per request, the session key and the token ids the
    endpoint returned (the ``return_token_ids`` extension) to the file ``$AGENT_LOG``."""
    import json
    import os

    model = await model_id(client)
    messages = prompt_messages(row)
    replies = []
    for turn in range(2):
        r = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, extra_body={"return_token_ids": True}
        )
        replies.append(r.choices[0])
        with open(os.environ["AGENT_LOG"], "a") as f:
            entry = {"key": client.api_key, "uid": row.uid, "turn": turn}
            f.write(
                json.dumps({**entry, "token_ids": r.choices[0].model_extra["token_ids"]}) + "\n"
            )
        messages += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "and?"},
        ]
    return vowel_share(replies[-1].message.content or "")
