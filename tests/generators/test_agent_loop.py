"""Agent loop: masks, step-wise rows, prefix invariant, budget, env faults, batching, engine
thread and errors, real engine."""

import asyncio
import threading
import time

import pytest
import torch
from agent_loop_helpers import ROWS, FakeEngine, Faulty, TwoToolTurns, make
from transformers import AutoTokenizer

from skyrl.data import arithmetic_rows
from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators import AgentLoop, Generator, LoopSettings, check_prefix, to_training_batch
from skyrl.inference.base import Completion, SamplingParams, request_seed
from skyrl.inference.local import run_serving
from skyrl.models import build_tiny_model


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


def test_context_is_the_template_rendering_when_eos_is_not_the_turn_end():
    """A Qwen2.5-base-like tokenizer (EOS ``<|endoftext|>``; turns end ``<|im_end|>\\n``) and
    an engine that stops on ``<|im_end|>``: every turn's context is the chat template's
    rendering of the conversation so far, token for token."""
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    tok.eos_token = "<|endoftext|>"
    engine = FakeEngine(tok, eos=False)
    engine.ids += [tok.convert_tokens_to_ids("<|im_end|>")]
    out = make(tok, engine, TwoToolTurns, True).generate(ROWS[:1], 1, SamplingParams())
    assert_contexts_are_the_templates(tok, out)


def test_a_reply_ended_on_eos_still_closes_its_turn_when_eos_is_not_the_turn_end():
    """Qwen2.5-base-like tokenizer, and the model samples its EOS ``<|endoftext|>``: the EOS
    is kept (it was sampled, and is trained) and ``<|im_end|>\\n`` still closes the turn, so
    each context is the template's rendering of replies "ok 7<|endoftext|>" (before, only
    "\\n" followed the EOS: no assistant turn was ever closed)."""
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    tok.eos_token = "<|endoftext|>"
    out = make(tok, FakeEngine(tok, eos=True), TwoToolTurns, True).generate(
        ROWS[:1], 1, SamplingParams()
    )
    assert out.response_token_ids == [tok.encode("ok 7") + [tok.eos_token_id]] * 3
    assert_contexts_are_the_templates(tok, out, reply="ok 7<|endoftext|>")


def assert_contexts_are_the_templates(tok, out, reply: str = "ok 7") -> None:
    """Each of the 3 turns' prompt is the chat template's rendering of the conversation so
    far (replies ``reply``, tool results "result 1", "result 2")."""
    messages = [{"role": "user", "content": ROWS[0].prompt}]
    for turn in range(3):
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert out.prompt_token_ids[turn] == tok.encode(want, add_special_tokens=False)
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "tool", "content": f"result {turn + 1}"},
        ]


class StopAwareEngine(FakeEngine):
    """Replies ``ok 7<|im_end|>`` then an invented next turn, cut at the first token in the
    engine's EOS or the request's ``stop_token_ids`` (as the hf and vLLM engines do); with no
    stop token met the whole reply comes back as ``length``. Records each finish reason."""

    def __init__(self, tok):
        super().__init__(tok, eos=False)
        self.eos_id = tok.eos_token_id
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        self.ids += [im_end] + tok.encode("\n<|im_start|>user\ninvented turn")
        self.finish_reasons: list[str] = []

    def reply(self, sampling: SamplingParams) -> Completion:
        stops = {self.eos_id, *sampling.stop_token_ids}
        cut = next((i + 1 for i, t in enumerate(self.ids) if t in stops), None)
        ids, reason = (self.ids, "length") if cut is None else (self.ids[:cut], "stop")
        self.finish_reasons.append(reason)
        return Completion(ids, [-0.5] * len(ids), reason)


def test_a_reply_stops_on_the_template_turn_end_when_eos_differs():
    """Qwen2.5-base-like tokenizer: EOS ``<|endoftext|>``, turns end ``<|im_end|>``. The loop
    asks the engine to stop on ``<|im_end|>`` too, so a sampled ``<|im_end|>`` ends the reply
    (finish ``stop``) instead of the model going on with an invented turn that is trained;
    the request's own stop ids are kept, and the contexts stay the template's rendering."""
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    tok.eos_token = "<|endoftext|>"
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id != im_end
    engine = StopAwareEngine(tok)
    sampling = SamplingParams(stop_token_ids=[7])
    out = make(tok, engine, TwoToolTurns, True).generate(ROWS[:1], 1, sampling)
    # 3 turns, each "ok 7" + <|im_end|>: 3 x "stop", nothing after the turn end
    assert engine.finish_reasons == ["stop"] * 3 and out.stop_reasons == ["stop"] * 3
    assert out.response_token_ids == [tok.encode("ok 7") + [im_end]] * 3
    assert sampling.stop_token_ids == [7]  # the caller's params are not mutated
    assert_contexts_are_the_templates(tok, out)


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


class NeverDone(TextEnv):
    """A multi-turn chat that only ``max_turns`` ends."""

    def step(self, action_text):
        return StepResult([{"role": "user", "content": "go on"}], 0.5, False)


@pytest.mark.parametrize("max_turns", [1, 2])
def test_a_cut_off_last_turn_is_length_even_at_max_turns(tok, max_turns):
    """Every reply is cut at ``max_tokens_per_turn``: ending on ``max_turns`` does not hide
    that the last reply is truncated, so the overlong filter masks the trajectory."""
    from skyrl.rollouts.dynamic_sampling import mask_truncated

    engine = FakeEngine(tok, text="a long reply " * 4)
    settings = LoopSettings(256, 64, max_turns, max_tokens_per_turn=5)
    out = Generator(AgentLoop(engine, tok, NeverDone, settings), engine).generate(
        ROWS[:1], 1, SamplingParams()
    )
    assert out.stop_reasons == ["length"]
    assert mask_truncated(out) == 1 and sum(out.loss_masks[0]) == 0


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


class SlowOnUid(TwoToolTurns):
    """``TwoToolTurns``, but each step of the prompt with uid ``slow`` takes 0.3 s."""

    def step(self, action_text):
        if self.extras.get("slow"):
            time.sleep(0.3)
        return super().step(action_text)


def test_a_slow_env_does_not_hold_back_other_trajectories(tok):
    """Continuous batching: each turn is its own request, so the fast trajectories' three
    turns are all done before the slow one's second turn is even dispatched (timestamps)."""
    engine = FakeEngine(tok)
    settings = LoopSettings(256, 64, 4, 10.0)
    loop = AgentLoop(engine, tok, SlowOnUid, settings)
    rows = [PromptRow("s", "toy", {"slow": True}, uid="slow")] + [
        PromptRow(f"f{i}", "toy", {}, uid=f"fast{i}") for i in range(3)
    ]
    trajs = run_serving(engine, loop.run(rows, 2, SamplingParams()))
    slow = [t for t in trajs if t.row.uid == "slow"]
    fast = [t for t in trajs if t.row.uid != "slow"]
    assert all(len(t.turns) == 3 for t in trajs)
    fast_done = max(t.turns[-1].finished_at for t in fast)
    assert fast_done < min(t.turns[1].dispatched_at for t in slow)
    for t in trajs:  # turns in order, each after the previous one finished
        for a, b in zip(t.turns, t.turns[1:], strict=False):
            assert a.dispatched_at <= a.finished_at <= b.dispatched_at


def test_request_seeds_depend_on_prompt_sample_and_turn(tok):
    engine = FakeEngine(tok)
    make(tok, engine, TwoToolTurns, True).generate(ROWS, 2, SamplingParams(seed=11))
    expected = {
        request_seed(11, uid, k, turn)
        for uid in ("p0", "p1")
        for k in range(2)
        for turn in range(3)
    }
    assert set(engine.seeds) == expected and len(expected) == 12  # no two requests share one
    again = FakeEngine(tok)
    make(tok, again, TwoToolTurns, True).generate(ROWS, 2, SamplingParams(seed=11))
    assert sorted(again.seeds) == sorted(engine.seeds)
    unseeded = FakeEngine(tok)
    make(tok, unseeded, TwoToolTurns, True).generate(ROWS, 2, SamplingParams())
    assert unseeded.seeds == [None] * 12


def test_turns_record_the_policy_version(tok):
    from skyrl.generators import VersionClock

    clock = VersionClock(current=3)
    engine = FakeEngine(tok)
    loop = AgentLoop(engine, tok, TwoToolTurns, LoopSettings(256, 64, 4), clock=clock)
    steps = Generator(loop, engine, step_wise=True).generate(ROWS, 1, SamplingParams())
    assert steps.policy_versions == [[(3, 3)]] * 6
    whole = Generator(loop, engine, step_wise=False).generate(ROWS, 1, SamplingParams())
    assert whole.policy_versions == [[(3, 3)] * 3] * 2
    batch = to_training_batch(whole)
    assert batch.metadata["policy_versions"] == [[(3, 3)] * 3] * 2


def test_engine_runs_on_the_calling_thread(tok):
    """In-process engines keep torch on the thread that owns its OpenMP team (local.py)."""
    engine = FakeEngine(tok)
    gen = make(tok, engine, TwoToolTurns, False)
    gen.generate(ROWS, 2, SamplingParams())
    assert engine.threads and set(engine.threads) == {threading.get_ident()}

    async def from_a_running_event_loop():  # Jupyter
        return gen.generate(ROWS, 1, SamplingParams())

    engine.threads.clear()
    assert len(asyncio.run(from_a_running_event_loop())) == 2
    assert engine.threads and set(engine.threads) == {threading.get_ident()}


def test_engine_error_reaches_the_caller(tok):
    class Broken(FakeEngine):
        def reply(self, sampling):
            raise RuntimeError("engine fell over")

    with pytest.raises(RuntimeError, match="engine fell over"):
        make(tok, Broken(tok), TwoToolTurns, False).generate(ROWS, 2, SamplingParams())


def test_generator_agent_names_the_driver(tok):
    from skyrl.generators import DRIVERS, driver_factory

    assert driver_factory("agent_loop") is DRIVERS["agent_loop"]
    assert driver_factory("skyrl.generators.agent_loop.AgentLoop.from_context") is not None
    with pytest.raises(ValueError, match="generator.agent: 'nope' is not a built-in driver"):
        driver_factory("nope")
    with pytest.raises(ValueError, match="does not import"):
        driver_factory("no.such.module.factory")


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


def test_the_environment_config_limits_the_env_calls(tok):
    # environment.max_concurrent_calls and max_hung_calls reach the loop's EnvThreads (their
    # behaviour: the hung/queued env call tests below)
    from skyrl.config.environment import EnvironmentConfig
    from skyrl.config.generator import HFGeneratorConfig
    from skyrl.generators import make_generator

    env_cfg = EnvironmentConfig(name="math", max_concurrent_calls=3, max_hung_calls=5)
    gen = make_generator(HFGeneratorConfig(), env_cfg, FakeEngine(tok), tok)
    threads = gen.driver.env_threads
    assert (threads.max_running, threads.max_stuck) == (3, 5)


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
    model = engine.engines[0].model
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


def rollout_without_async(client, row):
    """An external agent written without ``async``."""


NOT_CALLABLE = 3


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("rollout_without_async", "takes (client, row): an external agent must be `async def"),
        ("NOT_CALLABLE", "is not callable"),
    ],
)
def test_an_agent_that_is_neither_a_factory_nor_async_is_refused(name, fragment):
    # a plain `def rollout(client, row)` was taken for a driver factory and called with one
    # argument once Ray was up: a TypeError traceback
    from skyrl.generators import driver_factory

    with pytest.raises(ValueError, match="generator.agent: ") as info:
        driver_factory(f"{__name__}.{name}")
    assert fragment in str(info.value)
