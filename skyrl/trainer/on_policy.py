"""When a step's old logprobs are the training forward's own, and the separate forward is skipped.

PPO-style losses need ``pi_old``: the policy's logprobs before the step's first update. With
one policy mini-batch per step and one update epoch, the only optimizer step of the step comes
after the training forward, so that forward sees exactly the weights ``pi_old`` is defined
by: its logprobs, detached, ARE the old logprobs, and the no-grad forward that computes them
separately is redundant. The ratio ``pi / pi_old`` is then exactly 1 (its gradient is that of
``pi``), and the update equals the two-pass path's (``tests/workers/test_on_policy.py``).

It holds only when nothing else needs the old logprobs before training and both forwards
compute the same thing:
- one mini-batch per step (``train_batch_size == policy_mini_batch_size``) and one epoch;
- no critic (its mini-batches and its warm-up steps change when the policy trains);
- no KL in the reward (it is computed from the old logprobs before the advantages);
- no dropout in the policy's training forward (checked on the workers: ``active_dropout``).

``trainer.reuse_training_logprobs=false`` always runs the separate forward.
"""

from __future__ import annotations

from skyrl.config.root import SkyRLConfig


def separate_forward_reason(cfg: SkyRLConfig) -> str | None:
    """Why the config needs the separate old-logprob forward; None = the training forward's
    logprobs serve (subject to the workers' dropout check)."""
    t, a = cfg.trainer, cfg.algorithm
    if not t.reuse_training_logprobs:
        return "trainer.reuse_training_logprobs=false"
    mini_batches = t.train_batch_size // t.policy_mini_batch_size
    if mini_batches > 1:
        return f"{mini_batches} policy mini-batches per step"
    if t.update_epochs_per_batch > 1:
        return f"trainer.update_epochs_per_batch={t.update_epochs_per_batch}"
    if a.uses_critic:
        return "a critic"
    if a.use_kl_in_reward:
        return "algorithm.use_kl_in_reward"
    return None


def describe(reason: str | None) -> str:
    """For the run plan and the start-up log."""
    if reason is None:
        return "the training forward's own (on-policy step: no separate forward)"
    return f"a separate forward ({reason})"
