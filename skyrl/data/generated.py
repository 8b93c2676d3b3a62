"""Built-in generated prompt sets: an arithmetic task and any reasoning-gym dataset.

The arithmetic task is tuned for a small instruct model (SmolLM2-135M-Instruct)
to start low but not at zero and to leave room that a few dozen GRPO steps can
take: one-digit additions, subtractions and multiplications plus some two-digit
additions / subtractions, with a strict answer format (``#### <number>`` on the
last line, graded by the ``math`` env). Each prompt is a short chat: a system
prompt stating the format, ONE worked example (a user turn and the assistant's
answer in the exact format), then the question. With a bare instruction the
base model almost never used the format (greedy 2%, samples at temperature 1:
0 of 256 right); with the example ~38% of samples at temperature 1 are right
(greedy ~47%), a third of the responses miss the format (learnable), and the
two-digit problems are mostly arithmetic slips. Responses are short (median 14
tokens, 96% under 48). Numbers: ``tests/bench/bench_smollm2.py``.

Train and eval problems are disjoint: each expression belongs to one split by a
hash of its text, so eval accuracy is measured on problems never trained on.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

from skyrl.data.prompts import Message, PromptRow, assign_uids

ARITHMETIC_SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Write the final answer on the last line as '#### <number>'."
)
"""States the answer format (the grader accepts nothing else: no marker, no reward)."""
ARITHMETIC_EXAMPLE: list[Message] = [
    {"role": "user", "content": "What is 4 + 3?"},
    {"role": "assistant", "content": "4 + 3 = 7\n#### 7"},
]
"""One worked example shown before every question (one-shot, as chat turns)."""
_EXAMPLE_EXPR = "4 + 3"
"""The example's expression, never asked as a question."""
EVAL_SHARE = 8
"""One expression in ``EVAL_SHARE`` (by hash) is an eval problem, the rest train."""


def _add_1d(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"{a} + {b}", a + b


def _sub_1d(rng: random.Random) -> tuple[str, int]:
    b = rng.randint(1, 9)
    a = rng.randint(b, b + 9)
    return f"{a} - {b}", a - b


def _mul_1d(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"{a} * {b}", a * b


def _add_2d_1d(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 49), rng.randint(1, 9)
    return f"{a} + {b}", a + b


def _add_2d(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 49), rng.randint(10, 49)
    return f"{a} + {b}", a + b


def _sub_2d_1d(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(20, 59), rng.randint(1, 9)
    return f"{a} - {b}", a - b


ARITHMETIC_KINDS: dict[str, tuple[float, Callable[[random.Random], tuple[str, int]]]] = {
    "add_1d": (1, _add_1d),
    "sub_1d": (2, _sub_1d),
    "mul_1d": (2, _mul_1d),
    "add_2d_1d": (2, _add_2d_1d),
    "add_2d": (1, _add_2d),
    "sub_2d_1d": (1, _sub_2d_1d),
}
"""Problem kinds: name -> (sampling weight, sampler returning (expression, value))."""


def arithmetic_split(expr: str) -> str:
    """``train`` or ``eval``: a fixed hash partition of the expressions."""
    return "eval" if zlib.crc32(expr.encode()) % EVAL_SHARE == 0 else "train"


def _arithmetic_problem(rng: random.Random, split: str) -> tuple[str, int]:
    """A problem of ``split``, its kind drawn by weight (rejection sampling on the hash)."""
    names = list(ARITHMETIC_KINDS)
    weights = [ARITHMETIC_KINDS[n][0] for n in names]
    while True:
        kind = rng.choices(names, weights=weights)[0]
        expr, value = ARITHMETIC_KINDS[kind][1](rng)
        if expr != _EXAMPLE_EXPR and arithmetic_split(expr) == split:
            return expr, value


def arithmetic_messages(expr: str) -> list[Message]:
    """The chat for one question: system prompt, the worked example, the question."""
    return [
        {"role": "system", "content": ARITHMETIC_SYSTEM_PROMPT},
        *ARITHMETIC_EXAMPLE,
        {"role": "user", "content": f"What is {expr}?"},
    ]


def arithmetic_rows(num_prompts: int, seed: int, split: str = "train") -> list[PromptRow]:
    """``num_prompts`` arithmetic questions of ``split`` (``train`` or ``eval``, disjoint)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"arithmetic-{split}-{seed}")
    rows = []
    for _ in range(num_prompts):
        expr, value = _arithmetic_problem(rng, split)
        rows.append(PromptRow(arithmetic_messages(expr), "arithmetic", {"answer": str(value)}))
    return assign_uids(rows, prefix=f"arithmetic-{split}")


REASONING_GYM_INSTRUCTION = "Give your final answer between <answer> and </answer>."


def reasoning_gym_rows(
    dataset: str, num_prompts: int, seed: int, split: str = "train"
) -> list[PromptRow]:
    """Rows of the reasoning-gym dataset ``dataset``, generated offline with ``seed``."""
    import reasoning_gym

    offset = 0 if split == "train" else 1_000_003
    data = reasoning_gym.create_dataset(dataset, size=num_prompts, seed=seed + offset)
    rows = [
        PromptRow(
            f"{entry['question']}\n{REASONING_GYM_INSTRUCTION}",
            f"reasoning_gym/{dataset}",
            {"entry": entry, "answer": entry["answer"], "dataset": dataset},
        )
        for entry in data
    ]
    return assign_uids(rows, prefix=f"{dataset}-{split}")
