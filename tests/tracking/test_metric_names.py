"""Every key a producer writes is documented in ``skyrl/tracking/metric_names.py``: the real
producers run on tiny inputs (the trainer's step with fake worker groups, as in
``tests/trainer/test_trainer.py``) and each key they return must be a documented name.

A producer that starts writing a new literal key fails here until the key is documented.
Not run here: ``agent/sampling_overrides`` (set inline by ``skyrl.serve.harness`` around a
live agent session) and the asynchronous source's ``async/...`` keys (written through the
``metric_names`` constants, so documented by construction)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace as NS

import pytest
import torch

from skyrl.algorithms.kl_controllers import FixedKLController
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.data import DataConfig
from skyrl.config.environment import EnvironmentConfig
from skyrl.config.generator import GeneratorConfig
from skyrl.config.root import SkyRLConfig
from skyrl.config.trainer import TrainerConfig
from skyrl.data import PromptRow
from skyrl.generators import GeneratorOutput
from skyrl.generators.metrics import rollout_metrics
from skyrl.rollouts.evaluation import evaluate_prompts
from skyrl.rollouts.sync import filled_batch, shape_rewards
from skyrl.serve.reconcile import Chain, fork_counts
from skyrl.tracking import metric_names as names
from skyrl.trainer.trainer import RLTrainer
from skyrl.trainer.weight_sync import EngineSync
from skyrl.workers.stats import LossSums, PackingStats, TrainStats

CONSTANTS = {
    value
    for key, value in vars(names).items()
    if key.isupper() and isinstance(value, str) and "/" in value
} | set(names.PHASE_TIMES.values())
"""Every name ``metric_names`` defines as a constant."""

PATTERNS = [
    re.escape(names.PASS_AT_PREFIX) + r"\d+/.+",  # generate/pass@<n>/<source>
    re.escape(names.EVAL_PASS_AT_PREFIX) + r"\d+",  # eval/pass@<k>
    re.escape(names.LOGPROB_DIFF_BY_STALENESS) + r"\d+",
    # TrainedRoleMetrics: properties, token means / fractions by loss term, pack/<field>
    # (their reductions are checked in tests/trainer/test_step_stats.py)
    r"(policy|critic)/.+",
]
"""The documented templates of the names built from a value (a count, a source, a term)."""


def is_documented(key: str) -> bool:
    if key in CONSTANTS or any(re.fullmatch(p, key) for p in PATTERNS):
        return True
    by_source = re.fullmatch(r"eval/(.+)/([^/]+)", key)  # names.eval_source_key
    if by_source is None:
        return False
    overall = f"eval/{by_source[2]}"
    return overall != names.EVAL_SECONDS and is_documented(overall)


def undocumented(metrics: dict[str, float]) -> list[str]:
    return sorted(k for k in metrics if not is_documented(k))


def test_the_check_itself_tells_documented_from_undocumented():
    assert is_documented("eval/gsm8k/pass@1") and is_documented("eval/a/b/reward_mean")
    assert is_documented("generate/pass@4/gsm8k") and is_documented("policy/pack/fill_ratio")
    assert names.eval_source_key("gsm8k", names.EVAL_REWARD) == "eval/gsm8k/reward_mean"
    assert not is_documented("eval/gsm8k/seconds")
    assert not is_documented("generate/response_length_min")
    assert not is_documented("timing/new_phase_s")


def test_rollout_metrics_are_documented():
    # two samples of one prompt, the first from an external agent's session (agent/... counts)
    def trajectory(reward: float, counts: dict[str, float]) -> NS:
        row = NS(data_source="gsm8k", uid="p0")
        turns = [NS(response_ids=[1, 2, 3])]
        return NS(turns=turns, row=row, reward=reward, stop_reason="length", env_errors=0,
                  counts=counts)  # fmt: skip

    agent_counts = fork_counts(Chain(decode=str))
    metrics = rollout_metrics([trajectory(1.0, agent_counts), trajectory(0.0, {})], 2, 1.0)
    assert set(agent_counts) <= set(metrics)
    assert metrics[names.TRUNCATION_RATE] == 1.0  # both stopped at "length"
    assert metrics[names.RESPONSE_LENGTH_MAX] == 3.0 and metrics[names.TURNS_MEAN] == 1.0
    assert undocumented(metrics) == []


class TwoSampleGenerator:
    """Two samples per eval prompt, rewards 1 then 0, one data source; one env error."""

    def generate(self, rows: list[PromptRow], n: int, sampling) -> NS:
        uids = [r.uid for r in rows for _ in range(n)]
        return NS(uids=uids, data_sources=["gsm8k"] * len(uids),
                  rewards=[1.0, 0.0] * len(rows), is_last_step=[True] * len(uids),
                  metrics={names.ENV_ERRORS: 1.0})  # fmt: skip


def test_eval_metrics_are_documented():
    rows = [PromptRow("q0", "gsm8k"), PromptRow("q1", "gsm8k")]
    cfg = GeneratorConfig(eval_n_samples_per_prompt=2)
    metrics, _ = evaluate_prompts(TwoSampleGenerator(), rows, cfg, seed=0)
    # per prompt c = 1 pass of n = 2: pass@1 = 1 - C(1,1)/C(2,1) = 0.5, pass@2 = 1; reward 0.5
    assert metrics[names.EVAL_PASS_AT_1] == 0.5 and metrics["eval/pass@2"] == 1.0
    assert metrics[names.eval_source_key("gsm8k", names.EVAL_REWARD)] == 0.5
    assert names.EVAL_SECONDS in metrics and metrics[names.EVAL_ENV_ERRORS] == 1.0
    assert undocumented(metrics) == []


def test_reward_shaping_and_dynamic_sampling_metrics_are_documented():
    cfg = SkyRLConfig(
        trainer=TrainerConfig(train_batch_size=2, policy_mini_batch_size=2),
        generator=GeneratorConfig(max_generate_length=4),
        algorithm=AlgorithmConfig(overlong_filter=True, overlong_buffer_len=2),
        environment=EnvironmentConfig(),
        data=DataConfig(),
    )
    out = GeneratorOutput(
        prompt_token_ids=[[1, 2]], response_token_ids=[[5, 6, 7, 8]], loss_masks=[[1] * 4],
        rollout_logprobs=[[0.0] * 4], rewards=[1.0], uids=["a"], trajectory_ids=["a/0"],
        is_last_step=[True], data_sources=["s"], stop_reasons=["length"],
        policy_versions=[[(0, 0)]],
    )  # fmt: skip
    _, shaping = shape_rewards(cfg, out)
    # 4 tokens, ramp from 4 - 2 = 2: -min((4 - 2) / 2, 1) * 1.0 = -1; one trajectory masked
    assert shaping == {names.OVERLONG_PENALTY_MEAN: -1.0, names.OVERLONG_MASKED: 1.0}
    with pytest.warns(UserWarning, match="topped up"):
        _, sampling = filled_batch(["a"], ["b"], 2, 3, 1)
    assert sampling == {names.KEPT_GROUP_FRAC: 0.5, names.DYNAMIC_SAMPLING_ROUNDS: 3.0}
    assert undocumented(shaping) == [] and undocumented(sampling) == []


class FakeGroup:
    """A worker group whose every mini-batch steps (grad norm 1, lr 1e-3)."""

    compute_s = 0.0

    def train_mini_batch(self, chunks, logprobs_into=None) -> TrainStats:
        packing = PackingStats(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0)
        return TrainStats(LossSums(0.1, 3.0, {"approx_kl": 0.3}, {"clip": 1.0}), 1.0, 1e-3,
                          False, 0.0, packing)  # fmt: skip


def trainer_batch() -> TrainingInputBatch:
    """2 prompts x 2 samples, one row each; rows 0 and 2 sampled one policy version ago."""
    lm = torch.zeros(4, 6)
    lm[:, 3:] = 1
    tensors = dict(
        input_ids=torch.ones(4, 6, dtype=torch.long), attention_mask=torch.ones(4, 6),
        loss_mask=lm, values=0 * lm, old_logprobs=-lm, ref_logprobs=-1.5 * lm,
        rollout_logprobs=-lm, rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
    )  # fmt: skip
    versions = [[(0, 0)], [(1, 1)], [(0, 0)], [(1, 1)]]
    metadata = dict(uids=["a", "a", "b", "b"], is_last_step=[True] * 4, policy_versions=versions)
    return TrainingInputBatch(tensors, metadata)


def test_a_trainer_step_writes_documented_names_only():
    """One step with a critic, KL in the reward, a checkpoint and an eval: every phase and
    every trainer-written key. The rollout source's own metrics are left out (above)."""
    tr = RLTrainer.__new__(RLTrainer)
    t = NS(
        policy_mini_batch_size=1, critic_mini_batch_size=1, train_batch_size=2,
        update_epochs_per_batch=1, critic_only_steps=0, dp_size=1,
        ckpt_interval=1, eval_interval=1,
    )  # fmt: skip
    a = AlgorithmConfig(advantage_estimator="gae", use_kl_in_reward=True, kl_estimator="k1")
    tr.cfg = NS(trainer=t, generator=NS(step_wise=False, max_seq_len=6), algorithm=a)
    tr.policy, tr.reference, tr.critic = FakeGroup(), None, FakeGroup()
    tr.kl_ctrl = FixedKLController(0.1)
    tr.reuse_training_logprobs = False
    tr.total_steps, tr.policy_version, tr.consecutive_nonfinite = 1, 1, 0
    tr.moved_since_checkpoint = False
    tr.rollouts = NS(
        next_batch=lambda step: (trainer_batch(), {}), has_eval=lambda: True, evaluate=dict
    )
    tr.add_logprobs_and_values = lambda batch, step: batch
    tr.sync_weights = lambda version: None
    tr.engine_sync = EngineSync(tr.policy, None, tr.rollouts, tr.cfg)  # no engine: no wait
    tr.save_checkpoint = lambda step, publish=True: None
    metrics = tr.run_step(1)
    phases = {"timing/sync_s", names.CHECKPOINT_TIME, "timing/eval_s", "timing/train_s"}
    assert phases <= set(metrics)
    # k1 = old - ref = -1 - (-1.5) = 0.5 nats on every loss token, at the fixed coefficient
    assert metrics[names.KL_IN_REWARD] == pytest.approx(0.5, abs=1e-12)
    assert metrics[names.KL_IN_REWARD_COEF] == 0.1
    assert {names.LOGPROB_DIFF_BY_STALENESS + s for s in "01"} <= set(metrics)
    assert names.CRITIC.loss in metrics and not math.isnan(metrics[names.POLICY.lr])
    assert undocumented(metrics) == []
