"""Training batches: `TrainingInputBatch`, padding, prompt-unit mini-batch
boundaries and token-budget packed micro batches."""

from skyrl.batch.boundaries import (
    compute_prompt_boundaries,
    compute_prompt_mini_batch_boundaries,
    optimizer_steps_per_batch,
)
from skyrl.batch.packing import (
    PackedMicroBatch,
    micro_batch_metrics,
    pack_micro_batches,
    pad_micro_batches,
    plan_micro_batches,
    unpack_to_rows,
)
from skyrl.batch.training_batch import TrainingInputBatch, pad_training_input_batch

__all__ = [
    "PackedMicroBatch",
    "TrainingInputBatch",
    "compute_prompt_boundaries",
    "compute_prompt_mini_batch_boundaries",
    "micro_batch_metrics",
    "optimizer_steps_per_batch",
    "pack_micro_batches",
    "pad_micro_batches",
    "pad_training_input_batch",
    "plan_micro_batches",
    "unpack_to_rows",
]
