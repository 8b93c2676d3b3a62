"""An external agent that talks to ``/v1/completions``: ``generator.agent_reward_fn`` gets
the reply's text. Its record kept no reply, so the reward function was called with
``[{}]`` and could not score what the model wrote. The engine is scripted
(``scripted_engine``): it says what the prompt's last ``SAY:`` tells it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from scripted_engine import ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.generators.trajectory import DriverContext, LoopSettings, VersionClock
from skyrl.inference.base import SamplingParams
from skyrl.serve.harness import POLICY_MODEL, HarnessDriver

ROW = PromptRow("What is 2 + 2?", "toy", {}, uid="p0")


async def completes(client, row) -> None:
    await client.completions.create(
        model=POLICY_MODEL, prompt="SAY:four END", max_tokens=8, stop=[" END"]
    )


def test_a_completions_reply_reaches_the_reward_fn(tiny_tokenizer):
    seen: list[list[dict]] = []

    def reward_fn(row, messages):
        seen.append(messages)
        return 1.0

    engine = ScriptedEngine(tiny_tokenizer)
    done: Future = Future()
    serving = threading.Thread(target=engine.serve, args=(done,), daemon=True)
    serving.start()
    settings = LoopSettings(64, 32, 4)
    ctx = DriverContext(engine, tiny_tokenizer, lambda: None, settings, VersionClock())
    driver = HarnessDriver(ctx, completes, 30.0, reward_fn)
    try:
        (traj,) = asyncio.run(driver.run([ROW], 1, SamplingParams(seed=3)))
    finally:
        driver.close()
        done.set_result(None)
        serving.join(timeout=10)
    assert (traj.reward, traj.env_errors) == (1.0, 0)
    # the engine says "four END" and stops on the stop string " END": the client is given
    # "four" (the text before the stop string), and so is the reward function
    assert seen == [[{"role": "assistant", "content": "four"}]]
