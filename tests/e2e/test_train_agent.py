"""Training an external agent through the real CLI: ``generator.agent`` names a coroutine in
``agents.py`` that talks to the policy with the `openai` client. The tokens trained with loss
mask 1 are exactly the tokens the endpoint returned to the agent, in sync and async runs."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from test_train_robustness import cli, records

pytestmark = pytest.mark.slow
AGENT = [
    "experiment=smoke", "hydra.run.dir=run", "generator.agent=agents.logged_two_turns",
    "generator.max_turns=2", "generator.max_generate_length=40", "trainer.total_steps=2",
    "trainer.dump_rollouts=true", "data.num_eval_prompts=0", "trainer.export_hf=false",
    "generator.sampling.seed=0",
]  # fmt: skip


def trained_tokens(run) -> dict[str, list[tuple[int, ...]]]:
    """Per prompt uid, each trajectory's loss-mask-1 tokens (all its rows, in order)."""
    by_traj: dict[str, list[int]] = defaultdict(list)
    uid_of = {}
    for step in (1, 2):
        for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            tid = f"{step}:{row['trajectory_id']}"
            uid_of[tid] = row["uid"]
            by_traj[tid] += [
                t for t, m in zip(row["response_ids"], row["loss_mask"], strict=True) if m
            ]
    out: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    for tid, tokens in by_traj.items():
        out[uid_of[tid]].append(tuple(tokens))
    return {uid: sorted(v) for uid, v in out.items()}


def returned_tokens(log) -> dict[str, list[tuple[int, ...]]]:
    """Per prompt uid, each session's returned token ids (all its requests, in order)."""
    by_key: dict[str, list[int]] = defaultdict(list)
    uid_of = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        by_key[entry["key"]] += entry["token_ids"]
        uid_of[entry["key"]] = entry["uid"]
    out: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    for key, tokens in by_key.items():
        out[uid_of[key]].append(tuple(tokens))
    return {uid: sorted(v) for uid, v in out.items()}


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param([], id="sync"),
        pytest.param(
            ["trainer.max_staleness=1", "generator.num_cpus_per_engine=1", "trainer.dp_size=1"],
            id="async",
        ),
    ],
)
def test_an_external_agent_trains_on_exactly_the_tokens_it_was_sent(tmp_path, layout):
    log = tmp_path / "agent.jsonl"
    result = cli(tmp_path, *AGENT, *layout, env={"AGENT_LOG": str(log)})
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    trained, returned = trained_tokens(run), returned_tokens(log)
    assert len(trained) == 4  # 2 steps x 2 prompts
    # an async run generates ahead: prompts of step 3 were sent too, never trained on
    assert trained == {uid: returned[uid] for uid in trained}
    steps = records(tmp_path)
    assert [r["step"] for r in steps if "agent/requests" in r] == [1, 2]
    for r in steps:
        if "agent/requests" in r:
            assert r["env/errors"] == 0 and r["agent/forks"] == 0
            assert r["agent/requests"] == 2 * 2 * 2  # 2 requests x 2 samples x 2 prompts


def test_the_react_recipe_trains_on_the_tiny_model(tmp_path):
    """``recipes/react_agent``: native tool calls on the tiny model's template, 2 steps."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [
            sys.executable, "-m", "skyrl", "experiment=react_agent", "model.path=skyrl-tiny",
            "generator=hf", "trainer.total_steps=2", "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2", "generator.n_samples_per_prompt=2",
            "data.num_eval_prompts=0", "trainer.export_hf=false", "trainer.dump_rollouts=true",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=repo, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r for r in records(tmp_path) if "agent/requests" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["env/errors"] == 0 and r["agent/requests"] >= 4 for r in steps)
    first = json.loads((tmp_path / "run" / "rollouts" / "step_1.jsonl").read_text().splitlines()[0])
    assert "<tools>" in first["prompt_text"] and "calculator" in first["prompt_text"]
