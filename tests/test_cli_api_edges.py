"""The edges of the command line and the Python API: ``--package`` naming nothing, a scalar
where a list goes, ``skyrl.evaluate``'s ``output_dir``, ``dir(skyrl)`` before the API is
imported, and the eval table's env errors. The command lines run the real entry points in a
subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import one_line, run  # tests/ is on sys.path

import skyrl
from skyrl.config import ConfigError, register_configs
from skyrl.config.precheck import command_line_problem
from skyrl.config.validate import validate
from skyrl.eval_cli import EvalResult, format_eval_table

TINY = ["experiment=smoke", "data.num_eval_prompts=1", "generator.eval_n_samples_per_prompt=1"]


@pytest.mark.parametrize("command", ["skyrl-train", "skyrl-eval"])
def test_a_package_naming_nothing_is_one_error_line(tmp_path, command):
    # before: Hydra's "package 'trainer.nope' not found in config", no error: prefix, exit 1
    line = one_line(run(tmp_path, command, "--cfg", "job", "--package", "trainer.seedd"))
    assert line == (
        "error: --package: trainer.seedd: no such key in the config --cfg job prints "
        "(did you mean 'seed'?)"
    )


def test_a_package_of_hydras_config_in_the_job_config_says_where_it_is(tmp_path):
    line = one_line(run(tmp_path, "skyrl-train", "--cfg", "job", "--package", "hydra.run.dir"))
    assert line == (
        "error: --package: hydra.run.dir: no such key in the config --cfg job prints "
        "(Hydra's own config: --cfg hydra prints it)"
    )


def test_a_package_without_cfg_is_refused(tmp_path):
    # before: ignored; the run (here a dry run) went on as if --package were not there
    line = one_line(run(tmp_path, "skyrl-train", "--package", "trainer", "trainer.dry_run=true"))
    assert (
        line == "error: --package: only with --cfg (it picks the part of the config --cfg prints)"
    )
    assert not (tmp_path / "outputs").exists()


SHELLS = "takes one of install=SHELL, uninstall=SHELL, query=SHELL (SHELL: bash, fish, zsh)"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # before, both: a traceback ending "ValueError: Expecting one subcommand from
        # ['install', 'uninstall', 'query'] to be set", exit 1
        (["--shell-completion"], f"error: --shell-completion: {SHELLS}"),
        (
            ["-sc", "install=bash", "uninstall=bash"],
            f"error: --shell-completion: install and uninstall: {SHELLS}",
        ),
        # before: a traceback ending "ValueError: No completion plugin for 'fsh' found,
        # available :" and the shells on the lines after it
        (
            ["-sc", "install=fsh"],
            f"error: --shell-completion: install=fsh: no such shell; {SHELLS}",
        ),
    ],
)
@pytest.mark.parametrize("command", ["skyrl-train", "skyrl-eval"])
def test_shell_completion_without_one_shell_is_one_line(tmp_path, command, args, expected):
    assert one_line(run(tmp_path, command, *args)) == expected


def test_eval_prints_a_package_after_its_overrides(tmp_path):
    """``skyrl-eval`` with ``data.source=files``, its overrides before ``--cfg job``: before,
    the check appended ``data.train_files=...`` after the flags (an unrecognized argument)
    and said ``source=files needs at least one eval file`` of a command line naming one."""
    prompts = tmp_path / "eval.jsonl"
    prompts.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    files = ["data.source=files", f"data.eval_files=[{prompts}]"]
    result = run(tmp_path, "skyrl-eval", *files, "--cfg", "job", "--package", "data.eval_files")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["# @package data.eval_files", f"- {prompts}"]


def test_a_scalar_where_a_list_goes_says_how_to_write_the_list(tmp_path):
    # before: "error: model.lora.target_modules: Invalid value assigned: str is not a
    # ListConfig, list or tuple." (target_modules is list[str]; all-linear is one entry of it)
    expected = (
        "error: model.lora.target_modules: takes a list, got the str 'all-linear'; write a "
        "list in brackets: model.lora.target_modules=[all-linear]"
    )
    assert (
        one_line(run(tmp_path, "skyrl-train", "model.lora.target_modules=all-linear")) == expected
    )
    from skyrl.api import config_error_line

    register_configs()
    problem = command_line_problem(["-m", "data.eval_files=a.jsonl,b.jsonl"])
    assert config_error_line(problem) == (
        "error: data.eval_files: takes a list, got the str 'a.jsonl'; write a list in brackets: "
        "data.eval_files=[a.jsonl]"
    )
    with pytest.raises(ConfigError) as caught:
        skyrl.compose({"model.lora.target_modules": "all-linear"})
    assert str(caught.value) == expected.removeprefix("error: ")


@pytest.mark.parametrize("output_dir", [None, 3])
def test_evaluate_without_an_output_dir_is_a_type_error_saying_so(output_dir):
    # before: "TypeError: expected str, bytes or os.PathLike object, not NoneType"
    with pytest.raises(TypeError) as caught:
        skyrl.evaluate(skyrl.compose(TINY), output_dir)
    assert str(caught.value) == (
        "skyrl.evaluate takes output_dir as a str or Path (the directory to write the results "
        f"in, e.g. 'outputs/mine'), got {output_dir!r}"
    )


def test_train_with_an_output_dir_not_a_path_is_a_type_error_saying_so(tmp_path, monkeypatch):
    # before: "TypeError: expected str, bytes or os.PathLike object, not int"; None is the default
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError) as caught:
        skyrl.train(skyrl.compose(["experiment=smoke", "trainer.dry_run=true"]), 3)
    assert str(caught.value) == (
        "skyrl.train takes output_dir as a str or Path (the directory to write the results in, "
        "e.g. 'outputs/mine'), got 3"
    )
    assert not any(tmp_path.iterdir())


def test_a_relative_output_dir_gives_absolute_result_paths(tmp_path, monkeypatch):
    """As ``skyrl.train``'s ``TrainResult``: taken from the working directory at the call."""
    monkeypatch.chdir(tmp_path)
    result = skyrl.evaluate(skyrl.compose(TINY), "evals")
    monkeypatch.chdir("/")  # a notebook's %cd after the call: the paths still name the files
    assert result.output_file == tmp_path / "evals" / "eval_results.json"
    assert result.samples_file == tmp_path / "evals" / "eval_results.samples.jsonl"
    assert result.output_file.is_file() and result.samples_file.is_file()


def test_dir_lists_the_api_before_it_is_imported():
    # a fresh interpreter: the API is imported on first use (module doc of skyrl)
    code = "import json, skyrl, sys; print(json.dumps([dir(skyrl), 'skyrl.api' in sys.modules]))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    names, api_imported = json.loads(out.stdout)
    assert {"EvalResult", "TrainResult", "compose", "evaluate", "train"} <= set(names)
    assert "__getattr__" in names  # the module's own names stay listed
    assert not api_imported


def _table(metrics: dict[str, float], num_prompts: dict[str, int]) -> list[str]:
    cfg = validate(skyrl.compose(["experiment=smoke", "generator.eval_n_samples_per_prompt=2"]))
    result = EvalResult("m", metrics, num_prompts, Path("/r.json"), Path("/r.samples.jsonl"))
    return format_eval_table(result, cfg).splitlines()


def test_the_eval_table_shows_env_errors_when_there_are_any():
    # 2 sources x 2 prompts x 2 samples = 8 samples, 3 of which the env failed
    metrics = {"eval/pass@1": 0.25, "eval/pass@2": 0.5, "eval/reward_mean": 0.25}
    metrics |= {"eval/a/pass@1": 0.5, "eval/a/pass@2": 0.5, "eval/a/reward_mean": 0.5}
    metrics |= {"eval/bb/pass@1": 0.0, "eval/bb/pass@2": 0.5, "eval/bb/reward_mean": 0.0}
    lines = _table({**metrics, "eval/env_errors": 3.0}, {"a": 2, "bb": 2})
    assert lines[1:] == [
        "source  prompts  samples       pass@1       pass@2  reward_mean   env_errors",
        "a             2        4        0.500        0.500        0.500",
        "bb            2        4        0.000        0.500        0.000",
        "all           4        8        0.250        0.500        0.250            3",
        "results: /r.json",
    ]
    # none failed: the table as before, without the column
    assert _table({**metrics, "eval/env_errors": 0.0}, {"a": 2, "bb": 2})[1].split() == [
        "source",
        "prompts",
        "samples",
        "pass@1",
        "pass@2",
        "reward_mean",
    ]


def test_compose_names_a_config_name_naming_nothing():
    # before: Hydra's MissingConfigException, "Cannot find primary config 'nope'. Check that
    # it's in your config search path." and the search path on three more lines
    with pytest.raises(ConfigError) as caught:
        skyrl.compose([], config_name="nope")
    assert caught.value.key == "config_name"
    conf = Path(skyrl.__file__).parent / "conf"
    assert caught.value.message == f"'nope': no such config in {conf} (config)"
    # None composed Hydra's empty config: no schema, no key, no error until much later
    with pytest.raises(ConfigError) as caught:
        skyrl.compose([], config_name=None)  # type: ignore[arg-type]
    assert caught.value.key == "config_name"
    assert caught.value.message == f"None is not a config's name, one of {conf}'s (config)"


def test_ctrl_c_ends_an_eval_in_one_line(monkeypatch, capsys):
    """Before: the ``KeyboardInterrupt`` traceback through the engine's serving loop, exit 1
    (``skyrl-train`` ends in one line, exit 130 = 128 + SIGINT 2)."""
    import skyrl.cli
    from skyrl import eval_cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(sys, "argv", ["skyrl-eval", "experiment=smoke"])
    monkeypatch.setattr(eval_cli, "_hydra_main", interrupted)
    monkeypatch.setattr(skyrl.cli, "_exit_now", exit_now)
    try:
        eval_cli.main()
    except BaseException as exc:  # before the fix: the KeyboardInterrupt itself
        ended: BaseException | None = exc
    else:
        ended = None
    assert isinstance(ended, SystemExit) and ended.code == 130
    assert capsys.readouterr().err == "interrupted: the eval in progress wrote no results\n"
