"""Agent loop: the env threads (hung, slow or stuck env calls, constructors, closes),
malformed step results and observations, templates that refuse a role or re-render past
replies, and replies cut mid-trajectory."""

import asyncio
import copy
import threading
import time

import pytest
from agent_loop_helpers import ROWS, FakeEngine, TwoToolTurns, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators import AgentLoop, Generator, LoopSettings
from skyrl.inference.base import Completion, SamplingParams


class HangsFirst(TextEnv):
    """``step`` blocks on ``release`` for the first ``hangs`` calls (counted over all envs of
    the class), then returns reward 1; logs each hung step's return and each close."""

    hangs = 0
    release = threading.Event()
    started = 0
    lock = threading.Lock()
    log: list[tuple[str, int]] = []

    @classmethod
    def reset(cls, hangs: int) -> None:
        cls.hangs, cls.started, cls.log, cls.release = hangs, 0, [], threading.Event()

    def step(self, action_text):
        with self.lock:
            self.n, HangsFirst.started = HangsFirst.started, HangsFirst.started + 1
        if self.n < self.hangs:
            self.release.wait(30)  # stands for a step that never returns
            self.log.append(("step returned", self.n))
        return StepResult([], 1.0, True)

    def close(self):
        self.log.append(("close", getattr(self, "n", -1)))


def generate_or_hang(gen, rows, n, limit_s):
    """``gen.generate(rows, n)`` on a thread: its output, or "hangs" after ``limit_s``."""
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(out=gen.generate(rows, n, SamplingParams())), daemon=True
    )
    thread.start()
    thread.join(limit_s)
    return "hangs" if thread.is_alive() else result["out"]


def test_hung_env_steps_do_not_starve_later_env_calls(tok):
    """3 steps that never return (the first 3 calls) with room for 2 env calls at once: they
    end as env_error after 0.2 s, and the next batch's healthy trajectories all get their
    reward (the stuck threads held the pool's 2 threads for good: every later call queued
    behind them and ``generate`` never returned). A hung env is closed only after its step
    returns, never under it."""
    HangsFirst.reset(hangs=3)
    settings = LoopSettings(256, 64, 1, env_timeout_s=0.2, max_env_calls=2)
    engine = FakeEngine(tok)
    gen = Generator(AgentLoop(engine, tok, HangsFirst, settings), engine)
    try:
        bad = [PromptRow("x", "s", {}, uid=f"bad{i}") for i in range(3)]
        out = generate_or_hang(gen, bad, 1, 10)
        assert out != "hangs" and out.stop_reasons == ["env_error"] * 3
        assert HangsFirst.log == []  # the stuck steps' envs are not closed under them
        good = [PromptRow("y", "s", {}, uid=f"good{i}") for i in range(2)]
        out = generate_or_hang(gen, good, 2, 10)
        assert out != "hangs"
        assert out.stop_reasons == ["stop"] * 4 and out.rewards == [1.0] * 4
        assert sorted(HangsFirst.log) == [("close", n) for n in range(3, 7)]
    finally:
        HangsFirst.release.set()
    deadline = time.monotonic() + 5
    while len(HangsFirst.log) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    for n in range(3):  # each hung env is closed once, after its step returned
        mine = [event for event, k in HangsFirst.log if k == n]
        assert mine == ["step returned", "close"]


class SleepsBriefly(TextEnv):
    def step(self, action_text):
        time.sleep(0.3)
        return StepResult([], 1.0, True)


def test_time_queued_for_an_env_thread_does_not_count_against_the_limit(tok):
    """One env call at a time, 3 steps of 0.3 s each under a 0.5 s limit: each step is timed
    from its start, so all 3 finish (timed from the queue, the 2nd would wait 0.3 s and
    run 0.3 s: 0.6 s > 0.5 s, env_error)."""
    settings = LoopSettings(256, 64, 1, env_timeout_s=0.5, max_env_calls=1)
    engine = FakeEngine(tok)
    gen = Generator(AgentLoop(engine, tok, SleepsBriefly, settings), engine)
    out = gen.generate(
        [PromptRow("x", "s", {}, uid=f"p{i}") for i in range(3)], 1, SamplingParams()
    )
    assert out.stop_reasons == ["stop"] * 3 and out.rewards == [1.0] * 3


def test_too_many_stuck_env_calls_stop_the_run_with_a_clear_error(tok):
    """Stuck threads cannot be killed: past ``environment.max_hung_calls`` still running, the run
    stops with an error naming the limit instead of piling up threads."""
    from skyrl.generators.agent_loop import EnvHangError

    HangsFirst.reset(hangs=3)
    settings = LoopSettings(256, 64, 1, env_timeout_s=0.2, max_env_calls=4, max_hung_env_calls=2)
    engine = FakeEngine(tok)
    loop = AgentLoop(engine, tok, HangsFirst, settings)
    try:
        rows = [PromptRow("x", "s", {}, uid=f"bad{i}") for i in range(3)]
        with pytest.raises(
            EnvHangError,
            match=r"3 env calls .* environment.timeout_s=0.2 .* environment.max_hung_calls=2 may hang",
        ):
            Generator(loop, engine).generate(rows, 1, SamplingParams())
    finally:
        HangsFirst.release.set()


class Malformed(TextEnv):
    """Ends in one step with reward 1, unless the row's ``extras["bad"]`` names a malformed
    result: then a two-step episode whose first result is that one."""

    BAD = {
        "nan reward": lambda: StepResult([], float("nan"), True),
        "inf reward": lambda: StepResult([], float("-inf"), True),
        "None reward": lambda: StepResult([{"role": "user", "content": "again"}], None, False),
        "text reward": lambda: StepResult([], "1.0", True),
        "tuple": lambda: ([], 1.0, True),
        "int content": lambda: StepResult([{"role": "user", "content": 42}], 0.0, False),
        "one message": lambda: StepResult({"role": "user", "content": "hi"}, 0.0, False),
        "unknown role": lambda: StepResult([{"role": "wizard", "content": "hi"}], 0.0, False),
    }

    def step(self, action_text):
        bad = self.extras.get("bad")
        return self.BAD[bad]() if bad else StepResult([], 1.0, True)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("nan reward", "reward is nan, not a finite number"),
        ("inf reward", "reward is -inf, not a finite number"),
        ("None reward", "reward is None, not a number"),
        ("text reward", "reward is '1.0', not a number"),
        ("tuple", "returned a tuple, not a StepResult"),
        ("int content", "observations[0]['content'] is 42, not a string"),
        ("one message", "observations is a dict, not a list of messages"),
        # a template that renders any role (the tiny model's) took it; an external agent's
        # endpoint refuses it, and a prompt file's row with it is refused at load
        (
            "unknown role",
            "observations[0]['role'] is 'wizard', not one of system, user, assistant, tool",
        ),
    ],
)
def test_a_malformed_step_result_is_an_env_error_of_its_trajectory_alone(tok, caplog, bad, problem):
    """A NaN reward trained silently (every advantage of its GRPO group NaN); None, a tuple,
    a message whose content is not a string raised out of ``generate`` for every
    trajectory. Now that trajectory alone ends: reward 0, ``env_error``, one env error,
    logged once naming the env's class and the problem; the other trajectory carries on."""
    import logging

    rows = [PromptRow("a", "s", {}, uid="ok"), PromptRow("b", "s", {"bad": bad}, uid="bad")]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), Malformed, False).generate(rows, 2, SamplingParams())
    assert out.rewards == [1.0, 1.0, 0.0, 0.0]
    assert out.stop_reasons == ["stop", "stop", "env_error", "env_error"]
    assert out.metrics["env/errors"] == 2  # one per trajectory of the bad row
    assert out.metrics["generate/reward_mean"] == 0.5  # (1 + 1 + 0 + 0) / 4, not nan
    logged = [r.getMessage() for r in caplog.records if problem in r.getMessage()]
    assert len(logged) == 1, caplog.text  # the same problem twice: logged once
    assert logged[0].startswith(f"Malformed.step: {problem}")


def test_an_observation_the_template_cannot_render_is_an_env_error(tok):
    """The observation passes the check (string role and content) but the chat template
    fails on it (``tool_calls`` of an assistant message is iterated): that trajectory ends
    as an env error instead of ``generate`` raising."""

    class BadToolCalls(TextEnv):
        def step(self, action_text):
            if self.extras.get("bad"):
                message = {"role": "assistant", "content": "x", "tool_calls": 5}
                return StepResult([message], 0.0, False)
            return StepResult([], 1.0, True)

    rows = [PromptRow("a", "s", {}, uid="ok"), PromptRow("b", "s", {"bad": True}, uid="bad")]
    out = make(tok, FakeEngine(tok), BadToolCalls, False).generate(rows, 1, SamplingParams())
    assert out.rewards == [1.0, 0.0] and out.stop_reasons == ["stop", "env_error"]
    assert out.metrics["env/errors"] == 1


def test_a_template_that_refuses_a_role_stops_the_run(tok):
    """A template whose ``raise_exception`` refuses the tool role (Gemma-2 / Mistral style
    "roles must alternate") fails on every trajectory that calls a tool: a setup error, so
    ``generate`` raises it, as it did before observations became env errors; it must not end
    each of them as an env error with reward 0 and train the policy away from tools."""
    strict = copy.deepcopy(tok)
    refuse = (
        "{% if message['role'] == 'tool' %}{{ raise_exception('roles must alternate') }}{% endif %}"
    )
    strict.chat_template = strict.chat_template.replace(
        "{%- for message in messages %}", "{%- for message in messages %}" + refuse, 1
    )
    assert refuse in strict.chat_template  # the template has the loop this edits
    from skyrl.generators.chat import RefusedObservations  # a ConfigError: one CLI line

    with pytest.raises(RefusedObservations, match="roles must alternate"):
        make(strict, FakeEngine(strict), TwoToolTurns, False).generate(
            ROWS[:1], 1, SamplingParams()
        )


class BuiltTogether(TextEnv):
    """Its constructor waits until 4 are being built at once (a serial build would wait out the
    barrier's 5 s and raise); the 2nd one built raises."""

    barrier = threading.Barrier(4, timeout=5)
    count = 0
    lock = threading.Lock()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.lock:
            n, BuiltTogether.count = BuiltTogether.count, BuiltTogether.count + 1
        self.barrier.wait()
        if n == 1:
            raise ConnectionError("sandbox pool busy")

    def step(self, action_text):
        return StepResult([], 1.0, True)


def test_envs_are_built_on_env_threads_and_a_failing_constructor_is_an_env_error(tok, caplog):
    """The constructors ran on the event loop, outside the fault handling: 8 slow ones took
    8 times as long, and one that raised ended the whole ``generate``. Now they run on env
    threads at once, and a raising one ends its trajectory alone (reward 0, env_error,
    no turns)."""
    import logging

    BuiltTogether.count = 0
    rows = [PromptRow("a", "s", {}, uid="p0")]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), BuiltTogether, False).generate(rows, 4, SamplingParams())
    assert sorted(out.rewards) == [0.0, 1.0, 1.0, 1.0]
    assert sorted(out.stop_reasons) == ["env_error", "stop", "stop", "stop"]
    assert out.metrics["env/errors"] == 1 and BuiltTogether.count == 4
    assert "BuiltTogether(): raised ConnectionError: sandbox pool busy" in caplog.text


class HangsInConstructor(TextEnv):
    """Its constructor blocks on ``release``; each close is logged."""

    release = threading.Event()
    closed: list[str] = []

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.release.wait(30)  # stands for a constructor that never returns

    def step(self, action_text):
        return StepResult([], 1.0, True)

    def close(self):
        self.closed.append("closed")


def test_a_constructor_past_the_time_limit_is_an_env_error_and_its_env_closed_later(tok):
    HangsInConstructor.release, HangsInConstructor.closed = threading.Event(), []
    settings = LoopSettings(256, 64, 1, env_timeout_s=0.2)
    engine = FakeEngine(tok)
    gen = Generator(AgentLoop(engine, tok, HangsInConstructor, settings), engine)
    try:
        out = generate_or_hang(gen, [PromptRow("x", "s", {}, uid="p0")], 1, 10)
        assert out != "hangs" and out.stop_reasons == ["env_error"] and out.rewards == [0.0]
        assert HangsInConstructor.closed == []  # nothing built yet, nothing closed
    finally:
        HangsInConstructor.release.set()
    deadline = time.monotonic() + 5
    while not HangsInConstructor.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert HangsInConstructor.closed == ["closed"]  # the env built late is closed once


class ClosesSlowly(TextEnv):
    """Done after one step; ``close`` takes ``close_s`` (a sandbox being stopped) and is
    logged with the thread it ran on."""

    close_s = 1.0
    lock = threading.Lock()
    steps = 0
    closing = 0
    closed: list[str] = []

    @classmethod
    def reset(cls) -> None:
        cls.steps, cls.closing, cls.closed = 0, 0, []

    def step(self, action_text):
        with self.lock:
            ClosesSlowly.steps += 1
        return StepResult([], 1.0, True)

    def close(self):
        with self.lock:
            ClosesSlowly.closing += 1
        time.sleep(self.close_s)
        with self.lock:
            self.closed.append(threading.current_thread().name)


class AnswersAfter:
    """An in-process engine (no serving) that answers "7" after ``delay_s``; counts requests."""

    def __init__(self, tok, delay_s: float):
        self.ids, self.delay_s, self.requests = tok.encode("7") + [tok.eos_token_id], delay_s, 0

    async def generate(self, prompt_ids, sampling, route_key=None):
        self.requests += 1
        await asyncio.sleep(self.delay_s)
        return Completion(list(self.ids), [-0.5] * len(self.ids), "stop")


async def cancel_when(task: asyncio.Task, ready, limit_s: float = 10.0) -> None:
    """Cancel ``task`` once ``ready()``, and wait until it is done cancelling."""
    deadline = time.monotonic() + limit_s
    while not ready() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert ready(), "the trajectories did not get that far"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def wait_for_closes(expected: int, limit_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + limit_s
    while len(ClosesSlowly.closed) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return list(ClosesSlowly.closed)


def test_a_cancelled_trajectory_does_not_wait_for_its_env_to_close(tok):
    """3 trajectories cancelled while their requests are at the engine (an async run's
    shutdown), 1 env call at a time, each close 1 s. Each awaited its close: the cancel took
    until the first close was done (1 s; ``gather`` gives up at its first cancelled child),
    the other 2 closes went on queued for the slot (an async run's shutdown waited 3 x 1 s
    for them, and timed out with more) and were cancelled there when the loop ended: never
    closed. The closes are handed to threads and not waited for; every env is still closed,
    on an env thread."""
    ClosesSlowly.reset()
    settings = LoopSettings(256, 64, 1, env_timeout_s=10.0, max_env_calls=1)
    engine = AnswersAfter(tok, delay_s=1000.0)
    loop = AgentLoop(engine, tok, ClosesSlowly, settings)

    async def main() -> list[str]:
        task = asyncio.ensure_future(loop.run([ROWS[0]], 3, SamplingParams()))
        await cancel_when(task, lambda: engine.requests == 3)
        return list(ClosesSlowly.closed)

    # when the cancel was done no close had ended (each takes 1 s): it waited for none
    assert asyncio.run(main()) == []
    assert wait_for_closes(3) == ["skyrl-env"] * 3


def test_env_closes_queued_for_a_slot_still_run_when_cancelled(tok):
    """3 trajectories done at once, 1 env call at a time, each close 1 s: the first close
    runs, 2 wait for the slot when the run is cancelled. Those 2 were never closed (the
    cancel reached them in the queue); now they are, on threads of their own."""
    ClosesSlowly.reset()
    settings = LoopSettings(256, 64, 1, env_timeout_s=10.0, max_env_calls=1)
    loop = AgentLoop(AnswersAfter(tok, delay_s=0.0), tok, ClosesSlowly, settings)
    threads = loop.env_threads

    def queued() -> bool:  # every step done, the first close holds the slot, 2 wait for it
        waiting = len(threads._slots._waiters or ()) if threads._slots is not None else 0
        return ClosesSlowly.steps == 3 and ClosesSlowly.closing == 1 and waiting == 2

    async def main() -> list[str]:
        task = asyncio.ensure_future(loop.run([ROWS[0]], 3, SamplingParams()))
        await cancel_when(task, queued)
        return list(ClosesSlowly.closed)

    assert asyncio.run(main()) == []  # the cancel did not wait for the running close
    assert wait_for_closes(3) == ["skyrl-env"] * 3


@pytest.mark.parametrize("step_wise", [False, True], ids=["whole", "step_wise"])
def test_a_reply_cut_mid_trajectory_is_closed_masked_and_the_budget_ends_it(tok, step_wise):
    """``max_tokens_per_turn=6`` cuts every reply (the engine would say 34 tokens), the env
    wants 3 turns, ``max_generate_length=40``. Turn 1: 6 sampled + the template's whole turn
    end, the tool result and the next generation prompt (mask 0; the cut reply never sampled
    ``<|im_end|>``): 6 + G tokens. Turn 2: min(40 - (6 + G), 6) = 6 sampled, then its
    observation would bring the total to 2 * (6 + G) >= 40, so the trajectory stops on
    ``budget`` without it, with turn 2's step reward (0)."""
    engine = FakeEngine(tok, text="a long reply " * 4)
    cut = engine.ids[:6]
    settings = LoopSettings(256, 40, 4, max_tokens_per_turn=6)
    out = Generator(AgentLoop(engine, tok, TwoToolTurns, settings), engine, step_wise).generate(
        ROWS[:1], 1, SamplingParams()
    )
    glue = tok.encode(
        "<|im_end|>\n<|im_start|>tool\nresult 1<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    assert 40 - (6 + len(glue)) >= 6 and 2 * (6 + len(glue)) >= 40  # the arithmetic above
    prompt = tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": ROWS[0].prompt}],
            tokenize=False,
            add_generation_prompt=True,
        ),
        add_special_tokens=False,
    )
    assert set(out.stop_reasons) == {"budget"} and out.rewards[-1] == 0.0
    if step_wise:
        assert out.prompt_token_ids == [prompt, prompt + cut + glue]
        assert out.response_token_ids == [cut, cut]
        assert out.loss_masks == [[1] * 6, [1] * 6]
        assert out.rollout_logprobs == [[-0.5] * 6, [-0.5] * 6]
    else:
        assert out.prompt_token_ids == [prompt]
        assert out.response_token_ids == [cut + glue + cut]
        assert out.loss_masks == [[1] * 6 + [0] * len(glue) + [1] * 6]
        assert out.rollout_logprobs == [[-0.5] * 6 + [0.0] * len(glue) + [-0.5] * 6]
    assert out.metrics["generate/truncation_rate"] == 1.0


def test_a_template_that_re_renders_past_replies_stops_the_run_naming_max_turns(tok):
    """A Qwen3-style template renders the last assistant message with an empty ``<think>``
    block and earlier ones without: the second turn's context cannot extend the first one
    token for token. That is a setup error (this model with ``generator.max_turns`` > 1), so
    ``generate`` raises a ``ConfigError`` the CLI prints as one line naming the key, not a
    ValueError the CLI shows as a traceback."""
    from skyrl.config.cli_errors import one_line_error
    from skyrl.config.errors import ConfigError

    qwen3 = copy.deepcopy(tok)
    qwen3.chat_template = (
        "{%- for m in messages %}{%- if m.role == 'assistant' and loop.last %}"
        "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    with pytest.raises(ConfigError) as info:
        make(qwen3, FakeEngine(qwen3), TwoToolTurns, False).generate(ROWS[:1], 1, SamplingParams())
    assert info.value.key == "generator.max_turns"
    line = one_line_error(info.value)
    assert line.startswith("error: generator.max_turns: ") and "\n" not in line
    assert "re-renders earlier turns" in line and "max_turns=1" in line
