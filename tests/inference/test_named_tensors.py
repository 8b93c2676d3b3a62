"""``iter_named_tensors``: the weight forms every engine's ``update_weights`` takes, and one
line naming what is none of them. Before, ``model.parameters()`` (tensors without names)
failed as "too many values to unpack (expected 2)", a value that is no tensor as
"'list' object has no attribute 'shape'" deep in the engine."""

from __future__ import annotations

import pytest
import torch

from skyrl.inference.base import iter_named_tensors

A, B, C = torch.zeros(2), torch.ones(3), torch.full((1,), 2.0)
EXPECTED = "update_weights takes (name, tensor) pairs, lists of them or {name: tensor} dicts"


def test_pairs_buckets_and_dicts_in_any_mix_are_flattened_in_order():
    weights = [("a", A), [("b", B)], {"c": C}, (("a", A), ("b", B)), iter([("c", C)])]
    names = [name for name, _ in iter_named_tensors(weights)]
    assert names == ["a", "b", "c", "a", "b", "c"]
    assert [n for n, _ in iter_named_tensors({"a": A, "b": B})] == ["a", "b"]


@pytest.mark.parametrize(
    "weights, got",
    [
        ((p for p in [torch.nn.Parameter(A)]), "got a Parameter"),  # model.parameters()
        ([A], "got a Tensor"),
        ({"a": [0.0, 0.0]}, "got 'a' with list"),
        ([("a",)], "got 'a' with nothing"),
        ([("a", A, B)], "got 'a' with Tensor, Tensor"),
        ([[("a", A), 3]], "got an int"),
    ],
)
def test_anything_else_is_one_type_error_naming_it(weights, got):
    with pytest.raises(TypeError) as e:
        list(iter_named_tensors(weights))
    assert str(e.value) == f"{EXPECTED} (named_parameters(), not parameters()); {got}"
