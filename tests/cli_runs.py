"""Running the installed console scripts (``skyrl-train``, ``skyrl-eval``, ``skyrl-serve``) in a
subprocess, and reading the one error line a bad command line gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
"""Where this interpreter's console scripts are."""


def run(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess:
    """``command`` (a console script's name) with ``args``, in ``tmp_path``."""
    return subprocess.run(
        [str(BIN / command), *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    """The one stderr line of a command refused as bad input (exit 2, no traceback)."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    return line
