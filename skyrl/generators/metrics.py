"""Rollout metrics: lengths, turns, truncation, reward, pass@n per data source, env errors, speed.

``pass@n/<source>`` is the fraction of prompts with at least one sample whose
reward is >= 1 (full credit), over the ``n`` samples generated per prompt.
"""

from __future__ import annotations

from collections import defaultdict

from skyrl.tracking import metric_names as names


def rollout_metrics(trajs, n_samples: int, elapsed_s: float) -> dict[str, float]:
    if not trajs:
        return {}
    gen_lens = [sum(len(t.response_ids) for t in tr.turns) for tr in trajs]
    by_prompt: dict[tuple[str, str], list[float]] = defaultdict(list)
    for tr in trajs:
        by_prompt[(tr.row.data_source, tr.row.uid)].append(tr.reward)
    passes: dict[str, list[float]] = defaultdict(list)
    for (source, _), rewards in by_prompt.items():
        passes[source].append(float(max(rewards) >= 1.0))
    m = {
        names.RESPONSE_LENGTH: sum(gen_lens) / len(trajs),
        names.RESPONSE_LENGTH_MAX: float(max(gen_lens)),
        names.TURNS_MEAN: sum(len(t.turns) for t in trajs) / len(trajs),
        names.TRUNCATION_RATE: sum(
            t.stop_reason in ("length", "budget", "max_turns") for t in trajs
        )
        / len(trajs),
        names.REWARD: sum(t.reward for t in trajs) / len(trajs),
        names.ENV_ERRORS: float(sum(t.env_errors for t in trajs)),
        names.GENERATE_TOKENS_PER_S: sum(gen_lens) / max(elapsed_s, 1e-9),
        names.GENERATE_SECONDS: elapsed_s,
    }
    for source, vals in passes.items():
        m[f"{names.PASS_AT_PREFIX}{n_samples}/{source}"] = sum(vals) / len(vals)
    for tr in trajs:
        for key, value in tr.counts.items():
            m[key] = m.get(key, 0.0) + value
    return m
