"""Names of the metrics the console line, the plot and the summary read.

They are written by the trainer and its stages; any of them may be missing from a step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REWARD = "generate/reward_mean"
RESPONSE_LENGTH = "generate/response_length_mean"
KL = ("policy/kl", "policy/kl_loss")
POLICY_LOSS = "policy/policy_loss"
GRAD_NORM = "policy/grad_norm"
STEP_TIME = "timing/step_s"
OVERHEAD_FRAC = "timing/overhead_frac"
PHASE_TIMES = {
    "gen": "timing/generate_s",
    "fwd": "timing/forward_s",
    "train": "timing/train_s",
    "sync": "timing/sync_s",
    "eval": "timing/eval_s",
}
"""The step's phases in loop order, by their short console label."""

_EVAL_PASS_AT_1 = re.compile(r"^eval/.*pass@1(?!\d)")


def eval_pass_at_1_keys(keys: Iterable[str]) -> list[str]:
    """The ``eval/...pass@1...`` keys (not ``pass@16``), sorted."""
    return sorted(k for k in keys if _EVAL_PASS_AT_1.match(k))
