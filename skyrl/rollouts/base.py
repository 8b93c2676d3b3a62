"""``RolloutSource``: where the trainer's training batches come from.

The trainer asks for the next batch (``next_batch``), tells the source when the
engines hold new weights (``weights_updated``) and asks it to evaluate. Everything
about producing rows lives behind this boundary: prompt loading, sampling seeds,
the rollout driver, reward shaping, dynamic sampling, eval sampling, fake data.

- ``SyncRollouts`` (``skyrl.rollouts.sync``): prompts -> generator -> shaping ->
  dynamic sampling, one step at a time, at the engines' current weights.
- ``FakeRollouts`` (``skyrl.rollouts.fake``): ``data=fake``, random rows, no engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from skyrl.batch import TrainingInputBatch
from skyrl.config.root import SkyRLConfig
from skyrl.data import PromptSplits
from skyrl.inference.client import EngineClient


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

    def weights_updated(self, version: int) -> None:
        """The engines now hold policy version ``version``."""
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


def make_rollouts(
    cfg: SkyRLConfig,
    tokenizer,
    output_dir: Path,
    engine: EngineClient | None = None,
    prompts: PromptSplits | None = None,
) -> RolloutSource:
    """``FakeRollouts`` for ``data=fake``, else ``SyncRollouts`` over ``engine`` (built from
    ``cfg.generator`` when not given) and ``prompts`` (loaded and checked when not given)."""
    if cfg.data.source == "fake":
        from skyrl.rollouts.fake import FakeRollouts

        return FakeRollouts(cfg, tokenizer)
    from skyrl.rollouts.sync import SyncRollouts

    if engine is None:
        from skyrl.inference.factory import make_engine

        engine = make_engine(cfg.generator, cfg.model.path, cfg.model.tokenizer_path)
    return SyncRollouts(cfg, engine, tokenizer, output_dir, prompts)
