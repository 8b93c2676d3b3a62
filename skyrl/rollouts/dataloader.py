"""Prompt batches for training steps: a seeded shuffle per epoch, handed out in order.

The loader's whole state is ``(epoch, cursor)``; it goes into every checkpoint,
so a resumed run draws exactly the prompts the uninterrupted run would have. With it goes
what the order was drawn over (the number of prompts, a digest of them, the seed): a run
resumed over other prompts or another ``trainer.seed`` is warned, in one line, that the rest
of the epoch comes from another order (allowed: a curriculum changes its prompts on purpose;
resumed at an epoch's end, the next epoch simply starts over the new prompts, unwarned).
Each batch holds independent deep copies of the rows, so an env or rollout
function that mutates a row cannot leak state into a later epoch.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import random
import sys
from typing import Any

from skyrl.data import PromptRow


class PromptLoader:
    """Draws ``batch_size`` rows at a time; an epoch ends when fewer than a batch are left."""

    def __init__(self, rows: list[PromptRow], batch_size: int, seed: int):
        if len(rows) < batch_size:
            raise ValueError(
                f"the training set has {len(rows)} prompts, fewer than "
                f"trainer.train_batch_size={batch_size}"
            )
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.epoch, self.cursor = 0, 0
        self._order = self._shuffled(0)
        self._drawn = 0
        self._digest: str | None = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def next_batch(self, uid_prefix: str) -> list[PromptRow]:
        """The next ``batch_size`` rows as copies with uids ``<uid_prefix>p<j>``."""
        return [self.row(i, uid) for i, uid in self.draw(uid_prefix)]

    def draw(self, uid_prefix: str) -> list[tuple[int, str]]:
        """The next ``batch_size`` prompts as (row index, uid ``<uid_prefix>p<j>``)."""
        if self.cursor + self.batch_size > len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        picked = self._order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        start, self._drawn = self._drawn, self._drawn + len(picked)
        return [(i, f"{uid_prefix}p{start + j}") for j, i in enumerate(picked)]

    def row(self, index: int, uid: str) -> PromptRow:
        """An independent copy of row ``index`` with uid ``uid``."""
        return dataclasses.replace(copy.deepcopy(self.rows[index]), uid=uid)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "drawn": self._drawn,
            "order_of": self._order_of(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor, self._drawn = state["epoch"], state["cursor"], state["drawn"]
        self._order = self._shuffled(self.epoch)
        saved, now = state.get("order_of"), self._order_of()
        # at an epoch's end the next draw starts a new epoch: nothing is left to repeat or skip
        continues = 0 < self.cursor and self.cursor + self.batch_size <= len(self._order)
        if continues and saved is not None and saved != now:  # None: saved before the record
            differ = (
                "other prompts"
                if (saved["prompts"], saved["seed"]) == (now["prompts"], now["seed"])
                else f"{now['prompts']} prompts (seed {now['seed']})"
            )
            print(
                f"warning: trainer.resume: the checkpoint's prompt order was drawn over "
                f"{saved['prompts']} prompts (seed {saved['seed']}); this run has {differ}: "
                f"prompts may repeat or be skipped until epoch {self.epoch + 1} ends",
                file=sys.stderr,
                flush=True,
            )

    def _order_of(self) -> dict[str, Any]:
        """What the order is drawn over: the number of prompts, a digest of them, the seed."""
        if self._digest is None:
            digest = hashlib.sha1()
            for row in self.rows:
                record = [row.prompt, row.data_source, row.extras]
                digest.update(json.dumps(record, sort_keys=True, default=str).encode())
            self._digest = digest.hexdigest()[:16]
        return {"prompts": len(self.rows), "seed": self.seed, "digest": self._digest}

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order
