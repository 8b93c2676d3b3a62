"""Recipes: every experiment composes, validates and dry-runs; every recipe folder has a README
with its one command and a matching experiment; the recipes' plug-ins do what they claim."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig, OmegaConf

from skyrl.config import register_configs
from skyrl.config.validate import validate

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted(p.stem for p in (REPO / "skyrl" / "conf" / "experiment").glob("*.yaml"))
RECIPES = sorted(
    p.name for p in (REPO / "recipes").iterdir() if p.is_dir() and not p.name.startswith("__")
)

RECIPE_SETTINGS: dict[str, dict[str, object]] = {
    "gsm8k_grpo": {
        "model.path": "Qwen/Qwen2.5-0.5B-Instruct",
        "data.source": "files",
        "generator.backend": "vllm",
        "trainer.precision": "bf16",
        "trainer.num_gpus_per_worker": 1.0,
    },
    "dapo": {
        "algorithm.dynamic_sampling": "filter",
        "algorithm.overlong_buffer_len": 32,
        "algorithm.eps_clip_high": 0.28,
        "data.source": "arithmetic",
    },
    "dr_grpo": {
        "algorithm.advantage_estimator": "dr_grpo",
        "algorithm.norm_adv_by_std": False,
        "algorithm.loss_reduction": "seq_mean_token_sum_norm",
    },
    "ppo_critic": {"algorithm.advantage_estimator": "gae", "trainer.critic_only_steps": 3},
    "multi_turn_tools": {
        "environment.name": "tools",
        "generator.step_wise": True,
        "generator.max_turns": 3,
    },
    "reasoning_gym_curriculum": {
        "data.source": "reasoning_gym",
        "environment.name": "reasoning_gym",
        "environment.dataset": "chain_sum",
    },
    "custom_loss": {"algorithm.policy_loss": "vanilla_pg", "imports": ["recipes.custom_loss.loss"]},
    "react_agent": {
        "generator.agent": "recipes.react_agent.agent.rollout",
        "generator.max_turns": 3,
    },
}
"""What each recipe is about, as keys its composed config must hold."""


@pytest.fixture
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repository root on ``sys.path``, as ``python -m skyrl`` from the root has it."""
    monkeypatch.syspath_prepend(str(REPO))


def _compose(*overrides: str) -> DictConfig:
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


# -- every experiment ----------------------------------------------------------------


def _local_stand_ins(name: str, tmp_path: Path) -> list[str]:
    """Overrides putting local stand-ins for what an experiment needs from outside (a
    prepared dataset, a hub model), so its dry run passes the pre-flight check here."""
    if name != "gsm8k_grpo":
        return []
    from recipes.gsm8k_grpo import prepare

    raw, rows = tmp_path / "gsm8k_raw.jsonl", tmp_path / "gsm8k.jsonl"
    prepare.write_records(GSM8K_RECORDS * 64, raw)  # 128 prompts = one train batch
    prepare.main(["--input", str(raw), "--output", str(rows)])
    return ["model.path=skyrl-tiny", f"data.train_files=[{rows}]", f"data.eval_files=[{rows}]"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_dry_runs(name: str, tmp_path: Path, repo_on_path, capsys):
    from skyrl.api import train

    stand_ins = _local_stand_ins(name, tmp_path / "data")
    cfg = _compose(f"experiment={name}", "trainer.dry_run=true", *stand_ins)
    result = train(cfg, tmp_path)  # validate, pre-flight, save the resolved config, plan
    assert result.output_dir == tmp_path and not result.history
    assert "skyrl run plan" in capsys.readouterr().out
    saved = OmegaConf.load(tmp_path / "resolved_config.yaml")
    plain = _compose(f"experiment={name}")
    replaced = {override.split("=")[0] for override in stand_ins}
    for key, value in RECIPE_SETTINGS.get(name, {}).items():
        assert OmegaConf.select(plain, key) == value, f"experiment={name}: {key}"
        if key not in replaced:
            assert OmegaConf.select(saved, key) == value, f"experiment={name}: {key}"


def test_gsm8k_dry_run_without_its_prepared_data_names_the_file(tmp_path, monkeypatch):
    from skyrl.api import train
    from skyrl.config import ConfigError

    monkeypatch.chdir(tmp_path)  # no data/gsm8k/ here
    with pytest.raises(ConfigError) as err:
        train(_compose("experiment=gsm8k_grpo", "trainer.dry_run=true"), tmp_path / "out")
    assert (err.value.key, err.value.message) == (
        "data.train_files[0]",
        "data/gsm8k/train.jsonl: file not found",
    )
    assert not (tmp_path / "out").exists()


def test_every_recipe_setting_names_an_experiment():
    assert set(RECIPE_SETTINGS) <= set(EXPERIMENTS)


# -- recipe folders ------------------------------------------------------------------


def test_recipes_exist():
    assert set(RECIPE_SETTINGS) <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_has_readme_and_experiment(name: str):
    readme = REPO / "recipes" / name / "README.md"
    assert readme.is_file(), f"recipes/{name}/ has no README.md"
    assert (REPO / "conf" / "experiment" / f"{name}.yaml").is_file(), (
        f"recipes/{name}/ has no conf/experiment/{name}.yaml"
    )
    blocks = re.findall(r"```bash\n(.*?)```", readme.read_text(), re.DOTALL)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(commands) == 1, f"recipes/{name}/README.md: expected one command, got {commands}"
    assert f"experiment={name}" in commands[0] or f"recipes/{name}/" in commands[0]


def test_every_python_dash_m_in_the_recipes_names_a_runnable_module(repo_on_path):
    """``recipes/__init__.py`` said ``python -m skyrl.train``: "No module named skyrl.train"."""
    import importlib.util

    files = [p for p in (REPO / "recipes").rglob("*") if p.suffix in (".md", ".py", ".sh")]
    commands = {
        (p.relative_to(REPO), module.rstrip("."))
        for p in files
        for module in re.findall(r"python -m ([\w.]+)", p.read_text())
    }
    assert {m for _, m in commands} >= {"skyrl", "recipes.react_agent.agent"}
    for path, module in sorted(commands):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:  # a package
            spec = importlib.util.find_spec(f"{module}.__main__")
        assert spec is not None, f"{path}: python -m {module}: no such runnable module"


# -- custom_loss ---------------------------------------------------------------------


def _loss_example() -> dict[str, torch.Tensor]:
    """One row, three tokens, the last one not trained; token_mean weights 1/2 each."""
    return {
        "logprobs": torch.log(torch.tensor([[0.5, 0.25, 1.0]])),
        "old_logprobs": torch.log(torch.tensor([[0.25, 0.25, 1.0]])),
        "advantages": torch.tensor([[1.0, -3.0, 5.0]]),
        "loss_weights": torch.tensor([[0.5, 0.5, 0.0]]),
        "loss_mask": torch.tensor([[1.0, 1.0, 0.0]]),
    }


def test_custom_loss_is_registered_and_selected(repo_on_path):
    from recipes.custom_loss.loss import vanilla_pg
    from skyrl.algorithms import POLICY_LOSSES

    typed = validate(_compose("experiment=custom_loss"))
    assert POLICY_LOSSES.get(typed.algorithm.policy_loss) is vanilla_pg


def test_custom_loss_hand_value_through_the_worker_objective(repo_on_path):
    from skyrl.batch import TrainingInputBatch
    from skyrl.workers.losses import policy_loss

    typed = validate(_compose("experiment=custom_loss"))
    ex = _loss_example()
    logprobs = ex.pop("logprobs").requires_grad_(True)
    loss, sums = policy_loss(logprobs, None, TrainingInputBatch(ex), typed.algorithm)
    # r = pi / pi_old = [0.5 / 0.25, 0.25 / 0.25] = [2, 1] on the two loss tokens;
    # L_t = -A_t r_t = [-1 * 2, 3 * 1] = [-2, 3]; loss = 0.5 * -2 + 0.5 * 3 = 0.5.
    # PPO would clip r = 2 to 1.2 there: 0.5 * -1.2 + 0.5 * 3 = 0.9.
    assert loss.item() == pytest.approx(0.5, abs=1e-6)
    # dL/dlogp_t = w_t * (-A_t r_t) = [0.5 * -2, 0.5 * 3, 0] = [-1, 1.5, 0]
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, 1.5, 0.0]]))
    assert sums.loss == pytest.approx(0.5, abs=1e-6)
    assert sums.loss_tokens == 2
    assert sums.flag_tokens["outside_clip"] == 1  # r = 2 > 1 + eps_clip_high = 1.2
    # approx_kl = (r - 1) - log r = (2 - 1 - ln 2) + 0
    assert sums.token_sums["approx_kl"] == pytest.approx(1 - math.log(2), abs=1e-6)


def test_custom_loss_counts_the_tokens_ppo_would_clip(repo_on_path):
    """``outside_clip`` is documented as the tokens PPO would clip: where the clip binds, which
    depends on the advantage's sign, not every ratio outside [1 - eps_low, 1 + eps_high]."""
    from recipes.custom_loss.loss import vanilla_pg
    from skyrl.algorithms import POLICY_LOSSES

    typed = validate(_compose("experiment=custom_loss"))
    args = {
        "logprobs": torch.log(torch.tensor([[0.5, 0.5, 0.125, 0.125]])),
        "old_logprobs": torch.log(torch.full((1, 4), 0.25)),  # r = [2, 2, 0.5, 0.5]
        "advantages": torch.tensor([[1.0, -1.0, -1.0, 1.0]]),
        "loss_weights": torch.full((1, 4), 0.25),
        "loss_mask": torch.ones(1, 4),
        "cfg": typed.algorithm,
    }
    # PPO clips where -A * clip(r, 0.8, 1.2) > -A * r: r = 2 with A = 1 (-1.2 > -2) and
    # r = 0.5 with A = -1 (0.8 > 0.5); not r = 2 with A = -1 (1.2 < 2) nor r = 0.5 with A = 1.
    _, ppo_metrics = POLICY_LOSSES.get("ppo")(**args)
    assert ppo_metrics["clip_tokens"] == 2
    _, metrics = vanilla_pg(**args)
    assert metrics["outside_clip_tokens"] == 2


@pytest.mark.slow
def test_custom_loss_cli_dry_run_from_the_repo_root(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "skyrl", "experiment=custom_loss", "trainer.dry_run=true"]
        + [f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"optimizer steps / step\s+1\n", result.stdout)


# -- dapo ----------------------------------------------------------------------------


def test_dapo_readme_says_a_step_short_of_signal_is_topped_up_with_flat_groups():
    """After max_sample_batches rounds without 8 informative groups the step trains on flat
    (zero-advantage) groups too; the README said every step trains on groups with signal."""
    from skyrl.rollouts.sync import filled_batch

    typed = validate(_compose("experiment=dapo"))
    need = typed.trainer.train_batch_size  # 8 groups per step
    good, flat = ["a", "b"], ["c", "d", "e", "f", "g", "h", "i"]  # after the last round
    rounds = typed.algorithm.max_sample_batches  # 4
    with pytest.warns(UserWarning, match="topped up with 6 flat groups"):
        uids, _ = filled_batch(good, flat, need, rounds, step=1)
    assert uids == ["a", "b", "c", "d", "e", "f", "g", "h"]  # 2 informative + 8 - 2 = 6 flat
    readme = " ".join((REPO / "recipes" / "dapo" / "README.md").read_text().split())
    assert "every step trains on groups with signal" not in readme
    assert "topped up with flat groups (zero advantage" in readme


# -- gsm8k_grpo: prepare.py ----------------------------------------------------------

GSM8K_RECORDS = [
    {"question": "Tom has 3 bags of 24 apples. How many apples?", "answer": "3*24=72\n#### 72"},
    {"question": "A car costs $1,200 more than $800. Price?", "answer": "1200+800\n#### 2,000"},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_gsm8k_prepare_feeds_the_experiments_data_and_env(tmp_path: Path, suffix, repo_on_path):
    from recipes.gsm8k_grpo import prepare
    from skyrl.data import load_prompts
    from skyrl.envs.grading import grade

    raw, out = tmp_path / f"raw{suffix}", tmp_path / f"train{suffix}"
    prepare.write_records(GSM8K_RECORDS, raw)
    prepare.main(["--input", str(raw), "--output", str(out)])
    typed = validate(_compose("experiment=gsm8k_grpo", f"data.train_files=[{out}]"))
    rows = load_prompts(typed.data, typed.environment, "train")
    assert [r.extras["answer"] for r in rows] == ["72", "2000"]
    assert rows[0].prompt.startswith("Tom has") and "#### <number>" in rows[0].prompt
    assert grade("3 bags x 24 = 72\n#### 72", rows[0].extras["answer"]) == 1.0
    assert grade("#### 2,000", rows[1].extras["answer"]) == 1.0


def test_gsm8k_prepare_rejects_an_answer_without_a_final_number():
    from recipes.gsm8k_grpo.prepare import final_answer

    with pytest.raises(ValueError, match="####"):
        final_answer("no final line")


def _gsm8k_prepare_error(capsys, *argv: str) -> str:
    """The one line ``prepare.py`` ends with (exit 2) on a bad input or output."""
    from recipes.gsm8k_grpo import prepare

    with pytest.raises(SystemExit) as exit_:
        prepare.main(list(argv))
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return captured.err.rstrip("\n")


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (['{"question": "q", "answer": "#### 1"}', "", "not json"], "row 3: invalid JSON"),
        (['{"q": "x", "answer": "#### 1"}'], "row 1: missing column 'question' (has ['answer', 'q'])"),
        (['{"question": "q", "answer": "1"}'], "row 1: GSM8K answer has no '#### <number>': '1'"),
        (['{"question": "q", "answer": "1 + 1 = 2\\n#### "}'], "row 1: GSM8K answer has no '#### <number>': '1 + 1 = 2\\n#### '"),
        (["[1, 2]"], "row 1: not a JSON object: [1, 2]"),
        (['{"question": null, "answer": "#### 1"}'], "row 1: column 'question' is not text: None"),
        ([""], "no rows"),
    ],
)  # fmt: skip
def test_gsm8k_prepare_names_the_row_of_a_bad_record(
    tmp_path, capsys, repo_on_path, lines, problem
):
    raw, out = tmp_path / "raw.jsonl", tmp_path / "out" / "train.jsonl"
    raw.write_text("\n".join(lines) + "\n")
    error = _gsm8k_prepare_error(capsys, "--input", str(raw), "--output", str(out))
    assert error.startswith(f"error: --input {raw}: {problem}"), error
    assert not out.parent.exists()  # nothing written


def test_gsm8k_prepare_names_a_missing_input_and_a_bad_suffix(tmp_path, capsys, repo_on_path):
    raw, out = tmp_path / "raw.jsonl", tmp_path / "train.jsonl"
    assert _gsm8k_prepare_error(capsys, "--input", str(raw), "--output", str(out)) == (
        f"error: --input {raw}: file not found"
    )
    raw.write_text('{"question": "q", "answer": "#### 1"}\n')
    csv = tmp_path / "train.csv"
    assert _gsm8k_prepare_error(capsys, "--input", str(raw), "--output", str(csv)) == (
        f"error: --output {csv}: use .jsonl or .parquet"
    )
    assert _gsm8k_prepare_error(capsys, "--input", str(csv), "--output", str(out)) == (
        f"error: --input {csv}: use .jsonl or .parquet"
    )
    assert not out.exists() and not csv.exists()


def test_gsm8k_prepare_refuses_to_overwrite_its_input(tmp_path, capsys, repo_on_path):
    """The raw split copied to where the experiment reads its rows (data/gsm8k/train.jsonl)
    and converted in place would be lost: converted again, it has no 'question' column."""
    raw = tmp_path / "data" / "gsm8k" / "train.jsonl"
    raw.parent.mkdir(parents=True)
    raw.write_text('{"question": "q", "answer": "#### 1"}\n')
    same = tmp_path / "data" / ".." / "data" / "gsm8k" / "train.jsonl"  # the file, spelled apart
    assert _gsm8k_prepare_error(capsys, "--input", str(raw), "--output", str(same)) == (
        f"error: --output {same}: is the --input file; write the converted rows elsewhere"
    )
    assert raw.read_text() == '{"question": "q", "answer": "#### 1"}\n'


def test_gsm8k_prepare_names_an_unwritable_output(tmp_path, capsys, repo_on_path):
    raw, blocker = tmp_path / "raw.jsonl", tmp_path / "data"
    raw.write_text('{"question": "q", "answer": "#### 1"}\n')
    blocker.write_text("a file where the output folder should be")
    out = blocker / "train.jsonl"
    assert _gsm8k_prepare_error(capsys, "--input", str(raw), "--output", str(out)) == (
        f"error: --output {out}: {blocker} is a file, not a folder"
    )


# -- react_agent: agent.py as a command --------------------------------------------


def test_react_agent_cli_without_an_endpoint_names_the_url(capsys, repo_on_path):
    """``python -m recipes.react_agent.agent`` before ``skyrl-serve`` is up: one line naming
    ``--base-url``, not the openai client's connection traceback."""
    import socket

    from recipes.react_agent import agent

    with socket.socket() as sock:  # a port nothing listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        with pytest.raises(SystemExit) as exit_:
            agent.main(["--base-url", url])
    assert exit_.value.code == (
        f"error: --base-url {url}: no OpenAI-compatible endpoint answers there (start one "
        "with skyrl-serve: see recipes/react_agent/README.md)"
    )
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("url", ["127.0.0.1:8000/v1", "localhost:8000", "ftp://127.0.0.1/v1"])
def test_react_agent_cli_names_a_url_without_http(capsys, repo_on_path, url):
    """A URL without ``http://``: not "no endpoint answers there", which sends the user to
    start a server that may well be running."""
    from recipes.react_agent import agent

    with pytest.raises(SystemExit) as exit_:
        agent.main(["--base-url", url])
    assert exit_.value.code == (
        f"error: --base-url {url}: not an http:// or https:// URL "
        "(skyrl-serve prints its own, e.g. http://127.0.0.1:8000/v1)"
    )
    assert capsys.readouterr().out == ""


# -- reasoning_gym_curriculum: run.sh ------------------------------------------------


CURRICULUM_SCRIPT = REPO / "recipes" / "reasoning_gym_curriculum" / "run.sh"


def run_curriculum(tmp_path: Path, stages: str, *overrides: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "CURRICULUM_STAGES": stages,
        "CURRICULUM_DIR": str(tmp_path),
        "CURRICULUM_MODEL": "skyrl-tiny",
        "SKYRL_TRAIN": f"{sys.executable} -m skyrl",
    }
    return subprocess.run(
        ["bash", str(CURRICULUM_SCRIPT), "trainer.dry_run=true", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.slow
def test_curriculum_dry_run_checks_every_stage(tmp_path: Path):
    """Nothing is exported by a dry run: each stage is checked with the model stage 1 has."""
    result = run_curriculum(tmp_path, "chain_sum basic_arithmetic")
    assert result.returncode == 0, result.stderr
    first = OmegaConf.load(tmp_path / "stage1-chain_sum" / "resolved_config.yaml")
    second = OmegaConf.load(tmp_path / "stage2-basic_arithmetic" / "resolved_config.yaml")
    assert (first.environment.dataset, first.model.path) == ("chain_sum", "skyrl-tiny")
    assert (second.environment.dataset, second.model.path) == ("basic_arithmetic", "skyrl-tiny")


@pytest.mark.slow
def test_curriculum_on_the_tiny_model_takes_the_prompt_length_the_readme_gives(tmp_path: Path):
    """``CURRICULUM_MODEL=skyrl-tiny``, as recipes/README.md offers it: the tiny tokenizer spells
    gsm_symbolic's questions (stage 3) in up to 518 tokens, over the experiment's 384, so the run
    stopped at stage 3 after training stages 1 and 2; the README now gives the override."""
    (tmp_path / "as_is").mkdir(), (tmp_path / "with_it").mkdir()
    refused = run_curriculum(tmp_path / "as_is", "gsm_symbolic")
    assert refused.returncode == 2  # a config error
    assert "over generator.max_prompt_length=384; 12 of 160 train prompts" in refused.stderr
    tiny = " ".join((REPO / "recipes" / "README.md").read_text().split()).split("skyrl-tiny", 1)[1]
    needed = re.search(r"run\.sh`? also need `(generator\.max_prompt_length=\d+)`", tiny)
    assert needed, "recipes/README.md: no prompt length for run.sh on the tiny model"
    result = run_curriculum(tmp_path / "with_it", "gsm_symbolic", needed.group(1))
    assert result.returncode == 0, result.stderr
    assert "longest 518 tokens" in result.stdout


@pytest.mark.slow
def test_curriculum_stages_chain_the_exported_policy(tmp_path: Path):
    """A trained stage (its final_hf: here a copy of the tiny model) is skipped and the next
    stage starts from it."""
    from skyrl.models.resolve import resolve_model_path

    exported = tmp_path / "stage1-chain_sum" / "final_hf"
    shutil.copytree(resolve_model_path("skyrl-tiny"), exported)
    result = run_curriculum(tmp_path, "chain_sum basic_arithmetic")
    assert result.returncode == 0, result.stderr
    assert f"== stage 1: chain_sum already trained ({exported})" in result.stdout
    second = OmegaConf.load(tmp_path / "stage2-basic_arithmetic" / "resolved_config.yaml")
    assert (second.environment.dataset, second.model.path) == ("basic_arithmetic", str(exported))


def echo_curriculum(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """run.sh over two stages with ``echo`` as skyrl-train: the stages' command lines,
    nothing run."""
    env = {**os.environ, "CURRICULUM_STAGES": "chain_sum basic_arithmetic"}
    env |= {"CURRICULUM_DIR": str(tmp_path), "SKYRL_TRAIN": "echo"}
    env.pop("CURRICULUM_MODEL", None)
    return subprocess.run(
        ["bash", str(CURRICULUM_SCRIPT), *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("dry_run", "chained"),
    [
        ("trainer.dry_run=true", False),
        ("trainer.dry_run=True", False),  # what Hydra itself writes in a sweep's overrides
        ("trainer.dry_run=yes", False),
        ("++trainer.dry_run=1", False),
        ("trainer.dry_run=false", True),
    ],
)
def test_curriculum_knows_a_dry_run_in_every_spelling_skyrl_train_accepts(
    tmp_path, dry_run, chained
):
    """A dry run exports no final_hf: stage 2 is checked with stage 1's model, not pointed at
    a final_hf that will not exist (``error: model.path: ...final_hf: no such directory``)."""
    result = echo_curriculum(tmp_path, dry_run)
    assert result.returncode == 0, result.stderr
    commands = [line.split() for line in result.stdout.splitlines() if not line.startswith("==")]
    stage2 = commands[1]
    assert "environment.dataset=basic_arithmetic" in stage2
    if chained:
        assert stage2[-2:] == [f"model.path={tmp_path}/stage1-chain_sum/final_hf", dry_run]
    else:
        assert not any(arg.startswith("model.path=") for arg in stage2), stage2


@pytest.mark.parametrize(
    ("override", "key", "where"),
    [
        ("model.path=skyrl-tiny", "model.path", "stage 1's with CURRICULUM_MODEL"),
        ("+model.path=skyrl-tiny", "model.path", "stage 1's with CURRICULUM_MODEL"),
        ("trainer.output_dir=out", "trainer.output_dir", "where they go with CURRICULUM_DIR"),
        ("hydra.run.dir=out", "hydra.run.dir", "where they go with CURRICULUM_DIR"),
        ("environment.dataset=leg_counting", "environment.dataset", "them with CURRICULUM_STAGES"),
    ],
)
def test_curriculum_refuses_a_key_it_sets_per_stage(tmp_path, override, key, where):
    """Passed on to every stage, it would come last and win: every stage from the same model
    (the chain silently broken), into the same dir, or on the same dataset."""
    result = echo_curriculum(tmp_path, "trainer.dry_run=true", override)
    assert (result.returncode, result.stdout) == (2, "")  # no stage ran
    assert result.stderr == f"error: {key}: run.sh sets it for each stage; set {where}\n"


@pytest.mark.parametrize("override", ["trainer.export_hf=false", "trainer.export_hf=False"])
def test_curriculum_refuses_a_stage_without_export(tmp_path, override):
    """Stage 2 starts from stage 1's final_hf: without the export it would fail after stage 1
    trained, naming a model.path the user never set."""
    result = echo_curriculum(tmp_path, override)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "error: trainer.export_hf: each stage starts from the previous one's final_hf; "
        "leave it true\n"
    )
    assert echo_curriculum(tmp_path, "trainer.export_hf=true").returncode == 0
