"""Policy losses: PPO (clip-higher, dual clip), GSPO, CISPO, TIS, the sequence off-policy mask
(skyrl/algorithms/policy_losses/)."""

import math

import pytest
import torch

from skyrl.algorithms import POLICY_LOSSES, compute_loss_weights, finalize_metrics
from skyrl.algorithms.policy_losses.terms import seq_ratio_mask
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.errors import ConfigError
from skyrl.workers.stats import LossSums

NAN = float("nan")
ASYM = AlgorithmConfig(eps_clip_low=0.2, eps_clip_high=0.28)


def _one_token(name: str, ratio: float, adv: float, cfg: AlgorithmConfig = ASYM):
    """Loss and d loss / d logprob of one token with weight 1 (old logprob 0, so log ratio = logprob)."""
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    ones = torch.ones(1, 1)
    loss, metrics = POLICY_LOSSES.get(name)(
        logprobs, torch.zeros(1, 1), torch.tensor([[adv]]), ones, ones, cfg
    )
    loss.backward()
    return loss.item(), logprobs.grad.item(), metrics


@pytest.mark.parametrize(
    "ratio, adv, expected_loss, expected_grad, clipped",
    [
        # inside [0.8, 1.28]: L = -A r, dL/dlogp = -A r
        (1.1, 1.0, -1.1, -1.1, 0),
        # A > 0 above 1 + 0.28: max(-1.5, -1.28) = -1.28, no gradient
        (1.5, 1.0, -1.28, 0.0, 1),
        # A > 0 below 1 - 0.2: max(-0.5, -0.8) = -0.5 (pessimistic: unclipped), gradient -0.5
        (0.5, 1.0, -0.5, -0.5, 0),
        # A < 0 below 0.8: max(0.5, 0.8) = 0.8, no gradient
        (0.5, -1.0, 0.8, 0.0, 1),
        # A < 0 above 1.28: max(1.5, 1.28) = 1.5, gradient 1.5
        (1.5, -1.0, 1.5, 1.5, 0),
        # 1.25 is inside the asymmetric range (would be clipped at 1.2 with symmetric 0.2)
        (1.25, 1.0, -1.25, -1.25, 0),
        (1.25, -2.0, 2.5, 2.5, 0),
        # A = 2, r = 0.75 < 0.8: max(-1.5, -1.6) = -1.5
        (0.75, 2.0, -1.5, -1.5, 0),
    ],
)
def test_ppo_clip_both_sides_asymmetric(ratio, adv, expected_loss, expected_grad, clipped):
    loss, grad, metrics = _one_token("ppo", ratio, adv)
    assert loss == pytest.approx(expected_loss, abs=1e-6)
    assert grad == pytest.approx(expected_grad, abs=1e-6)
    assert metrics["clip_tokens"] == clipped
    assert metrics["loss_tokens"] == 1


@pytest.mark.parametrize(
    "ratio, adv, expected_loss, dual",
    [
        # A < 0, r = 5: PPO gives max(5, 1.28) = 5; dual clip bounds it at -A c = 3
        (5.0, -1.0, 3.0, 1),
        # A < 0, r = 2: 2 < 3, unchanged
        (2.0, -1.0, 2.0, 0),
        # A > 0: dual clip does not apply; max(-5, -1.28) = -1.28
        (5.0, 1.0, -1.28, 0),
    ],
)
def test_ppo_dual_clip(ratio, adv, expected_loss, dual):
    cfg = AlgorithmConfig(eps_clip_low=0.2, eps_clip_high=0.28, clip_ratio_c=3.0)
    loss, _, metrics = _one_token("ppo", ratio, adv, cfg)
    assert loss == pytest.approx(expected_loss, abs=1e-5)
    assert metrics["dual_clip_tokens"] == dual


def test_ppo_approx_kl_metric():
    # k3 of KL(old || new) with r = 1.5: (1.5 - 1) - log 1.5 = 0.0945348919
    _, _, metrics = _one_token("ppo", 1.5, 1.0)
    assert metrics["approx_kl_sum"] == pytest.approx(0.5 - math.log(1.5), abs=1e-6)


def test_gspo_uses_sequence_ratio():
    # row 0: token log-ratios (0.2, 0.0) -> s = exp(0.1) = 1.10517 inside [0.8, 1.28]:
    #        each token L = -A s = -1.10517, gradient d/dlogp_t = -A s (GSPO-token)
    # row 1: log-ratios (0.5, 0.3) -> s = exp(0.4) = 1.49182 > 1.28: each token -1.28, no gradient
    #        (both tokens share s, so they are clipped together)
    # the third column is masked out (NaN).
    old = torch.tensor([[-1.0, -2.0, NAN], [-1.0, -1.0, NAN]])
    logprobs = (old + torch.tensor([[0.2, 0.0, 0.0], [0.5, 0.3, 0.0]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, NAN], [1.0, 1.0, NAN]])
    loss, metrics = POLICY_LOSSES.get("gspo")(logprobs, old, adv, mask, mask, ASYM)
    loss.backward()
    s0 = math.exp(0.1)
    assert loss.item() == pytest.approx(-2 * s0 - 2 * 1.28, abs=1e-5)
    torch.testing.assert_close(
        logprobs.grad, torch.tensor([[-s0, -s0, 0.0], [0.0, 0.0, 0.0]]), rtol=0, atol=1e-6
    )
    assert metrics["clip_tokens"] == 2


def test_gspo_differs_from_token_ppo():
    # log-ratios (0.4, -0.4): sequence ratio 1 (no clip), token ratios 1.49 and 0.67 (both clip-relevant)
    old = torch.zeros(1, 2)
    logprobs = torch.tensor([[0.4, -0.4]])
    ones = torch.ones(1, 2)
    gspo, _ = POLICY_LOSSES.get("gspo")(logprobs, old, ones, ones, ones, ASYM)
    ppo, _ = POLICY_LOSSES.get("ppo")(logprobs, old, ones, ones, ones, ASYM)
    assert gspo.item() == pytest.approx(-2.0, abs=1e-6)  # -A * 1 per token
    assert ppo.item() == pytest.approx(
        -1.28 - math.exp(-0.4), abs=1e-6
    )  # max(-1.49, -1.28) + max(-0.67, -0.8)


def test_cispo_clipped_stop_gradient_weight():
    # eps_low 1 (no lower bound), eps_high 0.28.
    # t0: old p 0.4, new p 0.6 -> r 1.5 -> weight 1.28; A 1: L = -1.28 log 0.6; dL/dlogp = -1.28
    # t1: old p 0.4, new p 0.2 -> r 0.5 -> weight 0.5; A -2: L = -0.5*(-2) log 0.2 = log 0.2; dL/dlogp = 1
    cfg = AlgorithmConfig(eps_clip_low=1.0, eps_clip_high=0.28)
    old = torch.log(torch.tensor([[0.4, 0.4]]))
    logprobs = torch.log(torch.tensor([[0.6, 0.2]])).requires_grad_()
    ones = torch.ones(1, 2)
    loss, metrics = POLICY_LOSSES.get("cispo")(
        logprobs, old, torch.tensor([[1.0, -2.0]]), ones, ones, cfg
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.28 * math.log(0.6) + math.log(0.2), abs=1e-5)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.28, 1.0]]), rtol=0, atol=1e-5)
    assert metrics["clip_tokens"] == 1


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_tis_truncated_importance_weight(name):
    # logprobs = old = log 0.5 (ratio 1), A = 1: per-token loss -A r = -1 for ppo/gspo,
    # -1 * A * log 0.5 = -log 0.5 for cispo.
    # TIS weights pi_old / pi_rollout: t0 0.5 / 0.125 = 4 -> capped 2; t1 0.5 / 1 = 0.5
    cfg = AlgorithmConfig(tis_cap=2.0)
    old = torch.full((1, 2), math.log(0.5))
    rollout = torch.log(torch.tensor([[0.125, 1.0]]))
    ones = torch.ones(1, 2)
    loss, metrics = POLICY_LOSSES.get(name)(
        old.clone(), old, ones, ones, ones, cfg, rollout_logprobs=rollout
    )
    per_token = -math.log(0.5) if name == "cispo" else -1.0
    assert loss.item() == pytest.approx(per_token * (2.0 + 0.5), abs=1e-5)
    assert metrics["tis_clip_tokens"] == 1
    with pytest.raises(ValueError, match="rollout_logprobs"):
        POLICY_LOSSES.get(name)(old, old, ones, ones, ones, cfg)


SEQ_MASK = AlgorithmConfig(seq_ratio_bounds=[0.99, 1.01])


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_seq_ratio_mask_zeroes_the_loss_of_off_policy_sequences(name):
    # logprobs = old = log 0.5 (ratio 1), A = 1, weight 1: per-token loss -1 for ppo/gspo,
    # -log 0.5 for cispo, and d loss / d logprob = -1 for all three.
    # old - rollout per loss token (the third column is off the mask, NaN there):
    #   row 0 (0.01, -0.01): mean 0     -> exp(0) = 1                inside [0.99, 1.01]: kept
    #   row 1 (0.02,  0.02): mean 0.02  -> exp(0.02) = 1.0202 > 1.01:  masked
    #   row 2 (-0.02, -0.02): mean -0.02 -> exp(-0.02) = 0.9802 < 0.99: masked
    # loss = 2 kept tokens x per-token loss; 4 of 6 loss tokens masked.
    old = torch.full((3, 3), math.log(0.5))
    delta = torch.tensor([[0.01, -0.01, NAN], [0.02, 0.02, NAN], [-0.02, -0.02, NAN]])
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 3)
    logprobs = old.clone().requires_grad_()
    loss, metrics = POLICY_LOSSES.get(name)(
        logprobs, old, mask, mask, mask, SEQ_MASK, rollout_logprobs=old - delta
    )
    loss.backward()
    per_token = -math.log(0.5) if name == "cispo" else -1.0
    assert loss.item() == pytest.approx(2 * per_token, abs=1e-6)
    expected_grad = torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected_grad, rtol=0, atol=1e-6)
    assert metrics["seq_masked_tokens"] == 4 and metrics["loss_tokens"] == 6
    # reported as the share of loss tokens: 4 / 6
    assert finalize_metrics(metrics)["seq_masked_frac"] == pytest.approx(4 / 6)
    assert LossSums.from_loss_metrics(loss.item(), metrics).token_frac("seq_masked") == 4 / 6
    with pytest.raises(ValueError, match="seq_ratio_bounds.*rollout_logprobs"):
        POLICY_LOSSES.get(name)(old, old, mask, mask, mask, SEQ_MASK)


def test_seq_ratio_mask_splits_packed_rows_by_position_ids():
    # Two packed rows of two sequences each (position ids restart at 0 per sequence);
    # old - rollout per token, loss mask in brackets:
    #   row 0, seq A: (5.0 [0], 0.005 [1], 0.005 [1]) -> mean over loss tokens 0.005
    #                 -> exp = 1.00501, inside: kept (the 5.0 is off the mask)
    #          seq B: (0.03 [1], 0.01 [1])             -> mean 0.02 -> 1.0202 > 1.01: masked
    #   row 1, seq C: (-0.02 [1], -0.02 [1])           -> mean -0.02 -> 0.9802 < 0.99: masked
    #          seq D: (0.0 [1], 0.0 [1], 0.0 [1])       -> mean 0 -> 1, inside: kept
    # Row 0 as ONE sequence would be masked whole: (0.005 + 0.005 + 0.03 + 0.01) / 4 = 0.0125,
    # exp = 1.01258 > 1.01.
    delta = torch.tensor([[5.0, 0.005, 0.005, 0.03, 0.01], [-0.02, -0.02, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[False, True, True, True, True], [True] * 5])
    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]])
    old = torch.zeros(2, 5)
    keep, metrics = seq_ratio_mask(old, old - delta, mask, SEQ_MASK, positions)
    assert keep.tolist() == [[True, True, True, False, False], [False, False, True, True, True]]
    assert metrics == {"seq_masked_tokens": 4.0}  # B's 2 + C's 2
    whole_rows, metrics = seq_ratio_mask(old, old - delta, mask, SEQ_MASK)
    assert whole_rows.tolist() == [[False] * 5, [True] * 5]  # row 1: mean -0.008 -> 0.99203
    assert metrics == {"seq_masked_tokens": 4.0}  # row 0's 4 loss tokens


def test_seq_ratio_mask_splits_a_shared_prompts_continuations():
    # skyrl.batch.packing with share_prefixes: rows [5 6 7 | 8 9 10] and [5 6 7 | 11 12] share
    # the prompt 5 6 7, packed once; the second row's continuation restarts at the prompt's
    # length 3, not 0: positions [0 1 2 3 4 5 | 3 4] (loss mask [0 0 0 1 1 1 | 1 1]).
    # A new sequence starts wherever a position is not the previous + 1: at 0 and at 6.
    # old - rollout per loss token:
    #   seq A (cols 3-5): 0, 0, 0  -> mean 0 -> exp 1, inside [0.5, 2]: kept
    #   seq B (cols 6-7): 2, 2     -> mean 2 -> e^2 = 7.39 > 2: masked (2 loss tokens)
    # As one sequence: (0 + 0 + 0 + 2 + 2) / 5 = 0.8 -> e^0.8 = 2.23 > 2, all 5 masked.
    from skyrl.algorithms.policy_losses.terms import sequence_ids

    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 3, 4]])
    mask = torch.tensor([[False, False, False, True, True, True, True, True]])
    ids = sequence_ids(mask, positions)
    assert ids[0, :6].unique().numel() == 1 and ids[0, 6:].unique().numel() == 1
    assert ids[0, 0] != ids[0, 6]
    old = torch.zeros(1, 8)
    delta = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0]])
    bounds = AlgorithmConfig(seq_ratio_bounds=[0.5, 2.0])
    keep, metrics = seq_ratio_mask(old, old - delta, mask, bounds, positions)
    assert keep.tolist() == [[True] * 6 + [False] * 2]
    assert metrics == {"seq_masked_tokens": 2.0}
    # rows and packed rows that begin mid-sequence still get ids unique over the micro batch
    two_rows = sequence_ids(torch.ones(2, 4, dtype=torch.bool), torch.tensor([[3, 4, 0, 1]] * 2))
    assert two_rows[0].unique().numel() == 2 and two_rows[1].unique().numel() == 2
    assert set(two_rows[0].tolist()).isdisjoint(two_rows[1].tolist())


def test_seq_ratio_mask_off_by_default():
    old = torch.zeros(1, 2)
    assert seq_ratio_mask(old, None, torch.ones(1, 2, dtype=torch.bool), AlgorithmConfig()) == (
        None,
        {},
    )


@pytest.mark.parametrize(
    "bounds, fragment",
    [
        ([0.99], "two values"),
        ([0.9, 1.0, 1.1], "two values"),
        ([0.0, 1.01], "0 < low <= 1 <= high"),
        ([1.01, 1.02], "0 < low <= 1 <= high"),
        ([0.9, 0.99], "0 < low <= 1 <= high"),
    ],
)
def test_seq_ratio_bounds_validation(bounds, fragment):
    with pytest.raises(ConfigError, match="seq_ratio_bounds") as exc:
        AlgorithmConfig(seq_ratio_bounds=bounds)
    assert exc.value.key == "seq_ratio_bounds" and fragment in exc.value.message
    AlgorithmConfig(seq_ratio_bounds=[1.0, 1.0])  # the bounds may touch 1


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
def test_fully_masked_gives_zero_and_masked_nan_does_not_leak(name):
    zeros = torch.zeros(2, 3)
    nan = torch.full((2, 3), NAN)
    logprobs = nan.clone().requires_grad_()
    loss, metrics = POLICY_LOSSES.get(name)(logprobs, nan, nan, zeros, zeros, AlgorithmConfig())
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logprobs.grad, zeros)
    assert metrics["loss_tokens"] == 0

    # partly masked with NaN off the mask: finite loss and gradient
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[-1.0, -2.0, NAN], [NAN, -0.5, NAN]])
    logprobs = (values + 0.1).detach().requires_grad_()
    weights = compute_loss_weights("token_mean", mask, ["a", "b"], 3)
    adv = torch.where(mask > 0, 1.0, NAN)
    loss, _ = POLICY_LOSSES.get(name)(logprobs, values, adv, weights, mask, AlgorithmConfig())
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logprobs.grad).all()


def test_shape_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"logprobs=\(2, 3\).*advantages=\(2, 4\)"):
        POLICY_LOSSES.get("ppo")(
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            torch.zeros(2, 4),
            torch.zeros(2, 3),
            torch.zeros(2, 3),
            ASYM,
        )


def test_finalize_metrics():
    sums = {"loss_tokens": 8.0, "clip_tokens": 2.0, "approx_kl_sum": 0.4, "other": 3.0}
    assert finalize_metrics(sums) == {
        "loss_tokens": 8.0,
        "clip_frac": 0.25,
        "approx_kl": 0.05,
        "other": 3.0,
    }


def test_gspo_with_sequence_mean_is_the_sequence_level_gradient():
    # Sequence-level GSPO (G = 2 sequences, eps 0.2 / 0.28, no clip here):
    #   J = -(1/G) sum_i s_i A_i,  s_i = exp(mean_t log r_it),  dJ/dlogp_it = -(1/G) A_i s_i / |y_i|
    # row 0: one token, log r 0.1 -> s = e^0.1 = 1.10517, A 1: grad -(1/2) e^0.1 = -0.55259
    # row 1: three tokens, log r (0, 0.1, -0.1) -> s = 1, A 2: grad -(1/2) * 2 / 3 = -1/3 each
    # sequence_mean weights 1/(|y_i| G) give exactly that. token_mean (1/4 per token) gives
    # -e^0.1 / 4 = -0.27629 and -2/4 = -0.5: sequence i weighs |y_i| / 4, not 1/G.
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    old = torch.zeros(2, 3)
    grads = {}
    for reduction in ("sequence_mean", "token_mean"):
        logprobs = torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.1, -0.1]], requires_grad=True)
        weights = compute_loss_weights(reduction, mask, ["a", "a"], 3)
        loss, _ = POLICY_LOSSES.get("gspo")(logprobs, old, adv, weights, mask, ASYM)
        loss.backward()
        grads[reduction] = logprobs.grad
    s0 = math.exp(0.1)
    third = 1 / 3
    expected = torch.tensor([[-s0 / 2, 0.0, 0.0], [-third, -third, -third]])
    torch.testing.assert_close(grads["sequence_mean"], expected, rtol=0, atol=1e-6)
    expected = torch.tensor([[-s0 / 4, 0.0, 0.0], [-0.5, -0.5, -0.5]])
    torch.testing.assert_close(grads["token_mean"], expected, rtol=0, atol=1e-6)
