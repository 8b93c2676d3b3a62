"""An external agent whose own code lets an ``asyncio.CancelledError`` out (it cancelled a task
of its own and awaited it) fails its trajectory only, as an agent that raises anything else
does (reward 0, ``env/errors``; its requests so far still train): the error went through the
step's ``gather`` and ended the whole rollout, and so the run, with a CancelledError
traceback. The engine is scripted (``scripted_engine``)."""

from __future__ import annotations

import asyncio

from scripted_engine import ScriptedEngine

from skyrl.config.environment import EnvironmentConfig
from skyrl.config.generator import HFGeneratorConfig
from skyrl.data.prompts import PromptRow
from skyrl.generators import make_generator
from skyrl.inference.base import SamplingParams

ASK = [{"role": "user", "content": "SAY:four"}]


async def cancels_itself_on_p0(client, row) -> float:
    """One request; then, on row p0 only, the agent's bug: a task of its own cancelled and
    awaited, its CancelledError let out."""
    await client.chat.completions.create(model="policy", messages=ASK)
    if row.uid == "p0":
        task = asyncio.create_task(asyncio.sleep(30))
        await asyncio.sleep(0)
        task.cancel()
        await task
    return 1.0


def test_an_agent_s_own_cancelled_error_costs_its_trajectories_only(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok)
    rows = [PromptRow("q", "toy", {}, uid=f"p{i}") for i in range(2)]
    cfg = HFGeneratorConfig(
        agent=f"{__name__}.cancels_itself_on_p0",
        max_turns=2,
        max_prompt_length=64,
        max_generate_length=32,
    )
    gen = make_generator(cfg, EnvironmentConfig(name="math"), engine, tok)
    try:
        out = gen.generate(rows, 2, SamplingParams(seed=3))
    finally:
        gen.close()
    # (row, sample) order: p0's two samples failed, p1's scored
    assert out.rewards == [0.0, 0.0, 1.0, 1.0]
    assert out.stop_reasons[:2] == ["env_error"] * 2 and out.metrics["env/errors"] == 2
    # every trajectory's one request trains: "four" + EOS sampled
    four = tok.encode("four", add_special_tokens=False) + [tok.eos_token_id]
    assert [sum(mask) for mask in out.loss_masks] == [len(four)] * 4


async def waits(client, row) -> float:
    """One request, then waits (until its rollout is cancelled)."""
    await client.chat.completions.create(model="policy", messages=ASK)
    await asyncio.sleep(60)
    return 1.0


def test_a_cancelled_rollout_is_still_cancelled(tiny_tokenizer, caplog):
    # the rollout stopped from outside (Ctrl-C, an interrupted step) still ends by its
    # CancelledError, its trajectories not failed as agents' errors (a warning line each)
    from skyrl.inference.local import run_serving

    engine = ScriptedEngine(tiny_tokenizer)
    rows = [PromptRow("q", "toy", {}, uid="p0")]
    cfg = HFGeneratorConfig(agent=f"{__name__}.waits", max_prompt_length=64)
    gen = make_generator(cfg, EnvironmentConfig(name="math"), engine, tiny_tokenizer)

    async def cancel_it() -> str:
        task = asyncio.ensure_future(gen.trajectories(rows, 2, SamplingParams(seed=3)))
        while len(engine.prompts) < 2:  # both agents made their request
            await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "finished"

    try:
        assert run_serving(engine, cancel_it()) == "cancelled"
    finally:
        gen.close()
    assert [r.getMessage() for r in caplog.records if r.name == "skyrl.serve.harness"] == []
