"""``generator.backend=slow`` for a ``skyrl-serve`` subprocess (``imports=[slow_backend]``):
an engine that takes a minute to start, after writing ``started`` to the file named by
``SKYRL_SLOW_ENGINE_MARKER``. A test interrupts the server while it is starting."""

from __future__ import annotations

import os
import time
from pathlib import Path

from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec


class SlowEngine:
    def __init__(self, marker: str):
        Path(marker).write_text("started")
        time.sleep(60)


@ENGINE_BACKENDS.register("slow", override=True)
def slow(cfg, model_path, tokenizer_path):
    return EngineSpec(SlowEngine, {"marker": os.environ["SKYRL_SLOW_ENGINE_MARKER"]})
