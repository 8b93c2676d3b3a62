"""Per-token logprobs (and entropy) of a packed micro batch.

The packed row ``[1, T]`` goes through the model with ``attention_mask=None``,
``position_ids`` restarting at 0 per sequence and ``use_cache=False``. The
workers' models attend per sequence from those position ids
(``skyrl.workers.packed_attention``, the default); with
``trainer.packed_attention=masked`` transformers'
``masking_utils.find_packed_sequence_indices`` confines sdpa to each sequence
with a block-diagonal causal mask instead. (With a KV cache or a 2D attention
mask the detection is off, hence both are omitted.)

Alignment matches ``TrainingInputBatch``: the value at position ``t`` is
``log p(token_t | tokens_<t)`` of the same sequence, 0 where a sequence
starts (``PackedMicroBatch.parents`` says which output predicts which token, so a
prompt packed once for several rows works the same). Log-softmax is evaluated over
chunks of tokens so no full-vocab fp32 copy of all logits is made at once. Without
entropy the log-softmax and its backward are one autograd function (``token_logprobs``): the
backward writes ``onehot - softmax`` into one buffer in cache-sized row chunks instead of
autograd's chain of full-size temporaries (logsumexp's, the pick's zero-filled scatter, their
sum).

The workers ask for the loss tokens only (``loss_tokens_only``): the LM head (the
vocabulary projection, a fifth of SmolLM2's matmul work per position) and the log-softmax
run only at the positions that predict a loss token, through transformers'
``logits_to_keep``; a prompt's positions cost the transformer body alone. Values elsewhere
are 0, which every consumer already masks away (losses, KL, the rollout logprob gap).
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch

from skyrl.batch.packing import PackedMicroBatch

TOKEN_CHUNK = 1024
"""Tokens per log-softmax chunk: bounds the fp32 ``[chunk, vocab]`` temporaries."""

ROW_CHUNK = 32
"""Rows of logits ``token_logprobs`` works on at a time on CPU (``TOKEN_CHUNK`` on other
devices, where each chunk is a few kernel launches): 32 x SmolLM2's 49152 fp32 = 6 MB,
which each pass (subtract, exp, scale) finds in cache. Its forward + backward on 256 rows x
49152 with 552 picks, medians of 9 (Xeon, 2 threads): 25 ms at 32 or 64 rows, 27 at 128, 39
at 1024; autograd's log-softmax and pick took 76."""


def _rows_per_chunk(logits: torch.Tensor) -> int:
    return ROW_CHUNK if logits.device.type == "cpu" else TOKEN_CHUNK


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` in fp32 (``logits`` itself when already fp32 at 1.0)."""
    scaled = logits.float()
    return scaled / temperature if temperature != 1.0 else scaled


class _TokenLogprobs(torch.autograd.Function):
    """``log softmax(logits / temperature)[rows, targets]`` with a backward of its own."""

    @staticmethod
    def forward(ctx, logits, rows, targets, temperature):
        rows_per_chunk = _rows_per_chunk(logits)
        log_z = logits.new_empty(logits.shape[0], dtype=torch.float32)
        for start in range(0, logits.shape[0], rows_per_chunk):
            chunk = _tempered(logits[start : start + rows_per_chunk], temperature)
            log_z[start : start + rows_per_chunk] = torch.logsumexp(chunk, dim=-1)
        picked = _tempered(logits[rows, targets], temperature)
        ctx.save_for_backward(logits, log_z, rows, targets)
        ctx.temperature = temperature
        return picked - log_z[rows]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        """d/d logits of ``sum_i grad_i * logp_i``: ``(onehot(target_i) - softmax(row_i)) *
        grad_i / temperature``, summed over the picks of each row (a shared prompt's last
        position predicts the first token of each of its rows).

        The whole sum is formed in fp32 per chunk and rounded once into ``out``: with bf16
        logits, adding the one-hot ``grad_i`` to an already rounded ``-p * grad_i`` loses the
        target's ``(1 - p) * grad_i`` (0 for p > 0.998)."""
        logits, log_z, rows, targets = ctx.saved_tensors
        temperature = ctx.temperature
        grad = grad.float()
        row_grad = torch.zeros_like(log_z).index_add_(0, rows, grad)
        out = torch.empty_like(logits)
        rows_per_chunk = _rows_per_chunk(logits)
        # the picks sorted by row, and where each chunk's picks start (one host sync)
        rows, order = torch.sort(rows, stable=True)
        targets, grad = targets[order], grad[order]
        chunk_starts = torch.arange(0, logits.shape[0] + rows_per_chunk, rows_per_chunk)
        bounds = torch.searchsorted(rows, chunk_starts.to(rows.device)).tolist()
        for index, start in enumerate(range(0, logits.shape[0], rows_per_chunk)):
            end = start + rows_per_chunk
            chunk = _tempered(logits[start:end], temperature)
            dest = out[start:end] if out.dtype == torch.float32 else None
            probs = torch.sub(chunk, log_z[start:end, None], out=dest).exp_()
            probs.mul_(row_grad[start:end, None].neg())
            first, last = bounds[index], bounds[index + 1]
            probs.index_put_(
                (rows[first:last] - start, targets[first:last]), grad[first:last], accumulate=True
            )
            if temperature != 1.0:
                probs.div_(temperature)
            if dest is None:
                out[start:end] = probs
        return out, None, None, None


def token_logprobs(
    logits: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """fp32 ``[n]``: the log-probability of ``targets[i]`` under the tempered softmax of
    ``logits[rows[i]]`` (``logits`` ``[k, vocab]``, any float dtype; a row may be picked
    several times). Differentiable in ``logits``, once."""
    return _TokenLogprobs.apply(logits, rows, targets, temperature)


class PackedForward(NamedTuple):
    logprobs: torch.Tensor
    """``[1, T]`` fp32, aligned with ``input_ids`` (0 at each sequence start)."""
    entropy: torch.Tensor | None
    """``[1, T]`` entropy of the distribution that predicted token t, or None."""


def _chunk_log_z(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: ``log Z`` of the tempered logits, and the entropy of their softmax (a
    ``-inf`` logit, a masked vocabulary entry, adds 0, not ``0 x -inf`` = NaN, to the value
    and its gradient, as in ``skyrl.algorithms.entropy``)."""
    scaled = _tempered(logits, temperature)
    log_z = torch.logsumexp(scaled, dim=-1)
    probs = torch.softmax(scaled, dim=-1)
    return log_z, log_z - (probs * torch.where(probs > 0, scaled, 0.0)).sum(-1)


def loss_predictors(micro_batch: PackedMicroBatch) -> torch.Tensor | None:
    """Sorted packed positions whose outputs predict a loss token (``loss_mask`` != 0), or
    None when the micro batch has no ``loss_mask`` (every position is then computed). Never
    empty: a micro batch without loss tokens (a filler, a row with no response) keeps its last
    position, so its forward and backward still touch every parameter."""
    loss_mask = micro_batch.token_fields.get("loss_mask")
    if loss_mask is None:
        return None
    parents = micro_batch.parents
    wanted = parents[(loss_mask.reshape(-1) != 0) & (parents >= 0)]
    if wanted.numel() == 0:
        return torch.full((1,), micro_batch.input_ids.shape[1] - 1, dtype=torch.long)
    return torch.unique(wanted)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the causal LM inside ``model`` (a DeepSpeed engine, a PEFT model or the model
    itself) takes transformers' ``logits_to_keep`` (an index tensor of positions)."""
    inner = getattr(model, "module", model)
    base_model = getattr(inner, "get_base_model", None)  # PEFT
    if callable(base_model):
        inner = base_model()
    return "logits_to_keep" in inspect.signature(inner.forward).parameters


def packed_logprobs(
    model: torch.nn.Module,
    micro_batch: PackedMicroBatch,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    loss_tokens_only: bool = False,
    logits_to_keep: bool = False,
) -> PackedForward:
    """Forward one packed micro batch; per-token logprobs ``[1, T]`` (and entropy).

    ``model`` is a causal LM returning ``.logits`` (a DeepSpeed engine wrapping
    one works too). Gradients flow when enabled. The token at position ``t`` is predicted
    by the output at ``micro_batch.parents[t]``: ``t - 1`` within a sequence, a shared
    prompt's last position for a continuation's first token.

    ``loss_tokens_only``: values only at the micro batch's loss tokens (0 elsewhere), so the
    vocabulary projection and log-softmax run only at their predictors
    (``loss_predictors``): the prompt positions cost no LM head. With ``logits_to_keep``
    (the model takes transformers' kwarg: ``accepts_logits_to_keep``) the model itself
    projects only those positions; otherwise all logits are computed and those picked.
    """
    input_ids = micro_batch.input_ids
    device = input_ids.device
    position_ids = micro_batch.position_ids.to(device)
    parents = micro_batch.parents.to(device)
    keep = loss_predictors(micro_batch) if loss_tokens_only else None
    kwargs: dict[str, torch.Tensor] = {}
    if keep is not None:
        keep = keep.to(device)
        if logits_to_keep:
            kwargs["logits_to_keep"] = keep
    # squeeze, not ``[0]``: a view both ways, where indexing's backward zero-fills a
    # gradient of all the logits and copies into it (~8 ms per SmolLM2 micro batch)
    logits = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=None,
        use_cache=False,
        **kwargs,
    ).logits.squeeze(0)
    unused = parents < 0
    source = parents.clamp(min=0)
    if keep is not None:
        if not logits_to_keep:
            logits = logits.index_select(0, keep)
        # the row of ``logits`` holding each token's predictor (meaningless off the loss tokens)
        source = torch.searchsorted(keep, source).clamp(max=keep.numel() - 1)
        loss_mask = micro_batch.token_fields["loss_mask"].reshape(-1).to(device)
        unused = unused | (loss_mask == 0)
    # Every position gets a value from the graph, so the result always has one: a one-token
    # (filler) micro batch must still backpropagate, or DeepSpeed rejects the loss.
    if not compute_entropy:
        logprobs = token_logprobs(logits, source, input_ids[0], temperature)
        return PackedForward(logprobs.masked_fill(unused, 0.0).unsqueeze(0), None)
    pieces_z: list[torch.Tensor] = []
    pieces_ent: list[torch.Tensor] = []
    for start in range(0, logits.shape[0], TOKEN_CHUNK):
        log_z, ent = _chunk_log_z(logits[start : start + TOKEN_CHUNK], temperature)
        pieces_z.append(log_z)
        pieces_ent.append(ent)
    picked = _tempered(logits[source, input_ids[0]], temperature)
    logprobs = (picked - torch.cat(pieces_z)[source]).masked_fill(unused, 0.0).unsqueeze(0)
    entropy = torch.cat(pieces_ent)[source].masked_fill(unused, 0.0).unsqueeze(0)
    return PackedForward(logprobs, entropy)
