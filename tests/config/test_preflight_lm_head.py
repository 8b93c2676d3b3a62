"""The pre-flight refuses a ``model.path`` whose weights have no LM head (a bare transformer
body, a reward model): the policy worker refused it only once Ray and the engines were up,
and the hf engine served it with a randomly initialised head. It reads the checkpoint's
tensor names (safetensors header or index), never the weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from preflight_helpers import cfg_for, refused
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
)

from skyrl.config.preflight import local_model_paths, preflight
from skyrl.models.tiny import build_tiny_model

SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")


def no_head_message(path: str) -> str:
    return (
        f"{path} has no weights for Qwen2ForCausalLM's LM head (lm_head.weight): not a causal "
        "LM (a reward model, a bare transformer body?); a reward model can start the critic "
        "(trainer.critic_model_path)"
    )


def saved(model, path: Path, **kwargs) -> str:
    model.save_pretrained(path, **kwargs)
    return str(path)


def fake_run_of(path: str, *overrides: str):
    return cfg_for("data=fake", "environment.name=unused", f"model.path={path}", *overrides)


@pytest.mark.parametrize("kind", ["body", "reward_model", "sharded_reward_model"])
def test_a_model_path_without_lm_head_weights_is_refused(kind, tiny_model_path, tmp_path):
    # before: the dry run passed, the policy worker refused it after Ray and the engines started
    if kind == "body":  # model.embed_tokens ... model.norm, untied: no lm_head.weight
        path = saved(AutoModel.from_pretrained(tiny_model_path), tmp_path / kind)
    else:  # model.* + score.weight (1 x 64); sharded: an index names the tensors
        rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
        shards = {"max_shard_size": "100KB"} if kind.startswith("sharded") else {}
        path = saved(rm, tmp_path / kind, **shards)
        assert (Path(path) / "model.safetensors.index.json").is_file() == bool(shards)
    for for_run in (False, True):
        error = refused(fake_run_of(path), for_run)
        assert (error.key, error.message) == ("model.path", no_head_message(path))


def test_a_body_whose_head_is_tied_to_its_embedding_passes(tmp_path):
    # tie_word_embeddings: the head is the embedding, which the body's checkpoint holds
    tied = build_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    path = saved(AutoModel.from_pretrained(tied), tmp_path / "tied_body")
    preflight(fake_run_of(path), for_run=False)


def test_a_head_saved_under_its_checkpoint_name_passes(tmp_path):
    # transformers loads GPT-NeoX's (Pythia's) "embed_out.weight" as lm_head.weight: the
    # check renames checkpoint keys as the loader does
    config = GPTNeoXConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    path = saved(GPTNeoXForCausalLM(config), tmp_path / "neox")
    from safetensors import safe_open

    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        assert "embed_out.weight" in f.keys() and "lm_head.weight" not in f.keys()
    preflight(fake_run_of(path), for_run=False)


def test_eval_and_serve_refuse_it_too(tiny_model_path, tmp_path):
    path = saved(AutoModel.from_pretrained(tiny_model_path), tmp_path / "body")
    with pytest.raises(Exception) as err:
        local_model_paths(cfg_for(f"model.path={path}", f"model.tokenizer_path={tiny_model_path}"))
    assert str(err.value) == f"model.path: {no_head_message(path)}"


def test_the_dry_run_refuses_it_in_one_line(tiny_model_path, tmp_path):
    path = saved(AutoModel.from_pretrained(tiny_model_path), tmp_path / "body")
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [SKYRL_TRAIN, "experiment=smoke", f"model.path={path}", "trainer.dry_run=true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"error: model.path: {no_head_message(path)}"]


def test_a_model_path_that_is_no_causal_lm_is_refused(tmp_path):
    # before: a T5 folder stopped the dry run with a traceback (AttributeError: 'T5Config'
    # object has no attribute 'max_position_embeddings'), where the RoPE check read it
    from transformers import T5Config

    config = T5Config(vocab_size=128, d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2)
    config.save_pretrained(tmp_path / "t5")
    path = str(tmp_path / "t5")
    for for_run in (False, True):
        error = refused(fake_run_of(path), for_run)
        assert error.key == "model.path"
        assert error.message == (
            f"{path} is not a causal LM: ValueError: Unrecognized configuration class "
            "<class 'transformers.models.t5.configuration_t5.T5Config'> for this kind of "
            "AutoModel: AutoModelForCausalLM."
        )


def test_a_model_with_its_own_code_passes(tiny_model_path, tmp_path):
    from custom_code_model import custom_code_model  # tests/ is on sys.path

    path = custom_code_model(tiny_model_path, tmp_path / "custom_model")
    preflight(fake_run_of(path, "model.trust_remote_code=true"), for_run=False)


def test_an_encoder_decoder_critic_is_refused(tmp_path):
    # before: the dry run stopped with a traceback (AttributeError: 'T5Config' object has no
    # attribute 'max_position_embeddings'); the critic is a decoder-only body + value head
    from transformers import T5Config

    config = T5Config(vocab_size=128, d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2)
    config.save_pretrained(tmp_path / "t5")
    path = str(tmp_path / "t5")
    cfg = fake_run_of("skyrl-tiny", "algorithm=ppo", f"trainer.critic_model_path={path}")
    for for_run in (False, True):
        error = refused(cfg, for_run)
        assert (error.key, error.message) == (
            "trainer.critic_model_path",
            f"{path} (t5) is an encoder-decoder model: the critic is a decoder-only "
            "transformer body with a value head (a causal LM's or a reward model's)",
        )
