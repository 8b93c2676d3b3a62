"""The real `openai` client against `skyrl-serve` on the tiny model (a subprocess, hf engine):
chat, completions, logprobs and token ids, streaming, n > 1, seeds, concurrency, and each
error with its status code."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

SKYRL_SERVE = str(Path(sys.executable).parent / "skyrl-serve")
HI = [{"role": "user", "content": "What is 2 + 2?"}]


def start_serving(run: Path, *args: str):
    """``skyrl-serve args`` on a free port: ``(process, base URL)``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(
        [SKYRL_SERVE, "model.path=skyrl-tiny", "serve.port=0", f"hydra.run.dir={run}", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=run, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    url = None
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"skyrl-serve exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        found = re.search(r"at (http://\S+/v1)", line)
        url = found.group(1) if found else None
    assert url, "skyrl-serve printed no base URL"
    return proc, url


def stop_serving(proc) -> None:
    """SIGTERM must end ``skyrl-serve`` cleanly (exit 0)."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``skyrl-serve`` with the hf engine on the tiny model; its base URL."""
    proc, url = start_serving(
        tmp_path_factory.mktemp("serve"), "generator=hf", "generator.max_prompt_length=64",
        "generator.max_generate_length=16",
    )  # fmt: skip
    yield url
    stop_serving(proc)


def test_a_tool_call_comes_back_as_tool_calls_through_skyrl_serve(tmp_path):
    """``skyrl-serve`` with the scripted engine (``scripted_backend``: it says what the prompt
    tells it to), so the reply is a known tool call in the tiny template's format."""
    proc, url = start_serving(
        tmp_path, "imports=[scripted_backend]", "generator=hf", "generator.backend=scripted",
        "generator.max_prompt_length=1024",
    )  # fmt: skip
    try:
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
        call = (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
        )
        tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
        r = client.chat.completions.create(
            model="skyrl-tiny", messages=[{"role": "user", "content": f"SAY:{call}"}], tools=tools
        )
    finally:
        stop_serving(proc)
    (got,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and got.function.name == "calculator"
    assert got.function.arguments == '{"expression": "6*7"}'


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served, api_key="anything", max_retries=0)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["skyrl-tiny"]


def test_chat_completion_with_logprobs_and_token_ids(client, served):
    r = client.chat.completions.create(
        model="skyrl-tiny", messages=HI, max_tokens=6, logprobs=True, seed=7,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    ids = choice.model_extra["token_ids"]
    assert r.usage.completion_tokens == len(ids) == len(choice.logprobs.content) >= 1
    assert r.usage.prompt_tokens == len(r.model_extra["prompt_token_ids"])
    assert all(t.logprob <= 0 for t in choice.logprobs.content)
    again = client.chat.completions.create(
        model="skyrl-tiny", messages=HI, max_tokens=6, seed=7, extra_body={"return_token_ids": True}
    )
    assert again.choices[0].model_extra["token_ids"] == ids  # the seed fixes the sample


def test_completions_from_text_and_from_token_ids(client):
    r = client.completions.create(model="skyrl-tiny", prompt="The answer is", max_tokens=5, seed=1)
    assert len(r.choices) == 1 and r.usage.completion_tokens <= 5
    ids = client.completions.create(
        model="skyrl-tiny", prompt=[5, 6, 7, 8], max_tokens=5, seed=1, logprobs=0
    )
    assert ids.usage.prompt_tokens == 4
    assert len(ids.choices[0].logprobs.token_logprobs) == ids.usage.completion_tokens


def test_n_samples_differ_and_stream_matches(client):
    r = client.chat.completions.create(model="skyrl-tiny", messages=HI, max_tokens=8, n=3, seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # own seeds per sample
    whole = client.chat.completions.create(model="skyrl-tiny", messages=HI, max_tokens=8, seed=5)
    chunks = list(
        client.chat.completions.create(
            model="skyrl-tiny", messages=HI, max_tokens=8, seed=5, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[
        0
    ].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_concurrent_requests_are_all_answered(served):
    async def run():
        client = openai.AsyncOpenAI(base_url=served, api_key="k", max_retries=0)
        return await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="skyrl-tiny",
                    messages=[{"role": "user", "content": f"q{i}"}],
                    max_tokens=4,
                )
                for i in range(16)
            )
        )

    replies = asyncio.run(run())
    assert len(replies) == 16 and all(r.choices[0].message.content is not None for r in replies)


@pytest.mark.parametrize(
    "body, status, says",
    [
        ({"model": "gpt-4", "messages": HI}, 404, "model 'gpt-4' does not exist"),
        (
            {"model": "skyrl-tiny", "messages": [{"role": "user", "content": "hi " * 100}]},
            400, "over generator.max_prompt_length=64",
        ),
        (
            {"model": "skyrl-tiny", "messages": HI, "max_tokens": 100},
            400, "over generator.max_generate_length=16",
        ),
        ({"model": "skyrl-tiny", "messages": []}, 400, "messages: must be a non-empty list"),
        ({"model": "skyrl-tiny", "messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role"),
        ({"model": "skyrl-tiny", "messages": HI, "temperature": "hot"}, 400, "temperature must be a number"),
    ],
)  # fmt: skip
def test_errors_are_openai_error_objects(served, body, status, says):
    r = httpx.post(f"{served}/chat/completions", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert says in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_bad_json_is_a_400_and_the_client_raises_typed_errors(served, client):
    r = httpx.post(f"{served}/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HI)
    with pytest.raises(openai.BadRequestError, match="max_prompt_length=64"):
        client.chat.completions.create(
            model="skyrl-tiny", messages=[{"role": "user", "content": "x " * 200}]
        )


def test_a_port_in_use_is_one_line(tmp_path, served):
    port = served.rsplit(":", 1)[1].split("/")[0]
    result = subprocess.run(
        [SKYRL_SERVE, "model.path=skyrl-tiny", "generator=hf", f"serve.port={port}", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: serve.port: ")
