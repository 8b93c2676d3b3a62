"""The run directory, checked before anything is written to it or started: an output dir that
is a file, a resume target that is not a checkpoint, a fresh run over an earlier run's
checkpoints, a dry run over an earlier run's saved config (``skyrl.api.train``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyrl
from skyrl.config import ConfigError


def dry_run(out: Path, *overrides: str):
    cfg = skyrl.compose(["experiment=smoke", "trainer.dry_run=true", *overrides])
    return skyrl.train(cfg, output_dir=out)


def refused(out: Path, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        dry_run(out, *overrides)
    return err.value


def checkpoint(run: Path, step: int, state: str | None = None, dp_size: int = 2) -> Path:
    """A complete checkpoint of ``run`` at ``step`` (as the trainer leaves it) and ``latest``;
    saved by ``dp_size`` ranks (the smoke experiment's), each with its RNG state file."""
    ckpt = run / "checkpoints" / f"global_step_{step}"
    (ckpt / "policy").mkdir(parents=True)
    for rank in range(dp_size):
        (ckpt / "policy" / f"rng_rank{rank}.pt").write_bytes(b"")
    (ckpt / "trainer_state.json").write_text(state or json.dumps({"step": step, "kl_coef": 0.0}))
    (run / "checkpoints" / "latest").write_text(f"global_step_{step}\n")
    return ckpt


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        error = refused(out)
        assert error.key == "trainer.output_dir"
        assert f"{tmp_path / 'afile'} is a file, not a directory" in error.message


def test_an_output_dir_whose_name_is_too_long_is_refused(tmp_path):
    # a 300-character name, past the filesystem's 255: Path.exists raised OSError [Errno 36]
    # out of the check, a traceback instead of the key's line
    long = tmp_path / ("x" * 300) / "run"
    error = refused(long)
    assert error.key == "trainer.output_dir"
    assert error.message.endswith(f"{tmp_path / ('x' * 300)}: File name too long")


def test_a_resume_target_that_is_not_a_checkpoint_is_refused_before_the_run(tmp_path):
    error = refused(tmp_path / "run", f"trainer.resume={tmp_path / 'nowhere'}")
    assert error.key == "trainer.resume" and "not a checkpoint" in error.message
    # `latest` naming a step that is not there (resume=auto, the default)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("global_step_9\n")
    error = refused(run)
    assert error.key == "trainer.resume"
    assert "global_step_9, which is not a complete checkpoint" in error.message


@pytest.mark.parametrize(
    ("state", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ('{"kl_coef": 0.1}', "has no 'step'"),
        # a hand-edited state: the trainer's int(state["step"]) / state["kl_coef"] were a
        # ValueError / KeyError traceback once the workers had loaded
        ('{"step": "four", "kl_coef": 0.1}', "'step' is 'four', not a step number"),
        ('{"step": 4}', "'kl_coef' is None, not a number"),
    ],
)
def test_a_corrupt_trainer_state_is_refused_naming_the_file(tmp_path, state, fragment):
    ckpt = checkpoint(tmp_path / "run", 4, state)
    error = refused(tmp_path / "run", f"trainer.resume={ckpt}")
    assert error.key == "trainer.resume"
    assert str(ckpt / "trainer_state.json") in error.message and fragment in error.message


def test_a_checkpoint_without_a_critic_is_refused_when_the_run_needs_one(tmp_path):
    # a GRPO run's checkpoint resumed with algorithm=ppo: the critic worker failed to load it
    # ("critic worker failed: AssertionError") and the line blamed model.path or zero_stage
    ckpt = checkpoint(tmp_path / "run", 1)
    error = refused(tmp_path / "run", "algorithm=ppo")
    assert (error.key, error.message) == (
        "trainer.resume",
        f"{ckpt} has no critic (no {ckpt / 'critic'}): it was saved by a run without one, and "
        "algorithm.advantage_estimator=gae needs one; resume it with the algorithm it was "
        "saved with, or start this run in another trainer.output_dir",
    )


def test_a_checkpoint_without_weights_is_refused(tmp_path):
    ckpt = checkpoint(tmp_path / "run", 4, dp_size=0)
    (ckpt / "policy").rmdir()
    error = refused(tmp_path / "run")
    assert error.key == "trainer.resume" and "no policy weights" in error.message


def test_a_fresh_run_over_an_earlier_runs_checkpoints_is_refused(tmp_path):
    # resume=none there would save step 4 among steps 8 and 16, prune by step and overwrite
    # theirs as it went: it names the checkpoints and the way out, and writes nothing
    run = tmp_path / "run"
    checkpoint(run, 8)
    checkpoint(run, 16)
    error = refused(run, "trainer.resume=none")
    assert error.key == "trainer.resume"
    assert "holds checkpoints of an earlier run (global_step_8, global_step_16)" in error.message
    assert "trainer.resume=auto" in error.message and "trainer.output_dir" in error.message
    assert not (run / "resolved_config.yaml").exists()
    dry_run(run, "trainer.resume=auto")  # continuing it is fine


def test_unpublished_checkpoints_without_latest_are_resumed_and_named(tmp_path, capsys):
    # a run killed after saving step 4 but before writing its metrics record never pointed
    # `latest` at it (or the pointer was deleted): auto started fresh and replaced it, with a
    # warning; it resumes from it now (tests/config/test_run_dir_no_latest_bm.py)
    run = tmp_path / "run"
    ckpt = checkpoint(run, 4)
    (run / "checkpoints" / "latest").unlink()
    dry_run(run)
    assert capsys.readouterr().err == (
        f"warning: trainer.resume=auto: {run / 'checkpoints'} holds global_step_4 but no "
        "'latest' pointer (a run stopped before it published them, or the pointer was "
        f"removed): resuming from the newest complete one, {ckpt} (to start fresh instead, "
        "use another trainer.output_dir)\n"
    )


def test_a_dry_run_leaves_an_earlier_runs_saved_config_alone(tmp_path, capsys):
    # skyrl-eval reads a run's resolved_config.yaml to rebuild its model
    run = tmp_path / "run"
    dry_run(run)
    saved = (run / "resolved_config.yaml").read_text()
    dry_run(run, "trainer.policy_optimizer.lr=3e-4")
    assert (run / "resolved_config.yaml").read_text() == saved
    assert "resolved_config.yaml kept as it is (dry run)" in capsys.readouterr().out


def test_an_async_checkpoint_with_prompts_in_flight_needs_an_async_resume(tmp_path):
    # a synchronous run draws from the loader position and never serves the async run's
    # in-flight prompts: those would go untrained this epoch
    pending = [{"index": i, "uid": f"u{i}", "seed": 7} for i in (5, 0, 12, 14)]
    state = json.dumps({"step": 2, "kl_coef": 0.0, "rollouts": {"loader": {}, "pending": pending}})
    checkpoint(tmp_path, 2, state)
    error = refused(tmp_path, "trainer.resume=auto")
    assert error.key == "trainer.max_staleness"
    assert "4 prompts in flight" in error.message
    async_run = ("trainer.max_staleness=1", "generator.num_cpus_per_engine=1")
    assert dry_run(tmp_path, "trainer.resume=auto", *async_run) is not None
    done = json.dumps({"step": 2, "kl_coef": 0.0, "rollouts": {"loader": {}, "pending": []}})
    (tmp_path / "checkpoints" / "global_step_2" / "trainer_state.json").write_text(done)
    assert dry_run(tmp_path, "trainer.resume=auto") is not None


def test_a_checkpoint_saved_on_another_dp_size_is_refused_naming_trainer_dp_size(tmp_path):
    # each rank loads its own RNG state and (ZeRO 1-3) its own optimizer partition:
    # DeepSpeed loads a checkpoint only on the number of ranks that saved it. Before, rank 1
    # of a dp_size=2 run died on the missing rng_rank1.pt of a dp_size=1 checkpoint.
    ckpt = checkpoint(tmp_path / "run", 3, dp_size=1)
    error = refused(tmp_path / "run")  # the smoke experiment: trainer.dp_size=2
    assert error.key == "trainer.dp_size"
    assert f"{ckpt} was saved by 1 data-parallel rank" in error.message
    assert "trainer.dp_size=2" in error.message and "trainer.dp_size=1" in error.message
    assert "\n" not in error.message
    assert dry_run(tmp_path / "run", "trainer.dp_size=1") is not None  # the size that saved it


def test_a_checkpoint_without_rng_states_is_not_a_complete_checkpoint(tmp_path):
    # every rank loads its rng_rank<r>.pt: with none the checkpoint is incomplete, not one
    # saved on 0 ranks
    ckpt = checkpoint(tmp_path / "run", 3, dp_size=0)
    error = refused(tmp_path / "run")
    assert error.key == "trainer.resume"
    assert (
        error.message == f"{ckpt}: no rng_rank*.pt in {ckpt / 'policy'}: not a complete checkpoint"
    )


def lora_checkpoint(run: Path, rank: int = 8, alpha: int = 16, targets=("q_proj",)) -> Path:
    """A LoRA run's checkpoint: what the adapter tensors mean is its adapter_config.json."""
    from skyrl.config.root import LoraConfig
    from skyrl.models.lora import peft_config

    ckpt = checkpoint(run, 2)
    lora = LoraConfig(rank=rank, alpha=alpha, target_modules=list(targets))
    peft_config(lora).save_pretrained(str(ckpt / "policy"))
    return ckpt


LORA = ["model.lora.rank=8", "model.lora.alpha=16", "model.lora.target_modules=[q_proj]"]


@pytest.mark.parametrize(
    ("change", "key", "saved", "asked"),
    [
        # swapped targets of one shape loaded silently: q_proj's trained adapters dropped
        # (ZeRO 0/2) or loaded into o_proj (ZeRO 3)
        ("model.lora.target_modules=[o_proj]", "model.lora.target_modules", "[q_proj]", "[o_proj]"),
        # alpha scales the adapters' output: 32 resumed a policy 0.657 logits from the saved one
        ("model.lora.alpha=32", "model.lora.alpha", "16", "32"),
        ("model.lora.rank=4", "model.lora.rank", "8", "4"),
    ],
)
def test_a_lora_checkpoint_resumes_only_with_its_own_adapters(tmp_path, change, key, saved, asked):
    ckpt = lora_checkpoint(tmp_path / "run")
    error = refused(tmp_path / "run", *LORA, change)
    assert (error.key, error.message) == (
        key,
        f"{ckpt} trained adapters with {key}={saved}, but this run asks for {asked}: a "
        f"checkpoint resumes with the adapters it saved ({key}={saved})",
    )
    assert dry_run(tmp_path / "run", *LORA, "model.lora.dropout=0.1") is not None  # same tensors


def test_a_lora_checkpoint_resumes_with_the_target_modules_it_was_trained_with(tmp_path):
    # PEFT saves target_modules as a set: a run that listed a module twice was refused its
    # own checkpoint ("trained with [q_proj,v_proj], but this run asks for [q_proj,q_proj,v_proj]")
    lora_checkpoint(tmp_path / "run", targets=("q_proj", "v_proj", "q_proj"))
    targets = "model.lora.target_modules=[v_proj,q_proj,q_proj]"
    assert dry_run(tmp_path / "run", *LORA, targets) is not None


def test_lora_and_full_weight_checkpoints_do_not_resume_each_other(tmp_path):
    ckpt = lora_checkpoint(tmp_path / "lora")
    error = refused(tmp_path / "lora")  # model.lora.rank=0: full weights
    assert (error.key, error.message) == (
        "model.lora.rank",
        f"{ckpt} holds LoRA adapters (rank 8), but model.lora.rank=0 trains the full weights: "
        "resume with the model.lora settings it was trained with",
    )
    ckpt = checkpoint(tmp_path / "full", 2)
    error = refused(tmp_path / "full", *LORA)
    assert (error.key, error.message) == (
        "model.lora.rank",
        f"{ckpt} holds full weights (no adapter_config.json in {ckpt / 'policy'}), but "
        "model.lora.rank=8 trains adapters: resume with model.lora.rank=0",
    )


def test_a_checkpoint_file_removed_since_its_save_is_named_before_the_run(tmp_path):
    # file_sizes.json records what the save wrote. Before, a lost rng_rank1.pt of a dp_size=2
    # save read "saved by 1 data-parallel rank ... set trainer.dp_size=1"
    ckpt = checkpoint(tmp_path / "run", 3, dp_size=2)
    sizes = {"policy/rng_rank0.pt": 0, "policy/rng_rank1.pt": 0}
    (ckpt / "file_sizes.json").write_text(json.dumps(sizes))
    (ckpt / "policy" / "rng_rank1.pt").unlink()
    error = refused(tmp_path / "run")
    assert (error.key, error.message) == (
        "trainer.resume",
        f"{ckpt / 'policy' / 'rng_rank1.pt'} is missing: {ckpt} is not a complete checkpoint",
    )


def test_a_checkpoint_of_another_zero_layout_is_refused_before_the_run(tmp_path):
    ckpt = checkpoint(
        tmp_path / "run", 3, state=json.dumps({"step": 3, "kl_coef": 0.0, "zero_stage": 0})
    )
    error = refused(tmp_path / "run", "trainer.zero_stage=3")
    assert error.key == "trainer.zero_stage"
    assert error.message.startswith(f"{ckpt} was saved at trainer.zero_stage=0, but ")
    assert dry_run(tmp_path / "run", "trainer.zero_stage=0") is not None
