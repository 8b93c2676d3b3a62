"""``skyrl-eval``: a model, a run and a checkpoint evaluated without training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import skyrl
from skyrl import eval_cli
from skyrl.config import ConfigError
from skyrl.eval_cli import evaluate
from skyrl.trainer.checkpoint import EXPORT_RECORD, exported_step

SKYRL_EVAL = str(Path(sys.executable).parent / "skyrl-eval")
SKYRL_TRAIN = str(Path(sys.executable).parent / "skyrl-train")


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )


def assert_one_line(result: subprocess.CompletedProcess, expected: str) -> None:
    """Exit 2 with one line on stderr that starts with ``expected``, and no traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def make(root: Path, layout: dict[str, str | None]) -> None:
    """Under ``root``: a directory for each None, else a file holding the text."""
    for name, text in layout.items():
        path = root / name
        if text is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def train_smoke(out: Path, *overrides: str) -> Path:
    """A two-step smoke run: its final_hf and its checkpoint of step 2 hold the same weights."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [SKYRL_TRAIN, "experiment=smoke", f"trainer.output_dir={out}", *overrides]
    result = run(cmd, out.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> Path:
    return train_smoke(tmp_path_factory.mktemp("run") / "run")


@pytest.mark.slow
def test_eval_of_a_run_prints_the_table_and_writes_json(smoke_run, tmp_path):
    result = run([SKYRL_EVAL, "experiment=smoke", f"eval.checkpoint={smoke_run}"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    # smoke: 4 eval prompts, 4 samples each (the root config's eval_n_samples_per_prompt)
    header = next(i for i, line in enumerate(lines) if line.startswith("source"))
    assert lines[header].split() == [
        "source",
        "prompts",
        "samples",
        "pass@1",
        "pass@4",
        "reward_mean",
    ]
    assert lines[header + 1].split()[:3] == ["arithmetic", "4", "16"]
    assert lines[header - 1].startswith(f"eval of {smoke_run / 'final_hf'}")
    assert exported_step(smoke_run / "final_hf") == 2  # exported after step 2, latest step 2
    results = Path(lines[header + 2].removeprefix("results: "))
    assert (
        results.parent.parent.parent == tmp_path / "outputs" / "eval"
    )  # outputs/eval/<date>/<time>
    record = json.loads(results.read_text())
    assert record["num_prompts"] == {"arithmetic": 4}
    assert record["samples_per_prompt"] == 4
    # the seed the samples came from, derived from trainer.seed 42 when eval_sampling has none
    assert record["sampling"]["seed"] == 42 * 1_000_003 % 2**31
    assert set(record["metrics"]) >= {"eval/pass@1", "eval/pass@4", "eval/arithmetic/pass@1"}
    samples = Path(record["samples_file"]).read_text().splitlines()
    assert len(samples) == 16
    assert {json.loads(s)["data_source"] for s in samples} == {"arithmetic"}


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [0, 3])
def test_a_checkpoint_evaluates_like_the_exported_model(smoke_run, tmp_path, zero_stage):
    """The checkpoint's weights, read from its DeepSpeed files (ZeRO-3: gathered from the
    ranks' partitions), give token for token the samples of the run's final_hf."""
    if zero_stage == 3:
        smoke_run = train_smoke(tmp_path / "run3", "trainer.zero_stage=3")
    samples = []
    for name, target in [("ckpt", smoke_run / "checkpoints" / "global_step_2"), ("hf", smoke_run)]:
        cfg = skyrl.compose(["experiment=smoke", f"eval.checkpoint={target}"])
        result = evaluate(cfg, tmp_path / name)
        assert result.model == str(target if name == "ckpt" else target / "final_hf")
        samples.append([json.loads(line) for line in result.samples_file.read_text().splitlines()])
    assert [s["response_ids"] for s in samples[0]] == [s["response_ids"] for s in samples[1]]
    assert len(samples[0]) == 16


def test_model_path_is_evaluated_on_the_composed_eval_prompts(tmp_path):
    cfg = skyrl.compose(
        ["experiment=smoke", "data.num_eval_prompts=3", "generator.eval_n_samples_per_prompt=2"]
    )
    result = evaluate(cfg, tmp_path)
    assert result.model == "skyrl-tiny"
    assert result.num_prompts == {"arithmetic": 3}
    assert 0.0 <= result.metrics["eval/pass@1"] <= result.metrics["eval/pass@2"] <= 1.0
    assert len(result.samples_file.read_text().splitlines()) == 6  # 3 prompts x 2 samples
    assert json.loads(result.output_file.read_text())["metrics"] == result.metrics


def test_samples_are_named_after_the_output_file(tmp_path):
    """Two evals writing a.json and b.json into one directory keep their own samples."""
    small = ["experiment=smoke", "data.num_eval_prompts=2", "generator.eval_n_samples_per_prompt=1"]
    results = {}
    for name in ("a", "b"):
        cfg = skyrl.compose([*small, f"eval.output_file={tmp_path / 'res' / name}.json"])
        results[name] = evaluate(cfg, tmp_path / "run" / name)
    for name, result in results.items():
        assert result.samples_file == tmp_path / "res" / f"{name}.samples.jsonl"
        assert len(result.samples_file.read_text().splitlines()) == 2  # 2 prompts x 1 sample
        record = json.loads(result.output_file.read_text())
        assert record["samples_file"] == str(result.samples_file)
    assert not list((tmp_path / "run").rglob("*.jsonl"))


def test_files_source_needs_no_training_files(tmp_path, monkeypatch):
    """``data.source=files`` with only ``data.eval_files``: eval never reads training files
    (the command line's check and ``skyrl.evaluate`` alike)."""
    (tmp_path / "good.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in "xy")
    )
    overrides = [
        "experiment=smoke",
        "data.source=files",
        "data.eval_files=[good.jsonl]",
        "generator.eval_n_samples_per_prompt=1",
        "eval.output_file=res.json",
    ]
    result = run([SKYRL_EVAL, *overrides], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "res.json").read_text())["num_prompts"] == {"good": 2}
    monkeypatch.chdir(tmp_path)
    cfg = skyrl.compose(overrides)
    assert evaluate(cfg, tmp_path / "run").num_prompts == {"good": 2}
    assert list(cfg.data.train_files) == []  # the caller's config is left as it was


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["eval.checkpoint=no/such/run"],
            "error: eval.checkpoint: no/such/run: neither a run directory",
        ),
        (
            ["data.num_eval_prompts=0"],
            "error: data.num_eval_prompts: no eval prompts to evaluate on",
        ),
        (["eval.chekpoint=x"], "error: eval.chekpoint: unknown key (did you mean 'checkpoint'?)"),
        (["model.path=/nonexistent"], "error: model.path: '/nonexistent': no such directory"),
        (["environment._target_=no.such.Env"], "error: environment._target_: cannot import"),
    ],
)
def test_bad_input_is_one_line(tmp_path, overrides, expected):
    assert_one_line(run([SKYRL_EVAL, "experiment=smoke", *overrides], tmp_path), expected)


# not "z3": with the working directory on sys.path (python -m pytest), a folder of that name
# is imported as the z3 solver package torch looks for, and later tests fail in torch.fx
Z3_STATE = "zero3/policy/state/zero_pp_rank_0_mp_rank_00_model_states.pt"


@pytest.mark.parametrize(
    ("layout", "override", "expected"),
    [
        (
            {"resdir": None},
            "eval.output_file=resdir",
            "error: eval.output_file: resdir: is a directory",
        ),
        (
            {"afile": ""},
            "eval.output_file=afile/out.json",
            "error: eval.output_file: afile/out.json: afile is a file, not a directory",
        ),
        (
            {"out.samples.jsonl": None},
            "eval.output_file=out.json",
            "error: eval.output_file: out.json: its samples file out.samples.jsonl is a directory",
        ),
        (
            {"badrun/checkpoints/latest": "global_step_5\n"},
            "eval.checkpoint=badrun",
            "error: eval.checkpoint: badrun: badrun/checkpoints/latest names "
            "badrun/checkpoints/global_step_5, which is not a complete checkpoint",
        ),
        (  # the run's export itself, not the run: a model directory, for model.path
            {"run/final_hf/config.json": "{}"},
            "eval.checkpoint=run/final_hf",
            "error: eval.checkpoint: run/final_hf: a model directory (config.json), not a run "
            "or a checkpoint; evaluate it with model.path=run/final_hf",
        ),
        (  # killed while exporting, before any checkpoint: nothing to evaluate
            {"run/final_hf/config.json": "{}", "run/final_hf/tokenizer.json": "{}"},
            "eval.checkpoint=run",
            "error: eval.checkpoint: run: its final_hf holds no weights (an export cut short) "
            "and it has no checkpoint",
        ),
        (
            {"corrupt/trainer_state.json": "{}"},
            "eval.checkpoint=corrupt",
            "error: eval.checkpoint: corrupt: no policy weights in corrupt/policy/state",
        ),
        (
            {"zero3/trainer_state.json": "{}", Z3_STATE: ""},
            "eval.checkpoint=zero3",
            "error: eval.checkpoint: zero3: zero3/policy/state holds ZeRO-3 partitions without",
        ),
        ({}, "data=fake", "error: data.source: fake has no prompts"),
        (  # a checkpoint with weights, but nothing to evaluate them on: no export first
            {"ck/trainer_state.json": "{}", "ck/policy/state/mp_rank_00_model_states.pt": ""},
            "eval.checkpoint=ck data.num_eval_prompts=0",
            "error: data.num_eval_prompts: no eval prompts to evaluate on",
        ),
        ({}, "data.source=files", "error: data.eval_files: source=files needs at least one"),
        (
            {},
            "data.source=files data.eval_files=[nope.jsonl]",
            "error: data.eval_files[0]: nope.jsonl: file not found",
        ),
    ],
)
def test_bad_files_are_refused_before_any_work(tmp_path, monkeypatch, layout, override, expected):
    """One line naming the key, exit 2; in-process: raised before any weights are read or
    any prompt is loaded or generated, so nothing is written."""
    make(tmp_path, layout)
    overrides = ["experiment=smoke", *override.split()]
    assert_one_line(run([SKYRL_EVAL, *overrides], tmp_path), expected)
    assert (
        not [  # no results or samples written: only the layout's own files
            p
            for p in tmp_path.rglob("*.json*")
            if p.is_file() and str(p.relative_to(tmp_path)) not in layout
        ]
    )

    def must_not_run(*args, **kwargs):
        raise AssertionError("ran before the bad input was reported")

    from skyrl.trainer import checkpoint

    monkeypatch.setattr(checkpoint, "policy_state_dict", must_not_run)
    monkeypatch.setattr(checkpoint, "export_checkpoint_hf", must_not_run)
    monkeypatch.setattr(eval_cli, "_run_eval", must_not_run)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        evaluate(skyrl.compose(overrides), tmp_path / "run")
    assert expected.startswith(f"error: {err.value.key}: ")


@pytest.mark.parametrize(
    ("architecture", "fragment"),
    [
        # the checkpoint's 2 layers against 3: layer 2's weights are missing
        ({"num_hidden_layers": 3}, "missing ['model.layers.2."),
        # hidden 64 against 96: every matrix has another shape
        ({"hidden_size": 96, "head_dim": 48}, "size mismatch for model.embed_tokens.weight"),
    ],
)
def test_a_checkpoint_that_does_not_fit_model_path_is_one_line(tmp_path, architecture, fragment):
    """model.path names another architecture than the one the run trained: refused as bad
    input naming eval.checkpoint (exit 2), not a ValueError's traceback."""
    import torch
    from transformers import AutoModelForCausalLM

    from skyrl.config.cli_errors import is_bad_input, one_line_error
    from skyrl.config.validate import validate
    from skyrl.models.tiny import build_tiny_model
    from skyrl.trainer.checkpoint import TRAINER_STATE

    torch.set_num_threads(1)
    trained = AutoModelForCausalLM.from_pretrained(build_tiny_model())  # 2 layers, hidden 64
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_1"
    (ckpt / "policy" / "state").mkdir(parents=True)
    torch.save({"module": trained.state_dict()}, ckpt / "policy/state/mp_rank_00_model_states.pt")
    (ckpt / TRAINER_STATE).write_text('{"global_step": 1}')
    other = build_tiny_model(tmp_path / "other", **architecture)
    cfg = validate(skyrl.compose(["experiment=smoke", f"model.path={other}",
                                  f"eval.checkpoint={ckpt}"]))  # fmt: skip
    base, found, _ = eval_cli._model_to_evaluate(cfg)  # no resolved_config.yaml: model.path
    assert found == ckpt and base.model.path == other
    with pytest.raises(ConfigError) as err:
        eval_cli._exported(base, ckpt, tmp_path / "scratch")
    line = one_line_error(err.value)
    assert line.startswith(f"error: eval.checkpoint: {ckpt}: its policy weights do not fit {other}")
    assert fragment in line and "\n" not in line and is_bad_input(err.value)


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_checkpoint_with_damaged_weights_is_one_line(tmp_path, damage):
    """A weights file cut short (a run killed while saving, a partial copy): refused as bad
    input naming eval.checkpoint and the weights directory, not torch's EOFError traceback."""
    import torch

    from skyrl.config.cli_errors import is_bad_input, one_line_error
    from skyrl.config.validate import validate

    ckpt = tmp_path / "checkpoints" / "global_step_1"
    state = ckpt / "policy" / "state"
    state.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"global_step": 1}')
    weights = state / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.zeros(256)}}, weights)
    size = weights.stat().st_size
    weights.write_bytes(b"" if damage == "empty" else weights.read_bytes()[: size // 2])
    cfg = validate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={ckpt}"]))
    base, found, _ = eval_cli._model_to_evaluate(cfg)
    assert found == ckpt
    with pytest.raises(ConfigError) as err:
        eval_cli._exported(base, ckpt, tmp_path / "scratch")
    line = one_line_error(err.value)
    assert line.startswith(f"error: eval.checkpoint: {ckpt}: its weights in {state} cannot be read")
    assert "\n" not in line and is_bad_input(err.value)


def fake_checkpoint(run_dir: Path) -> Path:
    """``run_dir/checkpoints/global_step_1`` with (empty) ZeRO 0-2 policy weights."""
    ckpt = run_dir / "checkpoints" / "global_step_1"
    make(ckpt, {"trainer_state.json": '{"global_step": 1}',
                "policy/state/mp_rank_00_model_states.pt": ""})  # fmt: skip
    (run_dir / "checkpoints" / "latest").write_text("global_step_1")
    return ckpt


def test_a_run_saves_its_local_model_paths_absolute(tmp_path, monkeypatch):
    # model.path=mymodel was saved as typed; an eval of the run from another directory
    # looked for <eval cwd>/mymodel (missing, or worse: another model of that name)
    from skyrl.config.validate import validate
    from skyrl.models.tiny import build_tiny_model

    proj, other = tmp_path / "proj", tmp_path / "other"
    build_tiny_model(dir=proj / "mymodel")
    build_tiny_model(dir=proj / "mytok")
    other.mkdir()
    monkeypatch.chdir(proj)
    local = [
        "model.path=mymodel",
        "model.tokenizer_path=./mytok",
        "trainer.critic_model_path=mymodel",
    ]
    for name, overrides in [("run", local), ("tiny", ["trainer.critic_model_path=skyrl-tiny"])]:
        cfg = skyrl.compose(
            ["experiment=smoke", "algorithm=ppo", "trainer.dry_run=true", *overrides]
        )
        skyrl.train(cfg, output_dir=proj / name)
    saved = OmegaConf.load(proj / "run" / "resolved_config.yaml")
    assert saved.model.path == str(proj / "mymodel")
    assert saved.model.tokenizer_path == str(proj / "mytok")
    assert saved.trainer.critic_model_path == str(proj / "mymodel")
    tiny = OmegaConf.load(proj / "tiny" / "resolved_config.yaml")  # looked up again by eval
    assert (tiny.model.path, tiny.model.tokenizer_path) == ("skyrl-tiny", None)
    assert tiny.trainer.critic_model_path == "skyrl-tiny"
    ckpt = fake_checkpoint(proj / "run")
    monkeypatch.chdir(other)
    cfg = validate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={proj / 'run'}"]))
    base, found, label = eval_cli._model_to_evaluate(cfg)
    assert (found, label) == (ckpt, str(ckpt))
    assert base.model.path == str(proj / "mymodel")
    assert base.model.tokenizer_path == str(proj / "mytok")


def test_a_saved_model_that_names_nothing_here_gives_way_to_the_command_line(
    tmp_path, monkeypatch, caplog
):
    """The run's model wins; where it names nothing any more (a run from before absolute
    paths were saved, a model moved), the command line's model.path stands in, with a
    warning, and an error names the command line's key, whose fix then works."""
    from skyrl.config.validate import validate
    from skyrl.models.tiny import build_tiny_model

    run_dir = tmp_path / "run"
    ckpt = fake_checkpoint(run_dir)
    (run_dir / "resolved_config.yaml").write_text("model:\n  path: mymodel\n")
    model = build_tiny_model(dir=tmp_path / "moved" / "mymodel")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no ./mymodel here
    cfg = validate(skyrl.compose([f"model.path={model}", f"eval.checkpoint={run_dir}"]))
    with caplog.at_level("WARNING", logger="skyrl.eval_cli"):
        base, found, _ = eval_cli._model_to_evaluate(cfg)
    assert found == ckpt and base.model.path == base.model.tokenizer_path == model
    [warning] = caplog.messages
    assert warning.startswith(
        f"{run_dir / 'resolved_config.yaml'} names model.path='mymodel', which does not resolve "
        f"here ('mymodel' could not be resolved. Tried: local directory {tmp_path / 'mymodel'}"
    )
    assert warning.endswith(f"; evaluating with model.path={model} from the command line")
    cfg = validate(skyrl.compose(["model.path=/nonexistent", f"eval.checkpoint={run_dir}"]))
    with pytest.raises(ConfigError) as err:
        eval_cli._model_to_evaluate(cfg)
    assert (err.value.key, err.value.message) == (
        "model.path",
        "'/nonexistent': no such directory (/nonexistent)",
    )


def run_with_export(run_dir: Path, exported: int | None, latest: int) -> tuple[Path, Path]:
    """``run_dir`` with a final_hf that records the step it was exported at (None: no record,
    a run from before it) and a checkpoint of step ``latest`` that ``latest`` names."""
    final_hf = run_dir / "final_hf"
    make(final_hf, {"config.json": "{}", "model.safetensors": ""})
    if exported is not None:
        (final_hf / EXPORT_RECORD).write_text(json.dumps({"step": exported}))
    ckpt = run_dir / "checkpoints" / f"global_step_{latest}"
    make(ckpt, {"trainer_state.json": json.dumps({"step": latest}),
                "policy/state/mp_rank_00_model_states.pt": ""})  # fmt: skip
    (run_dir / "checkpoints" / "latest").write_text(ckpt.name + "\n")
    return final_hf, ckpt


@pytest.mark.parametrize(
    ("exported", "latest", "evaluated"),
    [
        (2, 3, "ckpt"),  # resumed to total_steps=3, stopped before exporting again
        (3, 3, "final_hf"),  # exported after its last checkpoint: the same weights
        (4, 3, "final_hf"),  # ckpt_interval=3, 4 steps: the export is the newer
        (None, 3, "final_hf"),  # an export without the record (an older run): as before
    ],
)
def test_a_run_continued_past_its_export_is_evaluated_at_its_latest_checkpoint(
    tmp_path, caplog, exported, latest, evaluated
):
    """final_hf is evaluated only when it is not older than checkpoints/latest; a stale one
    gives way to the latest checkpoint with one line saying why."""
    from skyrl.config.validate import validate

    final_hf, ckpt = run_with_export(tmp_path / "run", exported, latest)
    cfg = validate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={tmp_path / 'run'}"]))
    with caplog.at_level("INFO", logger="skyrl.eval_cli"):
        _, found, label = eval_cli._model_to_evaluate(cfg)
    if evaluated == "final_hf":
        assert (found, label) == (None, str(final_hf)) and caplog.messages == []
        return
    assert (found, label) == (ckpt, str(ckpt))
    assert caplog.messages == [
        f"{final_hf} is from step 2, {tmp_path / 'run' / 'checkpoints' / 'latest'} is step 3 "
        f"({ckpt.name}): evaluating the latest checkpoint"
    ]


def test_an_export_cut_short_gives_way_to_the_latest_checkpoint(tmp_path, caplog):
    """A final_hf with its config but no weights (the run was killed while exporting; no
    record written): the latest checkpoint is evaluated, with a line saying why, not the
    empty export (a traceback from the engine that loads it)."""
    from skyrl.config.validate import validate

    final_hf, ckpt = run_with_export(tmp_path / "run", None, 2)
    (final_hf / "model.safetensors").unlink()
    cfg = validate(skyrl.compose(["experiment=smoke", f"eval.checkpoint={tmp_path / 'run'}"]))
    with caplog.at_level("INFO", logger="skyrl.eval_cli"):
        _, found, label = eval_cli._model_to_evaluate(cfg)
    assert (found, label) == (ckpt, str(ckpt))
    assert caplog.messages == [
        f"{final_hf} holds no weights (an export cut short): evaluating the latest checkpoint"
    ]


RUN_DIR = eval_cli.EVAL_RUN_DIR


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["experiment=smoke"], ["experiment=smoke", RUN_DIR]),
        # after the overrides, wherever the flags are: argparse takes one run of overrides
        (["--cfg", "job", "experiment=smoke"], ["--cfg", "job", "experiment=smoke", RUN_DIR]),
        (["a=1", "b=2", "--cfg", "job"], ["a=1", "b=2", RUN_DIR, "--cfg", "job"]),
        # no overrides: first, where no flag can take it as its value (--info takes one)
        (["--info"], [RUN_DIR, "--info"]),
        (["-m", "a=1,2"], ["-m", "a=1,2"]),  # a sweep's jobs go under hydra.sweep.dir
        (["a=1,2", "--multirun"], ["a=1,2", "--multirun"]),
        (["a=1", "hydra.run.dir=mine"], ["a=1", "hydra.run.dir=mine"]),
    ],
)
def test_the_eval_run_dir_goes_where_hydra_reads_it_as_an_override(argv, expected):
    assert eval_cli.with_eval_run_dir(argv) == expected


@pytest.mark.parametrize(
    "flags_first",
    [
        ["--cfg", "job"],  # as `skyrl-train --cfg job experiment=smoke` prints the config
        ["-m"],  # as README's `skyrl-train -m experiment=smoke ...` sweeps
    ],
)
def test_a_leading_hydra_flag_keeps_the_overrides(tmp_path, flags_first):
    # skyrl-eval put hydra.run.dir=... before the flag: argparse then refused the overrides
    # after it ("unrecognized arguments: experiment=smoke ...", exit 2)
    small = ["experiment=smoke", "data.num_eval_prompts=1", "generator.eval_n_samples_per_prompt=1"]
    result = run([SKYRL_EVAL, *flags_first, *small], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    if flags_first == ["--cfg", "job"]:
        config = OmegaConf.create(result.stdout)
        assert config.data.num_eval_prompts == 1 and config.generator.eval_n_samples_per_prompt == 1
        return
    [results] = (tmp_path / "outputs" / "multirun").glob(f"*/*/0/{eval_cli.RESULTS_FILE}")
    assert json.loads(results.read_text())["num_prompts"] == {"arithmetic": 1}


def test_help_says_what_skyrl_eval_does_and_lists_the_groups(tmp_path):
    result = run([SKYRL_EVAL, "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: skyrl-eval [GROUP=OPTION ...] [KEY=VALUE ...]\n")
    assert "Held-out pass@1 / pass@k" in result.stdout
    assert "  generator    hf *vllm\n" in result.stdout
    assert not list(tmp_path.iterdir())  # nothing composed or run: no run directory


def lora_export(root: Path) -> tuple[Path, Path, Path]:
    """A LoRA run's two exports of one trained policy, as ``export_hf`` writes them: the
    PEFT adapter directory ``final_adapter`` (naming its base model) and ``final_hf`` (the
    adapters merged); and the base model."""
    import torch
    from lora_adapters import trained_adapters  # tests/ is on sys.path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from skyrl.config.root import LoraConfig
    from skyrl.models.lora import add_adapters, write_adapter_dir
    from skyrl.models.tiny import build_tiny_model

    base = build_tiny_model()
    lora = LoraConfig(rank=4, alpha=8)
    model = add_adapters(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), lora)
    adapter = trained_adapters(model)
    tokenizer = AutoTokenizer.from_pretrained(base)
    write_adapter_dir(root / "final_adapter", adapter, lora, base)
    tokenizer.save_pretrained(root / "final_adapter")
    model.merge_and_unload().save_pretrained(root / "final_hf")
    tokenizer.save_pretrained(root / "final_hf")
    return root / "final_adapter", root / "final_hf", Path(base)


@pytest.mark.slow
def test_a_final_adapter_evaluates_like_the_merged_export(tmp_path):
    """README: skyrl-eval evaluates ``final_adapter`` as well as ``final_hf``; vLLM (the
    default engine) was handed the adapter directory as a model and failed in a traceback,
    and ``eval.checkpoint`` refused it as neither a run nor a checkpoint."""
    adapter, merged, base = lora_export(tmp_path / "run")
    greedy = [
        "experiment=smoke", "generator=vllm", "generator.kv_cache_memory_bytes=16777216",
        "data.num_eval_prompts=2", "generator.eval_n_samples_per_prompt=1",
        "generator.eval_sampling.temperature=0",
    ]  # fmt: skip

    def responses(name: str, *overrides: str) -> list[list[int]]:
        result = evaluate(skyrl.compose([*greedy, *overrides]), tmp_path / name)
        lines = result.samples_file.read_text().splitlines()
        return [json.loads(line)["response_ids"] for line in lines]

    expected = responses("merged", f"model.path={merged}")
    assert responses("base", f"model.path={base}") != expected  # the adapter matters
    assert responses("model_path", f"model.path={adapter}") == expected
    assert responses("checkpoint", f"eval.checkpoint={adapter}") == expected


def test_a_final_adapter_without_its_base_model_is_one_line(tmp_path):
    adapter = lora_export(tmp_path / "run")[0]
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    gone = tmp_path / "gone"
    config_file.write_text(json.dumps({**config, "base_model_name_or_path": str(gone)}))

    def refused(key: str) -> ConfigError:
        with pytest.raises(ConfigError) as err:
            evaluate(skyrl.compose(["experiment=smoke", f"{key}={adapter}"]), tmp_path)
        assert err.value.key == key
        return err.value

    error = refused("eval.checkpoint")
    assert error.message == f"{adapter}: its base model: '{gone}': no such directory ({gone})"
    config_file.write_text("{")
    error = refused("model.path")
    assert error.message.startswith(f"{config_file} is not valid JSON (JSONDecodeError: ")


def test_an_eval_sweep_is_not_held_to_a_training_runs_checks(monkeypatch):
    """``skyrl-eval`` reads no training prompts: a sweep with fewer of them than a training
    step takes (smoke: ``train_batch_size`` 2) passes its command-line check, where
    ``skyrl-train``'s refuses it (each job's pre-flight, before job 0)."""
    from skyrl.config.precheck import precheck_command_line

    argv = ["-m", "experiment=smoke", "data.num_train_prompts=1,2"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["skyrl-eval", *argv])
    eval_cli._check_command_line()  # exits 2 on a problem
    assert precheck_command_line(argv) == (
        "error: data.num_train_prompts: 1 training prompts, fewer than "
        "trainer.train_batch_size=2; in sweep job 0 of 2: data.num_train_prompts=1"
    )
