"""KL estimators between the policy and the reference model, per token.

Schulman 2020, "Approximating KL Divergence" (joschu.net/blog/kl-approx.html):
with samples y ~ pi and r = pi_ref(y) / pi(y), i.e. ``log r = ref_logprobs - logprobs``,

    k1  = -log r                      unbiased, high variance, can be negative
    k2  = (log r)^2 / 2               biased, low variance, >= 0
    k3  = (r - 1) - log r             unbiased, low variance, >= 0
    abs = |log r|

k3 takes exp of the log-ratio, so it is clamped: log r to [-20, 20] before exp,
the result to [-10, 10] (as verl does). Estimators ``fn(logprobs, ref_logprobs)``
return the per-token value for every position; callers mask with ``masked_kl``,
which replaces off-mask inputs by 0 first so NaN there never reaches the value or
its gradient.

Two uses (mutually exclusive, checked by the config): a reward penalty
(``use_kl_in_reward``: ``token_rewards = -kl_coef * masked_kl(...)`` into the
advantage estimator, coefficient from a KL controller) or a loss term
(``use_kl_loss``: ``kl_loss_coef * kl_loss(...)`` added to the policy loss).
"""

from __future__ import annotations

import torch

from skyrl.algorithms.registry import KL_ESTIMATORS
from skyrl.algorithms.shapes import check_same_shape

K3_LOG_RATIO_CLAMP = 20.0
"""k3: |log r| is clamped to this before exp."""
K3_VALUE_CLAMP = 10.0
"""k3: the estimate is clamped to [-this, this]."""


@KL_ESTIMATORS.register("k1")
def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref``."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``(log pi - log pi_ref)^2 / 2``."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``(r - 1) - log r`` with ``log r = log pi_ref - log pi`` (clamped)."""
    log_r = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.expm1(log_r) - log_r).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


@KL_ESTIMATORS.register("abs")
def abs_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``|log pi - log pi_ref|``."""
    return (logprobs - ref_logprobs).abs()


def masked_kl(
    name: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """``[B, S]`` per-token KL of the registered estimator ``name``; exactly 0 off ``loss_mask``.

    Raises ``ValueError`` naming the estimator when it does not return one value per token
    (a scalar, such as a mean, would otherwise broadcast to every token)."""
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, loss_mask=loss_mask)
    mask = loss_mask > 0
    logprobs = torch.where(mask, logprobs, 0.0)
    ref_logprobs = torch.where(mask, ref_logprobs, 0.0)
    kl = KL_ESTIMATORS.get(name)(logprobs, ref_logprobs)
    if not isinstance(kl, torch.Tensor) or kl.shape != mask.shape:
        got = f"shape {tuple(kl.shape)}" if isinstance(kl, torch.Tensor) else type(kl).__name__
        raise ValueError(
            f"KL estimator {name!r} returned {got}, expected one value per token "
            f"{tuple(mask.shape)} (the shape of logprobs)"
        )
    return torch.where(mask, kl, 0.0)


def kl_loss(
    name: str,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_weights: torch.Tensor,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The KL loss term ``sum_t w_t KL_t`` (multiply by ``kl_loss_coef``) and ``{"kl_sum", "loss_tokens"}``."""
    check_same_shape(loss_weights=loss_weights, loss_mask=loss_mask)
    kl = masked_kl(name, logprobs, ref_logprobs, loss_mask)
    metrics = {"kl_sum": float(kl.detach().sum()), "loss_tokens": float((loss_mask > 0).sum())}
    return (kl * torch.where(loss_mask > 0, loss_weights, 0.0)).sum(), metrics
