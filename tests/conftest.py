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
