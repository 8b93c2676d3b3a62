"""A group of ``dp_size`` Ray actors for one role, placed with a placement group.

The group is the only place that talks to Ray for training: it starts the
actors (one bundle per rank; the reference can share the policy's bundles),
runs a call on every rank with that rank's staged chunk, and turns a dead
actor, or an exception a rank raised, into one error line that names the role
and the rank.

The policy workers get the driver's policy loss and KL estimator as functions, pickled here
(``driver_parts``): the workers' own registries hold only what they import.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from skyrl.config.errors import ConfigError, exception_line
from skyrl.config.root import SkyRLConfig
from skyrl.workers.distributed import address_in_use, find_free_port, node_ip
from skyrl.workers.host_memory import MALLOC_ENV
from skyrl.workers.losses import driver_parts
from skyrl.workers.stats import TrainStats, combine_ranks
from skyrl.workers.worker import TrainingWorker

START_ATTEMPTS = 3
"""Starts of a group whose rendezvous port another process took first (``find_free_port``)."""

PLACEMENT_TIMEOUT_S = 120.0
"""How long a group waits for Ray to place its ranks' bundles before it gives up."""

DEATH_WAIT_S = 30.0
"""Longest wait, once a call failed, for the ranks still running: Ray reports a killed rank
some seconds after the peers it cut off in a collective failed (``WorkerGroup._explain``)."""

PEER_LOST = ("Connection closed by peer", "Connection reset by peer")
"""gloo's error in a collective whose peer process ended (``_lost_a_peer``)."""


class WorkerDiedError(RuntimeError):
    """A worker actor died (out of memory, killed, crashed) or failed to start."""


class WorkerGroup:
    """``dp_size`` ranks of one role; ``colocate_with`` shares another group's bundles."""

    def __init__(
        self,
        role: str,
        cfg: SkyRLConfig,
        total_optimizer_steps: int,
        colocate_with: WorkerGroup | None = None,
    ):
        t = cfg.trainer
        # before the bundles are reserved: a function that does not pickle reserves nothing
        parts = pickled_driver_parts(cfg) if role == "policy" else None
        self.role, self.dp_size = role, t.dp_size
        self._owns_pg = colocate_with is None
        share = 0.5 if colocate_with is not None else 1.0
        if colocate_with is None:
            bundle = {"CPU": t.num_cpus_per_worker}
            if t.num_gpus_per_worker:
                bundle["GPU"] = t.num_gpus_per_worker
            self.pg: PlacementGroup = placement_group(
                [dict(bundle) for _ in range(t.dp_size)], strategy="PACK"
            )
            self._wait_for_placement(bundle)
            # The owner of the bundles takes half of each when a colocated role will join it.
            share = 0.5 if t.colocate_policy_ref and role == "policy" else 1.0
        else:
            self.pg = colocate_with.pg
        self.compute_s = 0.0
        """Seconds the ranks spent computing in ``forward`` (slowest rank per call), for the
        trainer's overhead share; the trainer resets it."""
        actor_cls = ray.remote(TrainingWorker)
        args = (cfg, total_optimizer_steps, os.getcwd(), parts)
        for attempt in range(1, START_ATTEMPTS + 1):
            addr, port = node_ip(), find_free_port()
            # Ray's stubs type an actor as the class it wraps (no ``.remote`` on its methods)
            self.actors: list[Any] = [
                actor_cls.options(
                    num_cpus=t.num_cpus_per_worker * share,
                    num_gpus=t.num_gpus_per_worker * share,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=rank
                    ),
                    runtime_env={"env_vars": MALLOC_ENV},  # read at process start (host_memory)
                ).remote(role, rank, t.dp_size, addr, port, *args)
                for rank in range(t.dp_size)
            ]
            self._rank_of = {actor._actor_id.hex(): rank for rank, actor in enumerate(self.actors)}
            try:  # surface start-up failures here
                self.get([actor.pid.remote() for actor in self.actors])
                return
            except WorkerDiedError as exc:
                # Another process bound the rendezvous port before rank 0 did: start again on
                # a new one (the other ranks may wait on the old one; they are killed).
                self._kill_actors()
                if not (address_in_use(exc) and attempt < START_ATTEMPTS):
                    if self._owns_pg:
                        remove_placement_group(self.pg)
                    raise
            except BaseException:
                # Ctrl-C while the ranks start: left, the ranks and their bundles stay
                # reserved, and the next run in a notebook's kernel finds no room in Ray
                self._kill_actors()
                if self._owns_pg:
                    remove_placement_group(self.pg)
                raise

    def _wait_for_placement(self, bundle: dict[str, float]) -> None:
        """Wait for Ray to place the ranks' bundles; bundles that do not fit within
        ``PLACEMENT_TIMEOUT_S`` (more GPUs than the machine has, say) are a ``ConfigError``
        saying what Ray has, and the pending placement group is removed: left, it would take
        the resources once they free up."""
        try:
            ray.get(self.pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except BaseException as exc:  # a timeout, or Ctrl-C while waiting
            remove_placement_group(self.pg)
            if not isinstance(exc, GetTimeoutError):
                raise
            raise ConfigError(
                "trainer.dp_size",
                f"{self.dp_size} {self.role} workers of {_cpus_and_gpus(bundle)} each "
                "(trainer.num_cpus_per_worker, trainer.num_gpus_per_worker) found no room in "
                f"Ray within {PLACEMENT_TIMEOUT_S:g} s: it has "
                f"{_cpus_and_gpus(ray.cluster_resources())}, "
                f"{_cpus_and_gpus(ray.available_resources())} of them free",
            ) from None

    def get(self, refs: Sequence[ray.ObjectRef], timeout: float | None = None) -> list[Any]:
        """``ray.get`` that reports a dead actor as ``WorkerDiedError`` naming role and rank, and
        an exception a rank raised as a ``RuntimeError`` naming role, rank and cause
        (``_explain``). A rank that dies inside a collective makes its peers fail too; the dead
        one is named."""
        refs = list(refs)
        try:
            return ray.get(refs, timeout=timeout)
        except (RayActorError, RayTaskError) as first:
            error = self._explain(refs, first)
            raise error from (None if isinstance(error, WorkerDiedError) else first)

    def _explain(self, refs: list[ray.ObjectRef], first: Exception) -> Exception:
        """The error of a failed call: a rank that died (``WorkerDiedError``), else the lowest
        rank that raised, in one line naming it and its cause. The ranks still running are
        waited for together, ``DEATH_WAIT_S`` at most, because Ray notices a death some seconds
        after its peers fail: a rank's own exception ends the wait at once (its peers may be
        blocked in a collective until ``trainer.collective_timeout_min``), a collective cut
        short by a peer that ended (``_lost_a_peer``) does not."""
        deadline = time.monotonic() + DEATH_WAIT_S
        raised: dict[int | None, tuple[bool, BaseException]] = {}  # rank: (lost a peer, cause)
        pending = list(refs)
        while pending:
            # the first result to come, then every other one already there
            ready, pending = ray.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            if pending:
                more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                ready += more
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except RayActorError as exc:
                    rank = self._rank_of.get(getattr(exc, "actor_id", None) or "", "?")
                    if getattr(exc, "actor_init_failed", False):  # the cause is the last line
                        return WorkerDiedError(
                            f"{self.role} worker rank {rank} failed to start: {_last_line(exc)}"
                        )
                    return WorkerDiedError(
                        f"{self.role} worker rank {rank} died: {_first_line(exc)}"
                    )
                except Exception as exc:
                    cause = getattr(exc, "cause", None) or exc
                    raised[self._ref_rank(ref)] = (_lost_a_peer(cause), cause)
            if any(not lost for lost, _ in raised.values()):
                break
        if not raised:
            cause = getattr(first, "cause", None) or first
            return RuntimeError(f"{self.role} worker failed: {exception_line(cause)}")
        # a rank's own error before a lost peer, then the lowest rank (an unknown one last)
        culprit, (_, cause) = min(
            raised.items(), key=lambda item: (item[1][0], item[0] is None, item[0] or 0)
        )
        shown = "?" if culprit is None else culprit
        return RuntimeError(f"{self.role} worker rank {shown} failed: {exception_line(cause)}")

    def _ref_rank(self, ref: ray.ObjectRef) -> int | None:
        """The rank whose call ``ref`` is the result of (None if not one of this group's)."""
        try:
            return self._rank_of.get(ref.task_id().actor_id().hex())
        except Exception:  # not an actor task's ref
            return None

    def run(self, method: str, *args: Any) -> list[Any]:
        """Call ``method(*args)`` on every rank with the same arguments."""
        return self.get(self.submit(method, *args))

    def submit(self, method: str, *args: Any) -> list[ray.ObjectRef]:
        """Start ``method(*args)`` on every rank; ``get`` the refs for the results."""
        return [getattr(actor, method).remote(*args) for actor in self.actors]

    def run_chunks(self, method: str, chunks: Sequence[Any]) -> list[Any]:
        """Call ``method(chunks[r])`` on rank ``r``."""
        if len(chunks) != self.dp_size:
            raise ValueError(f"{len(chunks)} chunks for {self.dp_size} {self.role} ranks")
        return self.get(
            [
                getattr(actor, method).remote(chunk)
                for actor, chunk in zip(self.actors, chunks, strict=True)
            ]
        )

    def forward(
        self, staged: Sequence[Sequence[Any]], num_rows: int, method: str = "forward"
    ) -> torch.Tensor:
        """Per-token outputs for the ``num_rows`` rows that ``staged`` (from MeshDispatch) covers,
        back in their original order, padding rows dropped. ``method``: the workers' forward
        to run (``reference_forward``: a LoRA policy with its adapters off)."""
        out: torch.Tensor | None = None
        for chunks in staged:
            results = self.run_chunks(method, chunks)
            self.compute_s += max(r["compute_s"] for r in results)
            for result in results:
                (key,) = [k for k in result if k not in ("source_rows", "compute_s")]
                values = result[key]
                if out is None:
                    out = values.new_zeros(num_rows, values.shape[1])
                place_rows(out, values, result["source_rows"])
        assert out is not None, "forward got no chunks"
        return out

    def train_mini_batch(
        self, chunks: Sequence[Any], logprobs_into: torch.Tensor | None = None
    ) -> TrainStats:
        """One optimizer step on one mini-batch; the ranks' records combined (``combine_ranks``).
        ``logprobs_into`` (``[rows of the staged batch, S]``): on an on-policy step, where the
        ranks return their training forward's logprobs, they are written there in batch order."""
        records = self.run_chunks("train_mini_batch", chunks)
        if logprobs_into is not None:
            for record in records:
                if record.logprobs is None or record.source_rows is None:
                    raise RuntimeError(
                        f"{self.role} worker returned no training logprobs: the chunk was not "
                        "staged as on-policy (old_logprobs_from_training)"
                    )
                place_rows(logprobs_into, record.logprobs, record.source_rows)
        return combine_ranks(records)

    def stream_weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """The full weights as ``{name: tensor}`` buckets of about ``bucket_bytes``, streamed from
        rank 0 through the object store while every rank takes part in the gathers (ZeRO-3)."""
        streams = [
            actor.iter_weight_buckets.options(num_returns="streaming").remote(bucket_bytes)
            for actor in self.actors
        ]
        for ref in streams[0]:
            yield self.get([ref])[0]
        for stream in streams[1:]:  # the other ranks yield nothing; wait until they are done
            self.get(list(stream))

    def shutdown(self) -> None:
        """Kill the actors (and the placement group if this group owns it)."""
        self._kill_actors()
        if self._owns_pg:
            remove_placement_group(self.pg)

    def _kill_actors(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def pickled_driver_parts(cfg: SkyRLConfig) -> dict[str, bytes]:
    """This process's ``skyrl.workers.losses.driver_parts``, each ``(name, function)`` pickled
    on its own (cloudpickle), for ``TrainingWorker`` to load after its ``imports``. A function
    of ``skyrl`` or of an ``imports`` module goes by reference (the worker imports it); any
    other goes by value: one of ``__main__`` (a notebook, a script), or of a module the worker
    may not find (a test module, a notebook's helper file)."""
    from ray import cloudpickle

    pickled = {}
    for key, part in driver_parts(cfg.algorithm).items():
        module = _module_to_copy(part[1], cfg.imports)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)
        try:
            pickled[key] = cloudpickle.dumps(part)
        except Exception as exc:  # a global it uses that does not pickle (a lock, a client)
            raise ConfigError(
                f"algorithm.{key}",
                f"{part[0]!r} cannot be sent to the training workers: {exception_line(exc)}",
            ) from None
        finally:
            if module is not None:
                cloudpickle.unregister_pickle_by_value(module)
    return pickled


def _module_to_copy(fn: Callable, imports: Sequence[str]) -> ModuleType | None:
    """The module whose code a worker gets by value with ``fn``: that of a plain function the
    worker would not import itself; None for ``skyrl``, ``imports``, ``__main__`` (by value
    anyway) and a module already registered by value."""
    from ray import cloudpickle

    name = getattr(fn, "__module__", None) or ""
    module = sys.modules.get(name)
    if not inspect.isfunction(fn) or module is None or name == "__main__":
        return None
    if any(name == root or name.startswith(root + ".") for root in ("skyrl", *imports)):
        return None
    return None if name in cloudpickle.list_registry_pickle_by_value() else module


def place_rows(out: torch.Tensor, values: torch.Tensor, source_rows: Sequence[int]) -> None:
    """``out[source_rows[i]] = values[i]`` for every chunk row that is not padding (-1)."""
    rows = torch.as_tensor(source_rows, dtype=torch.long)
    real = rows >= 0
    out[rows[real]] = values[real].to(out.dtype)


def _cpus_and_gpus(resources: Mapping[str, float]) -> str:
    return f"{resources.get('CPU', 0):g} CPUs and {resources.get('GPU', 0):g} GPUs"


def _lost_a_peer(cause: BaseException) -> bool:
    """A collective that failed because another rank ended (gloo's reset, a torch.distributed
    error such as NCCL's): the cause is that rank, not this one."""
    dist_error = getattr(torch.distributed, "DistError", ())
    return isinstance(cause, dist_error) or any(text in str(cause) for text in PEER_LOST)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1].strip() if text else type(exc).__name__
