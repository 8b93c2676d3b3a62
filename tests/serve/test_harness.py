"""External agents (``generator.agent`` naming ``async def rollout(client, row)``) through the
real endpoint and the hf engine on the tiny model: rows hold exactly the sampled tokens,
forks are counted, a failing agent costs its trajectory only, reward functions, the
sampling-drift rule and ``max_turns``."""

from __future__ import annotations

import logging
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from skyrl.config.environment import EnvironmentConfig
from skyrl.config.generator import HFGeneratorConfig
from skyrl.data.prompts import PromptRow
from skyrl.generators import make_generator, to_training_batch
from skyrl.inference import make_engine
from skyrl.inference.base import SamplingParams

sys.path.insert(0, str(Path(__file__).parent.parent / "e2e"))

ROWS = [PromptRow(f"What is {i} + {i}?", "toy", {}, uid=f"p{i}") for i in range(4)]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from skyrl.config.generator import HFGeneratorConfig

    engine = make_engine(HFGeneratorConfig(), tiny_model_path)
    yield engine
    engine.shutdown()


def generate(engine, tokenizer, agent, rows=ROWS, n=2, **overrides):
    settings = {"max_turns": 4, "max_generate_length": 32, "max_prompt_length": 64, **overrides}
    cfg = HFGeneratorConfig(agent=agent, **settings)
    gen = make_generator(cfg, EnvironmentConfig(name="math"), engine, tokenizer)
    try:
        return gen.generate(rows, n, SamplingParams(seed=3, max_tokens=32))
    finally:
        gen.driver.close()


def test_two_turn_agent_rows_hold_exactly_the_sampled_tokens(engine, tiny_tokenizer):
    out = generate(engine, tiny_tokenizer, "agents.two_turns")
    assert len(out) == 8 and out.forks == [""] * 8  # one row per trajectory: the turns chain
    m = out.metrics
    assert m["agent/requests"] == 16 and m["agent/forks"] == 0 and m["env/errors"] == 0
    for mask, lps, resp in zip(
        out.loss_masks, out.rollout_logprobs, out.response_token_ids, strict=True
    ):
        assert sum(mask) == 12  # two replies of max_tokens=6 (the random model never stops)
        assert all((lp < 0) == bool(k) for lp, k in zip(lps, mask, strict=True))
        assert len(resp) > 12  # the agent's second message sits between the replies, masked
    to_training_batch(out)
    assert (
        all(0 <= r <= 1 for r in out.rewards)
        and len({tuple(r) for r in out.response_token_ids}) == 8
    )


def test_the_agents_requests_log_no_line_each(engine, tiny_tokenizer, caplog):
    # at the INFO level a run logs at, httpx wrote "HTTP Request: POST .../chat/completions
    # "HTTP/1.1 200 OK"" for every request of every agent, into the console and cli.log
    caplog.set_level(logging.INFO)
    out = generate(engine, tiny_tokenizer, "agents.two_turns", rows=ROWS[:1], n=1)
    assert out.metrics["agent/requests"] == 2
    assert [r.getMessage() for r in caplog.records if r.name.startswith("httpx")] == []


def test_same_seed_same_rollouts(engine, tiny_tokenizer):
    a = generate(engine, tiny_tokenizer, "agents.one_turn")
    b = generate(engine, tiny_tokenizer, "agents.one_turn")
    assert a.response_token_ids == b.response_token_ids and a.rewards == b.rewards


def test_an_agent_that_rewrites_a_reply_forks_into_step_rows(engine, tiny_tokenizer):
    out = generate(engine, tiny_tokenizer, "agents.edits_history")
    assert out.forks == ["", "rerendered"] * 8
    assert out.is_last_step == [False, True] * 8 and out.rewards[::2] == [0.0] * 8
    assert out.metrics["agent/forks"] == 8 and out.metrics["agent/forks_rerendered"] == 8
    batch = to_training_batch(out)
    assert batch.metadata["forks"] == out.forks


@pytest.mark.parametrize("agent", ["agents.raises", "agents.hangs", "agents.garbage"])
def test_a_failing_agent_costs_its_trajectories_only(engine, tiny_tokenizer, agent):
    rows = ROWS[:2]
    # only the hanging agent is timed out: at 2 s for all three, a loaded machine's engine
    # took longer on the raising agent's one request and the timeout cancelled it
    timeout_s = 2.0 if agent == "agents.hangs" else 120.0
    out = generate(engine, tiny_tokenizer, agent, rows=rows, agent_timeout_s=timeout_s)
    assert out.rewards == [0.0] * 4 and set(out.stop_reasons) == {"env_error"}
    assert out.metrics["env/errors"] == 4
    if agent == "agents.raises":  # the request it made before raising still trains
        assert all(sum(m) == 8 for m in out.loss_masks)


def test_a_step_whose_agents_all_fail_before_a_request_still_trains(engine, tiny_tokenizer):
    """Every trajectory fails before its agent's first accepted request (here: a body that is
    not JSON; in a run, a prompt over generator.max_prompt_length): every row has no token.
    The batch keeps one (padding) position, so the step packs a zero-loss filler; a batch
    0 positions wide crashed the packing (argmax over an empty dimension)."""
    from skyrl.batch import plan_micro_batches

    out = generate(engine, tiny_tokenizer, "agents.garbage", rows=ROWS[:2])
    assert out.prompt_token_ids == [[]] * 4 and out.response_token_ids == [[]] * 4
    batch = to_training_batch(out, pad_token_id=0)
    assert batch.input_ids.shape == (4, 1) and not batch["attention_mask"].any()
    for share in (False, True):
        micro = plan_micro_batches(batch, 64, share_prefixes=share)
        assert len(micro) == 1 and micro[0].is_empty


def test_a_reward_fn_scores_the_conversation(engine, tiny_tokenizer):
    out = generate(
        engine, tiny_tokenizer, "agents.one_turn", agent_reward_fn="agents.last_reply_vowels"
    )
    plain = generate(engine, tiny_tokenizer, "agents.one_turn")
    assert out.rewards == plain.rewards  # the same vowel share, computed by the reward fn


def test_sampling_drift_and_max_turns_reach_the_agent_as_errors(engine, tiny_tokenizer):
    drift = generate(engine, tiny_tokenizer, "agents.cold", rows=ROWS[:1], n=1)
    assert drift.metrics["env/errors"] == 1
    override = generate(
        engine, tiny_tokenizer, "agents.cold", rows=ROWS[:1], n=1, agent_sampling_drift="override"
    )
    assert override.metrics["env/errors"] == 0 and override.metrics["agent/sampling_overrides"] == 1
    capped = generate(engine, tiny_tokenizer, "agents.two_turns", rows=ROWS[:1], n=1, max_turns=1)
    assert capped.metrics["env/errors"] == 1 and sum(capped.loss_masks[0]) == 6


def test_an_agent_timing_out_mid_request_does_not_break_the_engine(engine, tiny_tokenizer):
    """The agent is cut off while its request is still being decoded; the step after it, and
    the engine, go on (the late answer has no one waiting: its event loop is gone)."""
    import time

    from skyrl.inference.local import Request

    original = Request.resolve

    def late(self, completion):
        time.sleep(1.0)  # the answer comes after the agent's time limit
        original(self, completion)

    Request.resolve = late
    try:
        out = generate(
            engine, tiny_tokenizer, "agents.one_turn", rows=ROWS[:1], n=1, agent_timeout_s=0.3
        )
    finally:
        Request.resolve = original
    assert out.metrics["env/errors"] == 1 and out.stop_reasons == ["env_error"]
    again = generate(engine, tiny_tokenizer, "agents.one_turn", rows=ROWS[:1], n=1)
    assert again.metrics["env/errors"] == 0 and sum(again.loss_masks[0]) >= 1


def _returns(value):
    async def agent(client, row):
        return value

    return agent


REWARDS = [
    (np.float32(0.75), 0.75),  # 0.75 = 2^-1 + 2^-2: exact in float32
    (np.float64(-0.5), -0.5),
    (np.int64(2), 2.0),
    (Fraction(1, 4), 0.25),
    (True, 1.0),  # as the built-in loop takes float(StepResult.reward)
    (np.bool_(True), 1.0),  # what `answer == gold` gives on numpy values
    (3, 3.0),
    (float("nan"), None),
    (np.float32("inf"), None),
    ("0.5", None),
    (None, None),
    (np.array([0.5]), None),
]


@pytest.mark.parametrize("value, reward", REWARDS, ids=[repr(v) for v, _ in REWARDS])
@pytest.mark.parametrize("by_reward_fn", [False, True])
def test_the_reward_may_be_any_real_number(tiny_tokenizer, value, reward, by_reward_fn):
    """A finite real number (numpy's included) is the reward, as a float; anything else is an
    env error with reward 0."""
    import asyncio

    from skyrl.generators.trajectory import DriverContext, LoopSettings, VersionClock
    from skyrl.serve.harness import HarnessDriver

    ctx = DriverContext(object(), tiny_tokenizer, lambda: None, LoopSettings(64, 32, 4),
                        VersionClock())  # fmt: skip
    if by_reward_fn:
        driver = HarnessDriver(ctx, _returns(None), 5.0, lambda row, messages: value)
    else:
        driver = HarnessDriver(ctx, _returns(value), 5.0)
    try:
        (traj,) = asyncio.run(driver.run(ROWS[:1], 1, SamplingParams(seed=3)))
    finally:
        driver.close()
    if reward is None:
        assert (traj.reward, traj.stop_reason, traj.env_errors) == (0.0, "env_error", 1)
    else:
        assert (traj.reward, traj.stop_reason, traj.env_errors) == (reward, "stop", 0)
        assert type(traj.reward) is float


def test_an_eval_session_is_served_with_eval_sampling_and_not_checked(
    engine, tiny_tokenizer, monkeypatch
):
    """The eval pass trains nothing, so no logprobs assume a temperature: an agent asking for
    another one than generator.eval_sampling (agents.cold asks for 0.2) is answered at the
    eval's, uncounted as drift. It was refused (400) against the eval temperature, every
    trajectory scored 0 and pass@1 = 0.0 was recorded as a result."""
    from skyrl.config.generator import SamplingConfig
    from skyrl.rollouts.evaluation import evaluate_prompts

    temperatures: list[float] = []
    generate_one = engine.generate

    async def recording(prompt_ids, sampling, route_key=None):
        temperatures.append(sampling.temperature)
        return await generate_one(prompt_ids, sampling, route_key)

    monkeypatch.setattr(engine, "generate", recording)
    cfg = HFGeneratorConfig(
        agent="agents.cold", max_turns=4, max_generate_length=32, max_prompt_length=64,
        eval_n_samples_per_prompt=1, eval_sampling=SamplingConfig(temperature=0.0),
    )  # fmt: skip
    gen = make_generator(cfg, EnvironmentConfig(name="math"), engine, tiny_tokenizer)
    try:
        metrics, out = evaluate_prompts(gen, ROWS[:2], cfg, seed=3)
    finally:
        gen.driver.close()
    assert metrics["eval/env_errors"] == 0 and out.stop_reasons == ["length", "length"]
    assert out.metrics["agent/sampling_overrides"] == 0
    assert temperatures == [0.0, 0.0]  # 2 prompts x 1 sample x 1 request, at the eval's


def test_a_failing_agent_shows_in_the_eval_metrics(engine, tiny_tokenizer):
    from skyrl.rollouts.evaluation import evaluate_prompts

    cfg = HFGeneratorConfig(
        agent="agents.raises", max_turns=4, max_generate_length=32, max_prompt_length=64,
        eval_n_samples_per_prompt=2,
    )  # fmt: skip
    gen = make_generator(cfg, EnvironmentConfig(name="math"), engine, tiny_tokenizer)
    try:
        metrics, _ = evaluate_prompts(gen, ROWS[:2], cfg, seed=3)
    finally:
        gen.driver.close()
    # 2 prompts x 2 samples, each raising: 4 env errors, each a fail (reward 0)
    assert metrics["eval/env_errors"] == 4 and metrics["eval/pass@1"] == 0.0


@pytest.mark.parametrize(
    "source, says",
    [
        ("raise RuntimeError('boom')\n", "raised RuntimeError: boom"),
        ("def reward(row, messages)\n    return 1.0\n", "raised SyntaxError: "),
    ],
)
def test_a_reward_fn_module_that_fails_to_import_is_one_config_error(
    tmp_path, monkeypatch, source, says
):
    # before: the module's own RuntimeError / SyntaxError came out of the dry run as a
    # traceback wall instead of a line naming generator.agent_reward_fn
    from skyrl.config.errors import ConfigError
    from skyrl.serve.harness import reward_function

    (tmp_path / "broken_reward.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as raised:
        reward_function("broken_reward.reward")
    assert raised.value.key == "generator.agent_reward_fn"
    assert raised.value.message.startswith(f"importing 'broken_reward.reward' {says}")
