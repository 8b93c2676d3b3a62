"""The inference-engine interface: one request (one turn of one trajectory) in, one completion out.

Every engine, in-process or a Ray actor behind ``EngineClient``, implements
``InferenceEngine``: ``generate`` is a coroutine awaited once per request, so each
trajectory advances on its own and batching is the engine's business (vLLM
schedules continuously; the hf engine batches what is queued). The control
methods (weights, prefix cache, sleep, shutdown) are plain calls, made between
generations or, for an engine that serves on another thread, run on that thread.

The logprob convention, decided here for every engine and the trainer:
``Completion.logprobs[i]`` is ``log softmax(logits / T)[token_i]``, the
log-probability under the distribution the token was sampled from AFTER
temperature scaling (``logprob_temperature``; greedy, T = 0, reports T = 1).
Top-p, top-k and min-p truncation is applied on NEITHER side: an engine samples
from the truncated distribution but reports the untruncated tempered logprob,
which is what the trainer's forward (``skyrl.workers.logprobs``) computes.

Seeds: ``request_seed`` derives each request's seed from a base seed (run seed,
step, sampling round), the prompt uid, the sample and the turn, so a run is
reproducible and samples of different prompts draw independent streams.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from skyrl.config.errors import is_int, require
from skyrl.config.generator import SamplingConfig

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass
class SamplingParams(SamplingConfig):
    """Sampling for one request: the ``generator.sampling`` fields plus ``n`` and ``max_tokens``.

    ``InferenceEngine.generate`` takes one sample per request (``n`` is read only by
    ``generate_batch``); ``seed`` is that request's own seed (None: unseeded).
    """

    n: int = 1
    """Samples per prompt (``generate_batch``)."""
    max_tokens: int = 64
    """New tokens per sample, >= 0 (0: an empty completion, finish_reason ``length``)."""

    def __post_init__(self) -> None:
        """The types an engine relies on (a str ``stop`` was read as its characters),
        then ``SamplingConfig``'s value checks; a ``ConfigError`` naming the field."""
        for name in ("n", "max_tokens", "top_k"):  # a bool is an int: max_tokens=True is 1
            value = getattr(self, name)
            require(is_int(value), name, f"must be an int, got {value!r}")
        for name in ("temperature", "top_p", "min_p"):  # compared with floats below
            value = getattr(self, name)
            require(
                is_int(value) or isinstance(value, float), name, f"must be a number, got {value!r}"
            )
        require(self.n >= 1, "n", f"must be >= 1, got {self.n}")
        # 0 is an empty completion (finish_reason length); a negative one read as 0 silently
        require(self.max_tokens >= 0, "max_tokens", f"must be >= 0, got {self.max_tokens}")
        require(
            self.seed is None or is_int(self.seed),
            "seed",
            f"must be an int or None, got {self.seed!r}",
        )
        require(
            isinstance(self.stop, list | tuple) and all(isinstance(s, str) for s in self.stop),
            "stop",
            f"must be a list of strings, got {self.stop!r}",
        )
        require(
            isinstance(self.stop_token_ids, list | tuple)
            and all(isinstance(t, int) for t in self.stop_token_ids),
            "stop_token_ids",
            f"must be a list of token ids (ints), got {self.stop_token_ids!r}",
        )
        super().__post_init__()

    @classmethod
    def from_config(cls, cfg: SamplingConfig, n: int, max_tokens: int) -> SamplingParams:
        """Build from the ``generator.sampling`` schema."""
        fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(SamplingConfig)}
        fields["stop"], fields["stop_token_ids"] = list(cfg.stop), list(cfg.stop_token_ids)
        return cls(n=n, max_tokens=max_tokens, **fields)


def logprob_temperature(temperature: float) -> float:
    """The temperature logprobs are reported at: the sampling temperature, 1 for greedy."""
    return temperature if temperature > 0 else 1.0


SEED_RANGE = (-(2**63), 2**64)
"""The seeds a torch generator takes, ``[low, high)``; each engine seeds one per request."""


def seed_refusal(seed: int | None) -> str | None:
    """Why no engine can seed a request with ``seed`` (None: it can). Outside ``SEED_RANGE``
    torch raised "Overflow when unpacking long long" for the whole batch (hf engine) or out
    of vLLM's step, ending the serving loop."""
    low, high = SEED_RANGE
    if seed is None or low <= seed < high:
        return None
    return f"seed {seed} is outside [-2**63, 2**64), the seeds a torch generator takes"


def request_seed(base: int, uid: str, sample: int, turn: int) -> int:
    """A 31-bit seed for turn ``turn`` of sample ``sample`` of prompt ``uid`` (a stable hash:
    the same arguments give the same seed in every process; different prompts differ)."""
    digest = hashlib.blake2b(f"{base}|{uid}|{sample}|{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


@dataclass
class Completion:
    """One sample: its tokens, the logprob of each, and why it ended."""

    token_ids: list[int]
    """Sampled token ids (a stop token or the token finishing a stop string is kept)."""
    logprobs: list[float]
    """log p(token) under the tempered, untruncated distribution (module docstring)."""
    finish_reason: str
    """``stop`` (EOS, stop token or stop string) or ``length`` (max_tokens reached)."""


WeightItems = Iterable[
    "tuple[str, torch.Tensor] | list[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]"
]
"""Named tensors, or buckets of them (lists or dicts), in any mix."""


def iter_named_tensors(weights: WeightItems) -> Iterator[tuple[str, torch.Tensor]]:
    """Flatten named tensors given one by one or in buckets; a ``TypeError`` naming what is
    neither (``model.parameters()``: tensors without names, say)."""
    import torch

    if isinstance(weights, dict):
        yield from map(_named_tensor, weights.items())
        return
    for item in weights:
        if isinstance(item, dict):
            yield from map(_named_tensor, item.items())
        elif isinstance(item, tuple) and item and isinstance(item[0], str):
            yield _named_tensor(item)
        elif isinstance(item, Iterable) and not isinstance(item, torch.Tensor | str | bytes):
            yield from map(_named_tensor, item)  # a bucket
        else:
            yield _named_tensor(item)  # raises


def _named_tensor(item: object) -> tuple[str, torch.Tensor]:
    import torch

    if (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], torch.Tensor)
    ):
        return item
    if isinstance(item, tuple) and item and isinstance(item[0], str):
        got = f"{item[0]!r} with {', '.join(type(v).__name__ for v in item[1:]) or 'nothing'}"
    else:
        kind = type(item).__name__
        got = f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"
    raise TypeError(
        "update_weights takes (name, tensor) pairs, lists of them or {name: tensor} dicts "
        f"(named_parameters(), not parameters()); got {got}"
    )


class InferenceEngine(Protocol):
    """What the rollout drivers and the trainer need from an engine."""

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        """One sample for one prompt. ``route_key`` (the prompt uid) keeps the requests of
        one prompt on one engine behind a client; a single engine ignores it."""
        ...

    def serve(self, done: Future) -> None:
        """Do this engine's in-process work on the calling thread until ``done`` is done
        (returns at once for an engine that serves elsewhere, e.g. a Ray actor)."""
        ...

    def update_weights(self, weights: WeightItems) -> None:
        """Load new weights (all or some parameters, by HF name). The vllm engine takes
        each of its layers only whole: all of q/k/v_proj (weights and biases) or none, all
        of gate/up_proj or none; it refuses (``ValueError``) a part of one."""
        ...

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Join the broadcast weight-sync group (``skyrl.inference.weight_sync``)."""
        ...

    def receive_weights(self, plan: list) -> None:
        """Receive and load the buckets of ``plan`` from the broadcast group."""
        ...

    def reset_prefix_cache(self) -> None:
        """Drop cached KV (computed with earlier weights). The vllm engine preempts the
        requests in flight too; they recompute theirs under the current weights."""
        ...

    def sleep(self) -> None: ...

    def wake_up(self) -> None: ...

    def shutdown(self) -> None:
        """Release the engine (model, KV cache, actor); the engine is unusable afterwards."""
        ...


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
