"""``skyrl-train --help --config-dir DIR`` lists the group options DIR adds (a user's
``DIR/experiment/mine.yaml``), which ``experiment=mine`` then picks; the help listed skyrl's
options alone, as if DIR held none."""

from __future__ import annotations

from cli_runs import run

from skyrl.cli import TRAIN_EXAMPLES, TRAIN_SUMMARY
from skyrl.config.help import command_help


def _experiment_line(text: str) -> str:
    """The experiment group's options, its wrapped lines joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  experiment "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("     "))
    return " ".join(" ".join(lines[start:end]).split())


def test_help_lists_the_options_of_the_config_dir(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    (tmp_path / "conf" / "algorithm").mkdir()
    (tmp_path / "conf" / "algorithm" / "my_loss.yaml").write_text("policy_loss: ppo\n")

    result = run(tmp_path, "skyrl-train", "--help", "--config-dir", "conf")
    assert result.returncode == 0, result.stderr[-2000:]
    assert _experiment_line(result.stdout) == (
        "experiment custom_loss dapo dr_grpo gsm8k_grpo mine multi_turn_tools ppo_critic "
        "react_agent reasoning_gym_curriculum smoke"
    )
    assert "  algorithm    cispo dapo dr_grpo *grpo gspo my_loss ppo" in result.stdout

    # without the flag, or with a folder that is not there, skyrl's options alone
    plain = command_help("skyrl-train", TRAIN_SUMMARY, TRAIN_EXAMPLES)
    missing = command_help(
        "skyrl-train", TRAIN_SUMMARY, TRAIN_EXAMPLES, ["--config-dir", str(tmp_path / "none")]
    )
    assert "mine" not in _experiment_line(plain) and missing == plain
