"""Several engines behind one client: load balancing with prompt affinity.

All requests with the same route key (the prompt's uid) go to the same engine,
so the samples and later turns of a prompt hit that engine's prefix cache. A
new key goes to the engine with the fewest keys assigned. Engines are called
in parallel (threads for in-process engines; Ray actors run on their own).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from skyrl.inference.base import Completion, SamplingParams, WeightItems


class EngineDiedError(RuntimeError):
    """An inference engine actor died (out of memory, killed, crashed)."""


class RayEngineHandle:
    """An engine class running as a Ray actor, with the engine's sync methods."""

    def __init__(self, actor):
        self.actor = actor

    @classmethod
    def start(cls, engine_cls: type, kwargs: dict, num_cpus: float = 1, num_gpus: float = 0):
        import ray

        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(engine_cls)
        return cls(remote.remote(**kwargs))

    def _call(self, name, *args, **kwargs):
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(getattr(self.actor, name).remote(*args, **kwargs))
        except RayActorError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EngineDiedError(f"inference engine actor died during {name}: {first}") from None

    def generate(self, prompts, sampling):
        return self._call("generate", prompts, sampling)

    def update_weights(self, weights: WeightItems) -> None:
        self._call("update_weights", list(weights))

    def join_weight_sync(self, *args) -> None:
        self._call("join_weight_sync", *args)

    def receive_weights(self, plan: list) -> None:
        self._call("receive_weights", plan)

    def reset_prefix_cache(self) -> None:
        self._call("reset_prefix_cache")

    def sleep(self) -> None:
        self._call("sleep")

    def wake_up(self) -> None:
        self._call("wake_up")


class EngineClient:
    """Routes requests over ``engines``; same interface as one engine plus ``route_keys``."""

    def __init__(self, engines: list):
        self.engines = engines
        self.assignment: dict[str, int] = {}
        self.load = [0] * len(engines)
        self.pool = ThreadPoolExecutor(len(engines))

    def route(self, key: str) -> int:
        """The engine index for ``key`` (sticky; new keys go to the least-loaded engine)."""
        if key not in self.assignment:
            idx = min(range(len(self.engines)), key=lambda i: self.load[i])
            self.assignment[key] = idx
            self.load[idx] += 1
        return self.assignment[key]

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        sampling: SamplingParams | list[SamplingParams],
        route_keys: list[str] | None = None,
    ) -> list[list[Completion]]:
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompt_token_ids)
        keys = route_keys or [str(tuple(p)) for p in prompt_token_ids]
        per_engine: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            per_engine.setdefault(self.route(key), []).append(i)
        futures = {
            e: self.pool.submit(
                self.engines[e].generate,
                [prompt_token_ids[i] for i in idx],
                [params[i] for i in idx],
            )
            for e, idx in per_engine.items()
        }
        result: list[list[Completion] | None] = [None] * len(keys)
        for e, idx in per_engine.items():
            for i, group in zip(idx, futures[e].result(), strict=True):
                result[i] = group
        return result  # type: ignore[return-value]

    def _all(self, name: str, *args) -> None:
        for f in [self.pool.submit(getattr(e, name), *args) for e in self.engines]:
            f.result()

    def update_weights(self, weights: WeightItems) -> None:
        named = list(weights)  # every engine needs the full list
        self._all("update_weights", named)

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Engine ``i`` joins as ranks ``first_rank + i * per_engine ...`` (all engines at
        once: joining blocks until the whole group is there)."""
        per_engine = (world_size - first_rank) // len(self.engines)
        futures = [
            self.pool.submit(
                engine.join_weight_sync,
                host,
                port,
                first_rank + i * per_engine,
                world_size,
                backend,
            )
            for i, engine in enumerate(self.engines)
        ]
        for f in futures:
            f.result()

    def receive_weights(self, plan: list) -> None:
        self._all("receive_weights", plan)

    def reset_prefix_cache(self) -> None:
        self._all("reset_prefix_cache")

    def sleep(self) -> None:
        self._all("sleep")

    def wake_up(self) -> None:
        self._all("wake_up")
