"""Llama 4's chunked-attention layers: a query sees only the keys of its own
``attention_chunk_size``-token chunk. ``trainer.packed_attention=per_sequence`` attends over the
whole sequence, so past one chunk the workers scored another model: on a tiny Llama 4 (chunk 8,
4 layers, 1 chunked), a 24-token sequence's logits were 0.58 off its eager forward, a 10-token
one's 0.55, while sequences of at most 8 tokens matched to 2e-7, and ``masked`` (transformers'
chunked mask) matched at every length (1.8e-7). The pre-flight refuses per_sequence once a
sequence can pass one chunk."""

from __future__ import annotations

from preflight_helpers import refused
from test_preflight_model import TINY, fake_run_of, model_folder

from skyrl.config.preflight import preflight


def _llama4(tmp_path, chunk: int) -> str:
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(
        **TINY, intermediate_size_mlp=128, num_local_experts=2, attention_chunk_size=chunk,
        max_position_embeddings=512,
    )  # fmt: skip
    assert "chunked_attention" in config.layer_types
    return model_folder(tmp_path, config)


def test_per_sequence_past_one_chunk_is_refused(tmp_path):
    # smoke: max_prompt_length 128 + max_generate_length 24 = 152 tokens > a chunk of 100
    path = _llama4(tmp_path, 100)
    for for_run in (False, True):
        error = refused(fake_run_of(path), for_run)
        assert error.key == "trainer.packed_attention"
        assert error.message == (
            f"{path} (llama4_text) attends within chunks of attention_chunk_size = 100 tokens "
            "on its chunked layers, which trainer.packed_attention=per_sequence does not apply: "
            "a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
            "128 + 24 = 152 tokens would attend across chunks; use "
            "trainer.packed_attention=masked (transformers' chunked mask), or keep the sum at "
            "most 100"
        )


def test_masked_or_sequences_within_one_chunk_pass(tmp_path):
    path = _llama4(tmp_path, 100)
    preflight(fake_run_of(path, "trainer.packed_attention=masked"), for_run=False)
    # 76 + 24 = 100: no sequence passes its first chunk
    preflight(fake_run_of(path, "generator.max_prompt_length=76"), for_run=False)
