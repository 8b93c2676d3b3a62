"""The wheel ships conf/ inside the package, so a non-editable install can compose configs."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_contains_every_config_yaml(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("skyrl-*.whl")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".yaml")}
    expected = {
        f"skyrl/conf/{p.relative_to(REPO / 'skyrl' / 'conf').as_posix()}"
        for p in (REPO / "skyrl" / "conf").rglob("*.yaml")
    }
    assert expected and expected <= shipped
    assert "entry_points.txt" in " ".join(zipfile.ZipFile(wheel).namelist())
