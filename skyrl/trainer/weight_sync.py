"""The driver's side of the broadcast weight sync: setting the group up and each sync.

``trainer.weight_sync`` picks the path (``skyrl.config.validate.uses_broadcast_sync``
resolves ``auto``). ``object_store`` streams buckets from policy
rank 0 through Ray into every engine's ``update_weights``. ``broadcast`` opens one
group (``skyrl.inference.weight_sync``) from policy rank 0 to every engine process
once, then each sync is one broadcast per bucket: the driver starts rank 0 sending
and has the engines receive at the same time (a collective blocks until every rank
is in it).
"""

from __future__ import annotations

from skyrl.config.root import SkyRLConfig
from skyrl.inference.base import InferenceEngine
from skyrl.workers.group import WorkerGroup


class BroadcastWeightSync:
    """Policy rank 0 to every engine over one broadcast group, set up on construction."""

    def __init__(self, policy: WorkerGroup, engine: InferenceEngine, cfg: SkyRLConfig):
        self.policy, self.engine = policy, engine
        bucket_bytes = cfg.trainer.weight_sync_bucket_mb << 20
        rank0 = policy.actors[0]  # a Ray actor handle
        self.plan, (host, port) = policy.get(
            [rank0.weight_sync_plan.remote(bucket_bytes), rank0.weight_sync_address.remote()]
        )
        self.backend = "nccl" if cfg.trainer.num_gpus_per_worker > 0 else "gloo"
        world_size = 1 + cfg.generator.num_engines * cfg.generator.processes_per_engine
        joining = policy.submit("join_weight_sync", host, port, world_size, self.backend)
        engine.join_weight_sync(host, port, 1, world_size, self.backend)
        policy.get(joining)

    def sync(self) -> None:
        """One broadcast of the full weights; the engines load them as they arrive."""
        sending = self.policy.submit("broadcast_weights", self.plan)
        self.engine.receive_weights(self.plan)
        self.policy.get(sending)
