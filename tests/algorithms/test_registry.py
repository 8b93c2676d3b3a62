"""Registering an algorithm part from outside ``skyrl/`` (as a recipe would)."""

import pytest
import torch

import skyrl.algorithms as algorithms
from skyrl.algorithms import POLICY_LOSSES, Registry, compute_loss_weights
from skyrl.config.algorithm import AlgorithmConfig


@POLICY_LOSSES.register("test_plain_reinforce")
def plain_reinforce(
    logprobs, old_logprobs, advantages, loss_weights, loss_mask, cfg, rollout_logprobs=None
):
    """A recipe's own loss: -A log pi, reduced with the mini-batch weights."""
    mask = loss_mask > 0
    per_token = -torch.where(mask, advantages, 0.0) * torch.where(mask, logprobs, 0.0)
    return (per_token * loss_weights).sum(), {"loss_tokens": float(mask.sum())}


def test_custom_loss_is_found_by_name():
    assert POLICY_LOSSES.get("test_plain_reinforce") is plain_reinforce
    assert "test_plain_reinforce" in POLICY_LOSSES.names()
    # -(1 * -0.5 + 2 * -1.0) / 2 tokens (token_mean) = 1.25
    mask = torch.ones(1, 2)
    weights = compute_loss_weights("token_mean", mask, ["a"], 2)
    loss, _ = POLICY_LOSSES.get("test_plain_reinforce")(
        torch.tensor([[-0.5, -1.0]]),
        torch.zeros(1, 2),
        torch.tensor([[1.0, 2.0]]),
        weights,
        mask,
        AlgorithmConfig(),
    )
    assert loss.item() == pytest.approx(1.25)


def test_builtins_registered_on_import():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"} <= set(
        algorithms.ADVANTAGE_ESTIMATORS.names()
    )
    assert {"ppo", "gspo", "cispo"} <= set(algorithms.POLICY_LOSSES.names())
    assert algorithms.LOSS_REDUCTIONS.names() == [
        "prompt_mean",
        "seq_mean_token_sum_norm",
        "sequence_mean",
        "token_mean",
    ]
    assert algorithms.KL_ESTIMATORS.names() == ["abs", "k1", "k2", "k3"]


def test_duplicate_and_unknown_names():
    registry = Registry("widget")
    registry.register("a")(len)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(abs)
    registry.register("a", override=True)(abs)
    assert registry.get("a") is abs
    with pytest.raises(KeyError, match="unknown widget 'b'; registered: a"):
        registry.get("b")


def _define(source: str) -> object:
    """Run ``source`` as a notebook cell would (module ``__main__``) and return its ``fn``."""
    namespace = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace["fn"]


def test_cell_run_again_replaces_its_own_entry():
    registry = Registry("widget")
    cell = "def fn(x):\n    return {}\n"
    first = registry.register("a")(_define(cell.format(1)))
    second = registry.register("a")(_define(cell.format(2)))  # same __main__.fn, new body
    assert first is not second
    assert registry.get("a") is second
    assert registry.get("a")(None) == 2


def test_other_function_under_a_taken_name_is_refused():
    registry = Registry("widget")
    registry.register("a")(_define("def fn():\n    pass\n"))
    other = _define("def other():\n    pass\nfn = other\n")  # __main__.other, not __main__.fn
    with pytest.raises(
        ValueError,
        match=r"^widget 'a' is already registered as __main__\.fn; "
        r"pass override=True to replace it with __main__\.other$",
    ):
        registry.register("a")(other)
    registry.register("a", override=True)(other)
    assert registry.get("a") is other
