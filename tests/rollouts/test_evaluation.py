"""``evaluate_prompts``: which base seed the eval samples draw from (tiny in-process hf engine)."""

from __future__ import annotations

import pytest

from skyrl.config.generator import GeneratorConfig, SamplingConfig
from skyrl.config.root import SkyRLConfig
from skyrl.config.trainer import TrainerConfig
from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.generators import AgentLoop, Generator, LoopSettings
from skyrl.generators.output import GeneratorOutput
from skyrl.inference.base import request_seed
from skyrl.inference.hf import HFEngine
from skyrl.models import build_tiny_model
from skyrl.rollouts.evaluation import evaluate_prompts, pass_at_k
from skyrl.rollouts.sync import base_seed
from skyrl.rollouts.sync import eval_seed as eval_base_seed

ROWS = [PromptRow("What is 12 + 7?", "s", {}), PromptRow("def add", "s", {})]


class OneTurn(TextEnv):
    def step(self, action_text):
        return StepResult([], 0.0, True)


@pytest.fixture(scope="module")
def generator_and_seeds():
    """A generator on the tiny random model, and the list each request's seed is added to."""
    engine = HFEngine(build_tiny_model())
    seeds: list[int | None] = []
    generate = engine.generate

    async def recording(prompt_ids, sampling, route_key=None):
        seeds.append(sampling.seed)
        return await generate(prompt_ids, sampling, route_key)

    engine.generate = recording  # type: ignore[method-assign]
    loop = AgentLoop(engine, engine.tokenizer, OneTurn, LoopSettings(128, 8, 1))
    return Generator(loop, engine), seeds


def _eval(generator_and_seeds, eval_seed: int | None, trainer_seed: int = 42):
    """The eval's responses and request seeds (2 prompts x 2 samples at T=1), called as the
    trainer and skyrl-eval call it: base seed ``skyrl.rollouts.sync.eval_seed(cfg)``."""
    generator, seeds = generator_and_seeds
    g = GeneratorConfig(
        max_generate_length=8,
        eval_n_samples_per_prompt=2,
        eval_sampling=SamplingConfig(temperature=1.0, seed=eval_seed),
    )
    cfg = SkyRLConfig(generator=g, trainer=TrainerConfig(seed=trainer_seed))
    seeds.clear()
    _, out = evaluate_prompts(generator, ROWS, cfg.generator, eval_base_seed(cfg))
    return out.response_token_ids, sorted(seeds), cfg


def _request_seeds(base: int) -> list[int]:
    """The seeds of rows eval0, eval1 x samples 0, 1 x turn 0 from base seed ``base``."""
    return sorted(request_seed(base, f"eval{i}", k, 0) for i in range(2) for k in range(2))


def test_eval_sampling_seed_is_the_eval_base_seed(generator_and_seeds):
    one, seeds_one, _ = _eval(generator_and_seeds, eval_seed=1)
    assert seeds_one == _request_seeds(1)  # the eval's own seed, not base_seed(...)
    two, seeds_two, _ = _eval(generator_and_seeds, eval_seed=2)
    assert seeds_two == _request_seeds(2)
    assert one != two  # other seed, other samples at T=1
    again, _, _ = _eval(generator_and_seeds, eval_seed=1, trainer_seed=7)
    assert again == one  # same eval seed, same samples, whatever trainer.seed is


def test_an_unset_eval_seed_derives_from_the_run_seed(generator_and_seeds):
    """Unchanged default: base_seed(cfg, 0, 0) = (42 * 1_000_003 + 0 + 0) % 2**31."""
    _, seeds, cfg = _eval(generator_and_seeds, eval_seed=None)
    assert base_seed(cfg, 0, 0) == 42 * 1_000_003 % 2**31
    assert seeds == _request_seeds(42 * 1_000_003 % 2**31)


def _output(groups: dict[str, list[float]]) -> GeneratorOutput:
    """One single-turn row per sample of each uid, all of source ``s``."""
    rows = [(uid, k, r) for uid, rewards in groups.items() for k, r in enumerate(rewards)]
    return GeneratorOutput(
        prompt_token_ids=[[1, 2] for _ in rows],
        response_token_ids=[[5] for _ in rows],
        loss_masks=[[1] for _ in rows],
        rollout_logprobs=[[0.0] for _ in rows],
        rewards=[r for *_, r in rows],
        uids=[u for u, *_ in rows],
        trajectory_ids=[f"{u}/{k}" for u, k, _ in rows],
        is_last_step=[True] * len(rows),
        data_sources=["s"] * len(rows),
        stop_reasons=["stop"] * len(rows),
        policy_versions=[[(0, 0)] for _ in rows],
    )


class _MutatingGenerator:
    """A generator whose env keeps state in its row's extras (one full-credit sample each)."""

    def generate(self, rows, n, sampling):
        for row in rows:
            row.extras["seen"].append(len(row.extras["seen"]))
        return _output({row.uid: [1.0] * n for row in rows})


def test_an_eval_pass_leaves_the_eval_rows_as_they_were():
    """The trainer evaluates the same rows every ``trainer.eval_interval`` steps: an env that
    mutates its row must not change what a later eval (or a resumed run's) starts from."""
    rows = [PromptRow("q", "s", {"seen": []})]
    cfg = GeneratorConfig(eval_n_samples_per_prompt=1)
    for _ in range(2):
        evaluate_prompts(_MutatingGenerator(), rows, cfg, seed=0)
    assert rows[0].extras == {"seen": []}


def test_pass_at_k_is_exact_for_small_counts():
    # 1 - C(2, 1) / C(3, 1) = 1 - 2/3 = 1/3; computed as 1 - 0.666... it was 0.33333333333333337
    assert pass_at_k(3, 1, 1) == 1 / 3
    # n = 10**6 samples, 1 correct, k = 1: c / n = 1e-6 exactly, not 1 - 0.999999
    assert pass_at_k(10**6, 1, 1) == 1e-6
    # C(6, 2) = 15, C(4, 2) = 6: 1 - 6/15 = 9/15 = 0.6
    assert pass_at_k(6, 2, 2) == 0.6
    assert pass_at_k(4, 3, 2) == 1.0  # n - c = 1 < k: every draw of 2 holds a pass
