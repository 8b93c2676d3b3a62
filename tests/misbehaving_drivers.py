"""Rollout drivers that break ``RolloutDriver.run``'s contract, for the generator's check of
their output on the synchronous and asynchronous paths: ``generator.agent`` names the
factories (``misbehaving_drivers.one_short``, ``misbehaving_drivers.dicts``)."""

from __future__ import annotations

from skyrl.generators import AgentLoop


class Misbehaving:
    """A rollout driver around the built-in loop that returns its trajectories ``how``."""

    def __init__(self, loop: AgentLoop, how: str):
        self.loop, self.how = loop, how

    async def run(self, rows, n_samples, sampling):
        trajs = await self.loop.run(rows, n_samples, sampling)
        if self.how == "one short":
            return trajs[:-1]
        if self.how == "sample-major":  # p0/0, p1/0, p0/1, p1/1
            return [trajs[k * n_samples + s] for s in range(n_samples) for k in range(len(rows))]
        if self.how == "dicts":
            return [{"turns": t.turns} for t in trajs]
        return trajs


def one_short(ctx) -> Misbehaving:
    return Misbehaving(AgentLoop.from_context(ctx), "one short")


def dicts(ctx) -> Misbehaving:
    return Misbehaving(AgentLoop.from_context(ctx), "dicts")
