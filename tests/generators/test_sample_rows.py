"""Each sample of a prompt runs on its own copy of the prompt row: an env or agent that
writes to its row's ``extras`` cannot change what the prompt's other samples see."""

import asyncio

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators.agent_loop import AgentLoop, LoopSettings
from skyrl.inference.base import Completion, SamplingParams


class Replies:
    """An in-process engine that answers "7" at once."""

    def __init__(self, tok):
        self.ids = tok.encode("7") + [tok.eos_token_id]

    async def generate(self, prompt_ids, sampling, route_key=None):
        return Completion(list(self.ids), [-0.5] * len(self.ids), "stop")


class CountsVisits(TextEnv):
    """Appends to ``extras["visits"]`` at init (an env keeping per-episode notes in its
    extras) and rewards the number of visits it then sees: 1 on a row of its own."""

    def init(self, prompt, extras):
        extras.setdefault("visits", []).append("init")
        return super().init(prompt, extras)

    def step(self, action_text):
        return StepResult([], float(len(self.extras["visits"])), True)


def test_each_sample_of_a_prompt_inits_its_env_on_its_own_row(tok):
    # 3 samples of one row that shared its extras: the envs saw 1, 2 and 3 visits (rewards
    # 1, 2, 3) and the loader's row kept all three; each sees its own 1 now
    row = PromptRow("What is 6*7?", "toy", {"visits": []}, uid="p0")
    loop = AgentLoop(Replies(tok), tok, CountsVisits, LoopSettings(256, 64, 1, 10.0))
    trajectories = asyncio.run(loop.run([row], 3, SamplingParams()))
    assert sorted(t.reward for t in trajectories) == [1.0, 1.0, 1.0]
    assert row.extras == {"visits": []}
    assert [t.row.uid for t in trajectories] == ["p0", "p0", "p0"]
