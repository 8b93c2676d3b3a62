"""Answer extraction and math-verify grading shared by the built-in envs."""

from __future__ import annotations

import re
import threading

_HASH = re.compile(r"####\s*([^\n]+)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed{") - 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer: ``<answer>..</answer>``, else ``#### x``, else the last ``\\boxed{x}``."""
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    hashes = _HASH.findall(text)
    if hashes:
        return hashes[-1].strip().rstrip(".").replace(",", "")
    return _boxed(text)


def math_equal(predicted: str, gold: str) -> bool:
    """Equivalence by math-verify (numbers, fractions, LaTeX), or equal strings.

    math-verify's own timeouts use ``signal.alarm``, which only works in the main
    thread (elsewhere it raises, which a blanket ``except`` would turn into a silent
    reward 0). Off the main thread they are disabled: the generator already runs
    every env call under its own time limit.
    """
    from math_verify import parse, verify

    if predicted.strip() == str(gold).strip():
        return True
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_p = parse(f"${gold}$", parsing_timeout=timeout)
    pred_p = parse(f"${predicted}$", parsing_timeout=timeout)
    return bool(gold_p and pred_p and verify(gold_p, pred_p, timeout_seconds=timeout))


def grade(text: str, gold: str) -> float:
    """1.0 when the response's final answer equals ``gold``, else 0.0 (no answer = 0)."""
    answer = extract_answer(text)
    return float(answer is not None and math_equal(answer, str(gold)))
