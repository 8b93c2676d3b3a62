"""``Generator``: a rollout driver's trajectories as validated training rows, with metrics.

``generator.agent`` picks the driver: ``agent_loop`` (the built-in ``TextEnv``
loop) or the import path of a ``DriverFactory`` (``module.attr``), so a driver
that is not our loop plugs in without touching the trainer. The engine backend
(``generator.backend``) is chosen separately.

``Generator.generate`` runs the driver's coroutine on a helper thread's event
loop while the calling thread serves the in-process engine
(``skyrl.inference.local.run_serving``); it also works from a running event
loop (Jupyter).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import cast

from skyrl.config.errors import ConfigError
from skyrl.data.prompts import PromptRow
from skyrl.generators.agent_loop import AgentLoop
from skyrl.generators.metrics import rollout_metrics
from skyrl.generators.output import GeneratorOutput
from skyrl.generators.trajectory import (
    DriverContext,
    DriverFactory,
    LoopSettings,
    RolloutDriver,
    Trajectory,
    Turn,
    VersionClock,
)
from skyrl.inference.base import InferenceEngine, SamplingParams
from skyrl.inference.local import run_serving
from skyrl.registry import import_path, unbindable_parameters

DRIVERS: dict[str, DriverFactory] = {"agent_loop": AgentLoop.from_context}
"""Built-in rollout drivers by ``generator.agent`` name."""


def driver_factory(name: str) -> DriverFactory:
    """The factory ``generator.agent`` names: a built-in name or an import path
    ``package.module.attr`` (``attr`` may be dotted: ``module.Class.method``). Anything else
    raises a ``ConfigError`` for ``generator.agent`` (the pre-flight check calls this too)."""
    if name in DRIVERS:
        return DRIVERS[name]
    if "." not in name:
        raise ConfigError(
            "generator.agent",
            f"{name!r} is not a built-in driver ({', '.join(sorted(DRIVERS))}) "
            "nor an import path module.attr",
        )
    try:
        target = import_path(name)
    except ValueError as exc:
        problem = str(exc)
    else:
        if inspect.iscoroutinefunction(target):  # an external agent: async def rollout(client, row)
            problem = _not_an_agent(name, target)
            if not problem:
                from skyrl.serve.harness import HarnessDriver

                return functools.partial(HarnessDriver.from_context, rollout=target)
        else:
            problem = _not_a_factory(name, target)
            if not problem:
                return cast(DriverFactory, target)
    raise ConfigError("generator.agent", problem)  # outside the handler: no exception context


def _not_an_agent(name: str, target: Callable) -> str:
    """Why the coroutine function ``target`` cannot be called as an external agent,
    ``rollout(client, row)`` ("" if it can; a signature Python cannot read is given the
    benefit of the doubt). The harness calls it so in every trajectory, each failing alone."""
    listed = unbindable_parameters(target, 2)
    if listed is None:
        return ""
    short = name.rsplit(".", 1)[-1]
    return f"{name} takes ({listed}): an external agent must be `async def {short}(client, row)`"


def _not_a_factory(name: str, target: object) -> str:
    """Why ``target`` cannot be called as a driver factory, ``factory(context)`` ("" if it
    can; a signature Python cannot read is given the benefit of the doubt)."""
    if not callable(target):
        return f"{name} is not callable: name a driver factory or an async external agent"
    listed = unbindable_parameters(target, 1)
    if listed is None:
        return ""
    if len(listed.split(", ")) == 2:
        return (
            f"{name} takes ({listed}): an external agent must be `async def {name.rsplit('.', 1)[-1]}"
            "(client, row)`; a driver factory takes one argument, the DriverContext"
        )
    return f"{name} takes ({listed}): a driver factory takes one argument, the DriverContext"


class Generator:
    """Rollouts for a list of prompt rows -> ``GeneratorOutput`` (validated, with metrics)."""

    def __init__(self, driver: RolloutDriver, engine: InferenceEngine, step_wise: bool = False):
        self.driver = driver
        self.engine = engine
        self.step_wise = step_wise

    def generate(
        self, rows: list[PromptRow], n_samples: int, sampling: SamplingParams
    ) -> GeneratorOutput:
        """Run every sample of every row (blocking) and convert to training rows."""
        started = time.perf_counter()
        trajs = run_serving(self.engine, self.trajectories(rows, n_samples, sampling))
        elapsed = time.perf_counter() - started
        out = trajectories_to_output(trajs, self.step_wise)
        out.validate()
        out.metrics = rollout_metrics(trajs, n_samples, elapsed)
        return out

    async def trajectories(
        self, rows: list[PromptRow], n_samples: int, sampling: SamplingParams
    ) -> list[Trajectory]:
        """The driver's trajectories of every sample of every row, checked against what
        ``RolloutDriver.run`` promises (``_check_driver_output``); the synchronous and the
        asynchronous rollout sources both run the driver through here."""
        trajs = await self.driver.run(rows, n_samples, sampling)
        _check_driver_output(trajs, rows, n_samples)
        return trajs

    def close(self) -> None:
        """Stop what the driver keeps running between calls (an external agent's endpoint:
        ``HarnessDriver.close``); a driver without ``close`` keeps nothing."""
        close = getattr(self.driver, "close", None)
        if close is not None:
            close()


def _check_driver_output(trajs: object, rows: list[PromptRow], n_samples: int) -> None:
    """Raise a ``ConfigError`` for ``generator.agent`` unless the driver returned what
    ``RolloutDriver.run`` promises (rows of a prompt apart, or missing, fail far from the
    driver, in the trainer)."""
    problem = _driver_output_problem(trajs, rows, n_samples)
    if problem is not None:
        raise ConfigError(
            "generator.agent",
            f"the rollout driver {problem}: RolloutDriver.run returns n_samples Trajectory "
            "objects per row, in (row, sample) order",
        )


def _driver_output_problem(trajs: object, rows: list[PromptRow], n_samples: int) -> str | None:
    """What is wrong with ``trajs`` as ``n_samples`` ``Trajectory``s per row in (row, sample)
    order, or None."""
    if not isinstance(trajs, list | tuple):
        return f"returned a {type(trajs).__name__}, not a list of trajectories"
    if len(trajs) != len(rows) * n_samples:
        return (
            f"returned {len(trajs)} trajectories, not {len(rows)} prompts x {n_samples} "
            f"samples = {len(rows) * n_samples}"
        )
    for i, t in enumerate(trajs):
        want = rows[i // n_samples].uid
        if not isinstance(t, Trajectory):
            return f"returned a {type(t).__name__} as trajectory {i}, not a Trajectory"
        if t.row.uid != want:
            return (
                f"returned prompt {t.row.uid!r} as trajectory {i}, where sample "
                f"{i % n_samples} of {want!r} belongs"
            )
    return None


def trajectories_to_output(trajs: list[Trajectory], step_wise: bool) -> GeneratorOutput:
    """Rows for training: one per trajectory (or per run of turns between forks), or one per
    turn when ``step_wise``."""
    out = GeneratorOutput([], [], [], [], [], [], [], [], [], [], [], step_wise=step_wise)

    def add(prompt, resp, mask, lps, reward, t: Trajectory, last: bool, versions, fork=""):
        out.prompt_token_ids.append(prompt)
        out.response_token_ids.append(resp)
        out.loss_masks.append(mask)
        out.rollout_logprobs.append(lps)
        out.rewards.append(reward if last else 0.0)
        out.uids.append(t.row.uid)
        out.trajectory_ids.append(t.trajectory_id)
        out.is_last_step.append(last)
        out.data_sources.append(t.row.data_source)
        out.stop_reasons.append(t.stop_reason)
        out.policy_versions.append(versions)
        out.forks.append(fork)

    for t in trajs:
        if not t.turns:  # env failed before the first turn: an empty, masked row
            add([], [], [], [], t.reward, t, True, [])
            continue
        if step_wise:
            for k, turn in enumerate(t.turns):
                n = len(turn.response_ids)
                last = k + 1 == len(t.turns)
                add(
                    turn.prompt_ids, turn.response_ids, [1] * n, turn.logprobs, t.reward, t, last,
                    [(turn.version_dispatched, turn.version_finished)], turn.fork,
                )  # fmt: skip
            continue
        _check_chained(t)
        segments = _segments(t.turns)
        for k, segment in enumerate(segments):
            resp, mask, lps = [], [], []
            for turn in segment:
                resp += turn.response_ids + turn.appended_ids
                mask += [1] * len(turn.response_ids) + [0] * len(turn.appended_ids)
                lps += turn.logprobs + [0.0] * len(turn.appended_ids)
            if segment[-1].appended_ids:  # trailing observation is never trained on
                cut = len(segment[-1].appended_ids)
                resp, mask, lps = resp[:-cut], mask[:-cut], lps[:-cut]
            versions = [(turn.version_dispatched, turn.version_finished) for turn in segment]
            last = k + 1 == len(segments)
            add(
                segment[0].prompt_ids, resp, mask, lps, t.reward, t, last, versions, segment[0].fork
            )
    return out


def _check_chained(t: Trajectory) -> None:
    """Raise ``ValueError`` unless each turn that is not a fork was given exactly the previous
    turn's prompt + response + ``appended_ids``: a whole-trajectory row is built from those
    pieces, so it is the context the engine saw only then (the built-in loop builds each
    context so; a driver that records the pieces otherwise would train another sequence)."""
    for k in range(1, len(t.turns)):
        prev, turn = t.turns[k - 1], t.turns[k]
        chain = prev.prompt_ids + prev.response_ids + prev.appended_ids
        if turn.fork or turn.prompt_ids == chain:
            continue
        pairs = zip(chain, turn.prompt_ids, strict=False)
        at = next(
            (i for i, (a, b) in enumerate(pairs) if a != b), min(len(chain), len(turn.prompt_ids))
        )
        raise ValueError(
            f"trajectory {t.trajectory_id!r}: turn {k}'s prompt is not turn {k - 1}'s prompt + "
            f"response + appended_ids (first difference at token {at}); a turn given another "
            "context must set Turn.fork"
        )


def _segments(turns: list[Turn]) -> list[list[Turn]]:
    """Runs of turns that extend each other: a forked turn starts a new run."""
    runs: list[list[Turn]] = []
    for turn in turns:
        if not runs or turn.fork:
            runs.append([])
        runs[-1].append(turn)
    return runs


def make_generator(
    gen_cfg, env_cfg, engine: InferenceEngine, tokenizer, clock: VersionClock | None = None
) -> Generator:
    """A ``Generator`` from the ``generator`` and ``environment`` config groups."""
    from skyrl.envs import make_env_factory

    settings = LoopSettings(
        max_prompt_length=gen_cfg.max_prompt_length,
        max_generate_length=gen_cfg.max_generate_length,
        max_turns=gen_cfg.max_turns,
        env_timeout_s=env_cfg.timeout_s,
        max_tokens_per_turn=gen_cfg.max_tokens_per_turn,
        max_env_calls=env_cfg.max_concurrent_calls,
        max_hung_env_calls=env_cfg.max_hung_calls,
    )
    ctx = DriverContext(
        engine, tokenizer, make_env_factory(env_cfg), settings, clock or VersionClock(), gen_cfg
    )
    driver = driver_factory(gen_cfg.agent)(ctx)
    return Generator(driver, engine, step_wise=gen_cfg.step_wise)
