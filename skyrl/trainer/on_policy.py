"""When a step's old logprobs are the training forward's own, and the separate forward is skipped.

PPO-style losses need ``pi_old``: the policy's logprobs before the step's first update. With
one policy mini-batch per step and one update epoch, the only optimizer step of the step comes
after the training forward, so that forward sees exactly the weights ``pi_old`` is defined
by: its logprobs, detached, ARE the old logprobs, and the no-grad forward that computes them
separately is redundant. The ratio ``pi / pi_old`` is then exactly 1 (its gradient is that of
``pi``), and the update equals the two-pass path's (``tests/workers/test_training_logprobs.py``).

It holds only when nothing else needs the old logprobs before training and both forwards
compute the same thing:
- one mini-batch per step (``train_batch_size == policy_mini_batch_size``) and one epoch;
- a step on which the policy trains: a critic's updates leave the policy's weights alone, but
  on its warm-up steps (``trainer.critic_only_steps``) the policy does not train, so no
  training forward gives the old logprobs that ``rollout/logprob_abs_diff`` reads: those
  steps run the separate forward (``reuses_on_step``), the steps after them do not;
- no KL in the reward (it is computed from the old logprobs before the advantages);
- no dropout in the policy's training forward: ``model.lora.dropout`` is read from the config;
  the model's own dropout (its layers, its config's ``*dropout*`` fields) only once the workers
  have loaded it (``active_dropout``), so the run plan, from the config alone, says so.

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
    if a.use_kl_in_reward:
        return "algorithm.use_kl_in_reward"
    lora = cfg.model.lora
    if lora.enabled and lora.dropout > 0:
        return f"dropout in the policy's training forward: model.lora.dropout={lora.dropout:g}"
    return None


def reuses_on_step(cfg: SkyRLConfig, reuse: bool, step: int) -> bool:
    """Whether step ``step`` takes its old logprobs from the training forward: the run does
    (``reuse``: ``separate_forward_reason`` and the workers' dropout check) and the policy
    trains on this step (not one of the critic's ``trainer.critic_only_steps``)."""
    return reuse and step > cfg.trainer.critic_only_steps


def describe(cfg: SkyRLConfig, reason: str | None, model_checked: bool = True) -> str:
    """For the start-up log (after the workers' dropout check) and the run plan
    (``model_checked=False``: from the config alone, before any model is loaded)."""
    if reason is not None:
        return f"a separate forward ({reason})"
    own = "the training forward's own (on-policy step: no separate forward)"
    warm_up = cfg.trainer.critic_only_steps  # validated: only with a critic
    if warm_up:
        steps = "step 1" if warm_up == 1 else f"steps 1-{warm_up}"
        own += f"; a separate forward on the critic-only {steps}"
    if not model_checked:
        own += ", unless the model has dropout (checked at start)"
    return own
