"""What the agent loop tests share: an in-process engine replying one fixed text, envs with
two tool turns or faults, two prompt rows, and a generator over them."""

import threading
import time

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators import AgentLoop, Generator, LoopSettings
from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.local import LocalEngine


class FakeEngine(LocalEngine):
    """Replies ``text`` (+ EOS unless ``eos=False``), logprob -0.5 per token, to every request
    in the inbox at once; records each batch's size, seeds and serving thread."""

    def __init__(self, tok, text="ok 7", eos=True):
        super().__init__()
        self.ids = tok.encode(text) + ([tok.eos_token_id] if eos else [])
        self.calls: list[int] = []
        self.seeds: list[int | None] = []
        self.threads: list[int] = []

    def reply(self, sampling: SamplingParams) -> Completion:
        ids = self.ids[: sampling.max_tokens]
        reason = "length" if len(ids) < len(self.ids) else "stop"
        return Completion(ids, [-0.5] * len(ids), reason)

    def _serve_until(self, done):
        while not done.done():
            requests = self.take(block=True)
            if requests:
                self.calls.append(len(requests))
                self.threads.append(threading.get_ident())
            for r in requests:
                self.seeds.append(r.sampling.seed)
                r.resolve(self.reply(r.sampling))


class TwoToolTurns(TextEnv):
    """Observation after turns 1 and 2 (reward ``step_reward``), done with reward 1 on turn 3."""

    step_reward = 0.0

    def init(self, prompt, extras):
        self.t = 0
        return super().init(prompt, extras)

    def step(self, action_text):
        self.t += 1
        if self.t < 3:
            return StepResult(
                [{"role": "tool", "content": f"result {self.t}"}], self.step_reward, False
            )
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
    return Generator(AgentLoop(engine, tok, env_cls, settings), engine, step_wise=step_wise)
