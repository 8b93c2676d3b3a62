"""Random rollouts in the generator's output layout, for ``data=fake``: the trainer path
(reference/critic forward, advantages, policy/critic training, weight sync) can be run
and benchmarked without an inference engine.

Rows look like ``skyrl.generators.output.to_training_batch`` output: right-padded to the
longest row, ``loss_mask`` 1 on the response, ``rewards`` (0/1) on each trajectory's last
row, ``uids`` = ``p<i>``, ``trajectory_ids`` = ``<uid>/<sample>``, and ``rollout_logprobs``
on the response as an engine reports its sampler's: ``-log(vocab_size)``, each response
token's log-probability under the distribution it was drawn from (uniform over the
vocabulary), so ``rollout/logprob_abs_diff``, ``algorithm.tis_cap`` and
``algorithm.seq_ratio_bounds`` compare the policy with that sampler. Response lengths are
log-normal (long-tailed, like real RL rollouts), which is what makes packing matter.
Everything is drawn from one ``numpy`` generator, so a seed gives the same batch on every
machine.

Step-wise (``step_wise=True``): each trajectory has 1..``max_turns`` turns, one row per
turn; turn ``t``'s prompt is turn ``t-1``'s prompt + response + an observation, as a
real multi-turn generator produces. A trajectory ends early when the next turn would
not fit in ``max_seq_len``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from skyrl.batch import TrainingInputBatch


def fake_rollouts(
    num_prompts: int,
    n_samples_per_prompt: int,
    vocab_size: int,
    prompt_len: tuple[int, int] = (16, 64),
    response_len_mean: float = 128.0,
    response_len_sigma: float = 1.0,
    max_seq_len: int = 512,
    seed: int = 0,
    step_wise: bool = False,
    max_turns: int = 1,
) -> TrainingInputBatch:
    """``num_prompts * n_samples_per_prompt`` random trajectories (more rows when step-wise).

    ``prompt_len``: inclusive range of prompt (and observation) lengths, tokens.
    ``response_len_mean`` / ``response_len_sigma``: mean (tokens) and log-space sigma of
    the log-normal response length, clipped to ``[1, max_seq_len - prompt]``.
    """
    lo, hi = prompt_len
    if not 1 <= lo <= hi or hi >= max_seq_len:
        raise ValueError(f"prompt_len {prompt_len} must satisfy 1 <= lo <= hi < max_seq_len")
    if step_wise and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    rng = np.random.default_rng(seed)
    mu = math.log(response_len_mean) - response_len_sigma**2 / 2  # so E[length] = mean
    turns_max = max_turns if step_wise else 1

    rows: list[tuple[np.ndarray, int]] = []  # (token ids, prompt length)
    uids, trajectory_ids, is_last, rewards = [], [], [], []
    for p in range(num_prompts):
        prompt = rng.integers(0, vocab_size, rng.integers(lo, hi + 1))
        for s in range(n_samples_per_prompt):
            context, num_turns = prompt, int(rng.integers(1, turns_max + 1))
            reward = float(rng.integers(0, 2))
            for turn in range(num_turns):
                room = max_seq_len - len(context)
                length = int(np.clip(round(rng.lognormal(mu, response_len_sigma)), 1, room))
                seq = np.concatenate([context, rng.integers(0, vocab_size, length)])
                rows.append((seq, len(context)))
                obs = rng.integers(0, vocab_size, rng.integers(lo, hi + 1))
                last = turn + 1 == num_turns or len(seq) + len(obs) >= max_seq_len
                uids.append(f"p{p}")
                trajectory_ids.append(f"p{p}/{s}")
                is_last.append(last)
                rewards.append(reward if last else 0.0)
                if last:
                    break
                context = np.concatenate([seq, obs])
    return _to_batch(rows, uids, trajectory_ids, is_last, rewards, vocab_size)


def _to_batch(rows, uids, trajectory_ids, is_last, rewards, vocab_size) -> TrainingInputBatch:
    """Right-padded ``[B, S]`` tensors, ``S`` = the longest row."""
    b, s = len(rows), max(len(seq) for seq, _ in rows)
    input_ids = np.zeros((b, s), dtype=np.int64)
    attention = np.zeros((b, s), dtype=np.int64)
    loss_mask = np.zeros((b, s), dtype=np.float32)
    for i, (seq, prompt) in enumerate(rows):
        input_ids[i, : len(seq)] = seq
        attention[i, : len(seq)] = 1
        loss_mask[i, prompt : len(seq)] = 1.0
    # each response token was drawn uniformly: its sampling logprob is -log(vocab_size)
    logprobs = np.float32(-math.log(vocab_size)) * loss_mask
    return TrainingInputBatch(
        {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention),
            "loss_mask": torch.from_numpy(loss_mask),
            "rollout_logprobs": torch.from_numpy(logprobs),
            "rewards": torch.tensor(rewards, dtype=torch.float32),
        },
        {
            "uids": uids,
            "trajectory_ids": trajectory_ids,
            "is_last_step": is_last,
            "data_sources": ["fake"] * b,
        },
    )
