"""An in-process endpoint over any engine (served on a thread of the test) and the tiny
model's tokenizer."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@contextmanager
def endpoint(
    engine, tokenizer, names=("tiny",), max_prompt=64, max_gen=32, max_per_turn=None, **kwargs
):
    """``(base_url, backend)`` of an endpoint over ``engine`` (served on a thread here);
    ``max_per_turn``: ``generator.max_tokens_per_turn``."""
    from skyrl.serve.app import HTTPServer, build_app
    from skyrl.serve.backend import EngineBinding, Limits, OpenAIBackend

    done: Future = Future()
    serving = threading.Thread(target=engine.serve, args=(done,), daemon=True)
    serving.start()
    backend = OpenAIBackend(
        tokenizer,
        list(names),
        Limits(max_prompt, max_gen, max_per_turn),
        EngineBinding(engine),
        **kwargs,
    )
    server = HTTPServer(build_app(backend))
    try:
        yield server.start(), backend
    finally:
        server.stop()
        done.set_result(None)
        serving.join(timeout=10)


def training_session(backend, engine, uid: str = "p7", **sampling):
    """A training session on ``backend`` for a row ``uid`` (``SamplingParams(**sampling)``),
    as the harness opens one for each trajectory."""
    from skyrl.data.prompts import PromptRow
    from skyrl.inference.base import SamplingParams
    from skyrl.serve.backend import EngineBinding, Session

    row = PromptRow("q", "toy", {}, uid=uid)
    return backend.sessions.open(Session(row, 0, SamplingParams(**sampling), EngineBinding(engine)))
