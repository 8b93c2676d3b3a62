"""The pre-flight check: what a validated config points at (files, rows, prompt lengths, model
paths, env, rollout driver), checked before anything starts, one ``ConfigError`` each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from preflight_helpers import cfg_for, refused, write_jsonl

from skyrl.config.preflight import preflight
from skyrl.models import resolve


def test_dry_run_counts_and_fetches_nothing(monkeypatch):
    monkeypatch.setattr(resolve, "with_local_model_paths", lambda cfg: pytest.fail("fetched"))
    cfg = cfg_for()
    checked = preflight(cfg, for_run=False)
    assert checked.cfg is cfg and checked.prompts is None  # nothing resolved, no rows kept
    assert [(r.split, r.num_prompts, r.num_dropped) for r in checked.reports] == [
        ("train", 8, 0),
        ("eval", 4, 0),
    ]
    longest = max(r.max_prompt_tokens for r in checked.reports)
    assert checked.plan_rows() == [
        ("prompts", f"train 8, eval 4 (longest {longest} tokens, max_prompt_length 128)"),
        # smoke: no eval before training, eval_interval 0; the root's 4 samples per eval prompt
        ("eval", "4 prompts x 4 samples, after the last step"),
    ]


def test_the_plan_says_when_the_eval_runs():
    checked = preflight(
        cfg_for("trainer.eval_before_train=true", "trainer.eval_interval=4"), for_run=False
    )
    assert checked.plan_rows()[-1] == (
        "eval",
        "4 prompts x 4 samples, before the first step, every 4 steps and after the last step",
    )


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["data.num_eval_prompts=0"], "data.num_eval_prompts=0"),
        (["data.source=files", "data.train_files=[{train}]"], "data.eval_files is empty"),
        (
            [
                "data.source=files", "data.train_files=[{train}]", "data.eval_files=[{long}]",
                "data.overlong_prompts=drop", "generator.max_prompt_length=64",
            ],
            "its 1 prompt was dropped as over-long",
        ),
    ],
)  # fmt: skip
def test_a_run_without_eval_prompts_says_so_in_the_plan(tmp_path, overrides, why):
    # trainer.eval_before_train and eval_interval ask for evals that have nothing to run on:
    # the run went on without one and said nothing
    train = write_jsonl(tmp_path / "train.jsonl", [f"q{i}" for i in range(8)])
    long = write_jsonl(tmp_path / "long.jsonl", ["word " * 200])
    overrides = [o.format(train=train, long=long) for o in overrides]
    evals = ["trainer.eval_before_train=true", "trainer.eval_interval=1"]
    checked = preflight(cfg_for(*overrides, *evals), for_run=False)
    assert checked.plan_rows()[-1] == (
        "eval",
        f"none ({why}): trainer.eval_before_train and trainer.eval_interval evaluate nothing",
    )
    checked = preflight(cfg_for(*overrides, "trainer.eval_interval=1"), for_run=False)
    assert checked.plan_rows()[-1] == (
        "eval",
        f"none ({why}): trainer.eval_interval evaluates nothing",
    )


def test_a_run_keeps_the_resolved_paths_and_the_checked_rows():
    from transformers import AutoTokenizer

    from skyrl.data import load_checked_prompts

    cfg = cfg_for()
    checked = preflight(cfg, for_run=True)
    assert Path(checked.cfg.model.path).is_dir() and cfg.model.path == "skyrl-tiny"
    assert checked.cfg.model.tokenizer_path == checked.cfg.model.path
    assert checked.prompts is not None
    tok = AutoTokenizer.from_pretrained(checked.cfg.model.tokenizer_path)
    assert checked.prompts.train == load_checked_prompts(cfg, "train", tok)
    assert [r.uid for r in checked.prompts.eval] == [f"arithmetic-eval-{i}" for i in range(4)]


def test_missing_file_is_found_before_the_model_is_looked_up(tmp_path, monkeypatch):
    monkeypatch.setattr(resolve, "_resolve", lambda *a: pytest.fail("model looked up first"))
    ok = write_jsonl(tmp_path / "ok.jsonl", ["q1", "q2"])
    cfg = cfg_for("data.source=files", f"data.train_files=[{ok}]", "data.eval_files=[gone.jsonl]")
    error = refused(cfg)
    assert (error.key, error.message) == ("data.eval_files[0]", "gone.jsonl: file not found")


@pytest.mark.parametrize("key", ["model.path", "model.tokenizer_path"])
def test_model_paths_that_name_nothing(key):
    error = refused(cfg_for(f"{key}=/nonexistent"))
    assert (error.key, error.message) == (key, "'/nonexistent': no such directory (/nonexistent)")
    assert error.__context__ is None


def test_hub_id_offline_is_one_line_with_what_was_tried(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    error = refused(cfg_for("model.path=Nope/NotAModel"))
    assert error.key == "model.path" and "\n" not in error.message
    assert error.message.startswith("'Nope/NotAModel' could not be resolved. Tried: local dir")
    assert "HF hub: skipped (HF_HUB_OFFLINE" in error.message
    assert error.message.endswith("or set model.path to a local directory.")


def test_a_folder_without_a_tokenizer(tmp_path):
    (tmp_path / "empty").mkdir()
    error = refused(cfg_for(f"model.tokenizer_path={tmp_path / 'empty'}"))
    assert error.key == "model.tokenizer_path"
    assert error.message.startswith(f"cannot load a tokenizer from {tmp_path / 'empty'}: ")


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        (
            "environment._target_=no.such.Class",
            "environment._target_",
            "cannot import 'no.such.Class': No module named 'no'",
        ),
        (
            "environment._target_=skyrl.envs.math_env.NoSuchEnv",
            "environment._target_",
            "cannot import 'skyrl.envs.math_env.NoSuchEnv': module 'skyrl.envs.math_env' has no "
            "attribute 'NoSuchEnv'",
        ),
        (
            "environment.name=mathh",
            "environment.name",
            "unknown environment 'mathh' (did you mean 'math'?); registered: ",
        ),
        (  # a misspelt constructor argument: the env did nothing with it, silently
            "+environment.kwargs.system_promt=x",
            "environment.kwargs.system_promt",
            "MathEnv takes no argument 'system_promt'; it takes: max_observation_chars",
        ),
        (
            "generator.agent=no.such.driver",
            "generator.agent",
            "'no.such.driver' does not import: No module named 'no'",
        ),
        ("generator.agent=nope", "generator.agent", "'nope' is not a built-in driver"),
        (  # a leading dot: importlib's own "Empty module name" named no path
            "generator.agent=.rollout",
            "generator.agent",
            "'.rollout' is not an import path module.attr",
        ),
        (
            "generator.agent=skyrl.generators.agent_loop.NoDriver",
            "generator.agent",
            "'skyrl.generators.agent_loop.NoDriver' does not import: module "
            "'skyrl.generators.agent_loop' has no attribute 'NoDriver'",
        ),
        (
            "data.num_train_prompts=1",
            "data.num_train_prompts",
            "1 training prompts, fewer than trainer.train_batch_size=2",
        ),
        (
            "generator.max_prompt_length=40",
            "data.source",
            "arithmetic train prompt 1: prompt is ",
        ),
    ],
)
def test_what_the_config_names(override, key, message):
    error = refused(cfg_for(override))
    assert error.key == key and error.message.startswith(message), error


def test_an_env_constructor_that_rejects_its_kwargs():
    error = refused(cfg_for("environment._target_=skyrl.envs.reasoning_gym_env._scorer"))
    assert error.key == "environment.kwargs"
    assert error.message.startswith("cannot build the environment: TypeError: ")


def test_an_agent_module_that_raises_on_import(tmp_path, monkeypatch):
    (tmp_path / "broken_driver.py").write_text("raise RuntimeError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    error = refused(cfg_for("generator.agent=broken_driver.factory"))
    assert error.key == "generator.agent"
    assert error.message == "importing 'broken_driver.factory' raised RuntimeError: half written"
    sys.modules.pop("broken_driver", None)


def test_drop_reports_per_split_and_too_few_left(tmp_path):
    long = "word " * 200
    path = write_jsonl(tmp_path / "d.jsonl", ["short", long, "also short", long])
    files = ["data.source=files", f"data.train_files=[{path}]", f"data.eval_files=[{path}]"]
    drop = [*files, "generator.max_prompt_length=64", "data.overlong_prompts=drop"]
    checked = preflight(cfg_for(*drop), for_run=False)
    assert [(r.num_prompts, r.num_dropped) for r in checked.reports] == [(2, 2), (2, 2)]
    assert checked.plan_rows()[1] == (
        "over-long prompts",
        "dropped: train 2, eval 2 (data.overlong_prompts=drop)",
    )
    error = refused(
        cfg_for(*drop, "trainer.train_batch_size=4", "trainer.policy_mini_batch_size=2")
    )
    assert (error.key, error.message) == (
        "data.train_files",
        "2 training prompts after dropping 2 over-long, fewer than trainer.train_batch_size=4",
    )


@pytest.mark.parametrize("overlong", ["error", "drop"])
def test_critic_only_steps_are_checked_against_the_steps_the_loaded_prompts_give(
    tmp_path, overlong
):
    # 8 prompts kept (a 9th, over-long, dropped under drop) // train_batch_size 2
    # = 4 batches x epochs 1 = 4 steps
    prompts = [f"q{i}" for i in range(8)] + (["word " * 200] if overlong == "drop" else [])
    train = write_jsonl(tmp_path / "train.jsonl", prompts)
    ppo = [
        "algorithm=ppo", "data.source=files", f"data.train_files=[{train}]",
        f"data.overlong_prompts={overlong}", "generator.max_prompt_length=64",
        "trainer.train_batch_size=2", "trainer.policy_mini_batch_size=1",
        "trainer.critic_mini_batch_size=1", "trainer.total_steps=null", "trainer.epochs=1",
    ]  # fmt: skip
    error = refused(cfg_for(*ppo, "trainer.critic_only_steps=4"))
    assert (error.key, error.message) == (
        "trainer.critic_only_steps",
        "the policy would never train: 4 critic-only steps of 4",
    )
    checked = preflight(cfg_for(*ppo, "trainer.critic_only_steps=3"), for_run=False)
    assert checked.reports[0].num_prompts == 8


def test_fake_data_checks_only_the_model():
    checked = preflight(cfg_for("data=fake", "environment.name=unused"), for_run=False)
    assert checked.reports == []
    assert checked.plan_rows() == [("eval", "none (data.source=fake has no prompts)")]
    error = refused(cfg_for("data=fake", "model.path=/nonexistent"))
    assert error.key == "model.path"


@pytest.mark.parametrize(
    ("targets", "key", "fragment"),
    [
        ("[q_proj,qkv]", "model.lora.target_modules[1]", "'qkv' names no linear layer of Qwen2"),
        ("[lm_head]", "model.lora.target_modules[0]", "the output layer takes no adapter"),
    ],
)
def test_lora_target_modules_are_checked_against_the_model(targets, key, fragment):
    cfg = cfg_for("model.lora.rank=8", f"model.lora.target_modules={targets}")
    for for_run in (False, True):
        error = refused(cfg, for_run=for_run)
        assert error.key == key and fragment in error.message
    assert "q_proj, up_proj, v_proj" in error.message  # it lists the model's linear layers


def test_a_lora_adapter_directory_as_model_path_is_one_line(tmp_path):
    # a run's final_adapter: transformers said "Should have a `model_type` key in its
    # config.json" of a folder that has none
    adapter = tmp_path / "final_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "b"}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    for for_run in (False, True):
        error = refused(cfg_for(f"model.path={adapter}"), for_run=for_run)
        assert (error.key, error.message) == (
            "model.path",
            f"{adapter} is a LoRA adapter directory, not a model: name a model folder, e.g. "
            "its run's final_hf (these adapters merged into their base model)",
        )


def test_lora_target_modules_that_exist_pass():
    for targets in ("[all-linear]", "[q_proj,v_proj]", "[self_attn.o_proj,mlp.down_proj]"):
        preflight(cfg_for("model.lora.rank=8", f"model.lora.target_modules={targets}"), False)


def test_a_budget_beyond_the_models_context_passes_but_a_sequence_beyond_it_is_refused():
    # the tiny model: max_position_embeddings 2048; smoke's longest sequence 128 + 24 = 152.
    # A packed row's sequences attend only to themselves: the context bounds a sequence.
    preflight(cfg_for("trainer.micro_batch_max_tokens=4096"), for_run=False)  # 26 sequences
    preflight(cfg_for("generator.max_prompt_length=2024"), for_run=False)  # 2024 + 24 = 2048
    for for_run in (False, True):
        error = refused(cfg_for("generator.max_prompt_length=2025"), for_run=for_run)
        assert error.key == "generator.max_generate_length"
        assert error.message.endswith(
            "a sequence of up to generator.max_prompt_length + generator.max_generate_length = "
            "2025 + 24 = 2049 tokens exceeds the model's context, max_position_embeddings = 2048"
        )


def test_micro_batch_budget_over_the_memory_estimate_is_refused(monkeypatch):
    from skyrl.batch import budget

    # the tiny model (hidden 64, 2 layers, vocab 512), fp32, per token:
    # 34 x 64 x 4 bytes x 2 layers + 3 x 512 x 4 bytes = 17408 + 6144 = 23552
    config = type("Config", (), {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512})
    assert budget.activation_bytes(config, 1000, "fp32", checkpointing=False) == 23_552_000
    # checkpointing keeps 2 x 64 x 4 bytes per layer and one layer's full 34 x 64 x 4:
    # 1024 + 8704 + 6144 = 15872 per token
    assert budget.activation_bytes(config, 1000, "fp32", checkpointing=True) == 15_872_000
    # 2 ranks x 2000 tokens x 23552 bytes = 94.2 MB > half of a 100 MB machine
    monkeypatch.setattr(budget, "machine_memory_bytes", lambda: 100_000_000)
    error = refused(cfg_for("trainer.micro_batch_max_tokens=2000"))
    assert error.key == "trainer.micro_batch_max_tokens"
    assert "need about 0.1 GiB of activations on 2 rank(s)" in error.message
    assert "trainer.gradient_checkpointing=true" in error.message
    preflight(cfg_for("trainer.micro_batch_max_tokens=1000"), for_run=False)  # 47.1 MB fits


def test_a_sequence_longer_than_the_budget_is_checked_against_memory_too(monkeypatch):
    from skyrl.batch import budget

    # A sequence longer than the budget gets a micro batch of its own, so the largest micro
    # batch holds max(budget, longest sequence) tokens. Longest 1976 + 24 = 2000 tokens:
    # 2 ranks x 2000 x 23552 bytes = 94.2 MB > half of a 100 MB machine, whatever the budget
    # (a budget of 100 passed before: 2 x 100 x 23552 = 4.7 MB).
    monkeypatch.setattr(budget, "machine_memory_bytes", lambda: 100_000_000)
    long = "generator.max_prompt_length=1976"
    error = refused(cfg_for(long, "trainer.micro_batch_max_tokens=100"))
    assert error.key == "generator.max_generate_length"
    assert "a sequence of up to 2000 tokens (longer than trainer.micro_batch_max_tokens = 100)" in (
        error.message
    )
    assert "need about 0.1 GiB of activations on 2 rank(s)" in error.message
    # 1000 + 24 = 1024 tokens: 2 x 1024 x 23552 = 48.2 MB fits
    preflight(
        cfg_for("generator.max_prompt_length=1000", "trainer.micro_batch_max_tokens=100"), False
    )


@pytest.mark.parametrize("kind", ["empty folder", "broken config.json", "a file"])
def test_a_model_path_that_is_not_a_model_is_refused(tmp_path, kind):
    path = tmp_path / "model"
    if kind == "a file":
        path.write_text("x")
    else:
        path.mkdir()
        if kind == "broken config.json":
            (path / "config.json").write_text("{bad")
    for for_run in (False, True):
        error = refused(cfg_for(f"model.path={path}"), for_run=for_run)
        assert error.key == "model.path"
        assert f"{path} is not a model folder: " in error.message and "\n" not in error.message


@pytest.mark.parametrize("key", ["trainer.num_gpus_per_worker", "generator.num_gpus_per_engine"])
def test_a_run_asking_for_gpus_on_a_machine_without_any_is_refused(monkeypatch, key):
    # it waited 120 s for Ray to place the GPU bundle, then a GetTimeoutError naming no key
    from skyrl.config import preflight as module

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(module, "visible_gpus", lambda: 0)
    extra = ["generator.num_cpus_per_engine=0"] if key.startswith("generator") else []
    cfg = cfg_for(f"{key}=1", *extra)
    preflight(cfg, for_run=False)  # a dry run may check a GPU config on a laptop
    error = refused(cfg, for_run=True)
    assert error.key == key
    assert (
        error.message
        == f"{key}=1 asks for GPUs, but this machine has none (and RAY_ADDRESS names no cluster)"
    )
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # a cluster's GPUs are Ray's to place
    preflight(cfg, for_run=True)


@pytest.mark.parametrize("row", [{"prompt": "q"}, {"prompt": "q", "answer": None}])
def test_a_row_without_what_the_env_grades_against_is_refused(tmp_path, row):
    # the math env grades against extras["answer"]: a row without one raised KeyError in
    # every step (reward 0 and an env error each time); a null answer was graded as "None"
    path = tmp_path / "d.jsonl"
    good = json.dumps({"prompt": "q", "answer": "1"})
    path.write_text(f"{good}\n{json.dumps(row)}\n")
    error = refused(cfg_for("data.source=files", f"data.train_files=[{path}]"))
    assert error.key == "data.train_files[0]"
    assert error.message == (f"{path}: row 2: no 'answer' (environment 'math' grades against it)")


def test_a_critic_model_path_that_names_nothing_is_refused_before_anything_starts():
    # it passed the pre-flight; the critic worker then failed to load it inside its Ray actor
    cfg = cfg_for("algorithm=ppo", "trainer.critic_model_path=/nonexistent")
    for for_run in (False, True):
        error = refused(cfg, for_run=for_run)
        assert (error.key, error.message) == (
            "trainer.critic_model_path",
            "'/nonexistent': no such directory (/nonexistent)",
        )
        assert error.__context__ is None


def test_a_critic_hub_id_offline_is_refused_naming_its_key(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    error = refused(cfg_for("algorithm=ppo", "trainer.critic_model_path=Nope/NotACritic"))
    assert error.key == "trainer.critic_model_path" and "\n" not in error.message
    assert error.message.startswith("'Nope/NotACritic' could not be resolved. Tried: local dir")
    assert error.message.endswith("or set trainer.critic_model_path to a local directory.")


def test_a_critic_path_that_is_not_a_model_is_refused(tmp_path):
    (tmp_path / "critic").mkdir()
    cfg = cfg_for("algorithm=ppo", f"trainer.critic_model_path={tmp_path / 'critic'}")
    for for_run in (False, True):
        error = refused(cfg, for_run=for_run)
        assert error.key == "trainer.critic_model_path"
        assert error.message.startswith(f"{tmp_path / 'critic'} is not a model folder: ")


def test_a_run_resolves_the_critic_path():
    from skyrl.models.resolve import resolve_model_path

    checked = preflight(cfg_for("algorithm=ppo", "trainer.critic_model_path=skyrl-tiny"), True)
    assert checked.cfg.trainer.critic_model_path == resolve_model_path("skyrl-tiny")
    # no critic path: the critic starts from the policy's (resolved) model
    assert preflight(cfg_for("algorithm=ppo"), True).cfg.trainer.critic_model_path is None


def test_eval_and_serve_resolve_no_critic():
    # skyrl-eval / skyrl-serve load the policy only: a PPO config's critic is not fetched
    from skyrl.config.preflight import local_model_paths

    cfg = cfg_for("algorithm=ppo", "trainer.critic_model_path=/nonexistent")
    resolved = local_model_paths(cfg)
    assert Path(resolved.model.path).is_dir()
    assert resolved.trainer.critic_model_path == "/nonexistent"


def test_a_logger_whose_package_is_missing_is_refused_before_anything_starts(monkeypatch):
    # trainer.loggers=[console,wandb] without wandb installed ended, after Ray and the workers
    # had started, in train()'s Tracker with an ImportError traceback; now the pre-flight
    # (dry run too) names the key with the sink's own install hint, and only for the sinks
    # chosen: tensorboard, also missing here, is not asked for.
    import importlib.util

    real_find_spec = importlib.util.find_spec
    missing = {"wandb", "tensorboard"}
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in missing else real_find_spec(name, *a),
    )
    error = refused(
        cfg_for("data=fake", "environment.name=unused", "trainer.loggers=[console,wandb]")
    )
    assert (error.key, error.message) == (
        "trainer.loggers",
        "logger 'wandb' needs the 'wandb' package: pip install wandb "
        "(or pip install 'skyrl[trackers]' for every tracker)",
    )
    preflight(
        cfg_for("data=fake", "environment.name=unused", "trainer.loggers=[console,mlflow]"), False
    )


def test_a_recipe_sink_registered_over_a_builtin_name_is_not_checked(monkeypatch):
    # a recipe may register its own "wandb" sink (SINKS.register(..., override=True)): the
    # wandb package is then not what it needs
    import importlib.util

    from skyrl.tracking import SINKS

    class OwnWandb:
        def __init__(self, run): ...

    monkeypatch.setitem(SINKS._entries, "wandb", OwnWandb)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: pytest.fail(name))
    preflight(
        cfg_for("data=fake", "environment.name=unused", "trainer.loggers=[console,wandb]"), False
    )


def test_wandb_modes_are_the_installed_wandbs():
    import typing

    from wandb.sdk.wandb_settings import Settings

    from skyrl.config.preflight import WANDB_MODES

    assert set(WANDB_MODES) == set(typing.get_args(Settings.model_fields["mode"].annotation))


def test_a_wandb_mode_wandb_does_not_accept_is_refused_before_anything_starts(monkeypatch):
    # WANDB_MODE=bogus passed the pre-flight; the wandb sink refused it only once the workers
    # were up. wandb compares the exact string: "Offline" and "" are refused too.
    fake = ["data=fake", "environment.name=unused"]
    for mode in ("bogus", "Offline", ""):
        monkeypatch.setenv("WANDB_MODE", mode)
        error = refused(cfg_for(*fake, "trainer.loggers=[console,wandb]"))
        assert (error.key, error.message) == (
            "trainer.loggers",
            f"logger 'wandb' would not start with WANDB_MODE={mode!r}: wandb's modes are "
            "online, offline, shared, disabled, dryrun, run (unset WANDB_MODE: offline)",
        )
        preflight(cfg_for(*fake, "trainer.loggers=[console]"), False)  # no wandb, not read
    monkeypatch.setenv("WANDB_MODE", "disabled")
    preflight(cfg_for(*fake, "trainer.loggers=[console,wandb]"), False)
