"""Methods added to every vLLM worker (``worker_extension_cls``) for the broadcast weight sync.

vLLM mixes this class into its worker class; ``LLM.collective_rpc`` calls the methods
by name in each worker process (the engine process itself on CPU, where vLLM runs
in-process). Each worker joins ``skyrl.inference.weight_sync``'s group and loads the
received buckets with vLLM's in-place ``reload_weights``, one bucket in memory at a
time. Method names carry a ``skyrl_`` prefix so they cannot clash with vLLM's own.
"""

from __future__ import annotations


class WeightSyncWorkerExtension:
    """Mixed into ``vllm``'s worker class; ``self`` is a vLLM worker."""

    def skyrl_join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Join the group as ``first_rank`` + this worker's tensor-parallel rank."""
        from skyrl.inference.weight_sync import join_group

        rank = first_rank + self.rank
        self.skyrl_sync_group = join_group(host, port, rank, world_size, backend)

    def skyrl_receive_weights(self, plan: list) -> None:
        """Receive every bucket of ``plan`` and reload it into the running model."""
        from skyrl.inference.weight_sync import receive_stream

        stream = receive_stream(self.skyrl_sync_group, plan, self.device)
        self.reload_weights(weights_iterator=stream)
