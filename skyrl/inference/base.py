"""The inference-engine interface: token ids in, token ids + logprobs out.

The trainer never re-tokenizes generated text: engines take prompt token ids
and return the sampled token ids with the logprob of each under the model's
raw (untempered) distribution, which is what off-policy correction compares
against the trainer's own forward pass.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from skyrl.config.generator import SamplingConfig

logger = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """Sampling for one ``generate`` call (``n`` samples per prompt)."""

    n: int = 1
    """Samples per prompt."""
    max_tokens: int = 64
    """New tokens per sample."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 = all."""
    min_p: float = 0.0
    """Drop tokens below min_p x the top token's probability."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (kept in the response)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Stop token ids besides EOS (kept in the response)."""
    seed: int | None = None
    """Sampling seed; None = nondeterministic."""

    @classmethod
    def from_config(cls, cfg: SamplingConfig, n: int, max_tokens: int) -> SamplingParams:
        """Build from the ``generator.sampling`` schema."""
        return cls(
            n=n,
            max_tokens=max_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            min_p=cfg.min_p,
            stop=list(cfg.stop),
            stop_token_ids=list(cfg.stop_token_ids),
            seed=cfg.seed,
        )


@dataclass
class Completion:
    """One sample: its tokens, the logprob of each, and why it ended."""

    token_ids: list[int]
    """Sampled token ids (a stop token or the token finishing a stop string is kept)."""
    logprobs: list[float]
    """log p(token) under the raw model distribution, one per token."""
    finish_reason: str
    """``stop`` (EOS, stop token or stop string) or ``length`` (max_tokens reached)."""


WeightItems = Iterable[
    "tuple[str, torch.Tensor] | list[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]"
]
"""Named tensors, or buckets of them (lists or dicts), in any mix."""


def iter_named_tensors(weights: WeightItems) -> Iterator[tuple[str, torch.Tensor]]:
    """Flatten named tensors given one by one or in buckets."""
    if isinstance(weights, dict):
        yield from weights.items()
        return
    for item in weights:
        if isinstance(item, dict):
            yield from item.items()
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            yield item
        else:
            yield from item


class InferenceEngine(Protocol):
    """What the generator and the trainer need from an engine."""

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams
    ) -> list[list[Completion]]:
        """Per prompt, ``sampling.n`` completions."""
        ...

    def update_weights(self, weights: WeightItems) -> None:
        """Load new weights (all or some parameters, by HF name)."""
        ...

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Join the broadcast weight-sync group (``skyrl.inference.weight_sync``)."""
        ...

    def receive_weights(self, plan: list) -> None:
        """Receive and load the buckets of ``plan`` from the broadcast group."""
        ...

    def reset_prefix_cache(self) -> None: ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...


_reported: set[str] = set()


def report_once(message: str) -> None:
    """Log an unsupported-feature notice once per process."""
    if message not in _reported:
        _reported.add(message)
        logger.warning(message)


def truncate_at_stop(
    token_ids: list[int],
    logprobs: list[float],
    stop_ids: set[int],
    stop_strings: list[str],
    decode,
    max_tokens: int,
) -> Completion:
    """Cut a raw sample after its first stop token or the token completing a stop string."""
    for i, tok in enumerate(token_ids):
        if tok in stop_ids:
            return Completion(token_ids[: i + 1], logprobs[: i + 1], "stop")
    if stop_strings:
        for i in range(len(token_ids)):
            text = decode(token_ids[: i + 1])
            if any(s in text for s in stop_strings):
                return Completion(token_ids[: i + 1], logprobs[: i + 1], "stop")
    reason = "length" if len(token_ids) >= max_tokens else "stop"
    return Completion(list(token_ids), list(logprobs), reason)
