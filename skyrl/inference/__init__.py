"""Inference engines: one request (prompt token ids) in, sampled tokens + logprobs out.

``make_engine(cfg, model_path)`` builds the client over the engine(s) that
``generator.backend`` names in ``ENGINE_BACKENDS`` (built in: ``hf``, ``vllm``; a recipe
registers its own, ``skyrl.inference.backends``); ``generate_batch`` is the blocking
many-prompt call.
"""

from skyrl.inference.backends import ENGINE_BACKENDS, EngineSpec
from skyrl.inference.base import Completion, InferenceEngine, SamplingParams
from skyrl.inference.factory import make_engine
from skyrl.inference.local import generate_batch, run_serving

__all__ = [
    "ENGINE_BACKENDS",
    "EngineSpec",
    "Completion",
    "InferenceEngine",
    "SamplingParams",
    "generate_batch",
    "make_engine",
    "run_serving",
]
