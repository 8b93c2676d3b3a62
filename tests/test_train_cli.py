"""The real `skyrl-train` entry point, run in a subprocess from a foreign directory."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")
TESTS = str(Path(__file__).parent)
PLUGINS = ["imports=[recipe_plugins]"]
"""tests/recipe_plugins.py registers a sink (``recording``) and an engine backend
(``counting_hf``) as a recipe would; the runs below put tests/ on PYTHONPATH."""


def run_cli(
    tmp_path: Path, *args: str, module: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "skyrl", *args] if module else [SKYRL_TRAIN, *args]
    env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.lr_typo=1", "error: trainer.lr_typo: unknown key"),
        (
            "trainer.trian_batch_size=1",
            "error: trainer.trian_batch_size: unknown key (did you mean 'train_batch_size'?)",
        ),
        (
            "trainer.train_batch_size=abc",
            "error: trainer.train_batch_size: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        ("algorithm=nope", "error: algorithm=nope: no such option in group 'algorithm'"),
        ("trainer.train_batch_size=-4", "error: trainer.train_batch_size: must be >= 1, got -4"),
        (
            "trainer.train_batch_size=10",
            "error: trainer.policy_mini_batch_size: train_batch_size (10) must be divisible by policy_mini_batch_size (4)",
        ),
        # + and ++ add a key with the struct flag open; the validator refuses it all the same
        ("+trainer.lrx=1", "error: trainer.lrx: unknown key"),
        ("+foo=1", "error: foo: unknown key"),
        (
            "++trainer.policy_optimizer.lrx=1",
            "error: trainer.policy_optimizer.lrx: unknown key (did you mean 'lr'?)",
        ),
        # before: "... To override a value use 'override experiment: smoke'", a defaults list's
        # YAML, not a command line's
        (
            "+experiment=smoke",
            "error: +experiment=smoke: experiment is in the defaults already: choose it with "
            "experiment=smoke (no +)",
        ),
        # before: "Config group override must be a string or a list. Got NoneType", no key
        ("experiment=null", "error: experiment: is a config group: its value names one of its"),
        # a backend reads its own schema's fields: the vllm group's with the hf engine is refused
        (
            "generator.backend=hf",
            "error: generator.backend: engine backend 'hf' reads the fields of generator=hf; got a VLLMGeneratorConfig",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, override, expected):
    result = run_cli(tmp_path, override)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[0]], f"expected one line, got:\n{result.stderr}"
    assert lines[0].startswith(expected)
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "outputs").exists(), "a rejected command must not create a run dir"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # before: "(did you mean 'share_prompts'?)", a trainer key that has nothing to do with it
        (
            ["trainer.max_prompt_length=64"],
            "error: trainer.max_prompt_length: unknown key (did you mean "
            "'generator.max_prompt_length'?)",
        ),
        # before: "error: generator.lr: unknown key", no hint; the group's own places first
        (
            ["++generator.lr=1e-5"],
            "error: generator.lr: unknown key (did you mean 'trainer.policy_optimizer.lr' or "
            "'trainer.critic_optimizer.lr'?)",
        ),
        # before: "error: generator.gpu_memory_utilization: unknown key", a key of the other option
        (
            ["generator=hf", "generator.gpu_memory_utilization=0.5"],
            "error: generator.gpu_memory_utilization: unknown key (generator=vllm has it, not "
            "generator=hf)",
        ),
    ],
)
def test_a_key_in_the_wrong_place_names_where_it_is(tmp_path, args, expected):
    result = run_cli(tmp_path, "experiment=smoke", "trainer.dry_run=true", *args)
    assert (result.returncode, result.stderr.strip()) == (2, expected)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(("key", "module"), [("model.path", False), ("model.tokenizer_path", True)])
def test_unresolvable_model_is_an_error_not_a_traceback(tmp_path, key, module):
    result = run_cli(
        tmp_path,
        "experiment=smoke",
        f"{key}=Nope/NotAModel",
        "trainer.output_dir=run",
        module=module,
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    [error] = result.stderr.strip().splitlines()  # found by the pre-flight, before Ray starts
    assert error.startswith(f"error: {key}: 'Nope/NotAModel' could not be resolved. Tried: ")
    tried = error.split(" Tried: ", 1)[1].split("; ")  # local directory, HF cache, hub, the fix
    assert "local directory" in tried[0] and "HF cache" in tried[1]
    assert tried[2].startswith("HF hub: skipped (HF_HUB_OFFLINE")
    assert error.endswith(f"set {key} to a local directory.") and " Fix: " in error
    assert not (tmp_path / "run").exists()


# -- the pre-flight check: what the config names, checked in the dry run too ------------

LONG_PROMPT = "word " * 200
"""About 200 tokens with the tiny model's tokenizer; smoke's generator.max_prompt_length is 128."""

DATA_FILES = {
    "ok.jsonl": '{"prompt": "What is 1 + 1?", "answer": "2"}\n{"prompt": "What is 2 + 2?", "answer": "4"}\n',
    "no_prompt.jsonl": '{"prompt": "What is 1 + 1?", "answer": "2"}\n{"question": "x", "answer": "1"}\n',
    "not_json.jsonl": '{"prompt": "What is 1 + 1?", "answer": "2"}\n{oops\n',
    "long.jsonl": "".join(
        json.dumps({"prompt": p, "answer": "1"}) + "\n"
        for p in ["What is 1 + 1?", LONG_PROMPT, "What is 2 + 2?", LONG_PROMPT, "What is 3 + 3?"]
    ),
}


def dry_run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``skyrl-train experiment=smoke trainer.dry_run=true`` with the data files above in the
    working directory."""
    for name, text in DATA_FILES.items():
        (tmp_path / name).write_text(text)
    return run_cli(
        tmp_path,
        "experiment=smoke",
        "trainer.dry_run=true",
        f"trainer.output_dir={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        *overrides,
        env={"HF_HUB_OFFLINE": "1"},
    )


FILES = ("data.source=files", "data.train_files=[ok.jsonl]")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ("data.source=files", "data.train_files=[missing.jsonl]"),
            "error: data.train_files[0]: missing.jsonl: file not found",
        ),
        (
            ("data.source=files", "data.train_files=[no_prompt.jsonl]"),
            "error: data.train_files[0]: no_prompt.jsonl: row 2: missing column 'prompt' "
            "(has ['answer', 'question'])",
        ),
        (
            (*FILES, "data.eval_files=[ok.jsonl,not_json.jsonl]"),
            "error: data.eval_files[1]: not_json.jsonl: row 2: invalid JSON "
            "(Expecting property name enclosed in double quotes)",
        ),
        (("model.path=/nonexistent",), "error: model.path: '/nonexistent': no such directory"),
        (
            ("environment._target_=no.such.Class",),
            "error: environment._target_: cannot import 'no.such.Class': No module named 'no'",
        ),
        (
            ("environment.name=mathh",),
            "error: environment.name: unknown environment 'mathh' (did you mean 'math'?)",
        ),
        (
            ("generator.agent=no.such.driver",),
            "error: generator.agent: 'no.such.driver' does not import: No module named 'no'",
        ),
    ],
)
def test_dry_run_checks_what_the_config_names(tmp_path, overrides, expected):
    result = dry_run(tmp_path, *overrides)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{result.stderr}"
    assert lines[0].startswith(expected), lines[0]
    assert "skyrl run plan" not in result.stdout
    assert not (tmp_path / "out").exists(), "a refused run must not create its output dir"


def test_overlong_prompt_error_names_the_row_its_length_and_the_count(tmp_path):
    result = dry_run(tmp_path, "data.source=files", "data.train_files=[long.jsonl]")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert re.fullmatch(
        r"error: data\.train_files\[0\]: long\.jsonl: row 2: prompt is (\d+) tokens \(after the "
        r"chat template\), over generator\.max_prompt_length=128; 2 of 5 train prompts are too "
        r"long \(shorten them, raise generator\.max_prompt_length or set "
        r"data\.overlong_prompts=drop\)",
        line,
    ), line


def test_overlong_prompts_dropped_with_one_warning_and_the_count_in_the_plan(tmp_path):
    result = dry_run(
        tmp_path,
        "data.source=files",
        "data.train_files=[long.jsonl]",
        "data.eval_files=[long.jsonl,ok.jsonl]",
        "data.overlong_prompts=drop",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().splitlines() == [
        "warning: data.overlong_prompts=drop: dropped 2 of 5 train prompts longer than "
        "generator.max_prompt_length=128 tokens",
        "warning: data.overlong_prompts=drop: dropped 2 of 7 eval prompts longer than "
        "generator.max_prompt_length=128 tokens",
    ]
    plan = {
        line[2:24].strip(): line[24:].strip()
        for line in result.stdout.splitlines()
        if line.startswith("  ")
    }
    assert plan["over-long prompts"] == "dropped: train 2, eval 2 (data.overlong_prompts=drop)"
    assert plan["prompts"].startswith("train 3, eval 5 (longest ")
    assert (tmp_path / "out" / "resolved_config.yaml").exists()


def test_keys_can_be_added_under_a_free_form_mapping(tmp_path):
    # a key the env's constructor takes: the math env refuses one it does not know
    result = run_cli(
        tmp_path,
        "+environment.kwargs.max_observation_chars=1",
        "trainer.dry_run=true",
        f"trainer.output_dir={tmp_path / 'out'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / "out" / "resolved_config.yaml").read_text())
    assert saved["environment"]["kwargs"] == {"max_observation_chars": 1}


def test_unknown_option_lists_available(tmp_path):
    result = run_cli(tmp_path, "algorithm=grp")
    assert result.returncode == 2
    assert "(did you mean 'grpo'?)" in result.stderr
    assert "available: " in result.stderr and "grpo" in result.stderr.split("available: ")[1]


def test_cfg_job_prints_composed_config(tmp_path):
    result = run_cli(tmp_path, "--cfg", "job", "trainer.train_batch_size=32")
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert set(cfg) >= {"trainer", "generator", "algorithm", "environment", "data", "model"}
    assert cfg["trainer"]["train_batch_size"] == 32
    assert cfg["algorithm"]["advantage_estimator"] == "grpo"


def test_help_lists_groups_and_their_options_without_the_schemas(tmp_path):
    result = run_cli(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("usage: skyrl-train [GROUP=OPTION ...] [KEY=VALUE ...]\n")
    groups = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:2] == "  "}
    # the main job's defaults (conf/config.yaml) are starred; the typed schemas are not options
    assert groups["algorithm"] == [
        "cispo", "dapo", "dr_grpo", "*grpo", "gspo", "ppo", "reinforce_pp", "rloo"
    ]  # fmt: skip
    assert groups["generator"] == ["hf", "*vllm"]
    assert groups["trainer"] == ["*deepspeed"]
    assert "_schema" not in out and "powered by Hydra" not in out
    assert "train_batch_size: 8" not in out  # no config dump: that is --cfg job
    assert "skyrl-train --hydra-help" in out


def test_hydra_help_is_still_hydras(tmp_path):
    result = run_cli(tmp_path, "--hydra-help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Hydra (")


def test_dry_run_prints_plan_and_saves_resolved_config(tmp_path):
    result = run_cli(tmp_path, "trainer.dry_run=true", "hydra.run.dir=run0", module=True)
    assert result.returncode == 0, result.stderr
    # 16 prompts / 8 per mini-batch = 2 mini-batches x 1 epoch = 2 optimizer steps
    plan = {
        line.split("  ")[1]: line.split()[-1]
        for line in result.stdout.splitlines()
        if line.startswith("  ")
    }
    assert plan["optimizer steps / step"] == "2"
    saved = yaml.safe_load((tmp_path / "run0" / "resolved_config.yaml").read_text())
    assert saved["trainer"]["dry_run"] is True


def test_resolved_config_holds_the_values_validate_decided(tmp_path):
    """``auto`` precision and the asynchronous default TIS cap are saved as the run uses
    them, not as typed on the command line."""
    result = run_cli(
        tmp_path, "trainer.dry_run=true", "hydra.run.dir=run0", "trainer.precision=auto",
        "trainer.max_staleness=1", "generator.num_cpus_per_engine=1", module=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = yaml.safe_load((tmp_path / "run0" / "resolved_config.yaml").read_text())
    assert saved["trainer"]["precision"] in ("fp32", "bf16")
    assert saved["algorithm"]["tis_cap"] == 2.0  # ASYNC_TIS_CAP
    assert f"DeepSpeed ZeRO-0 {saved['trainer']['precision']}" in result.stdout  # the plan


def test_hydra_does_not_chdir(tmp_path):
    result = run_cli(
        tmp_path, "trainer.dry_run=true", "hydra.run.dir=elsewhere", "trainer.output_dir=rel_out"
    )
    assert result.returncode == 0, result.stderr
    # a relative output_dir resolves against the launch directory, not Hydra's run dir
    assert (tmp_path / "rel_out" / "resolved_config.yaml").exists()


def test_multirun_gives_each_job_its_own_dir(tmp_path):
    result = run_cli(
        tmp_path,
        "-m",
        "algorithm=grpo",
        "trainer.seed=1,2",
        "trainer.dry_run=true",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 0, result.stderr
    seeds = sorted(
        yaml.safe_load((tmp_path / "sweep" / str(i) / "resolved_config.yaml").read_text())[
            "trainer"
        ]["seed"]
        for i in (0, 1)
    )
    assert seeds == [1, 2]


def test_multirun_checks_every_sweep_value_first(tmp_path):
    result = run_cli(
        tmp_path,
        "-m",
        "trainer.train_batch_size=16,abc",
        "trainer.dry_run=true",
        "hydra.sweep.dir=sweep",
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: trainer.train_batch_size: Value 'abc' of type 'str' could not be converted to Integer"
    )
    assert not (tmp_path / "sweep").exists(), "no job may start when one sweep value is invalid"


def test_multirun_checks_every_job_first(tmp_path):
    """Each value is fine alone; job 3 (batch 12, mini-batch 8) is not: refused before job 0."""
    result = run_cli(
        tmp_path, "-m", "trainer.train_batch_size=8,12", "trainer.policy_mini_batch_size=4,8",
        "trainer.dry_run=true", "hydra.sweep.dir=sweep",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: trainer.policy_mini_batch_size: train_batch_size (12) must be divisible by "
        "policy_mini_batch_size (8); in sweep job 3 of 4: trainer.train_batch_size=12 "
        "trainer.policy_mini_batch_size=8"
    )
    assert not (tmp_path / "sweep").exists(), "no job may start when one job is invalid"


def test_multirun_preflights_every_job_first(tmp_path):
    """Each job's pre-flight runs before job 0 starts: job 1 asks for 10 prompts a step of the
    smoke experiment's 8 training prompts. Before: job 0 ran whole (a real run trained it),
    then job 1 failed at its start with this line (without the job)."""
    result = run_cli(
        tmp_path, "-m", "experiment=smoke", "trainer.train_batch_size=4,10",
        "trainer.dry_run=true", "hydra.sweep.dir=sweep", env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (
        "error: data.num_train_prompts: 8 training prompts, fewer than "
        "trainer.train_batch_size=10; in sweep job 1 of 2: trainer.train_batch_size=10"
    )
    assert not (tmp_path / "sweep").exists(), "no job may start when one job would fail"


def test_multirun_preflight_names_the_job_among_several_swept_keys(tmp_path):
    """Two swept keys: job 1 (a missing model) is named with both its values, before job 0."""
    result = run_cli(
        tmp_path, "-m", "experiment=smoke", "model.path=skyrl-tiny,/nonexistent",
        "trainer.seed=1,2", "trainer.dry_run=true", "hydra.sweep.dir=sweep",
        env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: model.path: '/nonexistent': no such directory"), line
    # jobs 0-1 take skyrl-tiny (seeds 1, 2), job 2 is the first with /nonexistent
    assert line.endswith("; in sweep job 2 of 4: model.path=/nonexistent trainer.seed=1"), line
    assert not (tmp_path / "sweep").exists()


def test_a_job_failing_at_run_time_is_one_line_and_the_jobs_before_it_are_kept(
    tmp_path, monkeypatch, capfd
):
    """What only a job's run finds (its pre-flight passed in the precheck) ends the sweep with
    the single run's error line and exit code, after Hydra's line naming the job, no
    traceback; job 0's outputs and the summary, with job 1 marked failed, stay."""
    from skyrl.config.errors import ConfigError

    def run(cfg):
        if cfg.trainer.seed == 2:
            raise ConfigError("model.path", "gone since the precheck")
        out = tmp_path / "sweep" / "0"
        (out / "metrics.jsonl").write_text('{"step": 1, "generate/reward_mean": 0.5}\n')
        return skyrl.api.TrainResult(out)

    import skyrl.api

    argv = ["-m", "experiment=smoke", "trainer.seed=1,2", "hydra.sweep.dir=sweep",
            "hydra/callbacks=sweep_summary"]  # fmt: skip
    code = main_in_process(tmp_path, monkeypatch, argv, run)
    err = capfd.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    job_line, error = err.strip().splitlines()[-2:]
    assert job_line == (
        "Error executing job with overrides: ['experiment=smoke', 'trainer.seed=2']"
    )
    assert error == "error: model.path: gone since the precheck"
    with open(tmp_path / "sweep" / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["steps"]) for r in rows] == [
        ("0", "ok", "1"),
        ("1", "failed", "0"),
    ]
    assert rows[1]["error"] == error


def test_a_bug_in_a_sweep_job_is_still_reported_as_hydra_does(tmp_path, monkeypatch, capfd):
    """Only a job's bad input (and a run failure) become one line; a bug keeps Hydra's
    trimmed traceback and its HYDRA_FULL_ERROR hint, and the environment is left as it was."""
    from hydra.core.global_hydra import GlobalHydra

    import skyrl.cli

    def bug(cfg):
        raise RuntimeError("a bug in the job")

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(skyrl.cli, "run", bug)
    monkeypatch.setattr(sys, "argv", ["skyrl-train", "-m", "trainer.seed=1,2", "hydra.sweep.dir=s"])
    try:
        with pytest.raises(SystemExit) as exited:
            skyrl.cli.main()
    finally:
        GlobalHydra.instance().clear()
    assert exited.value.code == 1
    err = capfd.readouterr().err
    assert err.startswith("Error executing job with overrides: ['trainer.seed=1']\nTraceback")
    assert "RuntimeError: a bug in the job" in err and "HYDRA_FULL_ERROR=1" in err
    assert "HYDRA_FULL_ERROR" not in os.environ


# -- interrupts: Ctrl-C and SIGTERM end a run (or a sweep) in one line -----------------------


def main_in_process(tmp_path, monkeypatch, argv: list[str], run) -> int:
    """``skyrl.cli.main()`` in this process with ``run`` as the Hydra task; returns its exit
    code (the final ``os._exit`` is replaced by ``SystemExit``)."""
    from hydra.core.global_hydra import GlobalHydra

    import skyrl.cli

    def exit_now(code: int):
        raise SystemExit(code)

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setattr(skyrl.cli, "run", run)
    monkeypatch.setattr(skyrl.cli, "_exit_now", exit_now)
    monkeypatch.setattr(sys, "argv", ["skyrl-train", *argv])
    try:
        with pytest.raises(SystemExit) as exited:
            skyrl.cli.main()
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(exited.value.code, int)
    return exited.value.code


def _users_loss():
    raise RuntimeError("boom: the user's loss failed")


def test_an_exception_raised_in_a_worker_ends_the_run_in_one_line(tmp_path, monkeypatch, capfd):
    """A worker's exception reaches the command line as ``WorkerGroup.get`` raises it: a
    ``RuntimeError`` naming role, rank and cause, from Ray's ``RayTaskError`` (which carries
    the worker's traceback as text). Before: Hydra printed both tracebacks (~50 lines), exit
    1. Now the README's one line, exit 1, with where the worker raised it."""
    import traceback

    from ray.exceptions import RayTaskError

    try:
        _users_loss()
    except RuntimeError as exc:
        worker_traceback, cause = traceback.format_exc(), exc
    task_error = RayTaskError(
        "train_mini_batch", worker_traceback, cause, proctitle="ray::TrainingWorker", pid=1,
        ip="127.0.0.1",
    ).as_instanceof_cause()  # as ``ray.get`` raises it  # fmt: skip

    def run(cfg):
        message = "policy worker rank 0 failed: RuntimeError: boom: the user's loss failed"
        raise RuntimeError(message) from task_error

    code = main_in_process(tmp_path, monkeypatch, ["experiment=smoke"], run)
    err = capfd.readouterr().err
    raise_line = _users_loss.__code__.co_firstlineno + 1  # the line after the ``def``
    assert code == 1
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "error: policy worker rank 0 failed: RuntimeError: boom: the user's loss failed "
        f"(raised at {__file__}:{raise_line}, in _users_loss)"
    )


def test_ctrl_c_ends_a_run_in_one_line_naming_the_checkpoint_to_resume(
    tmp_path, monkeypatch, capfd
):
    # Ctrl-C printed a 50-80 line KeyboardInterrupt traceback (from ray.get) and exited 1
    from skyrl.trainer.checkpoint import CheckpointManager

    out = tmp_path / "run"

    def run(cfg):
        manager = CheckpointManager(out / "checkpoints", 0)
        manager.commit(manager.temp_dir(2), 2, {"step": 2})  # then Ctrl-C in step 3
        raise KeyboardInterrupt

    code = main_in_process(
        tmp_path, monkeypatch, ["experiment=smoke", f"trainer.output_dir={out}"], run
    )
    err = capfd.readouterr().err
    assert code == 130  # 128 + SIGINT (2), as a shell reports Ctrl-C
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"interrupted; last checkpoint: {out / 'checkpoints' / 'global_step_2'} "
        "(trainer.resume=auto continues from it)"
    )


def test_ctrl_c_names_the_checkpoint_of_an_output_dir_under_home(tmp_path, monkeypatch, capfd):
    # trainer.output_dir='~/run': the run writes under the home (skyrl.train expands it, where
    # it wrote to <cwd>/~/run before), and the line must look there too
    from skyrl.trainer.checkpoint import CheckpointManager

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "home" / "run"

    def run(cfg):
        manager = CheckpointManager(out / "checkpoints", 0)
        manager.commit(manager.temp_dir(2), 2, {"step": 2})  # then Ctrl-C in step 3
        raise KeyboardInterrupt

    code = main_in_process(
        tmp_path, monkeypatch, ["experiment=smoke", "trainer.output_dir='~/run'"], run
    )
    assert code == 130
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        f"interrupted; last checkpoint: {out / 'checkpoints' / 'global_step_2'} "
        "(trainer.resume=auto continues from it)"
    )


def test_sigterm_ends_a_run_in_one_line_and_restores_the_handler(tmp_path, monkeypatch, capfd):
    # SIGTERM: Ray's handler (sys.exit(15)) and a C++ stack banner, then SIGABRT (exit -6)
    import signal
    import time

    before = signal.getsignal(signal.SIGTERM)

    def run(cfg):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler interrupts the sleep
        raise AssertionError("SIGTERM did not stop the run")

    code = main_in_process(tmp_path, monkeypatch, ["experiment=smoke", "trainer.output_dir=r"], run)
    err = capfd.readouterr().err
    assert code == 143  # 128 + SIGTERM (15)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "terminated (SIGTERM); no checkpoint was saved"
    assert signal.getsignal(signal.SIGTERM) is before


def test_ctrl_c_in_a_sweep_job_ends_the_sweep_in_one_line(tmp_path, monkeypatch, capfd):
    # a failed job lets the sweeper go on; an interrupted one stops the sweep
    jobs: list[int] = []

    def run(cfg):
        jobs.append(cfg.trainer.seed)
        raise KeyboardInterrupt

    argv = ["-m", "experiment=smoke", "trainer.seed=1,2", "hydra.sweep.dir=s"]
    code = main_in_process(tmp_path, monkeypatch, argv, run)
    err = capfd.readouterr().err
    assert code == 130 and jobs == [1]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "interrupted; no checkpoint was saved"
    assert "HYDRA_FULL_ERROR" not in os.environ


STALLING_TRAINER = """
import time

from skyrl.trainer import trainer


class StallingTrainer:
    # stands in for RLTrainer once Ray is up: the signal lands after ray.init
    def __init__(self, cfg, output_dir, prompts=None):
        pass

    def train(self):
        print("training", flush=True)
        time.sleep(60)

    def shutdown(self):
        print("shutdown ran", flush=True)


trainer.RLTrainer = StallingTrainer
"""


def test_sigterm_after_ray_started_exits_143_in_one_line(tmp_path):
    # ray.init replaced skyrl's SIGTERM handler with its own sys.exit and a C++ banner
    # ("*** SIGTERM received ..."); the interpreter then aborted in its finalization
    # (exit -6, SIGABRT) after the cleanup
    import signal
    import time

    (tmp_path / "stalling_trainer.py").write_text(STALLING_TRAINER)
    cmd = [
        SKYRL_TRAIN, "experiment=smoke", "trainer.output_dir=run", "imports=[stalling_trainer]",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "training":
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err[-3000:]
        assert "shutdown ran" in out
        assert "Traceback" not in err and "SIGTERM received" not in err
        assert err.strip().splitlines()[-1] == "terminated (SIGTERM); no checkpoint was saved"
        deadline = time.monotonic() + 20  # Ray's own processes stop with the run
        while time.monotonic() < deadline and _group_alive(proc.pid):
            time.sleep(0.5)
        assert not _group_alive(proc.pid)
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
