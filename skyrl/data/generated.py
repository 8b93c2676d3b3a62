"""Built-in generated prompt sets: an arithmetic task and any reasoning-gym dataset.

The arithmetic task is meant for a small instruct model (SmolLM2-135M): mostly
one- and two-digit additions and subtractions with a few multiplications, so
it starts low but not at zero, and it demands a strict answer format
(``#### <number>`` on the last line), graded by the ``math`` env.
"""

from __future__ import annotations

import random

from skyrl.data.prompts import PromptRow, assign_uids

ARITHMETIC_INSTRUCTION = (
    "Solve the problem. Write the final answer on the last line as '#### <number>'."
)


def _arithmetic_problem(rng: random.Random) -> tuple[str, int]:
    kind = rng.choices(["add1", "add2", "sub2", "mul1", "chain"], weights=[3, 3, 2, 1, 1])[0]
    if kind == "add1":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"{a} + {b}", a + b
    if kind == "add2":
        a, b = rng.randint(10, 99), rng.randint(1, 99)
        return f"{a} + {b}", a + b
    if kind == "sub2":
        a, b = sorted((rng.randint(1, 99), rng.randint(1, 99)), reverse=True)
        return f"{a} - {b}", a - b
    if kind == "mul1":
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        return f"{a} * {b}", a * b
    a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
    return f"{a} + {b} - {c}", a + b - c


def arithmetic_rows(num_prompts: int, seed: int, split: str = "train") -> list[PromptRow]:
    """``num_prompts`` arithmetic questions (train and eval use different seeds)."""
    rng = random.Random(f"arithmetic-{split}-{seed}")
    rows = []
    for _ in range(num_prompts):
        expr, value = _arithmetic_problem(rng)
        prompt = f"What is {expr}? {ARITHMETIC_INSTRUCTION}"
        rows.append(PromptRow(prompt, "arithmetic", {"answer": str(value)}))
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
