"""Attention over a packed micro batch that computes only each sequence's own block.

A packed micro batch is one row ``[1, T]`` of several sequences with position ids restarting
at 0 per sequence (``skyrl.batch.packing``). transformers' ``sdpa`` attention confines it
with a block-diagonal ``[T, T]`` mask, but the kernel still computes every block, the
cross-sequence ones included, so its cost grows with ``T^2`` instead of the sum of the
sequences' squares. Measured here (SmolLM2 shapes: 9 query heads, 3 KV heads, head dim 64;
forward + backward, one thread; sequences of 100 tokens): T=500 51 vs 14 ms, T=1000 182 vs
30 ms, T=2000 725 vs 50 ms per layer, masked vs per sequence. That made budgets above one
sequence's length no faster.

``per_sequence`` (registered with transformers as ``skyrl_per_sequence``) splits the row at
the position-id restarts and runs causal SDPA on each sequence (grouped-query heads without
copies), which is what flash-attention's varlen path does on a GPU. It also runs a prompt that
several rows share, packed once (``trainer.share_prompts``): each row's continuation attends
to the prompt's keys and causally to its own. On CPU it calls torch's flash-attention kernels
with a backward of its own (``_CpuSpanAttention``: SmolLM2 forward + backward of a
~600-token micro batch, best of 7 in two alternating rounds, 2.00/1.99 -> 1.86/1.89 s), once
per block of consecutive short spans under a mask (``attention_blocks``). On a GPU in bf16 or
fp16 it is one call of flash-attention's varlen kernel per row (torch's ``varlen_attn``): a
continuation's keys are its prompt's, gathered, then its own, causal aligned at the bottom
right (``_varlen_per_span``). Otherwise (fp32 on a GPU, a torch without ``varlen_attn``)
SDPA per span under autograd. ``tests/bench/bench_gpu_attention.py`` times them against a
masked, a flex and a padded call; on an H200 (SmolLM2's attention layer, bf16, forward +
backward of a 16k-token row) varlen took 1.26 ms, flex 1.96, masked 10.92, padded 12.12 and
SDPA per span 28.82 (README, GPUs).
``masked`` keeps transformers' ``sdpa`` (no shared prompts: its block-diagonal mask cannot
express them). ``trainer.packed_attention`` picks one.

A layer with a sliding window (Mistral's, Gemma3's local layers, Qwen2's with
``use_sliding_window``) that a sequence of the row is longer than runs SDPA per span under a
mask of the window (``_window_mask``, transformers' rule: a query sees the keys less than
``sliding_window`` positions back, a shared prompt's too); within the window every path above
computes the same.

Attention that neither computes (Gemma2's logit softcapping, gpt-oss's attention sinks:
arguments transformers' sdpa drops silently) is refused: by the pre-flight from the model's
config (``unimplemented_attention``), at load, and per call (``check_arguments``); so is a
model that attends in its own code, which neither reaches (``OWN_ATTENTION_MODEL_TYPES``:
Bloom, Falcon, GPT-J, ...), or whose other layers mix tokens along the whole packed row
(``MIXING_MODEL_TYPES``: Mamba, Qwen3.5's linear attention, ...). Llama 4's chunked-attention
layers (a query sees only its own ``attention_chunk_size`` chunk) are not applied here; the
pre-flight refuses ``per_sequence`` once a sequence can pass one chunk (``masked`` applies
transformers' chunked mask).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

PER_SEQUENCE = "skyrl_per_sequence"
"""The attention implementation's name in transformers' registries."""

IMPLEMENTATIONS = {"per_sequence": PER_SEQUENCE, "masked": "sdpa"}
"""``trainer.packed_attention`` -> the model's ``attn_implementation``."""


def attention_spans(position_ids: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """The spans of one packed row's position ids ``[T]``, as ``(start, end, prefix_start,
    prefix_length)``: the queries ``[start, end)`` attend causally to themselves and to all of
    ``[prefix_start, prefix_start + prefix_length)``.

    Positions restart at 0 where a sequence starts (a span with no prefix; so does the row's
    first span, wherever its positions begin); a jump back to
    ``p > 0`` starts a continuation of the sequence's first ``p`` tokens, a prompt several
    rows share (``skyrl.batch.packing``): its span's prefix. Any other jump is an error."""
    positions = position_ids.tolist()
    breaks = torch.nonzero(position_ids[1:] != position_ids[:-1] + 1).flatten().add(1).tolist()
    starts = [0, *breaks]
    ends = [*starts[1:], len(positions)]
    spans = []
    sequence_start = 0
    for start, end in zip(starts, ends, strict=True):
        first = positions[start]
        if first == 0 or start == 0:  # a row may begin mid-sequence: its first span
            sequence_start = start
            spans.append((start, end, start, 0))
        elif first <= positions[start - 1] and sequence_start + first <= start:
            spans.append((start, end, sequence_start, first))
        else:
            raise ValueError(
                f"position ids jump from {positions[start - 1]} to {first} at {start}: "
                "neither a new sequence (0) nor a continuation of a shared prefix"
            )
    return spans


def _continuation_mask(prefix: int, length: int, device: torch.device) -> torch.Tensor:
    """``[length, prefix + length]`` bool: every prefix key, then causal over its own keys."""
    own = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return torch.cat([own.new_ones(length, prefix), own], dim=1)


def per_sequence_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` ``[1, heads, T, d]``, ``key``/``value``
    ``[1, kv_heads, T, d]`` -> ``[1, T, heads, d]``. Causal attention within each sequence;
    a continuation of a shared prompt also sees that prompt (``attention_spans``).

    A ``sliding_window`` shorter than a sequence of the row is applied (``_sdpa_per_span``).
    An attention layer that does not pass its ``position_ids`` on (Ministral 3's, Persimmon's)
    gets those of the model's forward (``track_position_ids``).
    Anything but one packed row (a padded batch with a 2D attention mask, a KV cache: the
    model used outside the workers' forward) goes to transformers' sdpa with a causal mask.
    Any other argument that would change the result (``softcap``, ``s_aux``, ``is_causal=False``,
    ...) is a ``ValueError``: neither path computes it (``check_arguments``)."""
    check_arguments(module, kwargs)
    packed_row = query.shape[0] == 1 and query.shape[2] == key.shape[2]  # no KV cache
    if position_ids is None and attention_mask is None and packed_row:
        position_ids = _forward_position_ids(query.shape[2])
    if attention_mask is not None or position_ids is None or not packed_row:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    spans, longest = _row_spans(position_ids)
    if sliding_window is not None and longest > sliding_window:  # a window that cuts
        return _sdpa_per_span(query, key, value, spans, dropout, scaling, sliding_window), None
    # the flash kernels take one head size; multi-head latent attention (DeepSeek-V2/V3) has
    # values of another size than its queries and keys
    flash = dropout == 0.0 and value.shape[-1] == query.shape[-1]
    if query.device.type == "cpu" and flash:
        out = _CpuSpanAttention.apply(query, key, value, spans, scaling)
        return out.transpose(1, 2).contiguous(), None
    half = query.dtype in (torch.bfloat16, torch.float16)
    if query.is_cuda and half and flash and varlen_kernel() is not None:
        return _varlen_per_span(query, key, value, spans, scaling), None
    return _sdpa_per_span(query, key, value, spans, dropout, scaling), None


SINK_MODEL_TYPES = frozenset(
    {"gpt_oss", "deepseek_v4", "hy_v4", "mimo_v2_flash", "granite_swa", "granitemoe_swa"}
)
"""transformers' model types whose attention adds a learned logit per head to every query's
softmax (attention sinks, passed as ``s_aux=``; transformers 5.19's modeling files)."""


OWN_ATTENTION_MODEL_TYPES = frozenset(
    {"bloom", "codegen", "cpmant", "falcon", "gpt_neo", "gpt_neox_japanese", "gptj", "mpt", "xglm"}
)
"""transformers' model types whose causal LM attends in its own code, not through
transformers' attention interface (their transformers 5.19 modeling files use no
``ALL_ATTENTION_FUNCTIONS``): neither ``trainer.packed_attention`` reaches them, and they
build their own causal mask over the whole packed row. On tiny ones, the logits of a sequence
packed after another were up to 0.006 (Bloom), 0.003 (XGLM) and 0.15 (CodeGen) off its
logits alone; Falcon, GPT-Neo and GPT-J did not load with ``per_sequence`` (``KeyError:
'skyrl_per_sequence'``), MPT's forward failed without an attention mask."""

MIXING_MODEL_TYPES = frozenset(
    {
        "bamba", "falcon_h1", "falcon_mamba", "granitemoehybrid", "jamba", "kimi_linear", "lfm2",
        "lfm2_moe", "mamba", "mamba2", "minimax", "nemotron_h", "olmo_hybrid", "qwen3_5",
        "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "recurrent_gemma",
        "rwkv", "xlstm", "zamba", "zamba2",
    }
)  # fmt: skip
"""transformers' model types with layers that mix tokens outside attention: Mamba (state
space), linear attention (Qwen3.5's and Qwen3-Next's gated delta rule, MiniMax's lightning
attention), recurrence (RWKV, xLSTM, RecurrentGemma) or short convolutions (LFM2). Those run
along the whole packed row, carrying one sequence's state into the next (transformers splits
them per sequence only from its padding-free kwargs, ``seq_idx`` / ``cu_seq_lens``, which
skyrl's packed forward does not pass). On tiny ones, the logits of a sequence packed after
another were off its logits alone by 0.02 (Qwen3.5), 0.04 (Qwen3-Next), 0.07 (MiniMax), 0.34
(Bamba, Nemotron-H), 1.1 (RecurrentGemma), 1.7 (Mamba), 0.0006 (LFM2, one conv layer). A
config whose ``layer_types`` are all attention has none of them."""

ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
"""``layer_types`` entries of an attention layer."""


def _mixing_layers(model_config) -> bool:
    """Whether the (text) config ``model_config`` has layers that mix tokens outside attention
    (``MIXING_MODEL_TYPES``, unless its ``layer_types`` are all attention)."""
    if getattr(model_config, "model_type", None) not in MIXING_MODEL_TYPES:
        return False
    layer_types = getattr(model_config, "layer_types", None)
    return not (isinstance(layer_types, list | tuple) and set(layer_types) <= ATTENTION_LAYER_TYPES)


def unimplemented_attention(name: str, model_config) -> str | None:
    """Why the model ``name`` (its (text) config ``model_config``) cannot be trained here, or
    None: its attention computes what neither ``trainer.packed_attention`` does (Gemma2's
    logit softcapping, attention sinks; transformers' sdpa, ``masked``, ignores both), or
    attends in its own code, which neither reaches (``OWN_ATTENTION_MODEL_TYPES``), or has
    layers that mix tokens outside attention along the whole packed row (``MIXING_MODEL_TYPES``)."""
    model_type = getattr(model_config, "model_type", None)
    if model_type in OWN_ATTENTION_MODEL_TYPES:
        return (
            f"{name} ({model_type}) computes attention in its own code, which neither of "
            "skyrl's packed attentions (trainer.packed_attention) reaches: the sequences "
            "packed in one micro batch would see each other"
        )
    if _mixing_layers(model_config):
        return (
            f"{name} ({model_type}) has layers that mix tokens outside attention (state space, "
            "linear attention, recurrence or short convolutions), which skyrl's packed forward "
            "runs along the whole micro batch: the sequences packed in it would see each other"
        )
    softcap = getattr(model_config, "attn_logit_softcapping", None)
    if softcap is not None:
        feature = f"attention logit softcapping (attn_logit_softcapping = {softcap})"
    elif model_type in SINK_MODEL_TYPES:
        feature = "attention sinks (a learned logit per head in every query's softmax)"
    else:
        return None
    return (
        f"{name} ({model_config.model_type}) uses {feature}, which skyrl's packed attention does "
        "not implement (nor does transformers' sdpa, trainer.packed_attention=masked)"
    )


UNCHANGED_BY = frozenset(
    {"use_cache", "output_attentions", "output_hidden_states", "output_router_logits"}
)
"""Arguments transformers hands every layer's attention that do not change its output (the
attention weights are never returned: ``output_attentions`` gets None, as from sdpa)."""


def check_arguments(module: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    """Refuse an attention argument this module does not implement: one not ``UNCHANGED_BY``,
    set (not None) and, for ``is_causal``, not True. Gemma2 passes ``softcap=``, gpt-oss its
    sinks as ``s_aux=``; transformers' sdpa drops both too, and plain softmax attention then
    scored another model (0.198 / 0.672 nats per sequence off tiny ones' eager forward)."""
    for name, value in kwargs.items():
        if name in UNCHANGED_BY or value is None or (name == "is_causal" and value is True):
            continue
        shown = f"<tensor of shape {tuple(value.shape)}>" if torch.is_tensor(value) else repr(value)
        raise ValueError(
            f"{type(module).__name__} passes {name}={shown} to its attention, which skyrl's "
            "packed attention does not implement (computed without it, the logprobs would be "
            "another model's)"
        )


_forward_positions: torch.Tensor | None = None
"""The ``position_ids`` of the forward running now of a model ``track_position_ids`` follows."""


def track_position_ids(model: torch.nn.Module) -> None:
    """Keep the ``position_ids`` that each forward of ``model`` is called with, for an
    attention layer that does not pass its own on to the attention function (Ministral 3's and
    Persimmon's take them as an argument and drop them): without them a packed row looked like
    one sequence, and its sequences attended to each other (a tiny Ministral 3's second packed
    sequence 0.54 off its logits alone)."""

    def keep(_module, args, kwargs) -> None:
        global _forward_positions
        _forward_positions = kwargs.get("position_ids")

    model.register_forward_pre_hook(keep, with_kwargs=True)


def _forward_position_ids(length: int) -> torch.Tensor | None:
    """The running forward's ``position_ids`` (``track_position_ids``) if they are those of a
    row of ``length`` tokens, else None."""
    positions = _forward_positions
    if positions is None or positions.dim() != 2 or positions.shape != (1, length):
        return None
    return positions


_last_row: tuple[weakref.ref, int, list[tuple[int, int, int, int]], int] | None = None
"""The last packed row's position ids (by identity and version), spans and longest sequence."""


def _row_spans(position_ids: torch.Tensor) -> tuple[list[tuple[int, int, int, int]], int]:
    """``attention_spans`` of a packed row ``[1, T]`` and its longest sequence, read once per
    forward: every layer is handed the same position-ids tensor, and on a GPU reading it
    waits for the device."""
    global _last_row
    if _last_row is not None:
        ref, version, spans, longest = _last_row
        if ref() is position_ids and version == position_ids._version:
            return spans, longest
    spans, longest = attention_spans(position_ids[0]), int(position_ids.max()) + 1
    _last_row = (weakref.ref(position_ids), position_ids._version, spans, longest)
    return spans, longest


def _sdpa_per_span(
    query, key, value, spans, dropout, scaling, sliding_window: int | None = None
) -> torch.Tensor:
    """SDPA span by span, autograd through each slice (any device): ``[1, T, heads, d]``.
    ``sliding_window``: a query sees only the keys less than that many positions back
    (``_window_mask``), its shared prompt's included."""
    outputs = []
    for start, end, prefix_start, prefix in spans:
        q = query[:, :, start:end]
        if sliding_window is not None:
            shared = slice(prefix_start, prefix_start + prefix)
            outputs.append(
                F.scaled_dot_product_attention(
                    q,
                    torch.cat([key[:, :, shared], key[:, :, start:end]], dim=2),
                    torch.cat([value[:, :, shared], value[:, :, start:end]], dim=2),
                    attn_mask=_window_mask(prefix, end - start, sliding_window, query.device),
                    dropout_p=dropout,
                    scale=scaling,
                    enable_gqa=True,
                )
            )
            continue
        if not prefix:
            outputs.append(
                F.scaled_dot_product_attention(
                    q,
                    key[:, :, start:end],
                    value[:, :, start:end],
                    dropout_p=dropout,
                    is_causal=True,
                    scale=scaling,
                    enable_gqa=True,
                )
            )
            continue
        shared = slice(prefix_start, prefix_start + prefix)
        outputs.append(
            F.scaled_dot_product_attention(
                q,
                torch.cat([key[:, :, shared], key[:, :, start:end]], dim=2),
                torch.cat([value[:, :, shared], value[:, :, start:end]], dim=2),
                attn_mask=_continuation_mask(prefix, end - start, query.device),
                dropout_p=dropout,
                scale=scaling,
                enable_gqa=True,
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def _window_mask(prefix: int, length: int, window: int, device: torch.device) -> torch.Tensor:
    """``[length, prefix + length]`` bool: the keys (a shared prompt's ``prefix``, then the
    span's own) that each of the span's queries sees under a sliding window: causal, and
    less than ``window`` positions back (transformers' ``sliding_window_overlay``)."""
    queries = torch.arange(prefix, prefix + length, device=device)
    keys = torch.arange(prefix + length, device=device)
    back = queries[:, None] - keys[None, :]
    return (back >= 0) & (back < window)


@functools.cache
def varlen_kernel() -> Callable | None:
    """torch's flash-attention varlen call (``torch.nn.attention.varlen.varlen_attn``), causal
    aligned at the bottom right, taking ``(query, key, value, cu_seq_q, cu_seq_k, max_q,
    max_k, scale=)`` with fewer KV heads than query heads; None in a torch without it or
    without its ``scale`` (torch 2.10). Its arguments moved between versions: torch 2.11 takes
    ``window_size`` but has no ``enable_gqa`` (the KV heads are then repeated to the query
    heads', a copy per call), 2.12 on both."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    options: dict[str, Any]
    if "window_size" in params:  # (-1, 0): no limit to the left, nothing to the right
        options = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        options = {"is_causal": True}
    else:
        return None
    if "scale" not in params:
        return None
    grouped = "enable_gqa" in params
    if grouped:
        options["enable_gqa"] = True

    def kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=None):
        if not grouped and key.shape[1] != query.shape[1]:
            groups = query.shape[1] // key.shape[1]
            key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        return varlen_attn(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, **options
        )

    return kernel


class VarlenPlan(NamedTuple):
    """A packed row's spans as flash-attention's varlen kernel takes them."""

    gather: torch.Tensor | None
    """long ``[keys]``: the row positions of each span's keys, its prefix then its own; None
    when that is the row itself (no span has a prefix)."""
    cu_seq_q: torch.Tensor
    """int32 ``[spans + 1]``: where each span's queries start in the row, then the end."""
    cu_seq_k: torch.Tensor
    """int32 ``[spans + 1]``: the same for the gathered keys."""
    max_q: int
    max_k: int


@functools.lru_cache(maxsize=4)
def varlen_plan(spans: tuple[tuple[int, int, int, int], ...], device: torch.device) -> VarlenPlan:
    """The plan for ``attention_spans`` (cached: every layer of a forward asks for the same)."""
    index: list[int] = []
    cu_q, cu_k = [0], [0]
    for start, end, prefix_start, prefix in spans:
        index += [*range(prefix_start, prefix_start + prefix), *range(start, end)]
        cu_q.append(cu_q[-1] + end - start)
        cu_k.append(cu_k[-1] + prefix + end - start)
    has_prefix = any(prefix for *_, prefix in spans)
    return VarlenPlan(
        gather=torch.tensor(index, device=device) if has_prefix else None,
        cu_seq_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
        cu_seq_k=torch.tensor(cu_k, dtype=torch.int32, device=device),
        max_q=max(end - start for start, end, _, _ in spans),
        max_k=max(prefix + end - start for start, end, _, prefix in spans),
    )


def _varlen_per_span(query, key, value, spans, scaling) -> torch.Tensor:
    """One varlen call over the row's ``[T, heads, d]`` views: ``[1, T, heads, d]``. A
    continuation's keys are its prompt's then its own, and causal aligned at the bottom right
    lets each of its queries see the whole prompt and its own keys up to itself."""
    kernel = varlen_kernel()
    assert kernel is not None, "no varlen_attn in this torch"
    plan = varlen_plan(tuple(spans), query.device)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if plan.gather is not None:
        k, v = k.index_select(0, plan.gather), v.index_select(0, plan.gather)
    out = kernel(q, k, v, plan.cu_seq_q, plan.cu_seq_k, plan.max_q, plan.max_k, scale=scaling)
    return out[None]


BLOCK_TOKENS = 96
"""On CPU, consecutive spans are attended in one flash-kernel call per block of at most this
many query tokens (a longer span is a block alone), with a mask that keeps each span to its
own keys; see ``attention_blocks``."""


class AttentionBlock(NamedTuple):
    """Queries ``[start, end)`` of a packed row against the keys of ``key_ranges`` (in order)."""

    start: int
    end: int
    key_ranges: tuple[tuple[int, int], ...]
    mask: torch.Tensor | None
    """Additive ``[queries, keys]`` (0 seen, -inf not); None: causal over the block's own
    keys, which are then its queries' positions."""


def attention_blocks(
    spans: list[tuple[int, int, int, int]],
    dtype: torch.dtype = torch.float32,
    max_tokens: int | None = None,
) -> list[AttentionBlock]:
    """``attention_spans`` grouped into blocks of consecutive spans of at most ``max_tokens``
    (``BLOCK_TOKENS``) queries. A block's keys are the union of its spans' prefixes and own
    positions, a slice of the row when that union is one range (a prompt and the samples
    after it). Its mask lets each span see its prefix and, causally, itself. A block of one
    span without a prefix is a plain causal call.

    Why: a call of the flash kernel costs more than its scores at these sizes, but the masked
    scores of a block cost too. SmolLM2 attention (9 heads, 3 KV heads), forward + backward
    of one layer, ms, two runs, span by span / blocks of 48, 96, 128, 160 tokens:
    4 prompts of 74 tokens x 4 samples of 1-47: 7.3, 7.4 / 6.4, 6.8 / 5.9, 5.9 / 6.8, 7.1 /
    6.5, 7.0; 2 prompts of 80 x 8 samples of 10-63: 9.6, 10.7 / 10.2, 10.1 / 9.0, 9.2 / 9.2,
    9.3 / 9.5, 9.6; 10 sequences of 30-189 and 2 prompts of 100 x 8 samples of 150-249 (each
    span a block alone at 96): no difference beyond noise.
    """
    limit = BLOCK_TOKENS if max_tokens is None else max_tokens
    runs: list[list[tuple[int, int, int, int]]] = []
    for span in spans:
        if runs and span[1] - runs[-1][0][0] <= limit:
            runs[-1].append(span)
        else:
            runs.append([span])
    return [_block(tuple(run), dtype) for run in runs]


@functools.lru_cache(maxsize=16)
def _block(run: tuple[tuple[int, int, int, int], ...], dtype: torch.dtype) -> AttentionBlock:
    """One block's keys and mask (cached: every layer of a forward asks for the same)."""
    start, end = run[0][0], run[-1][1]
    if len(run) == 1 and not run[0][3]:
        return AttentionBlock(start, end, ((start, end),), None)
    ranges: list[list[int]] = []
    for a, b in sorted({r for s, e, ps, p in run for r in ((s, e), (ps, ps + p)) if r[1] > r[0]}):
        if ranges and a <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], b)
        else:
            ranges.append([a, b])
    offsets, total = [], 0
    for a, b in ranges:
        offsets.append(total - a)  # local key index = position + offset of its range
        total += b - a

    def local(position: int) -> int:
        for (a, b), offset in zip(ranges, offsets, strict=True):
            if a <= position < b:
                return position + offset
        raise AssertionError(f"key {position} outside the block's ranges {ranges}")

    seen = torch.zeros(end - start, total, dtype=torch.bool)
    for s, e, ps, p in run:
        rows = slice(s - start, e - start)
        if p:
            seen[rows, local(ps) : local(ps) + p] = True
        own = local(s)
        seen[rows, own : own + e - s] = torch.ones(e - s, e - s, dtype=torch.bool).tril()
    mask = torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, float("-inf"))
    return AttentionBlock(start, end, tuple((a, b) for a, b in ranges), mask)


def _block_keys(tensor: torch.Tensor, block: AttentionBlock) -> torch.Tensor:
    """The keys (or values) a block attends to: a slice of the row, or its ranges joined."""
    pieces = [tensor[:, :, a:b] for a, b in block.key_ranges]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


class _CpuSpanAttention(torch.autograd.Function):
    """``_sdpa_per_span`` on CPU, with torch's flash-attention kernels called directly, once
    per ``attention_blocks`` block: the backward writes each block's gradients straight into
    one gradient per input. Through autograd every span's slice of query, key and value got a
    zero tensor of the whole row, all of them then added up: ~10% of a SmolLM2 forward +
    backward (torch.profiler, one ~600-token micro batch of 4 prompts x 4 samples) went to
    those fills and adds."""

    @staticmethod
    def forward(ctx, query, key, value, spans, scaling):
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        blocks = attention_blocks(spans, query.dtype)
        out = query.new_empty(query.shape)
        log_sum_exps = []
        for block in blocks:
            o, lse = flash(
                query[:, :, block.start : block.end],
                _block_keys(key, block),
                _block_keys(value, block),
                0.0,
                block.mask is None,
                attn_mask=block.mask,
                scale=scaling,
            )
            out[:, :, block.start : block.end] = o
            log_sum_exps.append(lse)
        ctx.save_for_backward(query, key, value, out, *log_sum_exps)
        ctx.blocks, ctx.scaling = blocks, scaling
        return out

    @staticmethod
    def backward(ctx, grad_out):
        flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        query, key, value, out, *log_sum_exps = ctx.saved_tensors
        grad_query = torch.empty_like(query)  # the blocks cover every position once
        grad_key, grad_value = torch.zeros_like(key), torch.zeros_like(value)
        for block, lse in zip(ctx.blocks, log_sum_exps, strict=True):
            rows = slice(block.start, block.end)
            gq, gk, gv = flash_backward(
                grad_out[:, :, rows],
                query[:, :, rows],
                _block_keys(key, block),
                _block_keys(value, block),
                out[:, :, rows],
                lse,
                0.0,
                block.mask is None,
                attn_mask=block.mask,
                scale=ctx.scaling,
            )
            grad_query[:, :, rows] = gq
            offset = 0
            for a, b in block.key_ranges:
                grad_key[:, :, a:b] += gk[:, :, offset : offset + b - a]
                grad_value[:, :, a:b] += gv[:, :, offset : offset + b - a]
                offset += b - a
        return grad_query, grad_key, grad_value, None, None


def _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs):
    """transformers' sdpa; the 2D padding mask (what the flash-style mask function leaves) made
    causal first, and a query that may see no key at all (left padding) sees every key: its
    output is padding, and this keeps it finite."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask = attention_mask
    if mask is not None and mask.dim() == 2:
        q_len, kv_len = query.shape[2], key.shape[2]
        causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device)
        mask = causal.tril(kv_len - q_len)[None, None] & mask.bool()[:, None, None, :]
        mask = mask | ~mask.any(-1, keepdim=True)
    return sdpa_attention_forward(
        module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs
    )


def register() -> None:
    """Make ``skyrl_per_sequence`` a valid ``attn_implementation`` in this process: the
    attention function, and no mask (like flash-attention: none is built for a packed row)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(PER_SEQUENCE, per_sequence_attention)
    AttentionMaskInterface.register(PER_SEQUENCE, flash_attention_mask)
