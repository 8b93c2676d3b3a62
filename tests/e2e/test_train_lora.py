"""The real CLI trains LoRA adapters on the tiny model: the KL reference is the policy with
its adapters off, the engine serves each synced adapter (or the merged weights), and the run
exports a merged model and a PEFT adapter directory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from skyrl.models.tiny import build_tiny_model
from skyrl.tracking import metric_names as names

pytestmark = pytest.mark.slow
SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")


@pytest.mark.parametrize(
    ("backend", "lora_sync", "extra"),
    [
        ("vllm", "adapter", []),
        # PPO: a full critic beside the LoRA policy
        ("hf", "merged", ["algorithm=ppo", "algorithm.use_kl_in_reward=false"]),
    ],
)
def test_lora_run_syncs_the_adapter_and_exports_it(tmp_path, backend, lora_sync, extra):
    import subprocess

    args = [
        SKYRL_TRAIN, "experiment=smoke", f"generator={backend}", "hydra.run.dir=run",
        "model.lora.rank=8", "model.lora.alpha=16", f"trainer.lora_sync={lora_sync}",
        "trainer.total_steps=3", "trainer.policy_optimizer.lr=1e-2",
        "algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=0.1",
        "generator.max_generate_length=8", "trainer.ckpt_interval=3",
        "trainer.policy_mini_batch_size=2",  # one optimizer step per step: step 1 sees B = 0
        "environment._target_=parity_env.ParityEnv", "generator.n_samples_per_prompt=4",
        "generator.sampling.seed=0",  # reproducible samples: rewards vary within each group
    ]  # fmt: skip
    if backend == "vllm":
        args.append("generator.kv_cache_memory_bytes=16777216")
    args += extra
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert any(r[names.POLICY.grad_norm] > 0 for r in records)  # rewards carried signal
    # no reference workers started: the KL term comes from the policy with adapters off;
    # at step 1 the adapters are still 0 (B = 0), so KL(policy || reference) is exactly 0
    assert records[0][names.POLICY.token_mean(names.KL_TERM)] == 0.0
    # by step 3 they moved: the term is nonzero (ppo's k1 estimator, log(pi / pi_ref) per
    # sampled token, can average below 0 over a few tokens; k3 cannot)
    assert records[2][names.POLICY.token_mean(names.KL_TERM)] != 0.0
    # steps 2 and 3 sampled after syncs: the engine served the trained adapter
    for r in records[1:]:
        assert r[names.LOGPROB_ABS_DIFF] < 1e-4
    adapter = load_file(run / "final_adapter" / "adapter_model.safetensors")
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert any(t.abs().max() > 0 for k, t in adapter.items() if ".lora_B." in k)
    merged = AutoModelForCausalLM.from_pretrained(run / "final_hf")
    base = AutoModelForCausalLM.from_pretrained(build_tiny_model())
    assert not torch.equal(
        merged.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight
    )
    # the checkpoint keeps the adapters, not the frozen base
    [states] = (run / "checkpoints").glob("global_step_3/policy/state/mp_rank_00_model_states.pt")
    module = torch.load(states, weights_only=False)["module"]
    assert module and all(".lora_" in k for k in module)
    # skyrl-eval's export of that checkpoint (base + adapters, merged) is the final model
    from skyrl.trainer.checkpoint import export_checkpoint_hf

    tiny = build_tiny_model()
    exported = export_checkpoint_hf(states.parents[2], tiny, tiny, tmp_path / "exported")
    reloaded = AutoModelForCausalLM.from_pretrained(exported)
    final = dict(merged.named_parameters())
    for name, param in reloaded.named_parameters():
        torch.testing.assert_close(param, final[name], atol=1e-6, rtol=0)
