"""``AsyncRollouts``: the engines keep generating while the workers train, at most
``trainer.max_staleness`` policy versions ahead.

Prompt groups (all samples of one prompt) are admitted one at a time and run on
an event loop of their own (a background thread), against engines that are Ray
actors with CPUs or GPUs of their own, so generation and training really overlap.

- **Staleness is bounded by admission** (``Admission``), never by throwing work
  away: a group starts only while the groups admitted and not yet trained fit in
  the versions left, ``accepted + running <= (max_staleness + version + 1) *
  train_batch_size``. Counted from the batches taken, so a refused step (no
  weight sync) cannot stall the stream.
- **Batches are cut in admission order**: a batch is the next
  ``train_batch_size`` kept groups in the order they were admitted, one per prompt
  (past an epoch's end the filter's drops can move the next shuffle's group of a prompt
  up into a batch that holds one: it heads the next batch instead, as the synchronous
  source's refills skip the step's prompts), so which prompts a step trains on does
  not depend on timing, a fast prompt is never preferred to a slow one, and a resumed
  run consumes the prompts the uninterrupted one would have (without the dynamic filter:
  see **Resume**). The trainer waits for the slowest group of its batch while the engines go
  on with the next ones.
- **Versions are data**: every turn records the policy version at dispatch and
  at finish; each batch reports the staleness it holds (``async/...``). A group
  whose oldest turn is older than the bound is counted in ``async/stale_groups`` and its
  prompt generated again. Admission rules that out for a group trained in the batch it
  was admitted for; a repeat that waits for the next batch (above) can outlast the bound. A group with no turn at all (its environment failed before the first
  request) holds no policy's tokens and is never stale: it trains as masked rows, as in
  synchronous training.
- **Weight syncs** (``updating_weights``): new requests wait while the weights
  load; requests in flight finish first, under the old weights, unless
  ``trainer.partial_rollouts`` lets them continue under the new ones.
- **Dynamic sampling** (``algorithm.dynamic_sampling=filter``) is a filter on the
  stream: a group ``algorithm.dynamic_filter`` rejects is dropped, counted, and
  another prompt admitted in its place; as many as the synchronous source's extra rounds
  hold, ``(max_sample_batches - 1) * train_batch_size`` per batch. Past that the groups it
  rejects are kept (their advantages are 0), so a stream of flat groups still makes batches.
  The drops are decided in admission order (the first rejected groups of the batch's stretch
  of the line), not in the order groups finish, so they too do not depend on timing.
  The rollout metrics of a batch (``generate/...``, ``env/errors``) count the groups dropped
  since the previous batch too, as the synchronous source's cover every sampling round.
- **Resume**: a checkpoint holds the loader and every prompt drawn but not yet
  trained on (running or finished at save time); after a resume those are
  generated again first, so no prompt is trained twice or skipped. It also holds what the
  next batch's filter has dropped already (the rest of its allowance and the counts), so a
  resumed batch drops no more than the uninterrupted one would. Without the dynamic filter a
  resumed run trains on the prompts the uninterrupted one would have; with it, not always:
  the groups generated again are sampled under the resumed weights, not those they had, and
  the filter judges those new rollouts (kill -9 after step 3 of 6 with ``max_staleness=2``:
  step 4 trained ``s10r0p18 s10r0p19`` where the uninterrupted run trained ``s8r0p15
  s10r0p19``; its regenerated group of ``s8r0p15`` came out flat and was dropped).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from skyrl.batch import TrainingInputBatch
from skyrl.config.errors import ConfigError
from skyrl.config.root import SkyRLConfig
from skyrl.data import PromptRow, PromptSplits
from skyrl.generators import GeneratorOutput, VersionClock, make_generator, to_training_batch
from skyrl.generators.generator import trajectories_to_output
from skyrl.generators.metrics import rollout_metrics
from skyrl.generators.trajectory import Trajectory
from skyrl.inference.base import Completion, InferenceEngine, SamplingParams, WeightItems
from skyrl.inference.client import EngineClient
from skyrl.rollouts import dynamic_sampling as ds
from skyrl.rollouts.base import WeightSyncTimeout
from skyrl.rollouts.evaluation import evaluate_prompts
from skyrl.rollouts.sync import (
    base_seed,
    dump_step_rollouts,
    eval_seed,
    prompt_loader,
    shape_rewards,
)
from skyrl.tracking import metric_names as names

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Admission:
    """The staleness bound, kept when a group is admitted.

    ``in_line`` counts groups admitted and not yet taken into a batch or dropped
    (running or finished). A group admitted now trains at most ``holding +
    in_line // batch_size`` versions later: ``holding`` is 1 from taking a batch until
    its step's weight sync starts (requests sent after that wait for the new weights;
    ``release`` also comes with the next batch, for a refused step that synced nothing). So admitting while ``in_line < (max_staleness + 1 -
    holding) * batch_size`` keeps every group within ``max_staleness``; in a run
    without refused steps that is ``accepted + running <= (max_staleness + version
    + 1) * batch_size``, with ``accepted`` counting the groups trained already.
    """

    def __init__(self, max_staleness: int, batch_size: int):
        self.max_staleness, self.batch_size = max_staleness, batch_size
        self.in_line = 0
        self.holding = False
        self.admitted_total = 0

    @property
    def limit(self) -> int:
        """Most groups that may be in line now."""
        return (self.max_staleness + 1 - int(self.holding)) * self.batch_size

    def can_admit(self) -> bool:
        return self.in_line < self.limit

    def admit(self) -> None:
        self.in_line += 1
        self.admitted_total += 1

    def drop(self) -> None:
        """A group left the line without being trained on (filtered, or to be regenerated)."""
        self.in_line -= 1

    def take(self, n: int) -> None:
        """``n`` groups went into a batch; its weights are not synced yet."""
        self.in_line -= n
        self.holding = True

    def release(self) -> None:
        """The taken batch's step is over: its weight sync started, or the step was refused."""
        self.holding = False


@dataclass
class Group:
    """One admitted prompt and, once done, its rollouts."""

    index: int
    """Loader index of the prompt (``PromptLoader.rows``)."""
    row: PromptRow
    seed: int
    """Base sampling seed of the group's requests."""
    order: int
    """Admission order."""
    trajectories: list[Trajectory] = field(default_factory=list)
    output: GeneratorOutput | None = None
    shaping: dict[str, float] = field(default_factory=dict)
    done: bool = False
    rejected: bool = False
    """The dynamic filter rejected it (judged when it heads the line: ``_passes_filter``)."""
    flat_kept: bool = False
    """The dynamic filter rejected it but it was kept (its batch's drops were spent)."""

    @property
    def oldest_version(self) -> int | None:
        """Policy version at dispatch of the group's first request; None when it made none."""
        versions = [t.version_dispatched for tr in self.trajectories for t in tr.turns]
        return min(versions) if versions else None

    def pending(self) -> dict[str, Any]:
        """What a checkpoint keeps of a group not trained on yet (it is generated again)."""
        return {"index": self.index, "uid": self.row.uid, "seed": self.seed}


def batch_shaping(groups: list[Group]) -> dict[str, float]:
    """The reward-shaping metrics of a batch from its groups' (``shape_rewards`` ran on each
    group), as ``shape_rewards`` over the whole batch gives them: a ``..._mean`` over
    trajectories weighted by each group's trajectories, any other key (a count, such as
    ``reward/overlong_masked``) summed."""
    out = {}
    for key in {k for g in groups for k in g.shaping}:
        shaped = [g for g in groups if key in g.shaping]
        if key.endswith("_mean"):
            weights = [len(g.trajectories) for g in shaped]
            total = sum(g.shaping[key] * w for g, w in zip(shaped, weights, strict=True))
            out[key] = total / max(1, sum(weights))
        else:
            out[key] = float(sum(g.shaping[key] for g in shaped))
    return out


class _EngineView:
    """An engine seen through a wrapper that changes only ``generate``: the rest of the
    engine interface goes to ``self.engine`` unchanged."""

    engine: InferenceEngine

    def serve(self, done: Future) -> None:
        self.engine.serve(done)

    def update_weights(self, weights: WeightItems) -> None:
        self.engine.update_weights(weights)

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        self.engine.join_weight_sync(host, port, first_rank, world_size, backend)

    def receive_weights(self, plan: list) -> None:
        self.engine.receive_weights(plan)

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def shutdown(self) -> None:
        self.engine.shutdown()


class GatedEngine(_EngineView):
    """The engine as the training driver sees it: requests wait while a weight sync holds the
    gate; requests in flight are counted (a sync can wait for them) and the time with none in
    flight is the engine's idle time. Lives on the source's event loop."""

    def __init__(self, engine: InferenceEngine, gate: asyncio.Event):
        self.engine, self.gate = engine, gate
        self.in_flight = 0
        self.drained = asyncio.Event()
        self.drained.set()
        self.idle_s = 0.0
        self._idle_since: float | None = time.monotonic()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        await self.gate.wait()
        return await self.counted(prompt_ids, sampling, route_key)

    async def counted(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        """A request counted in flight, not held by the gate."""
        if self.in_flight == 0 and self._idle_since is not None:
            self.idle_s += time.monotonic() - self._idle_since
            self._idle_since = None
        self.in_flight += 1
        self.drained.clear()
        try:
            return await self.engine.generate(prompt_ids, sampling, route_key)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle_since = time.monotonic()
                self.drained.set()

    def take_idle_s(self) -> float:
        """Idle seconds since the last call."""
        idle = self.idle_s
        if self._idle_since is not None:
            now = time.monotonic()
            idle += now - self._idle_since
            self._idle_since = now
        self.idle_s = 0.0
        return idle


class UngatedEngine(_EngineView):
    """The engine as the eval pass sees it: its requests are not held by a weight sync's gate
    (the trainer evaluates between syncs) but count in ``gated``'s requests in flight, so an
    eval is engine time, not idle time. The eval's generator runs them on an event loop of
    its own; they are sent from the source's loop, where the count lives."""

    def __init__(self, gated: GatedEngine, loop: asyncio.AbstractEventLoop):
        self.gated, self.loop, self.engine = gated, loop, gated.engine

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None = None
    ) -> Completion:
        request = self.gated.counted(prompt_ids, sampling, route_key)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(request, self.loop))


class AsyncRollouts:
    """The ``RolloutSource`` of ``trainer.max_staleness > 0`` (module docstring)."""

    def __init__(
        self,
        cfg: SkyRLConfig,
        engine: EngineClient,
        tokenizer,
        output_dir: Path | None = None,
        prompts: PromptSplits | None = None,
        max_staleness: int | None = None,
    ):
        """``max_staleness``: the bound (default ``trainer.max_staleness``; a test may run the
        asynchronous source at 0, where it must give the synchronous batches)."""
        self.cfg, self.tokenizer, self.engine = cfg, tokenizer, engine
        self.output_dir = Path(output_dir) if output_dir is not None else None
        t = cfg.trainer
        self.loader, self.eval_rows = prompt_loader(cfg, tokenizer, prompts)
        self.batches_per_epoch = self.loader.batches_per_epoch
        self.max_staleness = t.max_staleness if max_staleness is None else max_staleness
        self.batch_size = t.train_batch_size
        self.admission = Admission(self.max_staleness, self.batch_size)
        self.keep = (
            ds.group_filter(cfg.algorithm.dynamic_filter)
            if cfg.algorithm.dynamic_sampling == "filter"
            else None
        )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.clock = VersionClock()
        """The version the engines hold; new requests record it at dispatch."""
        self.line: deque[Group] = deque()
        """Admitted groups not yet taken or dropped, in admission order."""
        self.queued: deque[tuple[int, str, int]] = deque()
        """Prompts to admit first: (loader index, uid, seed), regenerated ones and those a
        checkpoint held; then the loader's next chunk."""
        self.chunks = 0
        """Loader batches drawn so far (chunk ``c`` has uids ``s<c+1>r0p...``, as step ``c + 1``
        of the synchronous source)."""
        self.counts = {"filtered": 0, "stale": 0}
        self.dropped: list[Trajectory] = []
        """Trajectories of the groups dropped since the previous batch (filtered or stale): they
        were generated, so the next batch's rollout metrics count them, as the synchronous
        source's cover every sampling round."""
        self.rejects_left = self._reject_allowance()
        """Groups the dynamic filter may still drop before the next batch is taken."""
        self.failure: BaseException | None = None
        self.hold_deadline: float | None = None
        """When the weight sync holding the requests must be done (None: none holds them)."""
        self.trained_version = 0
        """The policy version the trainer trains the next batch with: that of the last weight
        sync it started (the engines may still be loading it). Staleness is counted from it."""
        self.started = False
        self.closed = False
        self._last_take = time.monotonic()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="skyrl-async-rollouts", daemon=True
        )
        self.thread.start()
        try:  # a driver that fails to start (user code): stop what did start
            self._on_loop(self._setup())
            self.eval_generator = make_generator(
                cfg.generator, cfg.environment, UngatedEngine(self.gated, self.loop), tokenizer
            )
        except BaseException:
            self._stop_started()
            raise

    def _stop_started(self) -> None:
        """Stop what a failed ``__init__`` started: the training driver, if it was made (an
        external agent's endpoint), and the event loop with its thread."""
        self.closed = True
        try:
            if hasattr(self, "generator"):
                self.generator.close()
        finally:
            self._stop_loop(timeout_s=5.0)

    async def _setup(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.clock.gate = self.gate
        self.progress = asyncio.Event()
        self.admit_wake = asyncio.Event()
        self.gated = GatedEngine(self.engine, self.gate)
        self.generator = make_generator(
            self.cfg.generator, self.cfg.environment, self.gated, self.tokenizer, self.clock
        )
        self.tasks: set[asyncio.Task] = set()

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the source's event loop and wait for it (cancelled on a timeout, or
        when the wait ends otherwise: Ctrl-C in a ``next_batch`` left its task pending on the
        stopped loop, and a script's ``skyrl.train`` ended with 'Task was destroyed but it is
        pending!')."""
        if self.loop.is_closed():  # ``close`` ran: never scheduled, so close it (no warning)
            coro.close()
            raise RuntimeError("the rollout stream is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:  # a timeout (two classes on 3.10), or an interrupt
            future.cancel()
            raise

    # -- the RolloutSource interface ----------------------------------------------------

    def next_batch(self, step: int) -> tuple[TrainingInputBatch, dict[str, float]]:
        """The next ``train_batch_size`` kept groups in admission order (waiting for them)."""
        waited = time.perf_counter()
        groups, metrics = self._on_loop(self._take(step))
        metrics[names.ASYNC_TRAINER_WAIT_S] = time.perf_counter() - waited
        out = GeneratorOutput.concat([g.output for g in groups if g.output is not None])
        if self.cfg.trainer.dump_rollouts and self.output_dir is not None:
            dump_step_rollouts(out, self.tokenizer, self.output_dir, step)
        return to_training_batch(out, self.pad_id), metrics

    def updating_weights(
        self, version: int, timeout_s: float | None = None
    ) -> AbstractContextManager[None]:
        """Around a weight sync: new requests wait; unless ``trainer.partial_rollouts``, the
        requests in flight finish first (under the old weights). Afterwards the engines hold
        ``version``.

        New requests wait from this call on, not from entering the block: a trainer that loads
        the weights on a thread of its own calls it on its own thread first, so the hold comes
        before its next ``next_batch``. The other way round, that call would admit groups under
        the old weights, too old to train on by the time they are taken (dropped as stale)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._on_loop(self._hold(deadline, version), timeout_s)
        return self._loading_weights(version, deadline)

    @contextmanager
    def _loading_weights(self, version: int, deadline: float | None) -> Iterator[None]:
        """``updating_weights`` after the hold: drain, load (the block), resume. A drain or
        load that fails leaves the engines at their old version: the gate stays shut and the
        next batch raises the failure (a background load's next batch would otherwise train
        on rows recorded at a version the engines never loaded)."""
        try:
            if not self.cfg.trainer.partial_rollouts:
                self._drain(deadline)
            yield
        except BaseException as exc:
            if not self.closed:  # a background load outlived the run (its sync timed out)
                self._on_loop(self._sync_failed(exc))
            raise
        if not self.closed:
            self._on_loop(self._resume(version))

    def has_eval(self) -> bool:
        return bool(self.eval_rows)

    def evaluate(self) -> dict[str, float]:
        """Held-out prompts with eval sampling, beside the training stream."""
        metrics, _ = evaluate_prompts(
            self.eval_generator, self.eval_rows, self.cfg.generator, eval_seed(self.cfg)
        )
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The loader, every prompt drawn and not trained on yet (to generate again) and the
        next batch's drops so far (``rejects_left``, ``dropped``)."""
        return self._on_loop(self._state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.started:
            raise RuntimeError("AsyncRollouts.load_state_dict after the stream started")
        if state.get("loader"):
            self.loader.load_state_dict(state["loader"])
        self.chunks = int(state.get("chunks", 0))
        # the next batch's drops made before the save: its allowance is not granted again
        allowance = self._reject_allowance()
        self.rejects_left = min(allowance, int(state.get("rejects_left", allowance)))
        dropped = state.get("dropped", {})
        self.counts = {why: int(dropped.get(why, 0)) for why in self.counts}
        pending = state.get("pending", [])  # none in a synchronous run's checkpoint
        self.queued = deque((int(p["index"]), p["uid"], int(p["seed"])) for p in pending)
        needed = max((index + 1 for index, _, _ in self.queued), default=0)
        if needed > len(self.loader.rows):
            raise ConfigError(
                "data",
                f"the checkpoint holds training prompt {needed - 1} to generate again, so it "
                f"expects at least {needed} training prompts, but the training set has "
                f"{len(self.loader.rows)}: the training prompts changed since the checkpoint "
                "(data.source, data.train_files, data.num_train_prompts); resume with the ones "
                "it was trained on",
            )

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel the groups in flight (waiting at most ``timeout_s`` for them to end; their
        envs close on threads not waited for), stop the drivers (an external agent's
        endpoints) and stop and close the event loop."""
        if self.closed:
            return
        self.closed = True
        try:
            self._on_loop(self._cancel_all(), timeout_s)
        except FutureTimeout:
            logger.warning(
                "closing the rollout stream: its tasks did not end within %g s of being "
                "cancelled; stopping its event loop anyway",
                timeout_s,
            )
        try:
            self.generator.close()
        finally:
            try:
                self.eval_generator.close()
            finally:
                self._stop_loop(timeout_s)

    def _stop_loop(self, timeout_s: float) -> None:
        """Stop the event loop and, once its thread is done, close it."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout_s)
        if not self.thread.is_alive():
            self.loop.close()

    # -- on the event loop ---------------------------------------------------------------

    async def _take(self, step: int) -> tuple[list[Group], dict[str, float]]:
        """The batch of ``step`` (its number names it in the warnings) and its metrics."""
        self.admission.release()  # the previous step is over, synced or refused
        if not self.started:
            self.started = True
            self.gated.take_idle_s()  # idle time counts from the stream's start
            self._last_take = time.monotonic()
            self._spawn(self._admit_forever())
        self.admit_wake.set()
        while True:
            if self.failure is not None:
                raise self.failure
            groups = self._pop_ready(step)
            if groups is not None:
                break
            self.progress.clear()
            await self._wait_for_progress()
        self.admission.take(len(groups))
        metrics = self._metrics(groups, step)  # before the next batch's drops
        self.rejects_left = self._reject_allowance()
        self._ready_head()  # the next batch's done groups: the filter's drops free their room
        self.admit_wake.set()
        return groups, metrics

    async def _wait_for_progress(self) -> None:
        """Until a group changes or the gate opens or closes (``_hold``, ``_resume``); while a
        weight sync holds the requests (it may load in the background), no longer than that
        sync's deadline: once the gate opens the batch is waited for as long as it takes."""
        if self.gate.is_set() or self.hold_deadline is None:
            await self.progress.wait()
            return
        try:
            await asyncio.wait_for(self.progress.wait(), self.hold_deadline - time.monotonic())
        except (TimeoutError, asyncio.TimeoutError):  # one class from Python 3.11
            if not self.cfg.trainer.partial_rollouts and self.gated.in_flight:
                raise WeightSyncTimeout(self._in_flight_message()) from None  # still draining
            raise WeightSyncTimeout(
                "the inference engines to load the weights (the next batch waits for them)"
            ) from None

    def _pop_ready(self, step: int) -> list[Group] | None:
        """``_ready_head``, taken out of the line (None: not ready) as ``step``'s batch."""
        groups = self._ready_head()
        if groups is None:
            return None
        repeats = len(groups) - len({g.index for g in groups})
        if repeats:  # ``_repeating_head``
            warnings.warn(
                f"step {step}: dynamic sampling: a batch holds {repeats} repeated prompt(s): the "
                f"groups in line ({len(self.line)}, as many as trainer.max_staleness allows) hold "
                f"fewer than trainer.train_batch_size={self.batch_size} prompts",
                stacklevel=1,
            )
        for group in groups:
            self.line.remove(group)
        return groups

    def _ready_head(self) -> list[Group] | None:
        """The first ``batch_size`` groups of the line, one per prompt, when all are done, else
        None (``_pop_ready`` takes them out of the line). Groups past the staleness bound are
        dropped on the way and their prompts queued again; the groups the dynamic filter
        rejected are dropped on the way while the batch's allowance lasts
        (``_passes_filter``): judged in line order, up to the first group not done, so which
        ones are dropped does not depend on which finished first. Run whenever a group
        finishes, so a drop frees its room as soon as the groups before it are done.

        A group of a prompt the batch already holds stays in line, first for the next batch:
        past an epoch's end the next shuffle hands out the batch's prompts again, and the
        filter's drops move them up into it (the synchronous source's refills skip them the
        same way). Only when the line is full, all done, and still holds fewer prompts than a
        batch is the batch cut as the line stands (with a warning), as nothing else can come."""
        batch: list[Group] = []
        prompts: set[int] = set()
        for group in list(self.line):
            if len(batch) == self.batch_size:
                break
            if group.index in prompts:
                continue  # not in this batch, done or not: the next one's
            if not group.done or self._dropped_stale(group):
                return None
            if not self._passes_filter(group):
                continue
            batch.append(group)
            prompts.add(group.index)
        if len(batch) < self.batch_size:
            return self._repeating_head()
        return batch

    def _repeating_head(self) -> list[Group] | None:
        """The first ``batch_size`` groups of the line, repeats included, when the line can
        change no more (full and all done) and holds fewer prompts than a batch; else None."""
        line = list(self.line)
        if len(line) < self.batch_size or self.admission.can_admit():
            return None
        if not all(g.done for g in line):
            return None
        if any([self._dropped_stale(g) for g in line[: self.batch_size]]):
            return None
        if not all([self._passes_filter(g) for g in line[: self.batch_size]]):
            return None  # room freed: another prompt can come
        return line[: self.batch_size]

    def _dropped_stale(self, group: Group) -> bool:
        """Whether ``group`` is past the staleness bound; if so it is dropped and its prompt
        queued again, first."""
        oldest = group.oldest_version
        if oldest is None or oldest >= self.trained_version - self.max_staleness:
            return False
        self._drop(group, "stale")
        self.queued.appendleft((group.index, f"{group.row.uid}~", group.seed + 1))
        return True

    def _drop(self, group: Group, why: str) -> None:
        """Take ``group`` out of the line untrained (``why``: ``stale`` or ``filtered``, the
        count it adds to); its trajectories count in the next batch's rollout metrics and its
        room goes to another prompt."""
        self.line.remove(group)
        self.counts[why] += 1
        self.dropped += group.trajectories
        self.admission.drop()
        self.admit_wake.set()

    async def _admit_forever(self) -> None:
        try:
            while True:
                while self.admission.can_admit():
                    index, uid, seed = self._next_prompt()
                    row = self.loader.row(index, uid)
                    group = Group(index, row, seed, self.admission.admitted_total)
                    self.admission.admit()
                    self.line.append(group)
                    self._spawn(self._run_group(group))
                self.admit_wake.clear()
                await self.admit_wake.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # re-raised on the trainer's thread by next_batch
            self.failure = self.failure or exc
            self.progress.set()

    def _next_prompt(self) -> tuple[int, str, int]:
        if not self.queued:
            self.chunks += 1
            seed = base_seed(self.cfg, self.chunks, 0)
            prefix = f"s{self.chunks}r0"
            self.queued.extend((i, uid, seed) for i, uid in self.loader.draw(prefix))
        return self.queued.popleft()

    async def _run_group(self, group: Group) -> None:
        g = self.cfg.generator
        n = g.n_samples_per_prompt
        sampling = SamplingParams.from_config(g.sampling, n=n, max_tokens=g.max_generate_length)
        sampling.seed = group.seed
        try:
            group.trajectories = await self.generator.trajectories([group.row], n, sampling)
            out = trajectories_to_output(group.trajectories, g.step_wise)
            out.validate()
            group.output, group.shaping = shape_rewards(self.cfg, out)
            group.rejected = self.keep is not None and not self.keep(group.output)
            group.done = True
            self._ready_head()  # judges the groups now done at the line's head
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # re-raised on the trainer's thread by next_batch
            self.failure = self.failure or exc
        finally:
            self.progress.set()

    def _reject_allowance(self) -> int:
        """The groups the dynamic filter may drop per batch: the synchronous source's extra
        sampling rounds, ``(max_sample_batches - 1) * train_batch_size``."""
        return (self.cfg.algorithm.max_sample_batches - 1) * self.batch_size

    def _passes_filter(self, group: Group) -> bool:
        """Whether the done ``group`` stays in line: the dynamic filter kept it, or rejected it
        past the batch's allowance (marked ``flat_kept``; counted with the batch that takes
        it). A rejected group within the allowance is dropped: False."""
        if not group.rejected or group.flat_kept:
            return True
        if self.rejects_left <= 0:
            group.flat_kept = True
            return True
        self.rejects_left -= 1
        self._drop(group, "filtered")
        return False

    async def _hold(self, deadline: float | None, version: int) -> None:
        """A sync starts: new requests wait for the new weights, so groups admitted from now on
        are dispatched under them; the step that held the taken batch is over. ``deadline``
        (monotonic): when the sync must be done by; a batch waited for meanwhile waits no
        longer (``_take``)."""
        self.hold_deadline = deadline
        self.trained_version = version
        self.gate.clear()
        self.admission.release()
        self.admit_wake.set()
        self.progress.set()  # a batch waited for now waits no longer than ``deadline``

    def _drain(self, deadline: float | None) -> None:
        """Wait (on the trainer's thread) until no request is in flight, or raise
        ``WeightSyncTimeout`` naming what is still in flight."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self._on_loop(self.gated.drained.wait(), timeout)
        except (TimeoutError, FutureTimeout):
            raise WeightSyncTimeout(self._in_flight_message()) from None

    def _in_flight_message(self) -> str:
        """What a weight sync still waits for while it drains the requests in flight."""
        return (
            f"{self.gated.in_flight} request(s) in flight on the inference engines to finish "
            "before the weights load"
        )

    async def _resume(self, version: int) -> None:
        """The engines hold ``version``: requests go out again (recording it). No release here:
        with a background load the trainer may already hold the next batch."""
        self.clock.current = version
        self.hold_deadline = None
        self.gate.set()
        self.progress.set()  # a batch waited for meanwhile is no longer held to the deadline

    async def _sync_failed(self, exc: BaseException) -> None:
        """A weight sync failed: the engines hold what they held; a batch waited for (now or
        later) raises ``exc`` instead of training on rows of a version that never loaded."""
        self.failure = self.failure or exc
        self.hold_deadline = None
        self.progress.set()

    async def _state(self) -> dict[str, Any]:
        pending = [{"index": i, "uid": u, "seed": s} for i, u, s in self.queued]
        return {
            "loader": self.loader.state_dict(),
            "chunks": self.chunks,
            "pending": [g.pending() for g in self.line] + pending,
            "rejects_left": self.rejects_left,
            "dropped": dict(self.counts),
        }

    def _metrics(self, groups: list[Group], step: int) -> dict[str, float]:
        """The metrics of ``step``'s batch: rollout metrics (``generate/...``, ``env/errors``)
        over its groups and those dropped since the previous batch; staleness over what it
        trains."""
        trajs = [t for g in groups for t in g.trajectories]
        now = time.monotonic()
        generated, self.dropped = self.dropped + trajs, []
        metrics = rollout_metrics(
            generated, self.cfg.generator.n_samples_per_prompt, now - self._last_take
        )
        self._last_take = now
        metrics.update(batch_shaping(groups))
        version = self.trained_version
        staleness = [
            version - min(t.version_dispatched for t in tr.turns) for tr in trajs if tr.turns
        ] or [0]
        turns = [t for tr in trajs for t in tr.turns]
        metrics.update(
            {
                names.ASYNC_STALENESS_MEAN: sum(staleness) / len(staleness),
                names.ASYNC_STALENESS_MAX: float(max(staleness)),
                names.ASYNC_MIXED_VERSION_TURNS: float(
                    sum(t.version_dispatched != t.version_finished for t in turns)
                ),
                names.ASYNC_QUEUE_DEPTH: float(sum(g.done for g in self.line)),
                names.ASYNC_RUNNING: float(sum(not g.done for g in self.line)),
                names.ASYNC_ENGINE_IDLE_S: self.gated.take_idle_s(),
                names.ASYNC_FILTERED_GROUPS: float(self.counts["filtered"]),
                names.ASYNC_STALE_GROUPS: float(self.counts["stale"]),
            }
        )
        # the batch's own groups (judged in its stretch of the line, as they finished)
        flat_kept = sum(g.flat_kept for g in groups)
        self.counts = dict.fromkeys(self.counts, 0)
        if self.keep is not None:
            metrics[names.KEPT_GROUP_FRAC] = (len(groups) - flat_kept) / (
                len(groups) + metrics[names.ASYNC_FILTERED_GROUPS]
            )
        if flat_kept:
            warnings.warn(
                f"step {step}: dynamic sampling: {flat_kept} group(s) the filter rejected were "
                f"kept after it dropped {self._reject_allowance()} (algorithm.max_sample_batches)",
                stacklevel=1,
            )
        return metrics

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _cancel_all(self) -> None:
        self.gate.set()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
