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
Within a split problems are drawn without repeats (2242 train, 312 eval problems
exist); the small one-digit kinds run out first, so a large draw holds more
two-digit problems than the kind weights alone say (the figures above were
measured on the earlier draw, which repeated problems).

A reasoning-gym dataset has no such partition: its eval questions are drawn from the
generator at another seed, skipping any that is a train question (small problem spaces
repeat), so eval depends on ``data.num_train_prompts`` as well.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import warnings
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


class TooFewProblems(UserWarning):
    """A generated split holds fewer distinct problems than asked for: some repeat."""


Problem = tuple[str, int]
"""``(expression, value)``."""


def _add_1d() -> list[Problem]:
    return [(f"{a} + {b}", a + b) for a in range(1, 10) for b in range(1, 10)]


def _sub_1d() -> list[Problem]:
    return [(f"{a} - {b}", a - b) for b in range(1, 10) for a in range(b, b + 10)]


def _mul_1d() -> list[Problem]:
    return [(f"{a} * {b}", a * b) for a in range(2, 10) for b in range(2, 10)]


def _add_2d_1d() -> list[Problem]:
    return [(f"{a} + {b}", a + b) for a in range(10, 50) for b in range(1, 10)]


def _add_2d() -> list[Problem]:
    return [(f"{a} + {b}", a + b) for a in range(10, 50) for b in range(10, 50)]


def _sub_2d_1d() -> list[Problem]:
    return [(f"{a} - {b}", a - b) for a in range(20, 60) for b in range(1, 10)]


ARITHMETIC_KINDS: dict[str, tuple[float, Callable[[], list[Problem]]]] = {
    "add_1d": (1, _add_1d),
    "sub_1d": (2, _sub_1d),
    "mul_1d": (2, _mul_1d),
    "add_2d_1d": (2, _add_2d_1d),
    "add_2d": (1, _add_2d),
    "sub_2d_1d": (1, _sub_2d_1d),
}
"""Problem kinds: name -> (sampling weight, every problem of the kind). No expression
belongs to two kinds."""


def arithmetic_split(expr: str) -> str:
    """``train`` or ``eval``: a fixed hash partition of the expressions."""
    return "eval" if zlib.crc32(expr.encode()) % EVAL_SHARE == 0 else "train"


def _arithmetic_problems(num_prompts: int, rng: random.Random, split: str) -> list[Problem]:
    """``num_prompts`` distinct problems of ``split`` while it has that many, else every one
    of them before any repeats (one pass after another, with a warning).

    Each draw has the distribution of drawing a kind by weight, then a uniform problem of
    that kind, again until it is one of ``split`` not yet drawn: the kind is drawn with
    weight x (its problems left in the split / all its problems), then one of those left."""
    weights: dict[str, float] = {}
    sizes: dict[str, int] = {}
    pools: dict[str, list[Problem]] = {}
    for name, (weight, problems) in ARITHMETIC_KINDS.items():
        every = problems()
        weights[name], sizes[name] = weight, len(every)
        pools[name] = [
            p for p in every if p[0] != _EXAMPLE_EXPR and arithmetic_split(p[0]) == split
        ]
    distinct = sum(len(p) for p in pools.values())
    if num_prompts > distinct:
        warnings.warn(
            f"arithmetic: {num_prompts} {split} prompts but {distinct} distinct {split} "
            "problems; each is repeated (every one once before any twice)",
            TooFewProblems,
            stacklevel=3,
        )
    left: dict[str, list[Problem]] = {}
    drawn = []
    for _ in range(num_prompts):
        if not any(left.values()):  # a new pass over the split
            left = {n: list(p) for n, p in pools.items()}
        names = [n for n in left if left[n]]
        odds = [weights[n] * len(left[n]) / sizes[n] for n in names]
        pool = left[rng.choices(names, weights=odds)[0]]
        j = rng.randrange(len(pool))
        pool[j], pool[-1] = pool[-1], pool[j]
        drawn.append(pool.pop())
    return drawn


def arithmetic_messages(expr: str) -> list[Message]:
    """The chat for one question: system prompt, the worked example, the question."""
    return [
        {"role": "system", "content": ARITHMETIC_SYSTEM_PROMPT},
        *ARITHMETIC_EXAMPLE,
        {"role": "user", "content": f"What is {expr}?"},
    ]


def arithmetic_rows(num_prompts: int, seed: int, split: str = "train") -> list[PromptRow]:
    """``num_prompts`` arithmetic questions of ``split`` (``train`` or ``eval``, disjoint),
    distinct while the split has that many (2242 train, 312 eval problems), drawn from
    ``seed``."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"arithmetic-{split}-{seed}")
    rows = [
        PromptRow(arithmetic_messages(expr), "arithmetic", {"answer": str(value)})
        for expr, value in _arithmetic_problems(num_prompts, rng, split)
    ]
    return assign_uids(rows, prefix=f"arithmetic-{split}")


REASONING_GYM_INSTRUCTION = "Give your final answer between <answer> and </answer>."
REASONING_GYM_EVAL_SEED_OFFSET = 1_000_003
"""The eval generator's seed is ``data.seed`` plus this."""
HELD_OUT_DRAWS_PER_PROMPT = 16
"""Eval entries drawn at most per eval prompt, looking for questions not in train."""


def reasoning_gym_rows(
    dataset: str,
    num_prompts: int,
    seed: int,
    split: str = "train",
    num_train_prompts: int | None = None,
) -> list[PromptRow]:
    """Rows of the reasoning-gym dataset ``dataset``, generated offline with ``seed``.

    ``train`` is the generator's first ``num_prompts`` entries at ``seed``. ``eval`` (which
    needs ``num_train_prompts``) holds distinct questions that are not train questions (a
    small problem space repeats): entries of the generator at ``seed`` +
    ``REASONING_GYM_EVAL_SEED_OFFSET``, ``num_prompts`` at a time, train and repeated
    questions skipped, at most ``HELD_OUT_DRAWS_PER_PROMPT`` x ``num_prompts`` drawn; short
    of ``num_prompts``, each is repeated (every one once before any twice), with a warning.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if split == "eval" and num_train_prompts is None:
        raise TypeError("reasoning_gym_rows(split='eval') needs num_train_prompts")
    entries = _without_hash_randomization(
        _reasoning_gym_entries, dataset, num_prompts, seed, split, num_train_prompts
    )
    rows = [
        PromptRow(
            f"{entry['question']}\n{REASONING_GYM_INSTRUCTION}",
            f"reasoning_gym/{dataset}",
            {"entry": entry, "answer": entry["answer"], "dataset": dataset},
        )
        for entry in entries
    ]
    return assign_uids(rows, prefix=f"{dataset}-{split}")


def _reasoning_gym_entries(
    dataset: str, num_prompts: int, seed: int, split: str, num_train_prompts: int | None
) -> list[dict]:
    """The entries of ``reasoning_gym_rows`` (generated in this process)."""
    if split == "train":
        return list(_create_dataset(dataset, num_prompts, seed))
    assert num_train_prompts is not None  # reasoning_gym_rows checks it
    train = _create_dataset(dataset, num_train_prompts, seed)
    return _held_out_entries(dataset, num_prompts, seed, {e["question"] for e in train})


_CHILD = """
import os, pickle, sys, warnings
result = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)  # what the generator prints (bf prints dots) goes to stderr, not into the pickle
paths, module, name, args = pickle.loads(sys.stdin.buffer.read())
sys.path[:0] = paths
import importlib
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        out = ("ok", getattr(importlib.import_module(module), name)(*args))
    except (ValueError, TypeError) as exc:
        out = ("error", type(exc).__name__, str(exc))
result.write(pickle.dumps((out, [(w.category.__name__, str(w.message)) for w in caught])))
result.flush()
"""
"""Runs ``module.name(*args)`` in ``_without_hash_randomization``'s child process and pickles
back its result (or its ``ValueError`` / ``TypeError``) and the warnings it raised on its
stdout, which holds nothing else: the generator's own prints go to its stderr."""


def _without_hash_randomization(fn: Callable, *args):
    """``fn(*args)`` as a process with ``PYTHONHASHSEED=0`` computes it: some generators
    iterate over sets of strings (reasoning-gym's ``ransom_note``, ``isomorphic_strings``,
    ``list_functions``, ``polynomial_multiplication``), so what they generate changed from one
    process to the next, a resumed run's prompts among them. In this process when it has hash
    randomization off, else in a child process (about a second). ``fn``'s ``ValueError`` or
    ``TypeError`` and its ``TooFewProblems`` warnings come back as they were raised."""
    if not sys.flags.hash_randomization:
        return fn(*args)
    payload = pickle.dumps((sys.path, fn.__module__, fn.__name__, args))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], input=payload, capture_output=True, env=env, check=False
    )
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"generating {fn.__name__}{args!r} failed: {' '.join(last)}")
    out, caught = pickle.loads(done.stdout)
    for category, message in caught:
        warnings.warn(message, TooFewProblems if category == "TooFewProblems" else UserWarning,
                      stacklevel=3)  # fmt: skip
    if out[0] == "error":
        raise (ValueError if out[1] == "ValueError" else TypeError)(out[2])
    return out[1]


def _create_dataset(dataset: str, size: int, seed: int):
    """``reasoning_gym.create_dataset`` with its default config; a ``ValueError`` for a name
    not registered, and for a dataset that refuses its default config (``composite`` lists
    no datasets): reasoning-gym checks configs with ``assert``."""
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(dataset, size=size, seed=seed)
    except AssertionError as exc:
        problem = f"dataset {dataset!r} cannot be generated from its default config: {exc}"
    raise ValueError(problem)  # outside the handler: no exception context


def _held_out_entries(
    dataset: str, num_prompts: int, seed: int, train_questions: set[str]
) -> list[dict]:
    """``num_prompts`` eval entries of distinct questions outside ``train_questions``, see
    ``reasoning_gym_rows``."""
    if num_prompts == 0:
        return []
    held_out: dict[str, dict] = {}
    max_draws = HELD_OUT_DRAWS_PER_PROMPT * num_prompts
    eval_seed = seed + REASONING_GYM_EVAL_SEED_OFFSET
    for start in range(0, max_draws, num_prompts):
        # most generators seed entry i with seed + i, so each chunk continues the last; the
        # first chunk is the whole eval set when none of it is a train or repeated question
        chunk = _create_dataset(dataset, num_prompts, eval_seed + start)
        for entry in chunk:
            if entry["question"] not in train_questions:
                held_out.setdefault(entry["question"], entry)
        if len(held_out) >= num_prompts:
            return list(held_out.values())[:num_prompts]
    distinct = list(held_out.values())
    outcome = (
        "each is repeated (every one once before any twice)" if distinct else "no eval prompts"
    )
    warnings.warn(
        f"reasoning-gym {dataset}: {num_prompts} eval prompts but {len(distinct)} distinct "
        f"questions that are not train questions in {max_draws} draws; {outcome}",
        TooFewProblems,
        stacklevel=3,
    )
    return (distinct * num_prompts)[:num_prompts]
