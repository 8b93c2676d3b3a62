"""The real CLI under faults: kill -9 and resume, NaN rewards, a dead worker; and the step-wise
multi-turn tool env and PPO with a critic end to end (tiny model, 2 DeepSpeed ranks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from math import isclose
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")
HERE = str(Path(__file__).parent)
PARITY = [
    "experiment=smoke", "hydra.run.dir=run", "environment._target_=parity_env.ParityEnv",
    "generator.n_samples_per_prompt=4", "generator.max_generate_length=8",
    "generator.sampling.seed=0",
]  # fmt: skip


def cli(cwd: Path, *args: str, env: dict | None = None, **kw):
    env = {**os.environ, "PYTHONPATH": HERE, **(env or {})}
    cmd = [SKYRL_TRAIN, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)


def records(cwd: Path) -> list[dict]:
    return [json.loads(x) for x in (cwd / "run" / "metrics.jsonl").read_text().splitlines()]


def comparable(record: dict) -> dict:
    """Everything but wall-clock figures."""
    noisy = ("timing/", "seconds", "tokens_per_s")
    return {k: v for k, v in record.items() if not any(n in k for n in noisy)}


def rollout_tokens(path: Path) -> list[tuple]:
    """Each dumped row's tokens, loss mask and reward (``trainer.dump_rollouts``)."""
    keys = ("prompt_ids", "response_ids", "loss_mask", "reward", "stop_reason")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [tuple(json.dumps(row[k]) for k in keys) for row in rows]


def kill_9_after_checkpoint(cwd: Path, args: list[str], step: int) -> None:
    """Start ``skyrl-train args`` in ``cwd`` and kill -9 it (the driver and every Ray process
    it started) as soon as its ``latest`` checkpoint is ``global_step_<step>``."""
    env = {**os.environ, "PYTHONPATH": HERE}
    with open(cwd / "killed_run.stderr", "w") as stderr:  # why it ended, if it ends early
        proc = subprocess.Popen(
            [SKYRL_TRAIN, *args], cwd=cwd, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    latest = cwd / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while not (latest.exists() and latest.read_text().strip() == f"global_step_{step}"):
        ended = proc.poll() is not None
        if ended or time.monotonic() > deadline:
            if not ended:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            what = f"ended with exit code {proc.returncode}" if ended else "timed out"
            said = (cwd / "killed_run.stderr").read_text()[-3000:]
            pytest.fail(f"the run {what} before checkpoint {step}; its stderr:\n{said}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_kill_9_then_resume_reproduces_the_uninterrupted_run(tmp_path):
    args = [
        *PARITY, "trainer.total_steps=4", "trainer.ckpt_interval=1", "trainer.export_hf=false",
        "trainer.dump_rollouts=true",
    ]  # fmt: skip
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir(), killed.mkdir()
    result = cli(straight, *args)
    assert result.returncode == 0, result.stderr[-3000:]

    kill_9_after_checkpoint(killed, args, step=2)
    result = cli(killed, *args)  # trainer.resume=auto is the default
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stdout and "global_step_2" in result.stdout
    resumed, expected = records(killed), records(straight)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # no duplicated steps after resume
    assert "steps run: 4" in result.stdout  # the summary covers the steps before the resume
    for step in (3, 4):  # the resumed run sampled the very same tokens: same weights, seeds
        got, want = (d / "run" / "rollouts" / f"step_{step}.jsonl" for d in (killed, straight))
        assert rollout_tokens(got) == rollout_tokens(want), f"step {step}'s rollouts differ"
    for got, want in zip(resumed[2:], expected[2:], strict=True):
        got, want = comparable(got), comparable(want)
        assert got.keys() == want.keys()
        # the same fp32 work in two processes is not always bit-identical: CI at 0e5ec22 saw
        # the same tokens with step 3's loss 4e-6 and grad norm 1.1e-5 apart (relative),
        # where earlier runs matched within 1e-6; the tokens are compared exactly above
        off = {
            k: (got[k], want[k])
            for k in want
            if not isclose(got[k], want[k], rel_tol=1e-4, abs_tol=1e-6)
        }
        assert not off, f"step {want['step']}, (resumed, straight): {off}"


def test_nan_advantages_refuse_steps_and_abort_with_the_last_good_checkpoint(tmp_path):
    result = cli(
        tmp_path,
        *PARITY,
        "+imports=[faults]",
        "algorithm.advantage_estimator=nan_after_first_step",
        "trainer.total_steps=4",
        "trainer.ckpt_interval=1",
        "trainer.max_consecutive_nonfinite=2",
    )  # fmt: skip  (step 1 trains; steps 2 and 3 have NaN advantages, so a NaN loss)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 2 consecutive steps had a non-finite loss or grad norm")
    assert last.endswith(str(tmp_path / "run" / "checkpoints" / "global_step_1"))
    assert "Traceback" not in result.stderr
    refused = [(r["step"], r["train/refused"]) for r in records(tmp_path)]
    assert refused == [(1, 0.0), (2, 1.0), (3, 1.0)]
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert latest == "global_step_1"  # refused steps save no checkpoint


def test_a_dead_worker_stops_the_run_with_one_clear_error(tmp_path):
    result = cli(tmp_path, *PARITY, "+imports=[faults]", "algorithm.policy_loss=die_on_rank1")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: policy worker rank 1 died")
    assert "Traceback" not in result.stderr


def test_step_wise_multi_turn_tool_env(tmp_path):
    result = cli(
        tmp_path, *PARITY, "environment=tools", "environment._target_=faults.ScriptedToolEnv",
        "generator.step_wise=true", "generator.max_turns=3", "generator.max_prompt_length=256",
        "generator.max_generate_length=96", "generator.max_tokens_per_turn=8",
        "trainer.export_hf=false",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for r in records(tmp_path):
        assert r["generate/turns_mean"] == 3.0
        # 2 prompts x 4 samples x 3 turns = 24 step-wise sequences; still 2 optimizer steps
        assert r["policy/pack/local_samples"] == 24
        assert r["policy/optimizer_steps"] == 2
        # the engine sampled with the policy's weights (shared-memory sync, the CPU default):
        # the trainer recomputes the same logprobs; a stale engine measured 0.04 here
        assert r["rollout/logprob_abs_diff"] < 1e-4


def test_ppo_with_a_critic_warms_up_the_critic_first(tmp_path):
    result = cli(
        tmp_path, *PARITY, "algorithm=ppo", "trainer.critic_only_steps=1", "trainer.export_hf=false"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = records(tmp_path)
    assert "policy/optimizer_steps" not in first and first["critic/loss"] >= 0
    assert second["policy/optimizer_steps"] == 2 and "critic/loss" in second
    assert "algorithm/kl_in_reward" in second
