"""Coefficient of the KL-in-reward penalty: fixed, or adapted toward a target KL.

Adaptive: Ziegler et al. 2019, "Fine-Tuning Language Models from Human
Preferences", section 2.2:

    e_t     = clip(KL_t / KL_target - 1, -0.2, 0.2)
    beta_t+1 = beta_t * (1 + K_beta * e_t),   K_beta = n_steps / horizon

where ``n_steps`` is the number of samples seen since the last update and
``horizon`` is ``kl_horizon`` (in samples). The factor ``1 + K_beta * e_t`` stays positive
only while ``0.2 * n_steps < horizon``; a shorter horizon could zero the coefficient or flip
its sign (a reward for drifting from the reference), so ``update`` refuses it.
"""

from __future__ import annotations

import math

from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.errors import ConfigError


class FixedKLController:
    """A constant coefficient; ``update`` does nothing."""

    def __init__(self, init_kl_coef: float):
        self.value = init_kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers share one interface)."""


class AdaptiveKLController:
    """Proportional controller toward ``target`` KL per token (Ziegler et al. 2019)."""

    PROPORTIONAL_ERROR_CLIP = 0.2
    """Bound on the relative KL error in one update."""

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` toward the target after ``n_steps`` samples at mean KL ``current_kl``.

        Raises ``ConfigError`` naming ``algorithm.kl_horizon`` when the horizon is too short for
        ``n_steps`` samples: the factor could reach 0 or below."""
        if self.PROPORTIONAL_ERROR_CLIP * n_steps >= self.horizon:
            shortest = math.floor(self.PROPORTIONAL_ERROR_CLIP * n_steps) + 1
            raise ConfigError(
                "algorithm.kl_horizon",
                f"{self.horizon} samples is too short for an update over {n_steps} samples: the "
                f"KL coefficient is multiplied by 1 + e * {n_steps} / {self.horizon} with e in "
                f"[-{self.PROPORTIONAL_ERROR_CLIP}, {self.PROPORTIONAL_ERROR_CLIP}], which can "
                f"reach 0 or flip its sign; set it to at least {shortest}",
            )
        error = current_kl / self.target - 1.0
        error = max(-self.PROPORTIONAL_ERROR_CLIP, min(self.PROPORTIONAL_ERROR_CLIP, error))
        self.value *= 1.0 + error * n_steps / self.horizon


def build_kl_controller(cfg: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    """The controller named by ``cfg.kl_ctrl`` (``fixed`` or ``adaptive``)."""
    if cfg.kl_ctrl == "adaptive":
        return AdaptiveKLController(cfg.init_kl_coef, cfg.kl_target, cfg.kl_horizon)
    return FixedKLController(cfg.init_kl_coef)
