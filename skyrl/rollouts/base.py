"""``RolloutSource``: where the trainer's training batches come from.

The trainer asks for the next batch (``next_batch``), brackets each weight sync with
``updating_weights`` (the source holds new requests meanwhile and then knows the
engines' new version) and asks it to evaluate. Everything
about producing rows lives behind this boundary: prompt loading, sampling seeds,
the rollout driver, reward shaping, dynamic sampling, eval sampling, fake data.

- ``SyncRollouts`` (``skyrl.rollouts.sync``): prompts -> generator -> shaping ->
  dynamic sampling, one step at a time, at the engines' current weights.
- ``AsyncRollouts`` (``skyrl.rollouts.async_rollouts``): ``trainer.max_staleness > 0``,
  the engines generate ahead while the workers train, at most that many versions.
- ``FakeRollouts`` (``skyrl.rollouts.fake``): ``data=fake``, random rows, no engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from skyrl.batch import TrainingInputBatch
from skyrl.config.root import SkyRLConfig
from skyrl.data import PromptSplits
from skyrl.inference.client import EngineClient


class WeightSyncTimeout(RuntimeError):
    """A weight sync did not finish in time; the message says what it was waiting for."""


class RolloutSource(Protocol):
    """What the trainer needs from the rollout side."""

    batches_per_epoch: int
    """Training batches in one pass over the prompts."""

    @property
    def engine(self) -> EngineClient | None:
        """The inference engines the batches are sampled from (the trainer syncs weights into
        them); None when no engine is involved (``data=fake``)."""
        ...

    def next_batch(self, step: int) -> tuple[TrainingInputBatch, dict[str, float]]:
        """The training batch of ``step`` and its rollout metrics."""
        ...

    def updating_weights(
        self, version: int, timeout_s: float | None = None
    ) -> AbstractContextManager[None]:
        """Entered around a weight sync; on exit the engines hold policy version ``version``.
        An asynchronous source holds new requests meanwhile (and may wait, at most
        ``timeout_s``, for those in flight: ``WeightSyncTimeout``)."""
        ...

    def has_eval(self) -> bool:
        """Whether ``evaluate`` has prompts to evaluate on."""
        ...

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics (``eval/...``) at the engines' current weights."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume the same stream of batches."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Stop producing (cancel what is in flight) and stop what the rollout drivers run
        (an external agent's endpoint); the engine itself stays up."""
        ...


@contextmanager
def set_version_after(clock, version: int) -> Iterator[None]:
    """``updating_weights`` of a source with nothing in flight during a sync: the clock
    (anything with a ``current`` version) moves to ``version`` once the sync is done."""
    yield
    clock.current = version


def make_rollouts(
    cfg: SkyRLConfig,
    tokenizer,
    output_dir: Path,
    engine: EngineClient | None = None,
    prompts: PromptSplits | None = None,
) -> RolloutSource:
    """``FakeRollouts`` for ``data=fake``, else ``SyncRollouts`` (``trainer.max_staleness=0``)
    or ``AsyncRollouts`` over ``engine`` (built from ``cfg.generator`` when not given) and
    ``prompts`` (loaded and checked when not given)."""
    if cfg.data.source == "fake":
        from skyrl.rollouts.fake import FakeRollouts

        return FakeRollouts(cfg, tokenizer)
    if engine is None:
        from skyrl.inference.factory import make_engine
        from skyrl.models.lora import engine_lora

        engine = make_engine(
            cfg.generator,
            cfg.model.path,
            cfg.model.tokenizer_path,
            lora=engine_lora(cfg),
            trust_remote_code=cfg.model.trust_remote_code,
        )
    if cfg.trainer.max_staleness > 0:
        from skyrl.rollouts.async_rollouts import AsyncRollouts

        return AsyncRollouts(cfg, engine, tokenizer, output_dir, prompts)
    from skyrl.rollouts.sync import SyncRollouts

    return SyncRollouts(cfg, engine, tokenizer, output_dir, prompts)
