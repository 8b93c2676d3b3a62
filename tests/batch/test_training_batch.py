import pickle

import pytest
import torch

from skyrl.batch import TrainingInputBatch, pad_training_input_batch


def make_batch(lengths=(3, 5, 2, 4), seq_len=6, uids=None) -> TrainingInputBatch:
    n = len(lengths)
    attention = torch.zeros(n, seq_len, dtype=torch.long)
    for i, length in enumerate(lengths):
        attention[i, :length] = 1
    ids = torch.arange(n * seq_len).reshape(n, seq_len) * attention
    loss = attention.float()
    loss[:, 0] = 0
    uids = uids or [f"u{i // 2}" for i in range(n)]
    return TrainingInputBatch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "loss_mask": loss,
            "advantages": torch.randn(n, seq_len) * attention,
            "rewards": torch.arange(n, dtype=torch.float32),
        },
        metadata={
            "uids": list(uids),
            "is_last_step": [i % 2 == 1 for i in range(n)],
            "trajectory_ids": [f"t{i}" for i in range(n)],
            "pad_size": 0,
        },
    )


def test_len_slice_and_metadata():
    b = make_batch()
    assert len(b) == 4
    s = b[1:3]
    assert len(s) == 2
    assert torch.equal(s["input_ids"], b["input_ids"][1:3])
    assert s.metadata["uids"] == ["u0", "u1"]
    assert s.metadata["is_last_step"] == [True, False]
    assert s.metadata["pad_size"] == 0
    picked = b[[3, 0]]
    assert picked.metadata["trajectory_ids"] == ["t3", "t0"]
    assert torch.equal(picked.rewards, torch.tensor([3.0, 0.0]))


def test_missing_optional_fields_are_none():
    b = make_batch()
    assert b["old_logprobs"] is None and b.values is None and b.ref_logprobs is None
    with pytest.raises(KeyError):
        b["not_a_field"]
    with pytest.raises(AttributeError):
        b.not_a_field  # noqa: B018


def test_chunk_cat_select_to():
    b = make_batch()
    parts = b.chunk(2)
    assert [len(p) for p in parts] == [2, 2]
    again = TrainingInputBatch.cat(parts)
    for k in b.keys():
        assert torch.equal(again[k], b[k])
    assert again.metadata["uids"] == b.metadata["uids"]
    with pytest.raises(ValueError, match="equal chunks"):
        b.chunk(3)
    sel = b.select(["input_ids", "values"], metadata_keys=["uids"])
    assert sel.keys() == ["input_ids"] and list(sel.metadata) == ["uids"]
    moved = b.to("cpu")
    assert moved.input_ids.device.type == "cpu" and len(moved) == 4


def test_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="batch size"):
        TrainingInputBatch({"a": torch.zeros(2, 3), "b": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="per-row list"):
        TrainingInputBatch({"a": torch.zeros(2, 3)}, {"uids": ["x"]})


def test_pickle_keeps_tensors_bf16_and_ships_only_the_slice():
    b = make_batch().replace(values=torch.randn(4, 6).to(torch.bfloat16))
    back = pickle.loads(pickle.dumps(b))
    assert back.values.dtype == torch.bfloat16 and torch.equal(back.values, b.values)
    assert back.metadata == b.metadata
    big = TrainingInputBatch({"x": torch.zeros(10_000, 100)})
    one_row = pickle.dumps(big[:1])
    assert len(one_row) < 10_000  # the view's 4 MB parent storage is not shipped


# ---- pad_training_input_batch, field by field ---------------------------------


def test_pad_fields():
    b = make_batch()
    before = {k: v.clone() for k, v in b.tensors.items()}
    meta_before = {k: list(v) if isinstance(v, list) else v for k, v in b.metadata.items()}
    p = pad_training_input_batch(b, 3)
    assert p is not b and len(p) == 7
    assert torch.equal(p.loss_mask[4:], torch.zeros(3, 6))
    assert torch.equal(p.loss_mask[:4], b.loss_mask)
    # row 0 holds 3 tokens; a padding row keeps its first one alone: one token to compute
    assert torch.equal(p.attention_mask[4:], torch.tensor([[1, 0, 0, 0, 0, 0]] * 3))
    for key in ("input_ids", "advantages"):  # row 0's column 0, zeros after it
        first = float(b[key][0, 0])
        assert torch.equal(p[key][4:].float(), torch.tensor([[first] + [0.0] * 5] * 3))
    assert p.real_lengths().tolist() == [3, 5, 2, 4, 1, 1, 1]
    assert torch.equal(p.rewards[4:], torch.zeros(3))  # row 0's reward is 0
    assert p.metadata["uids"] == ["u0", "u0", "u1", "u1", "pad0", "pad1", "pad2"]
    assert p.metadata["is_last_step"] == [False, True, False, True, True, True, True]
    assert p.metadata["is_padding"] == [False] * 4 + [True] * 3
    assert p.metadata["pad_size"] == 3
    # the input is untouched
    for k, v in before.items():
        assert torch.equal(b[k], v)
    assert b.metadata == meta_before


def test_pad_zero_returns_same_object_and_larger_than_batch():
    b = make_batch()
    meta = dict(b.metadata)
    assert pad_training_input_batch(b, 0) is b
    assert b.metadata == meta
    p = pad_training_input_batch(b[:1], 5)
    assert len(p) == 6 and p.metadata["uids"][1:] == [f"pad{i}" for i in range(5)]
    assert p.loss_mask[1:].sum() == 0


def test_pad_rows_of_a_tokenless_row_0_have_no_token():
    # row 0 of no token (an env that failed at init): its padding rows have none either
    p = pad_training_input_batch(make_batch(lengths=(0, 5)), 2)
    assert p.real_lengths().tolist() == [0, 5, 0, 0]


def test_pad_zeroes_loss_weights_and_rejects_negative():
    b = make_batch().replace(loss_weights=torch.ones(4, 6))
    assert pad_training_input_batch(b, 2).loss_weights[4:].sum() == 0
    with pytest.raises(ValueError, match="pad_size"):
        pad_training_input_batch(b, -1)


def test_a_boolean_mask_selects_the_rows_it_marks():
    """``batch[batch.rewards > 1]`` keeps rows 2 and 3 (rewards 0, 1, 2, 3), not rows 0 and
    1 as 0/1 row numbers; a mask of the wrong length is refused."""
    batch = make_batch()
    picked = batch[batch.rewards > 1]
    assert picked.metadata["trajectory_ids"] == ["t2", "t3"]
    assert picked.rewards.tolist() == [2.0, 3.0]
    assert batch[[True, False, True, False]].metadata["trajectory_ids"] == ["t0", "t2"]
    assert len(batch[torch.zeros(4, dtype=torch.bool)]) == 0
    with pytest.raises(ValueError, match="mask of 3 rows for a batch of 4"):
        batch[[True, False, True]]


def test_a_row_index_out_of_range_is_an_index_error_naming_it():
    """``batch[10]`` on 4 rows returned an empty batch (an int became the slice 10:11), and
    ``batch[[0, 7]]`` raised torch's "index out of range in self", naming neither the row
    nor the batch size."""
    batch = make_batch()
    for index in (10, -5, [0, 7], [-5], torch.tensor([4])):
        with pytest.raises(IndexError, match=r"row -?\d+ is out of range for a batch of 4 rows"):
            batch[index]


def test_negative_rows_count_from_the_end_in_lists_too():
    """``batch[-1]`` gave the last row but ``batch[[-1]]`` raised; -1 and -4 are rows 3 and 0
    of 4."""
    batch = make_batch()
    picked = batch[[-1, -4]]
    assert picked.metadata["trajectory_ids"] == ["t3", "t0"]
    assert torch.equal(picked.input_ids, batch.input_ids[[3, 0]])
    assert batch[-2].metadata["trajectory_ids"] == ["t2"]


def test_a_float_index_is_refused():
    """``batch[batch.rewards]`` (rewards 0, 1, 2, 3 as floats) silently truncated the floats to
    row numbers; a float tensor is neither row numbers nor a mask."""
    batch = make_batch()
    with pytest.raises(TypeError, match="integers or a boolean mask, got float32"):
        batch[batch.rewards]
    with pytest.raises(TypeError, match="got float64"):
        batch[[1.5]]
    assert len(batch[[]]) == 0  # an empty list selects no row


def test_cat_joins_batches_whose_fields_are_in_another_order():
    # the same three fields, inserted in another order, are the same fields: cat refused
    # them ("fields differ: ['input_ids', ...] vs ['loss_mask', ...]")
    b = make_batch(lengths=(3, 5))
    reordered = TrainingInputBatch(dict(reversed(list(b.tensors.items()))), b.metadata)
    joined = TrainingInputBatch.cat([b, reordered])
    assert joined.keys() == b.keys()  # the first batch's order
    for k in b.keys():
        assert torch.equal(joined[k], torch.cat([b[k], b[k]]))
    assert joined.metadata["uids"] == ["u0", "u0", "u0", "u0"]


def test_cat_names_the_fields_and_metadata_that_differ():
    b = make_batch(lengths=(3, 5))
    with pytest.raises(ValueError) as err:
        TrainingInputBatch.cat([b, b.replace(advantages=None, values=b.loss_mask)])
    assert str(err.value) == (
        "batch 1 differs from batch 0 in its fields: missing ['advantages'], extra ['values']"
    )
    # a per-row list in a later batch only was dropped silently (the reverse was refused)
    tagged = TrainingInputBatch(b.tensors, {**b.metadata, "stop_reasons": ["stop", "length"]})
    for batches in ([b, tagged], [tagged, b]):
        with pytest.raises(ValueError, match=r"per-row metadata 'stop_reasons' is missing in some"):
            TrainingInputBatch.cat(batches)
    # another sequence length: torch's "Sizes of tensors must match" named no field
    wider = make_batch(lengths=(3, 5), seq_len=8)
    with pytest.raises(ValueError) as err:
        TrainingInputBatch.cat([b, wider])
    assert str(err.value) == (
        "field 'input_ids' has rows of shape (6,) in batch 0 but (8,) in batch 1"
    )
