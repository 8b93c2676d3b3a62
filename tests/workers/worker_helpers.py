"""Shared by the worker tests (CPU and GPU): a config builder, a fixed batch, and plain
transformers logprobs to compare against. Imports no Ray, so GPU machines without it can use it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_module
from transformers import AutoModelForCausalLM

from skyrl.algorithms.reductions import compute_loss_weights
from skyrl.batch import TrainingInputBatch, compute_prompt_mini_batch_boundaries
from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.dispatch import MeshDispatch

LR = 0.05
MAX_SEQ_LEN = 16  # max_prompt_length 4 + max_generate_length 12
LENGTHS = [16, 9, 13, 6]
PROMPT_LEN = 4


def make_config(model_path: str, **trainer):
    overrides = {
        "dp_size": 2, "zero_stage": 0, "train_batch_size": 2, "policy_mini_batch_size": 2,
        "collective_timeout_min": 1, "policy_optimizer.lr": LR, "policy_optimizer.eps": 1.0,
        "policy_optimizer.max_grad_norm": 0.0, **trainer,
    }  # fmt: skip
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"model.path={model_path}", "generator.n_samples_per_prompt=2",
                "generator.max_prompt_length=4", "generator.max_generate_length=12",
                *(f"trainer.{k}={v}" for k, v in overrides.items()),
            ],
        )  # fmt: skip
    return validate(cfg)


def row_logprobs(model, batch: TrainingInputBatch) -> torch.Tensor:
    """logprob of token t at t (0 at t=0) from a plain padded forward."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([lp.new_zeros(len(batch), 1), lp], 1) * batch.attention_mask


def make_batch(model_path: str, uids: list[str], lengths: list[int]) -> TrainingInputBatch:
    gen = torch.Generator().manual_seed(7)
    n = len(lengths)
    ids = torch.randint(3, 200, (n, MAX_SEQ_LEN), generator=gen)
    for i, uid in enumerate(uids):  # the samples of one prompt share it (trainer.share_prompts)
        ids[i, :PROMPT_LEN] = ids[uids.index(uid), :PROMPT_LEN]
    attention = torch.zeros(n, MAX_SEQ_LEN, dtype=torch.long)
    for i, length in enumerate(lengths):
        attention[i, :length] = 1
    loss_mask = attention.float()
    loss_mask[:, :PROMPT_LEN] = 0
    advantages = torch.randn(n, 1, generator=gen).expand(n, MAX_SEQ_LEN) * loss_mask
    batch = TrainingInputBatch(
        {
            "input_ids": ids * attention,
            "attention_mask": attention,
            "loss_mask": loss_mask,
            "advantages": advantages.contiguous(),
        },
        {"uids": uids, "is_last_step": [True] * n},
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        old = row_logprobs(model, batch)  # on-policy: ratio 1 at the first step
    return batch.replace(old_logprobs=old * loss_mask)


def packed_after_another_gap(model, ids: torch.Tensor) -> float:
    """How far the logits of the second half of ``ids`` (``[1, 2n]``) are, packed after the
    first half in one row (positions restart at 0, no attention mask), from its logits alone:
    0 (to rounding) when the model keeps packed sequences apart."""
    half = ids.shape[1] // 2
    positions = torch.cat([torch.arange(half), torch.arange(half)])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, half:]
        alone = model(input_ids=ids[:, half:], use_cache=False).logits[0]
    return (packed - alone).abs().max().item()


def assert_weights_close(actual: dict, expected: dict, atol: float):
    assert actual.keys() == expected.keys()
    worst = max((actual[k] - expected[k]).abs().max().item() for k in expected)
    assert worst <= atol, f"max weight difference {worst:.3g} > {atol}"


def run_script(script: str, *args: str) -> dict:
    """Run ``script`` (``python -c``) in a fresh interpreter in this folder (so it can import
    ``worker_helpers``) with ``args``; the JSON object its last stdout line prints."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def one_mini_batch_chunks(batch: TrainingInputBatch) -> list:
    """``batch`` as one mini-batch of all its prompts, staged for 2 ranks with ``token_mean``
    loss weights: the chunks ``WorkerGroup.train_mini_batch`` takes."""
    prompts = len(set(batch.metadata["uids"]))
    bounds = compute_prompt_mini_batch_boundaries(batch.metadata["uids"], prompts, prompts)
    (chunks,) = MeshDispatch.stage_chunks(
        2,
        batch,
        bounds,
        loss_weights_fn=lambda mb: compute_loss_weights(
            "token_mean", mb.loss_mask, mb.metadata["uids"], MAX_SEQ_LEN
        ),
    )
    return list(chunks)
