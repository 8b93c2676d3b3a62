"""Agent loop: masks, step-wise rows, prefix invariant, budget, env faults, batching, engine
thread and errors, real engine."""

import asyncio
import threading
import time

import pytest
import torch
from transformers import AutoTokenizer

from skyrl.data import arithmetic_rows
from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators import AgentLoop, Generator, LoopSettings, check_prefix, to_training_batch
from skyrl.inference.base import Completion, SamplingParams
from skyrl.models import build_tiny_model


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


class FakeEngine:
    """Replies ``text`` (+ EOS unless ``eos=False``), logprob -0.5 per token; counts calls."""

    def __init__(self, tok, text="ok 7", eos=True):
        self.ids = tok.encode(text) + ([tok.eos_token_id] if eos else [])
        self.calls = []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        out = []
        for sp in sampling:
            ids = self.ids[: sp.max_tokens]
            reason = "length" if len(ids) < len(self.ids) else "stop"
            out.append([Completion(ids, [-0.5] * len(ids), reason)])
        return out


class TwoToolTurns(TextEnv):
    """Observation after turns 1 and 2, done with reward 1 on turn 3."""

    def init(self, prompt, extras):
        self.t = 0
        return super().init(prompt, extras)

    def step(self, action_text):
        self.t += 1
        if self.t < 3:
            return StepResult([{"role": "tool", "content": f"result {self.t}"}], 0.0, False)
        return StepResult([], 1.0, True)


class Faulty(TextEnv):
    def step(self, action_text):
        if self.extras["mode"] == "raise":
            raise RuntimeError("reward fn crashed")
        if self.extras["mode"] == "slow":
            time.sleep(2)
        return StepResult([], 1.0, True)


ROWS = [PromptRow("What is 6*7?", "toy", {}, uid="p0"), PromptRow("Hi", "toy2", {}, uid="p1")]


def make(tok, engine, env_cls, step_wise, max_turns=4, max_gen=64, timeout=10.0):
    settings = LoopSettings(256, max_gen, max_turns, timeout)
    return Generator(AgentLoop(engine, tok, env_cls, settings), step_wise=step_wise)


@pytest.mark.parametrize("eos", [True, False])
def test_step_wise_and_whole_trajectory_agree(tok, eos):
    whole = make(tok, FakeEngine(tok, eos=eos), TwoToolTurns, False).generate(
        ROWS, 2, SamplingParams()
    )
    steps = make(tok, FakeEngine(tok, eos=eos), TwoToolTurns, True).generate(
        ROWS, 2, SamplingParams()
    )
    assert len(whole) == 4 and len(steps) == 12  # 2 prompts x 2 samples x 3 turns
    assert steps.uids == ["p0"] * 6 + ["p1"] * 6
    assert steps.trajectory_ids[:6] == ["p0/0"] * 3 + ["p0/1"] * 3
    assert steps.is_last_step == [False, False, True] * 4
    assert steps.rewards == [0.0, 0.0, 1.0] * 4 and whole.rewards == [1.0] * 4
    reply = FakeEngine(tok, eos=eos).ids
    for i in range(4):
        last = 3 * i + 2
        # whole row == last step's full context, with the same first prompt
        assert whole.prompt_token_ids[i] == steps.prompt_token_ids[3 * i]
        assert (
            whole.prompt_token_ids[i] + whole.response_token_ids[i]
            == steps.prompt_token_ids[last] + steps.response_token_ids[last]
        )
        # mask 1 exactly on the 3 sampled replies; observations / template / added EOS are 0
        mask, resp = whole.loss_masks[i], whole.response_token_ids[i]
        assert sum(mask) == 3 * len(reply)
        assert [t for t, m in zip(resp, mask, strict=True) if m] == reply * 3
        assert [lp for lp in whole.rollout_logprobs[i] if lp] == [-0.5] * (3 * len(reply))
        obs = tok.decode([t for t, m in zip(resp, mask, strict=True) if not m])
        assert "result 1" in obs and "result 2" in obs and obs.count("<|im_start|>assistant") == 2
        assert obs.count("<|im_end|>") == (4 if not eos else 2)  # EOS appended when missing
    assert all(m == [1] * len(reply) for m in steps.loss_masks)
    assert whole.metrics["generate/turns_mean"] == 3.0
    assert whole.metrics["generate/pass@2/toy"] == 1.0 and whole.metrics["env/errors"] == 0


def test_training_batch_alignment(tok):
    out = make(tok, FakeEngine(tok), TwoToolTurns, True).generate(ROWS[:1], 2, SamplingParams())
    batch = to_training_batch(out, pad_token_id=tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 6
    for i in range(6):
        p, r = len(out.prompt_token_ids[i]), len(out.response_token_ids[i])
        assert batch["attention_mask"][i].sum() == p + r
        assert batch["loss_mask"][i, :p].sum() == 0 and batch["loss_mask"][i, p : p + r].sum() == r
        assert batch["input_ids"][i, p : p + r].tolist() == out.response_token_ids[i]
        assert torch.all(batch["rollout_logprobs"][i, p : p + r] == -0.5)
    assert batch.metadata["is_last_step"] == out.is_last_step
    assert batch["rewards"].tolist() == [0, 0, 1, 0, 0, 1]


def test_budget_truncates_and_marks(tok):
    engine = FakeEngine(tok, text="a long reply " * 4)
    out = make(tok, engine, TwoToolTurns, True, max_gen=30).generate(ROWS[:1], 1, SamplingParams())
    total = sum(len(r) for r in out.response_token_ids)
    assert out.stop_reasons[-1] in ("budget", "length")
    assert out.metrics["generate/truncation_rate"] == 1.0
    whole = make(tok, FakeEngine(tok, text="a long reply " * 4), TwoToolTurns, False, max_gen=30)
    w = whole.generate(ROWS[:1], 1, SamplingParams())
    assert len(w.response_token_ids[0]) <= 30 and total <= 30


def test_max_turns_stops(tok):
    out = make(tok, FakeEngine(tok), TwoToolTurns, True, max_turns=2).generate(
        ROWS[:1], 1, SamplingParams()
    )
    assert len(out) == 2 and out.stop_reasons == ["max_turns"] * 2 and out.rewards == [0.0, 0.0]


def test_env_faults_give_zero_reward_and_count(tok):
    rows = [
        PromptRow("a", "s", {"mode": "ok"}, uid="ok"),
        PromptRow("b", "s", {"mode": "raise"}, uid="bad"),
        PromptRow("c", "s", {"mode": "slow"}, uid="slow"),
    ]
    gen = make(tok, FakeEngine(tok), Faulty, False, timeout=0.5)
    out = gen.generate(rows, 1, SamplingParams())
    assert out.rewards == [1.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "env_error", "env_error"]
    assert out.metrics["env/errors"] == 2


def test_lockstep_turns_batch_into_one_engine_call(tok):
    engine = FakeEngine(tok)
    make(tok, engine, TwoToolTurns, True).generate(ROWS, 4, SamplingParams())
    assert engine.calls == [8, 8, 8]


def test_engine_runs_on_the_calling_thread(tok):
    """In-process engines keep torch on the thread that owns its OpenMP team (batcher.py)."""
    threads = []

    class Recording(FakeEngine):
        def generate(self, prompts, sampling):
            threads.append(threading.get_ident())
            return super().generate(prompts, sampling)

    gen = make(tok, Recording(tok), TwoToolTurns, False)
    gen.generate(ROWS, 2, SamplingParams())
    assert threads == [threading.get_ident()] * 3

    async def from_a_running_event_loop():  # Jupyter
        return gen.generate(ROWS, 1, SamplingParams())

    threads.clear()
    assert len(asyncio.run(from_a_running_event_loop())) == 2
    assert threads == [threading.get_ident()] * 3


def test_engine_error_reaches_the_caller(tok):
    class Broken(FakeEngine):
        def generate(self, prompts, sampling):
            raise RuntimeError("engine fell over")

    with pytest.raises(RuntimeError, match="engine fell over"):
        make(tok, Broken(tok), TwoToolTurns, False).generate(ROWS, 2, SamplingParams())


def test_prefix_violation_names_turn(tok):
    check_prefix([1, 2, 3], [1, 2, 3, 4], "p/0", 1)
    with pytest.raises(
        ValueError, match=r"'p/0': turn 2's prompt does not extend turn 1's .* token 1"
    ):
        check_prefix([1, 2, 3], [1, 9, 3, 4], "p/0", 2)
    out = make(tok, FakeEngine(tok), TwoToolTurns, True).generate(ROWS[:1], 1, SamplingParams())
    out.prompt_token_ids[2] = [0] + out.prompt_token_ids[2]
    with pytest.raises(ValueError, match="turn 2"):
        out.validate()
    out = make(tok, FakeEngine(tok), TwoToolTurns, True).generate(ROWS[:1], 1, SamplingParams())
    out.is_last_step[0] = True
    with pytest.raises(ValueError, match="row 0: is_last_step"):
        out.validate()


def test_real_hf_engine_single_turn_math(tok):
    from skyrl.config.environment import EnvironmentConfig
    from skyrl.config.generator import HFGeneratorConfig
    from skyrl.generators import make_generator
    from skyrl.inference import make_engine

    path = build_tiny_model()
    cfg = HFGeneratorConfig(max_generate_length=16, n_samples_per_prompt=2)
    engine = make_engine(cfg, path)
    gen = make_generator(cfg, EnvironmentConfig(name="math"), engine, tok)
    rows = arithmetic_rows(3, seed=0)
    sp = SamplingParams.from_config(cfg.sampling, n=1, max_tokens=16)
    out = gen.generate(rows, cfg.n_samples_per_prompt, sp)
    assert len(out) == 6 and all(0 < len(r) <= 16 for r in out.response_token_ids)
    # rollout logprobs are the engine's: recompute with a forward
    model = engine.model
    for p, r, lps in zip(
        out.prompt_token_ids, out.response_token_ids, out.rollout_logprobs, strict=True
    ):
        with torch.no_grad():
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(lps), ref, atol=1e-4, rtol=0)
    for key in ("generate/tokens_per_s", "generate/reward_mean", "generate/pass@2/arithmetic"):
        assert key in out.metrics
    batch = to_training_batch(out, tok.pad_token_id)
    assert batch["loss_mask"].sum() == sum(len(r) for r in out.response_token_ids)
