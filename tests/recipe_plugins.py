"""A recipe's plug-ins as the registry tests load them (``imports=[recipe_plugins]``, with
``tests/`` on the path): a metric sink and an engine backend, each registered by name from
outside ``skyrl/`` the way a recipe would."""

from __future__ import annotations

import json

from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec, hf_engine_kwargs
from skyrl.inference.hf import HFEngine
from skyrl.tracking import SINKS
from skyrl.tracking.sink import RunInfo

RECORDING_FILE = "recording_sink.jsonl"


@SINKS.register("recording")
class RecordingSink:
    """Writes each step's metrics to ``<output_dir>/recording_sink.jsonl``."""

    def __init__(self, run: RunInfo):
        self.file = (run.output_dir / RECORDING_FILE).open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class CountingHFEngine(HFEngine):
    """The hf engine, counting the requests it was sent; says how many at shutdown."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests = 0

    async def generate(self, prompt_ids, sampling, route_key=None):
        self.requests += 1
        return await super().generate(prompt_ids, sampling, route_key)

    def shutdown(self) -> None:
        print(f"counting_hf engine served {self.requests} requests", flush=True)
        super().shutdown()


@ENGINE_BACKENDS.register("counting_hf")
def counting_hf(cfg, model_path, tokenizer_path):
    """``generator=hf generator.backend=counting_hf``: the hf engine's kwargs, our class."""
    return EngineSpec(CountingHFEngine, hf_engine_kwargs(cfg, model_path, tokenizer_path))
