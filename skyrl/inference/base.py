"""The inference-engine interface: token ids in, token ids + logprobs out.

The trainer never re-tokenizes generated text: engines take prompt token ids
and return the sampled token ids with the logprob of each under the model's
raw (untempered) distribution, which is what off-policy correction compares
against the trainer's own forward pass.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from skyrl.config.generator import SamplingConfig

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass
class SamplingParams(SamplingConfig):
    """Sampling for one ``generate`` call: the ``generator.sampling`` fields plus ``n`` samples
    per prompt and ``max_tokens``."""

    n: int = 1
    """Samples per prompt."""
    max_tokens: int = 64
    """New tokens per sample."""

    @classmethod
    def from_config(cls, cfg: SamplingConfig, n: int, max_tokens: int) -> SamplingParams:
        """Build from the ``generator.sampling`` schema."""
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(SamplingConfig)}
        fields["stop"], fields["stop_token_ids"] = list(cfg.stop), list(cfg.stop_token_ids)
        return cls(n=n, max_tokens=max_tokens, **fields)


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
