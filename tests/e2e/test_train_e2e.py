"""The real CLI trains the tiny model end to end: generate, score, logprobs, advantages,
prompt-unit mini-batches over 2 DeepSpeed ranks, weight sync, metrics, HF export."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl.models.tiny import build_tiny_model
from skyrl.tracking import metric_names as names
from skyrl.tracking.console import COLUMNS

pytestmark = pytest.mark.slow
SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")


def test_smoke_grpo_two_steps_changes_the_policy(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run(
        [
            SKYRL_TRAIN, "experiment=smoke", "hydra.run.dir=run",
            "environment._target_=parity_env.ParityEnv",
            "generator.n_samples_per_prompt=4", "generator.max_generate_length=8",
            "generator.sampling.seed=0",  # reproducible samples: rewards vary within each group
            "trainer.dump_rollouts=true", "trainer.eval_before_train=true",
            "trainer.weight_sync=broadcast",  # a gloo group from policy rank 0 to the engine
        ],  # fmt: skip
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [0, 1, 2]  # 0: eval before training
    assert "eval/pass@1" in records[0] and "eval/pass@1" in records[2]
    dumped = [
        json.loads(line)
        for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()
    ]
    assert len(dumped) == 8 and all(len(d["loss_mask"]) == len(d["response_ids"]) for d in dumped)
    # step 2 generated after one weight sync: policy version 1, dispatched and finished
    assert all(d["policy_versions"] == [[1, 1]] for d in dumped)
    assert (tmp_path / "run" / "metrics.png").stat().st_size > 0
    assert "training reward:" in result.stdout  # the end-of-run summary
    for r in records[1:]:
        # 2 prompts / 1 prompt per mini-batch x 1 epoch = 2 optimizer steps;
        # 2 prompts x 4 samples = 8 sequences trained once each
        assert r["policy/optimizer_steps"] == 2
        assert r["policy/pack/local_samples"] == 8
        assert r["policy/loss_tokens"] > 0
        assert r["policy/grad_norm"] >= 0
        # step 2 sampled after a sync: the engine had the trained weights (measured 8e-7;
        # with the sync switched off, 0.04)
        assert r["rollout/logprob_abs_diff"] < 1e-4
    # a group whose 4 parity rewards happen to be equal has zero advantage: some mini-batch
    # of the run must carry signal (the weights check below is the real test)
    assert any(r["policy/grad_norm"] > 0 for r in records[1:])
    assert "step 2/2" in result.stdout
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final_hf")
    initial = AutoModelForCausalLM.from_pretrained(build_tiny_model())
    # the exported config is the model's, not training's (which turns the KV cache off)
    assert trained.config.use_cache is True and initial.config.use_cache is True
    changed = [
        n
        for n, p in trained.named_parameters()
        if not torch.equal(p, dict(initial.named_parameters())[n])
    ]
    assert changed, "no parameter changed after two GRPO steps with non-constant rewards"


def test_a_recipes_sink_and_engine_backend_run_by_name(tmp_path):
    """tests/recipe_plugins.py registers the ``recording`` sink and the ``counting_hf`` engine
    (the hf engine counting its requests); the CLI selects both by name."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run(
        [
            SKYRL_TRAIN, "experiment=smoke", "hydra.run.dir=run", "imports=[recipe_plugins]",
            "trainer.loggers=[console,recording]", "generator.backend=counting_hf",
            "trainer.dp_size=1", "trainer.export_hf=false", "data.num_eval_prompts=0",
        ],  # fmt: skip
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    recorded = [
        json.loads(line) for line in (run / "recording_sink.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in recorded] == [1, 2]
    assert recorded == [
        json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(r["policy/optimizer_steps"] == 2 for r in recorded)
    # 2 steps x 2 prompts x 2 samples (smoke), one single-turn request each; no eval set
    assert "counting_hf engine served 8 requests" in result.stdout


@pytest.mark.parametrize(("backend", "mini_batch_size"), [("hf", 1), ("vllm", 1), ("hf", 2)])
def test_engine_and_trainer_logprobs_agree_at_temperature_0_7(tmp_path, backend, mini_batch_size):
    """One convention (skyrl.inference.base): both engines report tempered logprobs, as the
    trainer's forward computes them. Before it, T=0.7 measured 0.47 here (T=1: 1e-6).
    Smoke's 2 prompts in mini-batches of 1 run the separate old-logprob forward; in one
    mini-batch of 2 the step is on-policy and the training forward's logprobs are compared."""
    args = [
        SKYRL_TRAIN, "experiment=smoke", f"generator={backend}", "hydra.run.dir=run",
        "trainer.total_steps=1", "trainer.dp_size=1", "trainer.export_hf=false",
        "generator.sampling.temperature=0.7", "generator.max_generate_length=16",
        f"trainer.policy_mini_batch_size={mini_batch_size}",
    ]  # fmt: skip
    if backend == "vllm":
        args.append("generator.kv_cache_memory_bytes=16777216")
    result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    [record] = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    # 1.8e-6 here for hf (bit-identical over runs), 2.4e-6 for vllm; one CI run (2026-12-06,
    # fresh clone at d3dede6) measured 1.6e-4 for hf with mini-batches of 1, cause not found
    # (the other two cases of that run: 2.4e-6, 1.8e-6). The convention bug this guards: 0.47
    assert record[names.LOGPROB_ABS_DIFF] <= 1e-3
    if mini_batch_size == 1:
        assert "old logprobs: a separate forward (2 policy mini-batches per step)" in result.stdout
    else:
        assert "old logprobs: the training forward's own" in result.stdout


NOT_IN_FAKE_RUNS = {names.PHASE_TIMES["eval"]: "no eval set"}
"""Console keys a ``data=fake`` run without eval does not produce, and why."""


def test_fake_rollouts_drive_the_trainer_without_an_engine(tmp_path):
    result = subprocess.run(
        [
            SKYRL_TRAIN, "experiment=smoke", "data=fake", "hydra.run.dir=run",
            "trainer.export_hf=false", "algorithm.use_kl_loss=true",  # the console's kl column
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1, 2]
    # 2 prompts x 2 samples (smoke) = 4 sequences per step, 2 optimizer steps
    assert all(
        r["policy/pack/local_samples"] == 4 and r["policy/optimizer_steps"] == 2 for r in records
    )
    # every key the console line reads has a producer (the eval column needs an eval set)
    read = {key for key, _ in COLUMNS.values()} | {names.STEP_TIME, *names.PHASE_TIMES.values()}
    for r in records:
        assert read - r.keys() == set(NOT_IN_FAKE_RUNS), sorted(r)
    assert re.search(
        r"step 2/2 \| reward \S+ \| len \S+ \| kl \S+ \| loss \S+ \| gnorm \S+ \| ", result.stdout
    )


def test_tokenizer_path_hub_id_is_resolved_and_exported(tmp_path):
    """``model.tokenizer_path`` as a hub id, found offline in the HF cache, reaches the
    engine, the trainer and the HF export."""
    from transformers import AutoTokenizer

    commit = "0" * 40
    repo = tmp_path / "hf" / "models--org--tok"
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    tokenizer.model_max_length = 12345  # marks this copy apart from the model's own tokenizer
    tokenizer.save_pretrained(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [
            SKYRL_TRAIN, "experiment=smoke", "hydra.run.dir=run", "trainer.total_steps=1",
            "model.tokenizer_path=org/tok",
        ],  # fmt: skip
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    exported = AutoTokenizer.from_pretrained(tmp_path / "run" / "final_hf")
    assert exported.model_max_length == 12345


def shifted_ppo(*args):
    """PPO's loss + 123: registered by the test below in this process only (pytest imports
    this file as a top-level module that the workers cannot import)."""
    from skyrl.algorithms.policy_losses.ppo import ppo

    loss, metrics = ppo(*args)
    return loss + 123.0, metrics


def test_a_policy_loss_registered_only_in_the_driver_trains(ray_cluster, tmp_path, monkeypatch):
    """A loss registered where the run starts (a notebook, a script, here this test module)
    and not in ``imports``: validation accepted it, then the workers, looking the name up in
    their own registry, died with "unknown policy loss". The driver now hands them it."""
    import skyrl
    from skyrl.algorithms import POLICY_LOSSES

    POLICY_LOSSES.register("e2e_shifted_ppo", override=True)(shifted_ppo)
    monkeypatch.chdir(tmp_path)
    cfg = skyrl.compose(
        [
            "experiment=smoke",
            "data=fake",
            "trainer.dp_size=1",
            "trainer.total_steps=1",
            "trainer.export_hf=false",
            "algorithm.policy_loss=e2e_shifted_ppo",
        ]  # fmt: skip
    )
    result = skyrl.train(cfg, tmp_path / "run")
    # each mini-batch is one micro batch at dp 1: its loss is PPO's (|loss| <= ~2 here, the
    # advantages being normalised per group) + 123, and policy/loss their mean
    [(step, loss)] = result.metric("policy/loss")
    assert step == 1 and loss == pytest.approx(123.0, abs=5.0)
