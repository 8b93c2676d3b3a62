"""Shared fixtures: one Ray cluster per test session, tiny models built locally."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster shared by every test that asks for it. Logical CPUs exceed the
    2 physical cores so policy, reference, critic and engine actors all fit; each actor
    sets its own torch thread count."""
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """A tiny random Qwen2 (head_dim 32) with a locally made tokenizer."""
    from skyrl.models.tiny import build_tiny_model

    return build_tiny_model()


def pytest_sessionstart(session):
    """The `skyrl-train` the tests run in subprocesses must import this checkout. A venv
    shared between clones (CI reuses one) can still point its editable install at another
    clone; the tests would then run old code and fail with confusing config errors."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent / "skyrl"
    probe = "import pathlib, skyrl; print(pathlib.Path(skyrl.__file__).resolve().parent)"
    found = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True)
    if found.returncode != 0 or Path(found.stdout.strip()) != here:
        where = found.stdout.strip() or found.stderr.strip().splitlines()[-1:]
        pytest.exit(f"this venv's skyrl is {where}, not {here}: run `make install-dev` here", 2)
