"""A model config without ``max_position_embeddings`` (a remote-code model's, say) has no
length-dependent RoPE to check: the pre-flight raised AttributeError reading it."""

from types import SimpleNamespace

from transformers import PretrainedConfig

from skyrl.config.preflight import _length_dependent_rope


def test_a_config_without_a_context_length_has_no_length_dependent_rope():
    assert _length_dependent_rope(PretrainedConfig()) is None


def test_a_longrope_config_without_a_context_length_uses_its_original_length():
    # a remote-code config: plain attributes, no max_position_embeddings
    config = SimpleNamespace(
        rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 4096}
    )
    assert _length_dependent_rope(config) == ("longrope", 4096, "original_max_position_embeddings")
