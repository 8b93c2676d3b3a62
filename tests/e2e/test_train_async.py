"""Asynchronous training through the real CLI (tiny model, the engine in a Ray actor of its
own, one DeepSpeed rank): the staleness bound in every step, rewards that rise, kill -9 and
resume, and a weight sync that times out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_robustness import cli, kill_9_after_checkpoint, records

pytestmark = pytest.mark.slow
ASYNC = [
    "experiment=smoke", "hydra.run.dir=run", "trainer.max_staleness=1",
    "generator.num_cpus_per_engine=1", "trainer.dp_size=1", "generator.sampling.seed=0",
    "generator.n_samples_per_prompt=4", "generator.max_generate_length=8",
]  # fmt: skip


def consumed_uids(run: Path, steps: int) -> list[str]:
    """The prompt uids each step trained on (``trainer.dump_rollouts``), in step order."""
    out = []
    for step in range(1, steps + 1):
        rows = (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        out += sorted({json.loads(r)["uid"] for r in rows})
    return out


def test_async_run_keeps_the_bound_and_rewards_rise(tmp_path):
    result = cli(
        tmp_path, *ASYNC, "environment._target_=parity_env.VowelEnv", "trainer.total_steps=20",
        "trainer.train_batch_size=4", "trainer.policy_mini_batch_size=2",
        "trainer.policy_optimizer.lr=3e-3", "data.num_train_prompts=32", "data.num_eval_prompts=0",
        "trainer.export_hf=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    steps = records(tmp_path)
    assert [r["step"] for r in steps] == list(range(1, 21))
    for r in steps:
        assert r["async/staleness_max"] <= 1  # the bound, in every step
        assert r["async/stale_groups"] == 0 and r["async/mixed_version_turns"] == 0
    # step 1 trains on version-0 rollouts; later batches were generated while the previous
    # step trained, one version behind
    assert [r["async/staleness_max"] for r in steps][:3] == [0, 1, 1]
    rewards = [r["generate/reward_mean"] for r in steps]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.1, rewards


def test_async_kill_9_then_resume_trains_on_the_same_prompts(tmp_path):
    args = [
        *ASYNC, "environment._target_=parity_env.ParityEnv", "trainer.total_steps=4",
        "trainer.ckpt_interval=1", "trainer.export_hf=false", "trainer.dump_rollouts=true",
        "data.num_eval_prompts=0",
    ]  # fmt: skip
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    result = cli(straight, *args)
    assert result.returncode == 0, result.stderr[-3000:]

    kill_9_after_checkpoint(killed, args, step=2)  # groups of steps 3 and 4 in flight
    result = cli(killed, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stdout and "global_step_2" in result.stdout
    assert [r["step"] for r in records(killed)] == [1, 2, 3, 4]
    want = consumed_uids(straight / "run", 4)
    got = consumed_uids(killed / "run", 4)
    assert len(set(want)) == len(want) == 4 * 2  # 4 steps x 2 prompts, none twice
    assert got == want  # no prompt trained twice, none skipped
    resumed = [r for r in records(killed) if r["step"] > 2]
    assert all(r["async/staleness_max"] <= 1 for r in resumed)


def test_a_weight_sync_timeout_ends_the_run_with_one_line(tmp_path):
    result = cli(
        tmp_path, *ASYNC, "+imports=[faults]", "generator.backend=slow_sync_hf",
        "environment._target_=parity_env.ParityEnv", "trainer.total_steps=4",
        "trainer.ckpt_interval=1", "trainer.weight_sync_timeout_s=3", "trainer.export_hf=false",
        "data.num_eval_prompts=0",
        env={"HANG_SYNC_FROM": "2", "HANG_SYNC_S": "20"},  # step 2's sync stalls
    )  # fmt: skip
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: weight sync to policy version 2 did not finish within "
        "trainer.weight_sync_timeout_s=3: still waiting for the inference engines to load"
    ), last
    # async over shared memory: the engine loads step 2's weights in the background, so
    # step 2 saves its checkpoint and step 3 (its next batch or its own sync) finds the stall
    checkpoint = tmp_path / "run" / "checkpoints" / "global_step_2"
    assert last.endswith(f"stopped at step 3; last checkpoint: {checkpoint}"), last
    assert "Traceback" not in result.stderr
    # the last checkpoint stays loadable
    from skyrl.trainer.checkpoint import policy_state_dict

    state = policy_state_dict(checkpoint)
    assert state and all(v.isfinite().all() for v in state.values())


@pytest.mark.parametrize(
    "case",
    [
        ["algorithm=ppo", "trainer.critic_only_steps=1"],  # GAE with a critic
        ["algorithm=dapo", "algorithm.overlong_buffer_len=4"],  # the stream filter + shaping
        [
            "environment=tools", "environment._target_=faults.ScriptedToolEnv",
            "generator.step_wise=true", "generator.max_turns=3",
            "generator.max_prompt_length=256", "generator.max_generate_length=96",
            "generator.max_tokens_per_turn=8",
        ],  # step-wise multi-turn
        ["generator=vllm", "trainer.dp_size=2", "algorithm=rloo"],  # vLLM actor, 2 ranks
        # LoRA: the vLLM actor loads each version's adapter; KL against the adapters-off policy
        ["generator=vllm", "model.lora.rank=8", "algorithm.use_kl_loss=true"],
        [
            "environment=tools", "environment._target_=faults.ScriptedToolEnv",
            "generator.step_wise=true", "generator.max_turns=3",
            "generator.max_prompt_length=256", "generator.max_generate_length=96",
            "generator.max_tokens_per_turn=8", "model.lora.rank=8",
        ],  # step-wise multi-turn with LoRA (hf engine actor, PEFT layers)
    ],
    ids=[
        "ppo_critic", "dapo", "step_wise_tools", "vllm_dp2_rloo", "vllm_lora_kl",
        "step_wise_tools_lora",
    ],
)  # fmt: skip
def test_async_runs_with_every_algorithm_and_layout(tmp_path, case):
    result = cli(
        tmp_path, *ASYNC, "environment._target_=parity_env.ParityEnv", "trainer.total_steps=3",
        "trainer.export_hf=false", "data.num_eval_prompts=0", *case,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = records(tmp_path)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["async/staleness_max"] <= 1
        if r["step"] == 1 and "trainer.critic_only_steps=1" in case:
            continue  # the critic's warm-up step trains no policy
        assert r["policy/optimizer_steps"] == 2  # 2 prompts / 1 per mini-batch
