"""Prompt batches for training steps: a seeded shuffle per epoch, handed out in order.

The loader's whole state is ``(epoch, cursor)`` and the rows a refill passed over
(``pending``, drawn first next time); it goes into every checkpoint, so a resumed run draws
exactly the prompts the uninterrupted run would have. With it goes what the order was drawn
over (the number of prompts, a digest of them, the seed): a run resumed over other prompts
or another ``trainer.seed`` is warned, in one line, that the rest of the epoch comes from
another order (allowed: a curriculum changes its prompts on purpose; resumed at an epoch's
end, the next epoch simply starts over the new prompts, unwarned).
Each batch holds independent deep copies of the rows, so an env or rollout
function that mutates a row cannot leak state into a later epoch.

A refill (``refill=True``: dynamic sampling's further rounds of one step) skips the rows the
step already drew, so a step never trains two groups of one prompt: past an epoch's end the
new shuffle would otherwise hand them out again. A skipped row waits in ``pending`` and
comes first in the epoch's next draws (left over at the epoch's end, like the remainder of
the shuffle, it waits for the next epoch). When fewer than a batch of rows are left that the
step has not drawn, a refill draws nothing: the step's sampling rounds end there.
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
        self._pending: list[int] = []
        """Rows of this epoch a refill skipped, in order: the next draws' first candidates."""
        self._step_rows: set[int] = set()
        """Rows drawn since the last draw that was not a refill (one step's)."""
        self._drawn = 0
        self._digest: str | None = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def next_batch(self, uid_prefix: str, refill: bool = False) -> list[PromptRow]:
        """The next ``batch_size`` rows as copies with uids ``<uid_prefix>p<j>``; ``refill``
        as in ``draw``."""
        return [self.row(i, uid) for i, uid in self.draw(uid_prefix, refill)]

    def draw(self, uid_prefix: str, refill: bool = False) -> list[tuple[int, str]]:
        """The next ``batch_size`` prompts as (row index, uid ``<uid_prefix>p<j>``).

        ``refill``: another batch for the same step, without the rows drawn since the last
        draw that was not a refill; none (``[]``, nothing moved) when fewer than a batch of
        rows are left without them: any batch would repeat a prompt of the step."""
        if not refill:
            self._step_rows = set()
        skip = self._step_rows
        if len(self.rows) - len(skip) < self.batch_size:
            return []
        picked = self._take(skip)
        if picked is None:  # fewer than a batch left in this epoch: the rest is dropped
            self.epoch, self.cursor, self._pending = self.epoch + 1, 0, []
            self._order = self._shuffled(self.epoch)
            picked = self._take(skip)
        assert picked is not None  # a new epoch holds every row, >= batch_size not skipped
        self._step_rows.update(picked)
        start, self._drawn = self._drawn, self._drawn + len(picked)
        return [(i, f"{uid_prefix}p{start + j}") for j, i in enumerate(picked)]

    def _take(self, skip: set[int]) -> list[int] | None:
        """The first ``batch_size`` rows of ``pending`` then the epoch's order from ``cursor``
        that are not in ``skip``; the skipped rows before the last one taken become
        ``pending``. None (nothing moved) when this epoch has fewer left."""
        candidates = self._pending + self._order[self.cursor :]
        picked: list[int] = []
        passed: list[int] = []
        for i in candidates:
            if len(picked) == self.batch_size:
                break
            (passed if i in skip else picked).append(i)
        if len(picked) < self.batch_size:
            return None
        used = len(picked) + len(passed)  # candidates up to the last row taken
        self.cursor += max(0, used - len(self._pending))
        self._pending = passed + self._pending[used:]
        return picked

    def row(self, index: int, uid: str) -> PromptRow:
        """An independent copy of row ``index`` with uid ``uid``."""
        return dataclasses.replace(copy.deepcopy(self.rows[index]), uid=uid)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "drawn": self._drawn,
            "pending": list(self._pending),
            "order_of": self._order_of(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.cursor, self._drawn = state["epoch"], state["cursor"], state["drawn"]
        pending = state.get("pending", [])  # absent: saved before refills skipped rows
        self._pending = [i for i in pending if i < len(self.rows)]  # other prompts: warned below
        self._order = self._shuffled(self.epoch)
        saved, now = state.get("order_of"), self._order_of()
        # at an epoch's end the next draw starts a new epoch: nothing is left to repeat or skip
        left = len(self._pending) + len(self._order) - self.cursor
        continues = 0 < self.cursor and self.batch_size <= left
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
