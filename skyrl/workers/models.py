"""Loading the models the workers train: the policy/reference LM and the critic.

The critic is the policy's transformer body with a scalar head on every
position (PPO's value model); its head starts at zero so initial values are 0, unless
the critic's checkpoint has a one-output head of its own (a reward model's ``score``):
the critic then starts from it, its initial values the reward model's per-token scores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel

from skyrl.models.resolve import IN_MEMORY

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def attention_implementation(packed_attention: str) -> str:
    """The ``attn_implementation`` for ``trainer.packed_attention`` (registered first)."""
    from skyrl.workers import packed_attention as packed

    packed.register()
    return packed.IMPLEMENTATIONS[packed_attention]


def track_position_ids(model: PreTrainedModel) -> None:
    """The packed attention gets each forward's ``position_ids`` even from an attention layer
    that drops them (``skyrl.workers.packed_attention.track_position_ids``)."""
    from skyrl.workers import packed_attention as packed

    packed.track_position_ids(model)


def check_attention(model: PreTrainedModel, path: str) -> None:
    """Refuse a model whose attention computes what the packed attention does not (the
    pre-flight refuses it first; this guards ``masked``, whose sdpa would drop it silently)."""
    from skyrl.workers.packed_attention import unimplemented_attention

    config = getattr(model.config, "text_config", None) or model.config
    problem = unimplemented_attention(path, config)
    if problem is not None:
        raise ValueError(problem)


def load_causal_lm(
    path: str,
    precision: str,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    packed_attention: str = "per_sequence",
) -> nn.Module:
    """A ``from_pretrained`` causal LM in the training dtype, its attention for packed micro
    batches (``trainer.packed_attention``). A checkpoint without the LM head's weights (a
    reward model, a bare transformer body) is refused: transformers would start the head
    at random."""
    loaded = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=DTYPES[precision],
        trust_remote_code=trust_remote_code,
        attn_implementation=attention_implementation(packed_attention),
        output_loading_info=True,
        **IN_MEMORY,
    )
    model, loading = cast(tuple[PreTrainedModel, dict], loaded)
    check_lm_head(model, path, loading["missing_keys"])
    check_attention(model, path)
    track_position_ids(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if not torch.cuda.is_available():
        tied_embedding_row_grads(model)
    return model


def check_lm_head(model: PreTrainedModel, path: str, missing_keys: set[str]) -> None:
    """Refuse the policy's model (``model.path``) when its LM head's weights are among the
    checkpoint's ``missing_keys`` (``from_pretrained``'s loading info; a head tied to the
    embedding is never missing). The hf engine refuses it so too."""
    missing = sorted(_lm_head_names(model) & set(missing_keys))
    if missing:
        raise ValueError(f"model.path={no_lm_head(path, model, missing)}")


def no_lm_head(path: str, model: PreTrainedModel, missing: list[str]) -> str:
    """What is wrong with the model at ``path`` whose LM head's weights ``missing`` are not in
    its checkpoint (``model``: the causal LM it would load as)."""
    return (
        f"{path} has no weights for {type(model).__name__}'s LM head ({', '.join(missing)}): "
        "not a causal LM (a reward model, a bare transformer body?); a reward model can start "
        "the critic (trainer.critic_model_path)"
    )


def _lm_head_names(model: PreTrainedModel) -> set[str]:
    """The parameter names of ``model``'s LM head (``lm_head.weight``); none when it has none."""
    head = model.get_output_embeddings()
    return {
        f"{module_name}.{param_name}"
        for module_name, module in model.named_modules()
        if module is head
        for param_name, _ in module.named_parameters(recurse=False)
    }


def missing_lm_head(model: PreTrainedModel, path: str) -> str | None:
    """Why ``load_causal_lm`` would refuse the model in the local folder ``path`` for its LM
    head's weights missing (``no_lm_head``), read from the checkpoint's tensor names alone
    (the safetensors header or index: no weights); ``model``: the causal LM it loads as,
    built on the meta device. None when the head is there or tied to the embedding, or when
    the names cannot be read without loading the weights (``pytorch_model.bin``, a file that
    does not parse: the load checks those)."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or (embedding is not None and head.weight is embedding.weight):  # tied
        return None
    keys = _checkpoint_keys(Path(path))
    loaded = None if keys is None else _loaded_names(model, keys)
    if loaded is None:
        return None
    missing = sorted(_lm_head_names(model) - loaded)
    return no_lm_head(path, model, missing) if missing else None


def _checkpoint_keys(folder: Path) -> list[str] | None:
    """The tensor names of the safetensors checkpoint ``from_pretrained`` would load from
    ``folder`` (``model.safetensors``, else its index's ``weight_map``); None for another
    kind or one that does not parse."""
    from safetensors import safe_open

    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    try:
        if single.is_file():
            with safe_open(str(single), framework="pt") as f:
                return list(f.keys())
        if index.is_file():
            return list(json.loads(index.read_text())["weight_map"])
    except Exception:  # an empty or broken file, an index without a weight_map: not judged here
        return None
    return None


def _loaded_names(model: PreTrainedModel, keys: list[str]) -> set[str] | None:
    """The parameters of ``model`` that the checkpoint tensors ``keys`` load into, renamed
    as transformers' loader renames them (its conversion mapping: GPT-NeoX's ``embed_out``
    is ``lm_head``; the base model's prefix added or dropped). A transformers without that
    mapping (4.x) loads the names as they are; None where the mapping, transformers'
    internals, fails on them (not judged here: the load checks the head)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            rename_source_key,
        )
    except ImportError:
        return set(keys)
    try:
        mapping = get_model_conversion_mapping(model)
        renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
        converters = [t for t in mapping if isinstance(t, WeightConverter)]
        names = model.state_dict()
        prefix = model.base_model_prefix
        loaded = set()
        for key in keys:
            name = rename_source_key(key, renamings, converters, prefix, names)[0]
            if name not in names and key in names:  # the loader's fallback: the prefix only
                name = rename_source_key(key, [], [], prefix, names)[0]
            loaded.add(name)
    except Exception:  # another transformers' internals (their signatures are not an API)
        return None
    return loaded


def tied_embedding_row_grads(model: PreTrainedModel) -> None:
    """When the input embedding is the LM head's weight (tied, as in SmolLM2), its lookup adds
    the gradients of the rows it looked up straight into the head's dense gradient, in place
    (``_RowGradEmbedding``), instead of a gradient of the whole vocabulary.

    Autograd sums the two uses' gradients before the parameter gets them. A dense lookup
    gradient is a zero-filled 113 MB table (SmolLM2) then added; a sparse one
    (``nn.Embedding.sparse``, used here before) arrives after the head's dense gradient, and
    autograd adds a late sparse gradient out of place: a 113 MB copy, 40 ms of a SmolLM2
    forward + backward on 2 threads (AVX2 EPYC, torch.profiler), gone with this. Same
    gradient to 1e-6. Not used on CUDA: unmeasured there. A model whose embedding is not
    tied to an LM head, or looks up with ``max_norm`` or ``scale_grad_by_freq``, is left as
    it is."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if (
        type(embedding) is nn.Embedding
        and head is not None
        and embedding.weight is head.weight
        and embedding.max_norm is None
        and not embedding.scale_grad_by_freq
    ):
        embedding.__class__ = _RowGradEmbedding
        rows = cast(_RowGradEmbedding, embedding)
        rows.pending = []
        rows.weight.register_post_accumulate_grad_hook(rows.add_pending)


class _RowGradEmbedding(nn.Embedding):
    """An ``nn.Embedding`` whose backward leaves the weight's gradient to its other use (the
    tied LM head) and keeps the looked-up rows' gradients in ``pending``; the weight's
    post-accumulate-grad hook (``add_pending``, which runs before any hook registered after
    it, e.g. DeepSpeed's ZeRO reduction) adds them into ``weight.grad`` in place. A backward
    that reaches the lookup but not the head never runs that hook: its rows are added when
    the backward ends (a callback the lookup queues). A backward that does not accumulate into
    ``weight.grad`` (``torch.autograd.grad``, ``backward(inputs=...)``) gets the rows as a
    sparse gradient, which autograd sums with the head's as usual."""

    pending: list[tuple[torch.Tensor, torch.Tensor]]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return super().forward(input)
        return _LookupRows.apply(input, self.weight, self)

    def add_pending(self, weight: torch.Tensor) -> None:
        while self.pending:
            ids, rows = self.pending.pop()
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
            weight.grad.index_add_(0, ids, rows.to(weight.grad.dtype))


class _LookupRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, embedding):
        ctx.save_for_backward(ids)
        ctx.embedding = embedding
        ctx.weight_node = torch.autograd.graph.get_gradient_edge(weight).node
        return F.embedding(ids, weight, embedding.padding_idx)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        embedding = ctx.embedding
        ids, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if embedding.padding_idx is not None:  # the padding row gets no gradient
            keep = ids != embedding.padding_idx
            ids, rows = ids[keep], rows[keep]
        if not _accumulates_into(ctx.weight_node):
            # the lookup in forward already bounds-checked these ids
            sparse = torch.sparse_coo_tensor(
                ids.unsqueeze(0), rows, embedding.weight.shape, check_invariants=False
            )
            return None, sparse, None
        if not embedding.pending:  # its rows, should the head's gradient never come
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: embedding.add_pending(embedding.weight)
            )
        embedding.pending.append((ids, rows))
        return None, None, None


def _accumulates_into(node) -> bool:
    """Whether the running backward executes ``node`` (a parameter's gradient accumulator),
    i.e. adds into that parameter's ``.grad``. ``torch.autograd.grad`` never does, and the
    engine refuses the question for an accumulator there."""
    try:
        return torch._C._will_engine_execute_node(node)
    except RuntimeError:  # "... currently running autograd.grad()"
        return False


class ValueModel(nn.Module):
    """Transformer body + linear value head: ``values[b, t]`` for every position."""

    def __init__(self, body: nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.value_head = nn.Linear(hidden_size, 1, dtype=next(body.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        hidden = self.body(
            input_ids=input_ids, position_ids=position_ids, **kwargs
        ).last_hidden_state
        return self.value_head(hidden).squeeze(-1)


def load_value_model(
    path: str,
    precision: str,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    packed_attention: str = "per_sequence",
) -> ValueModel:
    """The critic: the body of the model at ``path`` with a value head, the checkpoint's own
    one-output head (``VALUE_HEADS``; a line says which) or else a fresh one (zeros)."""
    body = _load_body(
        path,
        trust_remote_code,
        dtype=DTYPES[precision],
        attn_implementation=attention_implementation(packed_attention),
        **IN_MEMORY,
    )
    check_attention(body, path)
    track_position_ids(body)
    if gradient_checkpointing:
        body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = ValueModel(body, body.config.hidden_size)
    _init_value_head(model.value_head, path)
    return model


VALUE_HEADS = ("score", "value_head", "v_head", "v_head.summary")
"""Checkpoint names of a one-output head a critic starts from (``<name>.weight`` of shape
``(1, hidden_size)``, ``<name>.bias`` optional): a reward model's (transformers'
``AutoModelForSequenceClassification`` with ``num_labels=1``), OpenRLHF's critic and reward
model, TRL's value head."""


def _init_value_head(head: nn.Linear, path: str) -> None:
    """Copy into ``head`` the first of ``VALUE_HEADS`` that the checkpoint in the local folder
    ``path`` holds with one output, and say so; a head with several outputs (a classifier) is
    left out, said too. Nothing found: ``head`` stays as it is."""
    names = {f"{name}.{part}" for name in VALUE_HEADS for part in ("weight", "bias")}
    saved = _read_tensors(Path(path), names)
    for name in VALUE_HEADS:
        weight, bias = saved.get(f"{name}.weight"), saved.get(f"{name}.bias")
        if weight is None:
            continue
        if weight.shape != head.weight.shape or (bias is not None and bias.numel() != 1):
            shape, want = tuple(weight.shape), tuple(head.weight.shape)
            _say_once(
                f"critic: {name}.weight of {path} has shape {shape}, not {want} (one output): "
                "not a value head; the value head starts at zero"
            )
            return
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias.reshape(1) if bias is not None else torch.zeros(1))
        what = f"{name}.weight" + (f" and {name}.bias" if bias is not None else "")
        _say_once(f"critic: value head initialised from {what} of {path}")
        return


def _say_once(line: str) -> None:
    """Print ``line`` on rank 0 only: every critic rank loads the same checkpoint."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line, flush=True)


def _read_tensors(folder: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """Those of ``names`` that the checkpoint in ``folder`` holds, reading no other tensor:
    from the weights ``from_pretrained`` loads, the first of ``model.safetensors``, its index's
    shards, ``pytorch_model.bin``, its index's shards. A ``folder`` that is no directory (a
    hub id) holds none."""
    files: list[str] = []
    for weights in ("model.safetensors", "pytorch_model.bin"):
        index = folder / f"{weights}.index.json"
        if (folder / weights).is_file():
            files = [weights]
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({weight_map[n] for n in names if n in weight_map})
        else:
            continue
        break
    found: dict[str, torch.Tensor] = {}
    for file in files:
        if file.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(str(folder / file), framework="pt") as f:
                found.update({n: f.get_tensor(n) for n in names & set(f.keys())})
        else:
            state = torch.load(folder / file, map_location="cpu", weights_only=True)
            found.update({n: state[n] for n in names & state.keys()})
    return found


def _load_body(path: str, trust_remote_code: bool, **kwargs) -> PreTrainedModel:
    """The transformer body of the model at ``path``: its ``AutoModel``; for a model with its
    own code that maps only a causal LM (an ``auto_map`` without ``AutoModel``, as Qwen-7B's),
    which ``AutoModel`` refuses, that LM's base model, its LM head dropped."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    auto_map = getattr(config, "auto_map", None) or {}
    if not (
        trust_remote_code and "AutoModel" not in auto_map and "AutoModelForCausalLM" in auto_map
    ):
        return AutoModel.from_pretrained(path, trust_remote_code=trust_remote_code, **kwargs)
    lm = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, **kwargs)
    body = lm.base_model
    if body is lm:
        raise ValueError(
            f"{path}: the critic needs the transformer body of {type(lm).__name__}, which has "
            f"no attribute {lm.base_model_prefix!r} (its base_model_prefix) and its auto_map "
            "no AutoModel"
        )
    return cast(PreTrainedModel, body)
