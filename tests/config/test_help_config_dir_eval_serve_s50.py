"""``skyrl-eval`` and ``skyrl-serve`` ``--help --config-dir DIR`` list the group options DIR
adds, as ``skyrl-train``'s does (``test_help_config_dir_s51``); they listed skyrl's alone."""

from __future__ import annotations

import pytest
from cli_runs import run


@pytest.mark.parametrize("command", ["skyrl-eval", "skyrl-serve"])
def test_help_lists_the_options_of_the_config_dir(tmp_path, command):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\n")
    result = run(tmp_path, command, "--help", "--config-dir", "conf")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  experiment "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("     "))
    assert "mine" in " ".join(lines[start:end]).split()
