"""Inference engines: generate from token ids (tokens + logprobs out), update weights.

``make_engine(cfg, model_path)`` builds the engine (or the load-balancing client
over several) that ``generator.backend`` names.
"""

from skyrl.inference.base import Completion, InferenceEngine, SamplingParams
from skyrl.inference.factory import make_engine

__all__ = ["Completion", "InferenceEngine", "SamplingParams", "make_engine"]
