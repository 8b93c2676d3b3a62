"""KL estimators, masked KL, KL loss and KL controllers (skyrl/algorithms/kl.py, kl_controllers.py)."""

import math

import pytest
import torch

from skyrl.algorithms import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    build_kl_controller,
    compute_loss_weights,
    kl_loss,
    masked_kl,
)
from skyrl.config import ConfigError
from skyrl.config.algorithm import AlgorithmConfig

NAN = float("nan")
# log pi - log pi_ref = (0.5, -1.0, 0.0); the 4th position is masked and NaN
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5, NAN]])
REF = torch.tensor([[-1.5, -1.0, -0.5, NAN]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("k1", [0.5, -1.0, 0.0, 0.0]),  # log pi - log pi_ref
        ("k2", [0.125, 0.5, 0.0, 0.0]),  # (0.5)^2/2, (-1)^2/2
        # log r = log pi_ref - log pi = (-0.5, 1, 0): (r - 1) - log r
        ("k3", [math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1, 0.0, 0.0]),
        ("abs", [0.5, 1.0, 0.0, 0.0]),
    ],
)
def test_estimators_masked_with_nan(name, expected):
    logprobs = LOGPROBS.clone().requires_grad_()
    kl = masked_kl(name, logprobs, REF, MASK)
    torch.testing.assert_close(kl, torch.tensor([expected]), rtol=0, atol=1e-6)
    kl.sum().backward()
    assert torch.isfinite(logprobs.grad).all() and logprobs.grad[0, 3] == 0


def test_k3_is_clamped():
    # log r = -100 -> clamped to -20: e^-20 - 1 + 20 ~ 19 -> value clamp 10
    # log r = +100 -> clamped to 20: e^20 - 21 -> value clamp 10
    kl = KL_ESTIMATORS.get("k3")(torch.tensor([[0.0, -100.0]]), torch.tensor([[-100.0, 0.0]]))
    torch.testing.assert_close(kl, torch.tensor([[10.0, 10.0]]))


def test_kl_loss_token_mean():
    # k1 on the 3 loss tokens: (0.5 - 1 + 0) / 3 = -1/6
    weights = compute_loss_weights("token_mean", MASK, ["a"], 4)
    loss, metrics = kl_loss("k1", LOGPROBS, REF, weights, MASK)
    assert loss.item() == pytest.approx(-1 / 6, abs=1e-7)
    assert metrics == pytest.approx({"kl_sum": -0.5, "loss_tokens": 3.0})


def test_kl_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(1, 4\).*\(1, 3\)"):
        masked_kl("k1", LOGPROBS, REF[:, :3], MASK)


def test_adaptive_controller():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target=0.1, horizon=100)
    # KL 0.15: error 0.5 clipped to 0.2; 0.1 * (1 + 0.2 * 10/100) = 0.102
    ctrl.update(current_kl=0.15, n_steps=10)
    assert ctrl.value == pytest.approx(0.102, abs=1e-12)
    # KL 0.09: error -0.1; 0.102 * (1 - 0.1 * 10/100) = 0.10098
    ctrl.update(current_kl=0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.10098, abs=1e-12)


@pytest.mark.parametrize("horizon", [2, 3])
def test_adaptive_controller_refuses_a_horizon_that_could_flip_the_sign(horizon):
    # 16 samples, horizon 2: KL 0 gives error -0.2 and 0.1 * (1 - 0.2 * 16 / 2) = -0.06, a KL
    # *bonus*; horizon 3: 1 - 0.2 * 16 / 3 = -0.0667. Shortest safe: 0.2 * 16 = 3.2 < 4.
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target=0.1, horizon=horizon)
    with pytest.raises(ConfigError, match=r"^algorithm\.kl_horizon: .*at least 4$"):
        ctrl.update(current_kl=0.0, n_steps=16)
    assert ctrl.value == 0.1


def test_adaptive_controller_shortest_horizon_stays_positive():
    # horizon 4, 16 samples at KL 0: error -0.2; 0.1 * (1 - 0.2 * 16 / 4) = 0.1 * 0.2 = 0.02
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target=0.1, horizon=4)
    ctrl.update(current_kl=0.0, n_steps=16)
    assert ctrl.value == pytest.approx(0.02, abs=1e-12)


def test_fixed_controller_and_builder():
    ctrl = FixedKLController(0.05)
    ctrl.update(current_kl=10.0, n_steps=1000)
    assert ctrl.value == 0.05
    assert isinstance(build_kl_controller(AlgorithmConfig(kl_ctrl="fixed")), FixedKLController)
    adaptive = build_kl_controller(
        AlgorithmConfig(
            use_kl_in_reward=True,
            kl_ctrl="adaptive",
            init_kl_coef=0.2,
            kl_target=0.05,
            kl_horizon=7,
        )
    )
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 0.05, 7)


@pytest.mark.parametrize("target", [0.0, -0.1])
def test_kl_target_must_be_positive(target):
    # 0 divided by zero at the first adaptive update; a negative target moved beta the wrong way
    with pytest.raises(ConfigError, match="kl_target"):
        AlgorithmConfig(kl_ctrl="adaptive", kl_target=target)
