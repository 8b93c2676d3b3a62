"""The driver's side of the weight sync: the policy's weights into the inference engines.

``EngineSync`` runs each sync (the engines then hold one policy version) on the path
``trainer.weight_sync`` picks (``skyrl.config.validate.weight_sync_path`` resolves ``auto``):

- ``shared_memory`` (the CPU default): policy rank 0 copies its weights into one file in
  ``/dev/shm`` and the engines load from views of it
  (``skyrl.inference.shared_weights``); one machine only.
- ``object_store`` streams buckets from policy rank 0 through Ray into every engine's
  ``update_weights`` (any Ray cluster; each bucket is pickled and copied several times).
- ``broadcast`` opens one group (``skyrl.inference.weight_sync``) from policy rank 0 to
  every engine process once, then each sync is one broadcast per bucket: the driver
  starts rank 0 sending and has the engines receive at the same time (a collective
  blocks until every rank is in it).
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import ray

from skyrl.config.errors import ConfigError
from skyrl.config.root import SkyRLConfig
from skyrl.config.validate import weight_sync_path
from skyrl.inference.base import InferenceEngine, WeightItems
from skyrl.inference.client import EngineDiedError
from skyrl.inference.shared_weights import (
    SHM_DIR,
    SharedWeights,
    create_shared_weights,
    free_bytes,
    layout,
    sweep_stale,
    weight_files,
)
from skyrl.inference.weight_sync import Plan
from skyrl.rollouts import RolloutSource, WeightSyncTimeout
from skyrl.workers.group import WorkerGroup

SENDER_GRACE_S = 10.0
"""How long a broadcast sync whose engines failed waits to learn whether policy rank 0 (the
sender) failed first, its error then being the cause."""
RELEASE_TIMEOUT_S = 30.0
"""How long policy rank 0 letting go of the group (``leave_weight_sync``) may take."""


class SyncTimedOut(Exception):
    """The sync to policy version ``version`` did not finish within
    ``trainer.weight_sync_timeout_s``; ``waiting_for`` says what it still waited for."""

    def __init__(self, version: int, waiting_for: str):
        super().__init__(
            f"weight sync to policy version {version}: still waiting for {waiting_for}"
        )
        self.version, self.waiting_for = version, waiting_for


class EngineSync:
    """Puts policy rank 0's weights into the inference engines, one policy version per sync.

    The rollout source holds new requests meanwhile (``updating_weights``); a sync that takes
    longer than ``trainer.weight_sync_timeout_s`` raises ``SyncTimedOut``. Asynchronous
    training over shared memory or the object store: the step's weights are written or
    fetched from rank 0 at once and the engines load them in the background while the trainer
    goes on (the next batch is already generated); the next sync, an eval and the end of the
    run wait for that load (``wait``). Without engines (``data=fake``) a sync only moves the
    rollout source's version."""

    def __init__(
        self,
        policy: WorkerGroup,
        engine: InferenceEngine | None,
        rollouts: RolloutSource,
        cfg: SkyRLConfig,
        broadcast: BroadcastWeightSync | None = None,
        shared_weights: SharedMemoryWeightSync | None = None,
    ):
        self.policy, self.engine, self.rollouts, self.cfg = policy, engine, rollouts, cfg
        self.broadcast, self.shared_weights = broadcast, shared_weights
        """The path's set-up, where it has one (neither: the object store)."""
        self._loading: tuple[Future, int, float] | None = None
        """A weight load running in the background: (its future, version, start time)."""

    @classmethod
    def start(
        cls,
        policy: WorkerGroup,
        engine: InferenceEngine | None,
        rollouts: RolloutSource,
        cfg: SkyRLConfig,
    ) -> EngineSync:
        """The sync with its path set up: the broadcast group joined, or the shared-memory
        file made (or the object store where it cannot serve: ``SharedMemoryWeightSync.start``)."""
        path = weight_sync_path(cfg) if engine is not None else None
        broadcast = shared = None
        if path == "broadcast":
            assert engine is not None
            broadcast = BroadcastWeightSync(policy, engine, cfg)
        elif path == "shared_memory":
            shared = SharedMemoryWeightSync.start(
                policy, cfg, explicit=cfg.trainer.weight_sync != "auto"
            )
        return cls(policy, engine, rollouts, cfg, broadcast, shared)

    @property
    def name(self) -> str:
        """The path, for a line that names it."""
        if self.broadcast is not None:
            return "broadcast"
        return "shared memory" if self.shared_weights is not None else "object store"

    def sync(self, version: int) -> None:
        """The engines hold policy version ``version`` once this returns, or, asynchronous
        training off the broadcast path, once the load it started in the background ends."""
        self.wait()
        timeout = self.cfg.trainer.weight_sync_timeout_s
        started = time.monotonic()
        engine = self.engine
        if engine is not None and self.cfg.trainer.max_staleness > 0 and self.broadcast is None:
            try:
                weights = self._stage_within(timeout)  # this step's, taken now
            except WeightSyncTimeout as exc:
                raise SyncTimedOut(version, str(exc)) from None
            # new requests wait from here, on this thread: before the next batch is taken
            holding = self.rollouts.updating_weights(version, timeout)

            def load() -> None:
                with holding:
                    engine.update_weights(weights)
                    engine.reset_prefix_cache()
                if self.shared_weights is not None:
                    self.shared_weights.loaded()

            self._loading = (self.in_background(load), version, started)
            return
        try:
            with self.rollouts.updating_weights(version, timeout):
                if engine is not None:
                    left = timeout - (time.monotonic() - started)
                    self._push(max(left, 0.0))
        except WeightSyncTimeout as exc:
            raise SyncTimedOut(version, str(exc)) from None

    def wait(self) -> None:
        """Wait for a weight load still running in the background (asynchronous training),
        within what is left of ``trainer.weight_sync_timeout_s``."""
        if self._loading is None:
            return
        done, version, started = self._loading
        self._loading = None
        left = self.cfg.trainer.weight_sync_timeout_s - (time.monotonic() - started)
        try:
            done.result(max(left, 0.0))
        except FutureTimeout:
            waiting_for = (
                f"the inference engines to load the weights ({self.name}, in the background)"
            )
            raise SyncTimedOut(version, waiting_for) from None
        except WeightSyncTimeout as exc:
            raise SyncTimedOut(version, str(exc)) from None

    def loading_version(self) -> int | None:
        """The version a background load is bringing in, if one runs."""
        return None if self._loading is None else self._loading[1]

    def close(self) -> None:
        """Release the shared-memory file, where there is one."""
        if self.shared_weights is not None:
            self.shared_weights.close()

    def in_background(self, load: Callable[[], None]) -> Future:
        """Start a background load on a daemon thread (a test starts it when it says)."""
        return run_in_thread(load)

    def _stage_within(self, timeout: float) -> WeightItems:
        """``_staged`` within ``timeout`` seconds: it waits for policy rank 0 (another
        process) to write or send them; ``WeightSyncTimeout`` naming that wait when it does not
        finish in time (the wait itself goes on, on a daemon thread)."""
        staging = run_in_thread(self._staged)
        try:
            return staging.result(timeout)
        except FutureTimeout:
            raise WeightSyncTimeout(f"policy rank 0 to stage the weights ({self.name})") from None

    def _staged(self) -> WeightItems:
        """The policy's weights where the engines can load them: written by rank 0 into the
        shared-memory file, or a list of buckets of ``trainer.weight_sync_bucket_mb`` fetched
        from rank 0 through the object store."""
        if self.shared_weights is not None:
            return self.shared_weights.stage()
        return list(self.policy.stream_weight_buckets(self.cfg.trainer.weight_sync_bucket_mb << 20))

    def _push(self, timeout: float) -> None:
        """The transfer itself. With the engines in Ray actors it runs on a helper thread so it
        can time out; an in-process engine loads on this thread (its torch work stays on the
        thread that owns torch's thread pool), and what that load waits for from policy rank 0
        (another process), the staged weights, times out on a helper thread; an in-process
        engine's broadcast receive is bounded by the group's own (gloo) timeout only."""
        engine = self.engine
        assert engine is not None

        def push(weights: WeightItems | None = None) -> None:
            if self.broadcast is not None:
                self.broadcast.sync()
            else:
                engine.update_weights(self._staged() if weights is None else weights)
            engine.reset_prefix_cache()
            if self.shared_weights is not None:
                self.shared_weights.loaded()

        if not self.cfg.generator.engines_in_actors:
            push(None if self.broadcast is not None else self._stage_within(timeout))
            return
        try:
            run_in_thread(push).result(timeout)
        except FutureTimeout:
            raise WeightSyncTimeout(
                f"the inference engines to load the weights ({self.name} sync from policy rank 0)"
            ) from None


class BroadcastWeightSync:
    """Policy rank 0 to every engine over one broadcast group, set up on construction.

    Policy rank 0's side of each step (join, broadcast) is waited for on a helper thread while
    this thread does the engines' side, so a failure of either surfaces at once. Rank 0 failing
    without dying (a plan that no longer matches its model, say) left the engines in the
    broadcast until gloo's timeout (600 s) and its error surfaced only then: its side of the
    group is now closed as it fails, which ends the engines' wait ("Connection closed by
    peer"), and its own error is raised. The group is then gone: a later ``sync`` says so.
    (With NCCL an engine waiting in a broadcast does not see the sender's side close.)"""

    closed_by: str | None = None
    """Why the group was closed (a sync's sender failed); None while it serves."""

    def __init__(self, policy: WorkerGroup, engine: InferenceEngine, cfg: SkyRLConfig):
        self.policy, self.engine = policy, engine
        self.plan = sync_plan(policy, cfg)
        [(host, port)] = policy.get([policy.actors[0].weight_sync_address.remote()])
        self.backend = "nccl" if cfg.trainer.num_gpus_per_worker > 0 else "gloo"
        world_size = 1 + cfg.generator.num_engines * cfg.generator.processes_per_engine
        joining = run_in_thread(
            policy.get, policy.submit("join_weight_sync", host, port, world_size, self.backend)
        )
        # on a thread too: an engine waits for the group until its timeout (600 s) when
        # policy rank 0 failed to host it (its port taken, say), and nothing can stop that wait
        engines = run_in_thread(engine.join_weight_sync, host, port, 1, world_size, self.backend)
        wait([joining, engines], return_when=FIRST_EXCEPTION)
        sender_error = joining.exception() if joining.done() else None
        if sender_error is not None:
            raise sender_error from None
        self._raise_cause(engines, joining)

    def sync(self) -> None:
        """One broadcast of the full weights; the engines load them as they arrive. An engine
        whose sender died or failed fails too (gloo's "Connection reset by peer", or "closed
        by peer" once a failed sender's side is closed): the sender's own error, a dead worker
        named by role and rank, is the one raised; an engine that died or failed on its own
        raises its own."""
        if self.closed_by is not None:
            raise RuntimeError(
                "weight sync: the broadcast group was closed when an earlier sync failed "
                f"({self.closed_by}); it cannot serve another"
            )
        sending = run_in_thread(self._send, self.policy.submit("broadcast_weights", self.plan))
        try:
            self.engine.receive_weights(self.plan)
        except EngineDiedError:  # its own cause (the sender then fails on the lost peer)
            raise
        except Exception:
            sender_error = _error_within(sending, SENDER_GRACE_S)
            if sender_error is not None:
                raise sender_error from None
            raise
        sending.result()

    def _send(self, sending: list) -> None:
        """Policy rank 0's broadcast; where it fails, its side of the group is closed, which
        ends the engines' wait in the broadcast."""
        try:
            self.policy.get(sending)
        except Exception as exc:
            self.closed_by = (str(exc).splitlines() or [type(exc).__name__])[0]
            self._close_sender_side()
            raise

    def _close_sender_side(self) -> None:
        """Policy rank 0 lets go of the group (``leave_weight_sync``; nothing to do where it
        died)."""
        try:
            rank0 = self.policy.actors[0]
            self.policy.get([rank0.leave_weight_sync.remote()], RELEASE_TIMEOUT_S)
        except Exception:  # dead, or stuck: the engines wait until gloo's timeout as before
            pass

    def _raise_cause(self, engines: Future, sender: Future) -> None:
        """``engines``' error, or the sender's where it failed too (within ``SENDER_GRACE_S``:
        the engines failing first, on the lost peer); else wait for the sender."""
        engine_error = engines.exception()
        if engine_error is None:
            sender.result()
            return
        if not isinstance(engine_error, EngineDiedError):
            sender_error = _error_within(sender, SENDER_GRACE_S)
            if sender_error is not None:
                raise sender_error from None
        raise engine_error


def run_in_thread(fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` on a daemon thread; its outcome."""
    outcome: Future = Future()

    def run() -> None:
        try:
            outcome.set_result(fn(*args))
        except BaseException as exc:
            outcome.set_exception(exc)

    threading.Thread(target=run, name="skyrl-weight-sync", daemon=True).start()
    return outcome


def _error_within(outcome: Future, timeout_s: float) -> BaseException | None:
    """What ``outcome`` raised, or None where it finished, or is still running after
    ``timeout_s`` (the engine failed on its own; policy rank 0 waits in the broadcast)."""
    try:
        return outcome.exception(timeout=timeout_s)
    except FutureTimeout:
        return None


class SharedMemoryWeightSync:
    """Policy rank 0 writes the weights into one shared-memory file; engines read views."""

    def __init__(self, policy: WorkerGroup, cfg: SkyRLConfig, plan: Plan | None = None):
        self.policy = policy
        plan = plan or sync_plan(policy, cfg)
        self.weights: SharedWeights = create_shared_weights(plan, SHM_DIR)

    @classmethod
    def start(
        cls, policy: WorkerGroup, cfg: SkyRLConfig, explicit: bool
    ) -> SharedMemoryWeightSync | None:
        """The sync, or None where shared memory cannot serve: ``auto`` then falls back to
        the object store and says why on stdout, an explicit ``shared_memory`` is a
        ``ConfigError``. It cannot serve on a Ray cluster of several nodes (asked for
        explicitly it is built anyway: a process on another machine fails at its first sync
        with one line naming the file) or when /dev/shm has no room for the weights (measured
        once the files of this user's dead runs are swept, and again when the file takes its
        memory: another run may have taken the room meanwhile), does not exist, or refuses a
        new file (read-only, or writable by root only)."""
        plan = sync_plan(policy, cfg)
        sweep_stale(SHM_DIR)
        need = layout(plan)[1]
        if not SHM_DIR.is_dir():  # not Linux, or a container without one
            _step_aside(f"{SHM_DIR} does not exist", explicit, room=False)
            return None
        room = free_bytes(SHM_DIR)
        if room < need:
            _step_aside(_room(room, need), explicit, room=True)
            return None
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        if nodes > 1 and not explicit:
            print(
                f"weight sync: object store (the Ray cluster has {nodes} nodes; shared memory "
                "needs policy rank 0 and the engines on one machine)",
                flush=True,
            )
            return None
        try:
            return cls(policy, cfg, plan)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:  # a read-only or root-only /dev/shm, say
                why = f"cannot make the weight file in {SHM_DIR}: {exc.strerror}"
                _step_aside(why, explicit, room=False)
                return None
        # another run took the room since it was measured
        _step_aside(_room(free_bytes(SHM_DIR), need), explicit, room=True)
        return None

    def stage(self) -> SharedWeights:
        """Rank 0 writes this step's weights into the file; the handle the engines load from."""
        self.policy.run("write_shared_weights", self.weights)
        return self.weights

    def loaded(self) -> None:
        """The engines loaded a sync: every process that reads the file has mapped it, so its
        name goes (the memory stays while mapped; nothing is left behind by a killed run);
        after the first sync there is nothing left to unlink."""
        self.weights.unlink()

    def close(self) -> None:
        self.weights.release()


def _room(room: int, need: int) -> str:
    """The room and the need in MB, or in bytes where both round to the same MB (a refusal
    of 4 MB for want of 4 MB says nothing); and the weight files of other runs that take
    room there (live, or another user's that only they may remove)."""
    free, weights = f"{room / 1e6:.0f} MB", f"{need / 1e6:.0f} MB"
    if free == weights:
        free, weights = f"{room:,} bytes", f"{need:,} bytes"
    why = f"{SHM_DIR} has {free} free, the weights need {weights}"
    others = [f"{path} ({size / 1e6:.0f} MB)" for path, size in weight_files(SHM_DIR)]
    return f"{why}; weight files of other skyrl runs there: {', '.join(others)}" if others else why


def _step_aside(why: str, explicit: bool, room: bool) -> None:
    """/dev/shm cannot take the weight file (``why``; ``room``: for want of room): a
    ``ConfigError`` naming ``trainer.weight_sync`` when shared memory was asked for, else why
    the object store serves instead, on stdout."""
    if explicit:
        bigger = ", or give the machine (container) a larger /dev/shm (docker run --shm-size)"
        raise ConfigError(
            "trainer.weight_sync",
            f"shared_memory: {why}; use trainer.weight_sync=object_store{bigger if room else ''}",
        )
    print(f"weight sync: object store ({why})", flush=True)


def sync_plan(policy: WorkerGroup, cfg: SkyRLConfig) -> Plan:
    """The buckets of what a sync sends, from policy rank 0."""
    rank0 = policy.actors[0]  # a Ray actor handle
    [plan] = policy.get([rank0.weight_sync_plan.remote(cfg.trainer.weight_sync_bucket_mb << 20)])
    return plan
