"""Held-out evaluation metrics: pass@1 and pass@k per data source.

A sample passes when its reward is >= 1 (full credit). pass@k uses the
unbiased estimator over the ``n`` samples of a prompt with ``c`` passes:
``1 - C(n - c, k) / C(n, k)``, averaged over prompts.

``evaluate_prompts`` is the one evaluation pass: the trainer's (through
``SyncRollouts.evaluate``) and ``skyrl-eval``'s. A trajectory whose env (or external
agent) failed scores 0, a fail like any other; ``eval/env_errors`` counts them, so a pass@1
of 0 from a broken env or agent is not taken for the model's. A custom driver's
(``generator.agent``) reward that is NaN, inf or beyond float32's range (``REWARD_MAX``), which
would stop training (``RLTrainer._finite_rewards``), counts the same way here, with a warning
naming the trajectory, instead of making every pass@1 and reward_mean NaN.

Its rows carry uids ``eval<i>`` (``is_eval_row``): nothing trains on them, so an external
agent's eval sessions are not held to the training sampling (``skyrl.serve.backend``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import re
import time
from collections import defaultdict
from math import comb

from skyrl.config.generator import GeneratorConfig
from skyrl.data import PromptRow
from skyrl.generators.agent_loop import REWARD_MAX
from skyrl.generators.generator import Generator
from skyrl.generators.output import GeneratorOutput
from skyrl.inference.base import SamplingParams
from skyrl.tracking import metric_names as names

logger = logging.getLogger(__name__)

_EVAL_UID = re.compile(r"eval\d+")
"""The uid of an eval row (training rows': the dataloader's ``s<step>r<round>p<j>``)."""


def is_eval_row(row: PromptRow) -> bool:
    """Whether ``row`` is one of an eval pass's (``evaluate_prompts``), which trains nothing."""
    return _EVAL_UID.fullmatch(row.uid) is not None


def evaluate_prompts(
    generator: Generator, rows: list[PromptRow], cfg: GeneratorConfig, seed: int
) -> tuple[dict[str, float], GeneratorOutput]:
    """Roll out ``generator.eval_n_samples_per_prompt`` samples of every row with
    ``generator.eval_sampling`` from base seed ``seed`` (``skyrl.rollouts.sync.eval_seed``);
    the ``eval/...`` metrics
    (``eval/env_errors`` and ``eval/seconds`` included) and the rollouts. The rollouts run on
    deep copies of ``rows``: an env that mutates its row cannot change a later eval pass."""
    started = time.perf_counter()
    n = cfg.eval_n_samples_per_prompt
    sampling = SamplingParams.from_config(
        cfg.eval_sampling, n=n, max_tokens=cfg.max_generate_length
    )
    sampling.seed = seed
    rows = [dataclasses.replace(copy.deepcopy(r), uid=f"eval{i}") for i, r in enumerate(rows)]
    out = generator.generate(rows, n, sampling)
    refused = _refuse_bad_rewards(out, cfg.agent)
    metrics = eval_metrics(out, n)
    metrics[names.EVAL_ENV_ERRORS] = out.metrics.get(names.ENV_ERRORS, 0.0) + refused
    metrics[names.EVAL_SECONDS] = time.perf_counter() - started
    return metrics, out


def _refuse_bad_rewards(out: GeneratorOutput, agent: str) -> int:
    """Score 0 (stop reason ``env_error``) every trajectory whose reward is not finite or is
    beyond ``REWARD_MAX``, as the built-in loop does with such an env reward; how many."""
    bad = [
        i
        for i, (reward, last) in enumerate(zip(out.rewards, out.is_last_step, strict=True))
        if last and not (math.isfinite(reward) and abs(reward) <= REWARD_MAX)
    ]
    if bad:
        logger.warning(
            "eval: trajectory %r has reward %g from generator.agent=%s, not a finite reward "
            "within +-%.4g; scored 0 and counted in %s (%d of %d trajectories)",
            out.trajectory_ids[bad[0]], out.rewards[bad[0]], agent, REWARD_MAX,
            names.EVAL_ENV_ERRORS, len(bad), sum(out.is_last_step),
        )  # fmt: skip
    for i in bad:
        out.rewards[i] = 0.0
        out.stop_reasons[i] = "env_error"
    return len(bad)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` of the ``n`` samples (``c`` correct) passes."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    total = comb(n, k)
    return (total - comb(n - c, k)) / total  # exact difference: one rounding, not 1 - x


def eval_metrics(output: GeneratorOutput, k: int) -> dict[str, float]:
    """``eval/pass@1``, ``eval/pass@k`` (if k > 1), ``eval/reward_mean`` overall and per source
    (``eval/<source>/pass@1``...), from the last step of every trajectory."""
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    for uid, src, reward, last in zip(
        output.uids, output.data_sources, output.rewards, output.is_last_step, strict=True
    ):
        if last:
            samples[(src, uid)].append(reward)
    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for (src, _), rewards in samples.items():
        by_source[src].append(rewards)
    metrics: dict[str, float] = {}
    everything = [r for groups in by_source.values() for r in groups]
    for prefix, groups in [("eval", everything)] + [
        (f"eval/{src}", g) for src, g in sorted(by_source.items())
    ]:
        metrics.update(_group_metrics(prefix, groups, k))
    return metrics


def _group_metrics(prefix: str, groups: list[list[float]], k: int) -> dict[str, float]:
    def mean_pass(kk: int) -> float:
        return sum(pass_at_k(len(g), sum(r >= 1.0 for r in g), kk) for g in groups) / len(groups)

    out = {
        f"{prefix}/pass@1": mean_pass(1),
        f"{prefix}/reward_mean": sum(sum(g) for g in groups) / sum(len(g) for g in groups),
    }
    if k > 1:
        out[f"{prefix}/pass@{k}"] = mean_pass(k)
    return out
