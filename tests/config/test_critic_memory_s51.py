"""The pre-flight's activation-memory estimate covers a critic of its own
(``trainer.critic_model_path``), not only the policy: a critic wider than the policy passed
the estimate the policy's config gave and ran out of memory at its first training step."""

from __future__ import annotations

from preflight_helpers import refused
from test_preflight_model import TINY, fake_run_of, model_folder

from skyrl.batch import budget
from skyrl.config.preflight import preflight


def test_activation_bytes_of_a_critic_leave_out_the_logits():
    # hidden 64, 2 layers, vocab 128, fp32, per token: 34 x 64 x 4 x 2 = 17408 bytes of
    # layers; a causal LM adds 3 x 128 x 4 = 1536 for its logits, a critic's value head none
    config = type("Config", (), {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128})
    assert budget.activation_bytes(config, 1000, "fp32", checkpointing=False) == 18_944_000
    assert budget.activation_bytes(config, 1000, "fp32", False, logits=False) == 17_408_000


def test_a_critic_over_the_memory_estimate_is_refused_naming_it(tmp_path, monkeypatch):
    from transformers import Qwen2Config

    # critic: hidden 1024, 2 layers, fp32: 34 x 1024 x 4 x 2 = 278528 bytes per token (no
    # logits); smoke's budget of 2048 tokens on 2 ranks: 2 x 2048 x 278528 = 1.14 GB (1.1 GiB)
    # > half of a 300 MB machine. The tiny policy (hidden 64, 2 layers, vocab 512: 23552
    # bytes per token): 2 x 2048 x 23552 = 96.5 MB fits; so do the critic's longest
    # sequences alone (128 + 24 = 152 tokens: 84.7 MB).
    wide = {**TINY, "hidden_size": 1024, "num_attention_heads": 32, "num_key_value_heads": 8}
    path = model_folder(tmp_path, Qwen2Config(**wide, max_position_embeddings=512))
    monkeypatch.setattr(budget, "machine_memory_bytes", lambda: 300_000_000)
    cfg = fake_run_of("skyrl-tiny", "algorithm=ppo", f"trainer.critic_model_path={path}")
    error = refused(cfg, False)
    assert error.key == "trainer.micro_batch_max_tokens"
    assert error.message.startswith(
        "2048 tokens per micro batch need about 1.1 GiB of activations for the critic "
        "(trainer.critic_model_path) on 2 rank(s), over 50% of this machine's 0.3 GiB"
    )
    # the same critic fits a machine of 2.5 GB: 1.14 GB <= 1.25 GB
    monkeypatch.setattr(budget, "machine_memory_bytes", lambda: 2_500_000_000)
    preflight(cfg, for_run=False)
