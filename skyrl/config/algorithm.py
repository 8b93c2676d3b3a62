"""Schema of the ``algorithm`` group: advantages, policy loss, KL, reductions.

Names (``advantage_estimator``, ``policy_loss``, ``loss_reduction``,
``kl_estimator``) are looked up in the registries of ``skyrl.algorithms``; the
validator checks them after ``imports`` ran, so a recipe's own registrations count.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyrl.config.errors import require, require_choice, require_finite

ASYNC_TIS_CAP = 2.0
"""``algorithm.tis_cap`` when ``trainer.max_staleness > 0`` and none is set."""


@dataclass
class AlgorithmConfig:
    """One RL algorithm, as the choice of its parts."""

    advantage_estimator: str = "grpo"
    """Registered estimator: grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline, gae."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group's reward std (+1e-6)."""
    advantage_whitening: bool = False
    """Whiten advantages over the whole batch's loss tokens after estimation."""
    gamma: float = 1.0
    """Discount per token (gae, reinforce_pp)."""
    lambd: float = 1.0
    """GAE lambda."""

    policy_loss: str = "ppo"
    """Registered policy loss: ppo, gspo, cispo."""
    eps_clip_low: float = 0.2
    """Lower clip: ratio >= 1 - eps_clip_low."""
    eps_clip_high: float = 0.2
    """Upper clip: ratio <= 1 + eps_clip_high (DAPO clip-higher uses 0.28)."""
    clip_ratio_c: float | None = None
    """Dual-clip bound for negative advantages (> 1, e.g. 3.0); None = off. Read by ppo and
    gspo; refused with cispo, which has no clipped surrogate to bound."""
    tis_cap: float | None = None
    """Token-level truncated importance sampling against the engine's rollout logprobs, the
    weight min(pi_old / pi_rollout, tis_cap); None = off in synchronous training and
    ``ASYNC_TIS_CAP`` (2.0) when ``trainer.max_staleness > 0``."""
    uncorrected_off_policy: bool = False
    """Asynchronous training without an off-policy correction (no TIS, no sequence mask): an
    explicit opt-out, refused together with ``tis_cap`` or ``seq_ratio_bounds``, and in
    synchronous training (``trainer.max_staleness=0``: nothing is stale)."""
    seq_ratio_bounds: list[float] | None = None
    """Sequence-level off-policy mask ``[low, high]`` (e.g. ``[0.99, 1.01]``): a sequence whose
    geometric-mean ratio pi_old / pi_rollout over its loss tokens, ``exp(mean(old_logprobs -
    rollout_logprobs))``, lies outside it gets no policy loss; None = off."""
    loss_reduction: str = "token_mean"
    """token_mean, sequence_mean, seq_mean_token_sum_norm, prompt_mean."""

    use_kl_loss: bool = False
    """Add kl_loss_coef x KL(policy || reference) to the loss."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""
    use_kl_in_reward: bool = False
    """Subtract a per-token KL penalty from the reward instead."""
    kl_estimator: str = "k3"
    """k1, k2, k3 or abs. As a loss term (``use_kl_loss``) k1's gradient averages to zero over
    samples of the current policy (E[grad log pi] = 0), so it barely holds the policy back:
    the loss wants k2 or k3; k1 suits the reward penalty (``use_kl_in_reward``)."""
    kl_ctrl: str = "fixed"
    """KL-in-reward coefficient controller: fixed or adaptive."""
    init_kl_coef: float = 0.001
    """Starting KL-in-reward coefficient."""
    kl_target: float = 0.1
    """Adaptive controller: target KL per token."""
    kl_horizon: int = 10000
    """Adaptive controller: horizon, in samples."""

    entropy_coef: float = 0.0
    """Entropy bonus weight (subtracted from the loss)."""
    value_clip: float = 0.2
    """Critic value clipping around the old values; 0 = off."""

    dynamic_sampling: str | None = None
    """None, ``filter`` (drop uninformative groups, sample more) or ``replace`` (copy informative
    ones over them); which groups are informative is ``dynamic_filter``."""
    dynamic_filter: str = "reward_variance"
    """Dynamic sampling's group filter: a name registered in
    ``skyrl.rollouts.dynamic_sampling.GROUP_FILTERS`` or an import path ``module.attr`` of a
    function ``(group: GeneratorOutput) -> bool`` (True = keep; ``group`` holds the rows of
    one prompt uid). ``reward_variance`` keeps groups whose last-step rewards are not all equal."""
    max_sample_batches: int = 4
    """Dynamic sampling (``filter``): most generate rounds per training step, each on a new
    batch of ``trainer.train_batch_size`` prompts from the loader that the step has not drawn
    yet, past an epoch's end too (a step never trains two groups of one prompt; a prompt so
    skipped comes in a later step); the rounds end early when fewer than a batch of those
    are left, the batch then topped up with flat groups as when the rounds run out. The step
    count stays ``trainer.epochs`` x batches per epoch, and the loader keeps drawing, so an
    epoch passes over the prompts up to ``max_sample_batches`` times; use
    ``trainer.total_steps`` to set the step count directly."""
    overlong_buffer_len: int = 0
    """DAPO soft overlong penalty: tokens before max_generate_length where it ramps; 0 = off."""
    overlong_penalty_factor: float = 1.0
    """DAPO: penalty at max_generate_length."""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated trajectories get no loss (their tokens are masked)."""

    def __post_init__(self) -> None:
        require(self.gamma > 0 and self.gamma <= 1, "gamma", f"must be in (0, 1], got {self.gamma}")
        require(0 <= self.lambd <= 1, "lambd", f"must be in [0, 1], got {self.lambd}")
        require(self.eps_clip_low >= 0, "eps_clip_low", f"must be >= 0, got {self.eps_clip_low}")
        require(self.eps_clip_high >= 0, "eps_clip_high", f"must be >= 0, got {self.eps_clip_high}")
        c = self.clip_ratio_c
        require(c is None or c > 1, "clip_ratio_c", f"must be > 1 or null, got {c}")
        require(
            self.tis_cap is None or self.tis_cap > 0,
            "tis_cap",
            f"must be > 0 or null, got {self.tis_cap}",
        )
        self._check_seq_ratio_bounds()
        require(self.kl_loss_coef >= 0, "kl_loss_coef", f"must be >= 0, got {self.kl_loss_coef}")
        require(self.init_kl_coef >= 0, "init_kl_coef", f"must be >= 0, got {self.init_kl_coef}")
        require_choice(self.kl_ctrl, ("fixed", "adaptive"), "kl_ctrl")
        require(self.kl_target > 0, "kl_target", f"must be > 0, got {self.kl_target}")
        require(self.kl_horizon >= 1, "kl_horizon", f"must be >= 1, got {self.kl_horizon}")
        if self.kl_ctrl == "adaptive":  # it steers the KL-in-reward coefficient by multiplying
            require(
                self.use_kl_in_reward,
                "kl_ctrl",
                "adaptive steers the KL-in-reward coefficient only, and use_kl_in_reward is "
                "false (kl_loss_coef stays fixed); set use_kl_in_reward=true or kl_ctrl=fixed",
            )
            require(
                self.init_kl_coef > 0,
                "init_kl_coef",
                "is 0, which the adaptive controller's updates (multiplications) never move; "
                "set it > 0 or kl_ctrl=fixed",
            )
        require(self.entropy_coef >= 0, "entropy_coef", f"must be >= 0, got {self.entropy_coef}")
        require(self.value_clip >= 0, "value_clip", f"must be >= 0, got {self.value_clip}")
        require_choice(self.dynamic_sampling, (None, "filter", "replace"), "dynamic_sampling")
        require(
            self.max_sample_batches >= 1,
            "max_sample_batches",
            f"must be >= 1, got {self.max_sample_batches}",
        )
        require(
            self.overlong_buffer_len >= 0,
            "overlong_buffer_len",
            f"must be >= 0, got {self.overlong_buffer_len}",
        )
        require(
            self.overlong_penalty_factor >= 0,
            "overlong_penalty_factor",
            f"must be >= 0 (a penalty), got {self.overlong_penalty_factor}",
        )
        # an inf weight in the loss or the reward makes every step's loss non-finite
        require_finite(
            self,
            (
                "kl_loss_coef",
                "init_kl_coef",
                "kl_target",
                "entropy_coef",
                "overlong_penalty_factor",
            ),
        )
        require(
            self.overlong_buffer_len > 0 or self.overlong_penalty_factor == 1.0,
            "overlong_penalty_factor",
            f"is {self.overlong_penalty_factor}, but overlong_buffer_len is 0, which turns the "
            "overlong penalty off: set overlong_buffer_len > 0, or leave "
            "overlong_penalty_factor at 1.0",
        )
        require(
            not (self.use_kl_loss and self.use_kl_in_reward),
            "use_kl_loss",
            "use_kl_loss and use_kl_in_reward are mutually exclusive; pick one",
        )

    def _check_seq_ratio_bounds(self) -> None:
        bounds = self.seq_ratio_bounds
        if bounds is None:
            return
        require(
            len(bounds) == 2,
            "seq_ratio_bounds",
            f"must be two values [low, high] or null, got {list(bounds)}",
        )
        low, high = bounds
        require(
            0 < low <= 1 <= high,
            "seq_ratio_bounds",
            f"must satisfy 0 < low <= 1 <= high, got [{low}, {high}]",
        )

    @property
    def uses_critic(self) -> bool:
        """Whether this algorithm trains a value model (GAE needs values)."""
        return self.advantage_estimator == "gae"

    @property
    def uses_reference(self) -> bool:
        """Whether reference-model logprobs are needed."""
        return self.use_kl_loss or self.use_kl_in_reward
