"""Every metric name a training run writes (rollouts, reward shaping, dynamic sampling, eval,
the trainer and its workers) and the console line, the plot and the summary read, defined once
with its unit and its reduction over a step.

Producers (``skyrl.generators.metrics``, ``skyrl.rollouts``, the worker losses,
``skyrl.trainer.step_stats``, the trainer) and consumers (``console``, ``summary``, sweeps)
import these names; any of them may be missing from a step (an eval metric on a step without
eval, the critic's without a critic). ``tests/tracking/test_metric_names.py`` runs the
producers and fails on a key not documented here.

A training step runs ``update_epochs_per_batch`` passes over its prompt-unit mini-batches,
one optimizer step each. The ``policy/...`` and ``critic/...`` figures below reduce the
step's mini-batches of ALL epochs, in the order they were trained; each is a mean, a max, a
sum or the last value, as its docstring says, never a sum where a mean is meant, so a
figure does not change with ``policy_mini_batch_size`` at equal optimisation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

REWARD = "generate/reward_mean"
"""Mean reward over the step's trajectories."""
RESPONSE_LENGTH = "generate/response_length_mean"
"""Mean generated tokens per trajectory (all its turns)."""
RESPONSE_LENGTH_MAX = "generate/response_length_max"
"""Most generated tokens of one trajectory (all its turns) in the step (max over rounds)."""
TURNS_MEAN = "generate/turns_mean"
"""Mean turns (engine requests) per trajectory."""
TRUNCATION_RATE = "generate/truncation_rate"
"""Share of the step's trajectories that stopped at a limit: stop reason ``length``
(``max_generate_length`` or ``max_tokens_per_turn`` cut the last reply), ``budget`` (no room
left for an observation and a reply) or ``max_turns``."""
ENV_ERRORS = "env/errors"
"""Trajectories whose env raised or timed out in the step's rollouts (a count; summed over
dynamic-sampling rounds)."""
GENERATE_SECONDS = "generate/seconds"
"""Wall seconds of the rollout driver over the step's rounds (summed)."""
GENERATE_TOKENS_PER_S = "generate/tokens_per_s"
"""Generated tokens per wall second of the rollout driver (over all the step's rounds)."""
PASS_AT_PREFIX = "generate/pass@"
"""``generate/pass@<n>/<source>``: share of the step's prompts of a source with a full-credit
sample among their ``n`` (over all the step's rounds)."""
AGENT_REQUESTS = "agent/requests"
"""External agent (``skyrl.serve``): requests answered, over the step's trajectories (a count,
summed over the trajectories and dynamic-sampling rounds, as every ``agent/...`` count)."""
AGENT_FORKS = "agent/forks"
"""External agent: requests that started a new training row (``skyrl.serve.reconcile``)."""
AGENT_FORKS_EDITED = "agent/forks_edited"
"""External agent: forks where the context before the last reply changed in text."""
AGENT_FORKS_RERENDERED = "agent/forks_rerendered"
"""External agent: forks where only the last reply came back different."""
AGENT_REALIGNED = "agent/realigned"
"""External agent: requests that extended the row in text but not in tokens (the engine was
given the sampled tokens; the row went on)."""
AGENT_SAMPLING_OVERRIDES = "agent/sampling_overrides"
"""External agent: temperature, top_p, top_k or min_p values that differed from
``generator.sampling`` and were overridden (``generator.agent_sampling_drift=override``; each
parameter of each request counts once)."""
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty_mean"
"""DAPO's soft overlong penalty added to the rewards (<= 0, reward units), mean over the
trajectories of the step's batch; written when ``algorithm.overlong_buffer_len > 0``."""
OVERLONG_MASKED = "reward/overlong_masked"
"""Truncated trajectories (stop reason ``length`` or ``budget``) whose loss mask overlong
filtering zeroed (``algorithm.overlong_filter``): a count over the step's batch."""
KEPT_GROUP_FRAC = "dynamic_sampling/kept_group_frac"
"""Share of the generated prompt groups that carried signal (dynamic sampling)."""
DYNAMIC_SAMPLING_ROUNDS = "dynamic_sampling/rounds"
"""Sampling rounds the step drew to fill its batch (synchronous
``algorithm.dynamic_sampling=filter``; at most ``algorithm.max_sample_batches``; a count)."""
KL_IN_REWARD_COEF = "algorithm/kl_coef"
"""The KL-in-reward coefficient this step's rewards were shaped with
(``algorithm.use_kl_in_reward``; an adaptive ``algorithm.kl_ctrl`` moves it after the step)."""
KL_IN_REWARD = "algorithm/kl_in_reward"
"""KL(old policy || reference) per token by ``algorithm.kl_estimator`` (nats), mean over the
batch's loss tokens, before the coefficient; written with ``algorithm.use_kl_in_reward``."""
EVAL_PASS_AT_1 = "eval/pass@1"
"""Held-out pass@1 over every eval prompt (the sweep objective)."""
EVAL_PASS_AT_PREFIX = "eval/pass@"
"""``eval/pass@<k>``, k = ``generator.eval_n_samples_per_prompt`` when above 1: the unbiased
estimate ``1 - C(n - c, k) / C(n, k)`` that one of k samples of a prompt gets full credit
(reward >= 1), mean over the eval prompts."""
EVAL_REWARD = "eval/reward_mean"
"""Mean reward over every eval sample (the last step of each trajectory)."""
EVAL_ENV_ERRORS = "eval/env_errors"
"""Eval trajectories whose env raised or timed out (an external agent included: it raised,
returned no number or ran past ``generator.agent_timeout_s``); each scored 0 and counts as a
fail in ``eval/pass@...`` (a count over the eval pass)."""
EVAL_SECONDS = "eval/seconds"
"""Wall seconds of the eval pass (rollouts and scoring); ``timing/eval_s`` also holds the wait
for a weight load still running in the background."""
TRAIN_REFUSED = "train/refused"
"""1 when the step's update was refused: every mini-batch it trained had a non-finite loss or
gradient, so no optimizer step, weight sync or checkpoint; else 0 (a step refused in part
shows in ``<role>/nonfinite``)."""
LOGPROB_ABS_DIFF = "rollout/logprob_abs_diff"
"""Mean |trainer logprob - engine logprob| over the step's trained tokens (nats): ~1e-6 in fp32
when the engines hold the policy's weights (one logprob convention, ``skyrl.inference.base``)."""
ASYNC_STALENESS_MEAN = "async/staleness_mean"
"""Asynchronous mode: mean over the step's trajectories of (policy version trained with -
version at dispatch of the trajectory's first turn)."""
ASYNC_STALENESS_MAX = "async/staleness_max"
"""Asynchronous mode: the step's largest staleness (never above ``trainer.max_staleness``)."""
ASYNC_MIXED_VERSION_TURNS = "async/mixed_version_turns"
"""Turns of the step that finished under other weights than they were dispatched with (only
with ``trainer.partial_rollouts``; a count). A lower bound: a turn's end version is the one
the rollout source records once every engine has loaded and reset its prefix cache, so a turn
that ends in between on an engine already on the new weights counts as one version."""
ASYNC_QUEUE_DEPTH = "async/queue_depth"
"""Groups generated and waiting for a later step when the step's batch was taken."""
ASYNC_RUNNING = "async/running_groups"
"""Groups still generating when the step's batch was taken."""
ASYNC_ENGINE_IDLE_S = "async/engine_idle_s"
"""Seconds since the previous batch with no request in flight on the engines."""
ASYNC_TRAINER_WAIT_S = "async/trainer_wait_s"
"""Seconds the trainer waited for the step's batch."""
ASYNC_FILTERED_GROUPS = "async/filtered_groups"
"""Groups ``algorithm.dynamic_filter`` dropped since the previous batch (a new one was
admitted for each)."""
ASYNC_STALE_GROUPS = "async/stale_groups"
"""Groups found past the staleness bound since the previous batch (generated again; 0 under
the admission rule)."""
LOGPROB_DIFF_BY_STALENESS = "rollout/logprob_abs_diff/staleness_"
"""Prefix: ``rollout/logprob_abs_diff`` over the rows of one staleness value (``..._0``, ``..._1``);
written for a batch unless all its rows have staleness 0."""
STEP_TIME = "timing/step_s"
"""Wall seconds of the whole step."""
OVERHEAD_FRAC = "timing/overhead_frac"
"""Share of the step that is neither generation, eval nor the workers' compute (the weight
sync and the checkpoint count as overhead); the summary weights it by step time."""
PHASE_TIMES = {
    "gen": "timing/generate_s",
    "fwd": "timing/forward_s",
    "train": "timing/train_s",
    "sync": "timing/sync_s",
    "eval": "timing/eval_s",
}
"""The step's phases in loop order, by their short console label (wall seconds)."""
CHECKPOINT_TIME = "timing/checkpoint_s"
"""Wall seconds saving the step's checkpoint, on the steps that save one
(``trainer.ckpt_interval``, the last step); between ``sync`` and ``eval`` in the loop."""

FORWARD_COMPUTE_S = "forward/compute_s"
"""Seconds the policy, reference and critic ranks computed the step's logprob/value forward
passes (slowest rank per call, summed); the trainer pops it into ``timing/overhead_frac``."""

KL_TERM = "kl"
"""Token-sum name of KL(policy || reference) per loss token, the ``use_kl_loss`` term's
estimator (``algorithm.kl_estimator``), before ``kl_loss_coef``."""
ENTROPY_TERM = "entropy"
"""Token-sum name of the policy's token entropy (nats), when ``entropy_coef > 0``."""


@dataclass(frozen=True)
class TrainedRoleMetrics:
    """The keys ``skyrl.trainer.step_stats`` writes for one trained role (policy or critic).

    Loss figures come from ``skyrl.workers.stats.LossSums``: per mini-batch, a token mean is a
    sum over its loss tokens divided by its loss-token count; the step reports the mean of
    those per-mini-batch means over the mini-batches that have loss tokens.
    """

    role: str

    @property
    def loss(self) -> str:
        """Mean over the step's mini-batches of the mini-batch loss ``sum_t w_t L_t`` as the
        optimizer saw it: the registered policy loss (or the value loss), without the KL and
        entropy terms, reduced by ``algorithm.loss_reduction`` (a token mean under
        ``token_mean``)."""
        return f"{self.role}/loss"

    @property
    def grad_norm(self) -> str:
        """Mean over the optimizer steps taken of the global L2 gradient norm before clipping
        (NaN when every mini-batch was refused)."""
        return f"{self.role}/grad_norm"

    @property
    def grad_norm_max(self) -> str:
        """Max over the optimizer steps taken of the global L2 gradient norm before clipping."""
        return f"{self.role}/grad_norm_max"

    @property
    def lr(self) -> str:
        """Learning rate of the step's LAST optimizer step taken (the schedule moves per step;
        a refused mini-batch's lr is the next step's); the last mini-batch's when every one
        was refused."""
        return f"{self.role}/lr"

    @property
    def loss_tokens(self) -> str:
        """Loss tokens trained, summed over the mini-batches (each epoch counts again)."""
        return f"{self.role}/loss_tokens"

    @property
    def optimizer_steps(self) -> str:
        """Optimizer steps taken (mini-batches x epochs, less the refused ones)."""
        return f"{self.role}/optimizer_steps"

    @property
    def nonfinite(self) -> str:
        """Mini-batches refused for a non-finite loss or gradient (no optimizer step), summed."""
        return f"{self.role}/nonfinite"

    @property
    def compute_s(self) -> str:
        """Seconds of forward, backward and optimizer step, slowest rank per mini-batch, summed;
        the trainer pops it into ``timing/overhead_frac``."""
        return f"{self.role}/compute_s"

    def token_mean(self, name: str) -> str:
        """A loss's ``<name>_sum`` as a token mean, averaged over mini-batches: ``approx_kl``
        (k3 KL(pi_old || pi), policy losses), ``kl`` (``KL_TERM``), ``entropy``
        (``ENTROPY_TERM``, nats), ``value_error`` ((V - R)^2, critic)."""
        return f"{self.role}/{name}"

    def token_frac(self, name: str) -> str:
        """A loss's ``<name>_tokens`` as the share of loss tokens where the flag is on, averaged
        over mini-batches: ``clip_frac``, ``dual_clip_frac``, ``tis_clip_frac``,
        ``seq_masked_frac`` (tokens of sequences ``algorithm.seq_ratio_bounds`` masked),
        ``vf_clip_frac``."""
        return f"{self.role}/{name}_frac"

    def pack(self, name: str) -> str:
        """A packing figure (a field of ``skyrl.workers.stats.PackingStats``, unit and step
        reduction documented there): ``<role>/pack/<name>``."""
        return f"{self.role}/pack/{name}"


POLICY = TrainedRoleMetrics("policy")
CRITIC = TrainedRoleMetrics("critic")

POLICY_LOSS = POLICY.loss
GRAD_NORM = POLICY.grad_norm
KL = POLICY.token_mean(KL_TERM)
"""``policy/kl``: KL(policy || reference) per token, written when ``algorithm.use_kl_loss``."""


def eval_source_key(source: str, overall: str) -> str:
    """``eval/<source>/<name>``: the overall ``eval/<name>`` figure (``EVAL_PASS_AT_1``,
    ``eval/pass@<k>``, ``EVAL_REWARD``) over the eval prompts of one data source."""
    return f"eval/{source}/{overall.removeprefix('eval/')}"


_EVAL_PASS_AT_1 = re.compile(r"^eval/.*pass@1(?!\d)")


def eval_pass_at_1_keys(keys: Iterable[str]) -> list[str]:
    """The ``eval/...pass@1...`` keys (not ``pass@16``), sorted."""
    return sorted(k for k in keys if _EVAL_PASS_AT_1.match(k))
