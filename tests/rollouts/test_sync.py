"""SyncRollouts over a real (tiny, in-process hf) engine: batches, seeds, versions, shaping."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

import skyrl
from skyrl.config.validate import validate
from skyrl.inference import make_engine
from skyrl.models.resolve import with_local_model_paths
from skyrl.rollouts import make_rollouts
from skyrl.rollouts.sync import SyncRollouts, shape_rewards


def _source(tmp_path, *overrides: str) -> SyncRollouts:
    cfg = with_local_model_paths(
        validate(skyrl.compose(["experiment=smoke", "generator.max_generate_length=8", *overrides]))
    )
    tok = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path)
    engine = make_engine(cfg.generator, cfg.model.path, cfg.model.tokenizer_path)
    source = make_rollouts(cfg, tok, tmp_path, engine)
    assert isinstance(source, SyncRollouts)
    return source


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return _source(tmp_path_factory.mktemp("sync"))


def test_a_batch_holds_the_steps_prompt_groups(source):
    batch, metrics = source.next_batch(1)
    # smoke: 2 prompts x 2 samples, single turn
    assert len(batch) == 4 and len(set(batch.metadata["uids"])) == 2
    assert batch.metadata["policy_versions"] == [[(0, 0)]] * 4
    assert "generate/reward_mean" in metrics
    with source.updating_weights(1):
        pass
    batch, _ = source.next_batch(2)
    assert batch.metadata["policy_versions"] == [[(1, 1)]] * 4


def test_a_run_is_reproducible_from_trainer_seed(tmp_path):
    """Two fresh sources with the same trainer.seed draw the same prompts and tokens; another
    seed draws other samples (generator.sampling.seed unset: derived from trainer.seed)."""
    a, _ = _source(tmp_path / "a").next_batch(1)
    b, _ = _source(tmp_path / "b").next_batch(1)
    c, _ = _source(tmp_path / "c", "trainer.seed=7").next_batch(1)
    assert torch.equal(a["input_ids"], b["input_ids"])
    # The same tokens; their logprobs agree to float noise only: the hf engine batches the
    # requests as they arrive, and another batch split pads rows differently, which moves
    # logits by ~1e-6 (skyrl/inference/hf.py). A different token would differ by O(1).
    torch.testing.assert_close(a["rollout_logprobs"], b["rollout_logprobs"], atol=1e-5, rtol=0)
    assert (
        not torch.equal(a["input_ids"], c["input_ids"])
        or a["input_ids"].shape != c["input_ids"].shape
    )


def test_eval_goes_through_the_same_generator(source):
    metrics = source.evaluate()
    assert "eval/pass@1" in metrics and metrics["eval/seconds"] > 0


def test_overlong_shaping_leaves_the_generator_output_unchanged(tmp_path):
    source = _source(
        tmp_path, "algorithm.overlong_buffer_len=4", "algorithm.overlong_penalty_factor=1.0"
    )
    rows = source.loader.next_batch("x")
    out = source.generate(rows, seed=0)
    rewards = list(out.rewards)
    shaped, metrics = shape_rewards(source.cfg, out)
    assert out.rewards == rewards  # the generator's output is not touched
    # every sample hit max_generate_length=8 > 8 - 4 (tiny random model: no EOS) -> penalty
    # -(L - 4) / 4 * 1.0 per trajectory; L = its generated tokens
    for r0, r1, mask in zip(out.rewards, shaped.rewards, out.loss_masks, strict=True):
        assert r1 == pytest.approx(r0 - min(max(sum(mask) - 4, 0) / 4, 1.0))
    assert metrics["reward/overlong_penalty_mean"] <= 0
