"""PrefillOrder: which requests an engine with prefix caching adds now, which one step later."""

from dataclasses import dataclass

import pytest

from skyrl.inference.prefill_order import PrefillOrder


@dataclass
class Req:
    name: str
    prompt_ids: list[int]


def names(requests: list[Req]) -> list[str]:
    return [r.name for r in requests]


def test_samples_of_one_prompt_wait_one_step_for_its_blocks():
    """Block size 4. A and B: the same 10-token prompt (2 full blocks + 2 tokens); C shares
    A's first block only; D shares nothing. Step 1 adds A and D; B and C would find A's
    blocks computed one step later, so they wait. Step 2: B finds both of A's blocks cached,
    C the first; nothing added in step 2 gives either more, so both go."""
    order = PrefillOrder(block_size=4)
    a = Req("A", list(range(1, 11)))
    b = Req("B", list(range(1, 11)))
    c = Req("C", [1, 2, 3, 4, 50, 51, 52, 53, 54])
    d = Req("D", [90, 91, 92, 93, 94])
    now, held = order.split([a, b, c, d])
    assert (names(now), names(held)) == (["A", "D"], ["B", "C"])
    now, held = order.split(held)
    assert (names(now), names(held)) == (["B", "C"], [])


def test_a_shared_system_prompt_then_each_prompt_once():
    """Two prompts P and Q share their first block (a system prompt) and differ in the
    second; two samples each. Step 1: P1 alone (all share its first block). Step 2: P2 (P's
    blocks now cached) and Q1 (the first block cached; its second is its own). Step 3: Q2,
    which would have shared Q1's second block in step 2."""
    order = PrefillOrder(block_size=4)
    system = [7, 7, 7, 7]
    p = [*system, 1, 2, 3, 4, 5]
    q = [*system, 8, 8, 8, 8, 5]
    requests = [Req("P1", p), Req("P2", p), Req("Q1", q), Req("Q2", q)]
    steps = []
    held = requests
    while held:
        now, held = order.split(held)
        steps.append(names(now))
    assert steps == [["P1"], ["P2", "Q1"], ["Q2"]]


def test_short_prompts_reset_and_off():
    """A prompt shorter than a block has nothing to share; after ``reset`` (the engine's
    prefix cache emptied) nothing counts as cached; with prefix caching off all go at once."""
    order = PrefillOrder(block_size=4)
    short = [Req("s1", [1, 2, 3]), Req("s2", [1, 2, 3])]
    assert order.split(short) == (short, [])
    a1, a2 = Req("a1", [5, 6, 7, 8]), Req("a2", [5, 6, 7, 8])
    assert order.split([a1]) == ([a1], [])
    assert order.split([a2]) == ([a2], [])  # a1's block is cached now
    order.reset()
    assert order.split([a1, a2]) == ([a1], [a2])
    off = PrefillOrder(block_size=4, enabled=False)
    assert off.split([a1, a2]) == ([a1, a2], [])
    with pytest.raises(ValueError, match="block_size"):
        PrefillOrder(block_size=0)
