"""Engine backends by name: the built-in entries load their engine lazily, a recipe's
registered backend is built by ``make_engine`` and generates, mismatches fail clearly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skyrl.config.generator import HFGeneratorConfig, VLLMGeneratorConfig
from skyrl.inference import ENGINE_BACKENDS, SamplingParams, make_engine
from skyrl.inference.local import generate_batch


def test_importing_the_registry_loads_no_engine():
    code = (
        "import sys, skyrl.inference.backends as b; "
        "print(b.ENGINE_BACKENDS.names(), [m for m in ('vllm', 'transformers', 'torch') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['hf', 'vllm'] []"


def test_a_registered_backend_is_built_and_generates(tiny_model_path):
    import recipe_plugins  # tests/ is on sys.path (rootdir conftest); registers counting_hf

    cfg = HFGeneratorConfig(backend="counting_hf", num_engines=2, max_batch_size=3)
    client = make_engine(cfg, tiny_model_path, use_ray=False)
    try:
        engines = client.engines
        assert [type(e) for e in engines] == [recipe_plugins.CountingHFEngine] * 2
        assert all(e.max_batch_size == 3 for e in engines)  # hf_engine_kwargs read the schema
        prompts = [[1, 380, 201, 20 + i] for i in range(3)]
        out = generate_batch(client, prompts, SamplingParams(temperature=0.0, n=2, max_tokens=5))
        assert [len(group) for group in out] == [2, 2, 2]
        assert all(len(c.token_ids) == len(c.logprobs) >= 1 for group in out for c in group)
        assert sum(e.requests for e in engines) == 6  # 3 prompts x 2 samples
    finally:
        client.shutdown()


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(KeyError, match="unknown engine backend 'nope'; registered: .*hf, vllm"):
        make_engine(HFGeneratorConfig(backend="nope"), "unused")


def test_a_backend_on_the_wrong_schema_says_which_option_it_reads():
    with pytest.raises(TypeError, match="'hf' reads the fields of generator=hf; got a VLLM"):
        make_engine(VLLMGeneratorConfig(backend="hf"), "unused")
    assert "hf" in ENGINE_BACKENDS and "vllm" in ENGINE_BACKENDS


def test_trust_remote_code_reaches_the_hf_engine(tiny_model_path, tmp_path):
    from custom_code_model import custom_code_model  # tests/ is on sys.path

    path = custom_code_model(tiny_model_path, tmp_path / "custom_model")
    client = make_engine(HFGeneratorConfig(), path, use_ray=False, trust_remote_code=True)
    try:
        [engine] = client.engines
        assert type(engine.model).__name__ == "CustomForCausalLM"  # the model's own class
        [[c]] = generate_batch(
            client, [[1, 380, 201]], SamplingParams(temperature=0.0, max_tokens=3)
        )
        assert 1 <= len(c.token_ids) == len(c.logprobs) <= 3
    finally:
        client.shutdown()


def test_trust_remote_code_reaches_the_vllm_engine_kwargs():
    from skyrl.inference.factory import engine_spec
    from skyrl.inference.vllm_engine import VLLMEngine

    spec = engine_spec(VLLMGeneratorConfig(), "m", None, trust_remote_code=True)
    assert spec.cls is VLLMEngine and spec.kwargs["trust_remote_code"] is True
    # off (the default): not passed, so an engine class without the argument still builds
    assert "trust_remote_code" not in engine_spec(VLLMGeneratorConfig(), "m", None).kwargs


def test_vllm_kv_cache_size_on_cpu_and_gpu():
    """generator.kv_cache_memory_bytes=null (the default) sizes the cache by
    gpu_memory_utilization on a GPU and at 256 MiB on CPU; a set value is used on both."""
    from skyrl.api import compose
    from skyrl.config.validate import validate
    from skyrl.inference.backends import vllm_engine_kwargs
    from skyrl.inference.vllm_engine import cache_memory_kwargs

    def engine_memory_kwargs(on_gpu: bool, *overrides: str) -> dict:
        kwargs = vllm_engine_kwargs(validate(compose(list(overrides))).generator, "m", None)
        return cache_memory_kwargs(
            on_gpu, kwargs["kv_cache_memory_bytes"], kwargs["gpu_memory_utilization"]
        )

    util = "generator.gpu_memory_utilization=0.3"
    assert engine_memory_kwargs(False, util) == {"kv_cache_memory_bytes": 256 * 1024 * 1024}
    assert engine_memory_kwargs(True, util) == {"gpu_memory_utilization": 0.3}
    fixed = "generator.kv_cache_memory_bytes=16777216"  # 16 MiB
    assert engine_memory_kwargs(False, util, fixed) == {"kv_cache_memory_bytes": 16777216}
    assert engine_memory_kwargs(True, util, fixed) == {
        "kv_cache_memory_bytes": 16777216,
        "gpu_memory_utilization": 0.3,  # vLLM still checks this much is free at start
    }
