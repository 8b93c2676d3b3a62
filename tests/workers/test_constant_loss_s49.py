"""A registered policy loss may return a constant (no gradient) for rows of no loss token: a
micro batch that holds only a data-parallel padding row, or responses masked whole. The worker
joins it to the graph at zero and trains on (DeepSpeed refused it: "loss must be a scalar
tensor"); a loss without a gradient on rows WITH loss tokens is an error naming
``algorithm.policy_loss``."""

from __future__ import annotations

import textwrap

import pytest
import torch
from worker_helpers import run_script

from skyrl.algorithms import POLICY_LOSSES
from skyrl.batch import TrainingInputBatch
from skyrl.config.algorithm import AlgorithmConfig
from skyrl.workers.losses import policy_loss

NAME = "zero_when_empty_s49"


@POLICY_LOSSES.register(NAME, override=True)
def zero_when_empty(logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, rollout=None):
    """``sum_t w_t * (-A_t * logprob_t)``; a constant 0 when no row has a loss token."""
    mask = loss_mask > 0
    if not mask.any():
        return torch.zeros(()), {"loss_tokens": 0.0}
    loss = torch.where(mask, -advantages * logprobs * loss_weights, 0.0).sum()
    return loss, {"loss_tokens": float(mask.sum())}


@POLICY_LOSSES.register("detached_s49", override=True)
def detached(logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, rollout=None):
    loss, metrics = zero_when_empty(
        logprobs.detach(), old_logprobs, advantages, loss_weights, loss_mask, cfg
    )
    return loss, metrics


def rows(loss_mask: torch.Tensor) -> TrainingInputBatch:
    n, s = loss_mask.shape
    return TrainingInputBatch(
        {
            "input_ids": torch.ones(n, s, dtype=torch.long),
            "attention_mask": torch.ones(n, s, dtype=torch.long),
            "loss_mask": loss_mask,
            "advantages": torch.full((n, s), 2.0),
            "old_logprobs": torch.zeros(n, s),
            "loss_weights": loss_mask / max(float(loss_mask.sum()), 1.0),
        }
    )


def test_a_constant_loss_on_rows_of_no_loss_token_backpropagates_zero():
    logprobs = torch.full((2, 3), -1.5, requires_grad=True)
    loss, sums = policy_loss(
        logprobs, None, rows(torch.zeros(2, 3)), AlgorithmConfig(policy_loss=NAME)
    )
    assert loss.requires_grad and float(loss.detach()) == 0.0 and sums.loss == 0.0
    loss.backward()
    assert torch.equal(logprobs.grad, torch.zeros(2, 3))


def test_the_loss_itself_is_left_as_it_is_on_loss_tokens():
    logprobs = torch.full((2, 3), -1.5, requires_grad=True)
    mask = torch.tensor([[0.0, 1, 1], [0, 1, 0]])
    loss, sums = policy_loss(logprobs, None, rows(mask), AlgorithmConfig(policy_loss=NAME))
    # 3 loss tokens of weight 1/3, each -A * logprob = -2 * -1.5 = 3: loss 3
    assert sums.loss == pytest.approx(3.0) and sums.loss_tokens == 3
    loss.backward()  # d/dlogprob = -A * w = -2/3 on the loss tokens
    assert torch.allclose(logprobs.grad, mask * (-2.0 / 3.0))


def test_a_loss_without_gradient_on_loss_tokens_names_the_key():
    logprobs = torch.full((1, 3), -1.5, requires_grad=True)
    with pytest.raises(TypeError, match=r"algorithm.policy_loss=detached_s49 .* 2 loss tokens"):
        policy_loss(
            logprobs,
            None,
            rows(torch.tensor([[0.0, 1, 1]])),
            AlgorithmConfig(policy_loss="detached_s49"),
        )


WORKER = textwrap.dedent(
    """
    import dataclasses, json, sys
    import torch
    from worker_helpers import make_config, make_batch, MAX_SEQ_LEN
    import test_constant_loss_s49 as losses  # registers the losses

    from skyrl.algorithms.reductions import compute_loss_weights
    from skyrl.batch.training_batch import pad_training_input_batch
    from skyrl.workers.distributed import find_free_port
    from skyrl.workers.worker import TrainingWorker

    torch.set_num_threads(1)
    model_path = sys.argv[1]
    # a budget of 16 tokens: the padding row (a copy of the 16-token row 0) is packed alone
    cfg = make_config(model_path, dp_size=1, micro_batch_max_tokens=16)
    cfg = dataclasses.replace(
        cfg, algorithm=dataclasses.replace(cfg.algorithm, policy_loss=losses.NAME)
    )
    batch = make_batch(model_path, ["a", "a", "b", "b"], [16, 9, 13, 6])
    # one mini-batch of both prompts on one rank, as dispatch stages it at dp 1
    weights = compute_loss_weights("token_mean", batch.loss_mask, batch.metadata["uids"], MAX_SEQ_LEN)
    chunk = batch.replace(loss_weights=weights)
    out, weights = {}, {}
    for pad in (0, 1):  # 1: a padding row, as dispatch adds to an odd mini-batch at dp 2
        worker = TrainingWorker("policy", 0, 1, "127.0.0.1", find_free_port(), cfg, 10)
        initial = worker.state_dict_for_sync()
        try:
            record = worker.train_mini_batch(pad_training_input_batch(chunk, pad))
        except Exception as exc:
            out[pad] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            continue
        weights[pad] = worker.state_dict_for_sync()
        moved = max((weights[pad][k] - initial[k]).abs().max().item() for k in initial)
        out[pad] = {"loss": record.losses.loss, "nonfinite": record.nonfinite, "moved": moved}
    if len(weights) == 2:
        out["weight_diff"] = max(
            (weights[0][k] - weights[1][k]).abs().max().item() for k in weights[0]
        )
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_a_padding_row_alone_in_a_micro_batch_trains_as_without_it(tiny_model_path):
    out = run_script(WORKER, tiny_model_path)
    plain, padded = out["0"], out["1"]
    assert isinstance(padded, dict), padded  # was: AssertionError: loss must be a scalar tensor
    assert not padded["nonfinite"]
    assert padded["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert plain["moved"] > 1e-3  # the step moved the weights (lr 0.05) ...
    assert out["weight_diff"] < 1e-6  # ... the same way with the padding row
