"""Agent loop and training rows: env errors reported as what they were, whole-trajectory rows
that are the tokens the engine saw, a rollout driver's return checked, the engine's context
ending a trajectory, and a template that refuses the observations as one config error."""

import logging
import time

import pytest
from agent_loop_helpers import TwoToolTurns
from misbehaving_drivers import Misbehaving

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators import AgentLoop, Generator, LoopSettings
from skyrl.generators.generator import trajectories_to_output
from skyrl.generators.trajectory import Trajectory, Turn
from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.local import LocalEngine

ROW = PromptRow("What is 6*7?", "toy", {}, uid="p0")


class ReplyEngine(LocalEngine):
    """Replies "ok 7" + EOS, logprob -0.5 per token, to every request."""

    def __init__(self, tok):
        super().__init__()
        self.ids = tok.encode("ok 7") + [tok.eos_token_id]

    def _serve_until(self, done):
        while not done.done():
            for r in self.take(block=True):
                r.resolve(Completion(self.ids, [-0.5] * len(self.ids), "stop"))


class OwnTimeout(TextEnv):
    """Its tool server times out at once: ``step`` raises its own ``TimeoutError``."""

    def step(self, action_text):
        raise TimeoutError("the sandbox did not answer within 2 s")


class Done(TextEnv):
    def step(self, action_text):
        return StepResult([], 1.0, True)


class Slow(TextEnv):
    def step(self, action_text):
        time.sleep(1)
        return StepResult([], 1.0, True)


@pytest.mark.parametrize(
    ("env_cls", "logged"),
    [
        (OwnTimeout, "OwnTimeout.step: raised TimeoutError: the sandbox did not answer within 2 s"),
        (Slow, "Slow.step: ran past environment.timeout_s=0.2"),
    ],
)
def test_an_envs_own_timeout_is_not_reported_as_the_time_limit(tok, caplog, env_cls, logged):
    """An env whose own call (a socket, a sandbox client) raises ``TimeoutError`` at once was
    logged as "ran past environment.timeout_s=0.2", sending the user to a setting that has
    nothing to do with it; only a call the loop stopped waiting for is that."""
    engine = ReplyEngine(tok)
    settings = LoopSettings(256, 64, 2, env_timeout_s=0.2)
    gen = Generator(AgentLoop(engine, tok, env_cls, settings), engine)
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = gen.generate([ROW], 1, SamplingParams())
    assert out.stop_reasons == ["env_error"] and out.rewards == [0.0]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [f"{logged}; its trajectory ends with reward 0 (env_error)"]


def two_turns(appended: list[int], second_prompt: list[int], fork: str = "") -> Trajectory:
    """Turn 0: prompt [1, 2], reply [3, 4]; turn 1: ``second_prompt``, reply [7]."""
    first = Turn([1, 2], [3, 4], [-0.1, -0.2], "stop", appended_ids=appended)
    second = Turn(second_prompt, [7], [-0.3], "stop", fork=fork)
    return Trajectory(ROW, "p0/0", [first, second], 1.0, "stop")


def test_a_whole_trajectory_row_is_the_context_the_engine_saw():
    """Turn 1 was given [1, 2, 3, 4, 5, 6] (turn 0's prompt, reply and observation 5, 6): the
    row is [1, 2] + [3, 4, 5, 6, 7], mask 1 on the replies 3, 4 and 7 only."""
    out = trajectories_to_output([two_turns([5, 6], [1, 2, 3, 4, 5, 6])], step_wise=False)
    assert out.prompt_token_ids == [[1, 2]] and out.response_token_ids == [[3, 4, 5, 6, 7]]
    assert out.loss_masks == [[1, 1, 0, 0, 1]]
    assert out.rollout_logprobs == [[-0.1, -0.2, 0.0, 0.0, -0.3]]


@pytest.mark.parametrize(
    ("appended", "second_prompt", "at"),
    [
        ([], [1, 2, 3, 4, 5, 6], 4),  # the driver left appended_ids out: [1, 2, 3, 4, 7] trained
        ([5, 6], [1, 2, 3, 4, 5, 9], 5),  # the observation it recorded is not the one sent
        ([5, 6], [1, 2, 3, 4, 5, 6, 8], 6),  # the engine was given a token more
    ],
)
def test_a_turn_that_does_not_chain_is_refused_in_whole_trajectory_rows(
    appended, second_prompt, at
):
    """A rollout driver whose turn 1 was not given turn 0's prompt + response +
    ``appended_ids``, and that did not mark it a fork: the whole-trajectory row was built
    from the recorded pieces all the same, a sequence the engine never saw, trained
    silently (step-wise rows of the same turns are checked). Now it is refused, naming the
    trajectory, the turn and the first token that differs."""
    traj = two_turns(appended, second_prompt)
    with pytest.raises(ValueError) as info:
        trajectories_to_output([traj], step_wise=False)
    assert str(info.value) == (
        "trajectory 'p0/0': turn 1's prompt is not turn 0's prompt + response + appended_ids "
        f"(first difference at token {at}); a turn given another context must set Turn.fork"
    )
    forked = trajectories_to_output([two_turns(appended, second_prompt, "edited")], False)
    assert forked.prompt_token_ids == [[1, 2], second_prompt]  # a fork starts its own row


@pytest.mark.parametrize(
    ("how", "problem"),
    [
        ("one short", "returned 3 trajectories, not 2 prompts x 2 samples = 4"),
        ("sample-major", "returned prompt 'p1' as trajectory 1, where sample 1 of 'p0' belongs"),
        ("dicts", "returned a dict as trajectory 0, not a Trajectory"),
    ],
)
def test_a_driver_that_breaks_its_contract_is_named_by_generator_agent(tok, how, problem):
    """``RolloutDriver.run`` returns ``n_samples`` Trajectories per row in (row, sample)
    order. A driver named by ``generator.agent`` that returned fewer went on to a trainer
    error about mini-batch boundaries (or, step-wise, a silently smaller GRPO group); one in
    another order, to "uid re-appears after a gap"; dicts, to an AttributeError. Now the
    generator refuses it with a ``ConfigError`` naming ``generator.agent`` and what came back."""
    from skyrl.config.errors import ConfigError

    rows = [ROW, PromptRow("Hi", "toy", {}, uid="p1")]
    engine = ReplyEngine(tok)
    loop = AgentLoop(engine, tok, Done, LoopSettings(256, 64, 1))
    assert len(Generator(Misbehaving(loop, "as told"), engine).generate(rows, 2, SamplingParams()))
    with pytest.raises(ConfigError) as info:
        Generator(Misbehaving(loop, how), engine).generate(rows, 2, SamplingParams())
    assert info.value.key == "generator.agent"
    assert info.value.message == (
        f"the rollout driver {problem}: RolloutDriver.run returns n_samples Trajectory objects "
        "per row, in (row, sample) order"
    )


class SmallContextEngine(LocalEngine):
    """Replies "a long reply" x 4 + EOS; ends a reply where a context of ``context_len``
    tokens does (finish ``length``) and refuses a prompt that fills it, as the hf engine does
    with the model's ``max_position_embeddings`` (and vLLM with its ``max_model_len``)."""

    def __init__(self, tok, context_len: int):
        super().__init__()
        self.ids = tok.encode("a long reply " * 4) + [tok.eos_token_id]
        self.context_len = context_len

    def _serve_until(self, done):
        while not done.done():
            for r in self.take(block=True):
                room = self.context_len - len(r.prompt_ids)
                if room <= 0:
                    r.fail(ValueError(f"a prompt of {len(r.prompt_ids)} tokens fills the context"))
                    continue
                n = min(room, r.sampling.max_tokens)
                reason = "length" if n < len(self.ids) else "stop"
                r.resolve(Completion(self.ids[:n], [-0.5] * n, reason))


class TwoObservations(TwoToolTurns):
    """A tool result after turns 1 and 2 (reward 0.5 each), done with reward 1 on turn 3."""

    step_reward = 0.5


@pytest.mark.parametrize("step_wise", [False, True], ids=["whole", "step_wise"])
def test_a_reply_cut_by_the_engines_context_ends_the_trajectory_as_length(tok, step_wise):
    """The model's context (the hf engine's ``max_position_embeddings``) is smaller than
    generator.max_prompt_length + max_generate_length: turn 1 asks for 64 tokens and the
    engine ends the reply after the 10 its context of P + 10 leaves (finish ``length``,
    10 < 64). The loop went on, appended the tool result and sent a prompt of more than P + 10
    tokens, which the engine refuses: the whole run stopped with the engine's ValueError. Now
    the trajectory ends there, ``length`` (overlong filtering masks it), with the reward the
    env gave that reply (0.5)."""
    prompt = tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": ROW.prompt}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )
    engine = SmallContextEngine(tok, context_len=len(prompt) + 10)
    settings = LoopSettings(256, 64, 3)
    gen = Generator(AgentLoop(engine, tok, TwoObservations, settings), engine, step_wise)
    out = gen.generate([ROW], 1, SamplingParams())
    assert out.prompt_token_ids == [prompt]
    assert out.response_token_ids == [engine.ids[:10]] and out.loss_masks == [[1] * 10]
    assert out.stop_reasons == ["length"] and out.rewards == [0.5]
    assert out.metrics["generate/turns_mean"] == 1.0


def test_a_template_that_refuses_the_observations_stops_the_run_naming_max_turns(tok):
    """A Gemma-2 / Mistral-style template whose ``raise_exception`` refuses the env's tool
    role after a reply: a setup error (this model with this multi-turn env), raised from
    ``generate`` as jinja2's ``TemplateError``, which the CLI shows as a traceback. Now a
    ``ConfigError`` for ``generator.max_turns`` (like a template that re-renders past turns):
    one line naming the role refused, the template's own words and the way out."""
    import copy

    from skyrl.config.cli_errors import one_line_error
    from skyrl.config.errors import ConfigError

    strict = copy.deepcopy(tok)
    refuse = (
        "{% if message['role'] == 'tool' %}{{ raise_exception('roles must alternate') }}{% endif %}"
    )
    strict.chat_template = strict.chat_template.replace(
        "{%- for message in messages %}", "{%- for message in messages %}" + refuse, 1
    )
    assert refuse in strict.chat_template  # the template has the loop this edits
    engine = ReplyEngine(strict)
    loop = AgentLoop(engine, strict, TwoObservations, LoopSettings(256, 64, 3))
    with pytest.raises(ConfigError) as info:
        Generator(loop, engine).generate([ROW], 1, SamplingParams())
    assert one_line_error(info.value) == (
        "error: generator.max_turns: the chat template refuses the env's observations after a "
        "reply (roles: tool): roles must alternate; use max_turns=1, an env whose observations "
        "it renders, or a model whose chat template does"
    )
