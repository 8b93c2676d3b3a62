"""The notebooks under ``notebooks/`` run top to bottom on the tiny model (slow), and are
committed without outputs (fast)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
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
