"""``build_engine`` on one data-parallel rank: no gradient all-reduce, the same update.

Each case runs in a fresh interpreter: DeepSpeed initializes ``torch.distributed`` (gloo,
world size 1) for the whole process, which must not leak into the other tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl.config.trainer import OptimizerConfig, TrainerConfig
    from skyrl.workers.deepspeed_setup import build_engine
    from skyrl.workers.distributed import find_free_port, set_dist_env

    model_path, zero_stage = sys.argv[1], int(sys.argv[2])
    set_dist_env(0, 1, "127.0.0.1", find_free_port(), 1)
    def load():
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    torch.manual_seed(0)
    ids = torch.randint(0, load().config.vocab_size, (1, 24))

    opt_cfg = OptimizerConfig(lr=1e-2, eps=1.0, weight_decay=0.0, max_grad_norm=0.5)
    engine = build_engine(load(), TrainerConfig(zero_stage=zero_stage), opt_cfg, 10)
    calls = []
    reduce = engine.buffered_allreduce_fallback
    engine.buffered_allreduce_fallback = lambda *a, **k: (calls.append(1), reduce(*a, **k))[1]
    for part in (ids[:, :12], ids[:, 12:]):  # two micro batches, one optimizer step
        engine.backward(engine(input_ids=part, labels=part).loss, scale_wrt_gas=False)
    engine.step()

    # the same step in plain torch: AdamW, global-norm clipping at 0.5
    plain = load()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, eps=1.0, weight_decay=0.0)
    for part in (ids[:, :12], ids[:, 12:]):
        plain(input_ids=part, labels=part).loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
    opt.step()
    trained = dict(engine.module.named_parameters())
    diff = max(float((trained[k] - v).abs().max()) for k, v in plain.named_parameters())
    print(json.dumps({
        "allreduce_calls": len(calls),
        "enabled": engine.enable_backward_allreduce,
        "grad_norm": float(engine.get_global_grad_norm() or float("nan")),
        "plain_norm": float(norm),
        "max_weight_diff": diff,
    }))
    """
)


def run_case(model_path: str, zero_stage: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, model_path, str(zero_stage)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_one_rank_zero0_skips_the_allreduce_and_matches_torch(tiny_model_path):
    out = run_case(tiny_model_path, zero_stage=0)
    assert out["allreduce_calls"] == 0 and out["enabled"] is False
    # the update is plain torch's: AdamW after clipping the summed gradients to norm 0.5
    assert out["grad_norm"] == pytest.approx(out["plain_norm"], rel=1e-5)
    assert out["plain_norm"] > 0.5  # so the clipping did act
    assert out["max_weight_diff"] < 1e-6


def test_zero1_keeps_the_reduction(tiny_model_path):
    """At ZeRO 1 the reduction also hands the gradients to the optimizer: it stays on."""
    out = run_case(tiny_model_path, zero_stage=1)
    assert out["enabled"] is True
    assert out["max_weight_diff"] < 1e-6
