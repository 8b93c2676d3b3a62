"""Loading the models the workers train: the policy/reference LM and the critic.

The critic is the policy's transformer body with a scalar head on every
position (PPO's value model); its head starts at zero so initial values are 0.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel

from skyrl.models.resolve import IN_MEMORY

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def attention_implementation(packed_attention: str) -> str:
    """The ``attn_implementation`` for ``trainer.packed_attention`` (registered first)."""
    from skyrl.workers import packed_attention as packed

    packed.register()
    return packed.IMPLEMENTATIONS[packed_attention]


def load_causal_lm(
    path: str,
    precision: str,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    packed_attention: str = "per_sequence",
) -> nn.Module:
    """A ``from_pretrained`` causal LM in the training dtype, its attention for packed micro
    batches (``trainer.packed_attention``)."""
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=DTYPES[precision],
        trust_remote_code=trust_remote_code,
        attn_implementation=attention_implementation(packed_attention),
        **IN_MEMORY,
    )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if not torch.cuda.is_available():
        sparse_tied_embedding_grads(model)
    return model


def sparse_tied_embedding_grads(model: PreTrainedModel) -> None:
    """When the input embedding is the LM head's weight (tied, as in SmolLM2), its lookup
    backpropagates sparse rows (``nn.Embedding.sparse``) that autograd adds into the head's
    dense gradient, instead of a dense zero-filled gradient of the whole vocabulary (113 MB
    for SmolLM2) plus a dense add of the two. The parameter's gradient stays dense: every
    forward that backpropagates uses the LM head (``loss_predictors`` never leaves it out).
    Same gradient to 1.5e-8; a SmolLM2 forward + backward ~20 ms (~1%) faster, which the
    bench work's train phase shows in one A/B (2.12/2.08 s vs 2.13/2.13 s) and run-to-run
    noise hides in another. Not used on CUDA, where the dense fill is cheap: unmeasured there.
    A model whose embedding is not tied to an LM head is left as it is."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if isinstance(embedding, nn.Embedding) and head is not None and embedding.weight is head.weight:
        embedding.sparse = True


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
    """The critic: the body of the model at ``path`` with a fresh value head."""
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    body = AutoModel.from_pretrained(
        path,
        dtype=DTYPES[precision],
        trust_remote_code=trust_remote_code,
        attn_implementation=attention_implementation(packed_attention),
        **IN_MEMORY,
    )
    if gradient_checkpointing:
        body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return ValueModel(body, config.hidden_size)
