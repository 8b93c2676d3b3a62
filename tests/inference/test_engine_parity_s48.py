"""The hf and vllm engines give one request one meaning: greedy tokens, logprobs and finish
reasons agree (stop token, stop string over two tokens, EOS or a stop string on the last
allowed token, the context's end), and a request neither can serve fails alone on both."""

import asyncio
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import run_serving
from skyrl.models import build_tiny_model

VOCAB_SIZE = 468
"""The tiny model's embedding rows: token ids 0..467."""
CONTEXT_LEN = 2048
"""The tiny model's max_position_embeddings; the vllm engine gets it as max_model_len."""


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


@pytest.fixture(scope="module")
def hf_engine():
    from skyrl.inference.hf import HFEngine

    return HFEngine(build_tiny_model())


@pytest.fixture(scope="module")
def vllm_engine():
    from skyrl.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        build_tiny_model(), kv_cache_memory_bytes=16 << 20, max_model_len=CONTEXT_LEN
    )
    yield engine
    engine.shutdown()


@pytest.fixture
def engine(request):
    return request.getfixturevalue(f"{request.param}_engine")


HF_AND_VLLM = pytest.mark.parametrize(
    "engine", ["hf", pytest.param("vllm", marks=pytest.mark.slow)], indirect=True
)


def serve_all(engine, requests):
    """One completion (or the exception) per ``(prompt, sampling)``, all in flight at once."""

    async def run():
        return await asyncio.gather(
            *(engine.generate(p, s) for p, s in requests), return_exceptions=True
        )

    return run_serving(engine, run())


def completions(engine, requests):
    out = serve_all(engine, requests)
    for c in out:
        if isinstance(c, BaseException):
            raise c
    return [(c.token_ids, c.finish_reason) for c in out], [c.logprobs for c in out]


@HF_AND_VLLM
def test_a_stop_token_id_outside_the_vocabulary_fails_that_request_alone(engine, tok):
    """vLLM refuses stop_token_ids=[500] or [5, -1] (no token has that id: the request would
    never stop on it); the hf engine took them and ignored them."""
    prompt = tok.encode("What is 12 + 7?")
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    [[alone], _] = completions(engine, [(prompt, greedy)])
    first, too_high, negative, last = serve_all(
        engine,
        [
            (prompt, greedy),
            (prompt, dataclasses.replace(greedy, stop_token_ids=[VOCAB_SIZE + 32])),
            (prompt, dataclasses.replace(greedy, stop_token_ids=[5, -1])),
            (prompt, greedy),
        ],
    )
    assert "stop_token_ids" in str(too_high) and "500" in str(too_high)
    assert "stop_token_ids" in str(negative) and "-1" in str(negative)
    assert (first.token_ids, first.finish_reason) == alone
    assert (last.token_ids, last.finish_reason) == alone


@HF_AND_VLLM
def test_a_seed_no_torch_generator_takes_fails_that_request_alone(engine, tok):
    """Each engine seeds a torch generator per request, which takes [-2**63, 2**64). With
    seed=2**64 the hf engine failed the whole batch and vLLM its serving loop, with
    "Overflow when unpacking long long"; now that request fails, naming its seed."""
    prompt = tok.encode("Hello")
    sampled = SamplingParams(temperature=1.0, max_tokens=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    [[alone], _] = completions(engine, [(prompt, greedy)])
    over, under, mate = serve_all(
        engine,
        [
            (prompt, dataclasses.replace(sampled, seed=2**64)),
            (prompt, dataclasses.replace(sampled, seed=-(2**63) - 1)),
            (prompt, greedy),
        ],
    )
    assert isinstance(over, ValueError) and "seed 18446744073709551616 " in str(over)
    assert isinstance(under, ValueError) and "seed -9223372036854775809 " in str(under)
    assert (mate.token_ids, mate.finish_reason) == alone
    # the ends of the range are seeds like any other: the same tokens each time
    edges = [dataclasses.replace(sampled, seed=s) for s in (2**64 - 1, -(2**63))]
    once, _ = completions(engine, [(prompt, s) for s in edges])
    again, _ = completions(engine, [(prompt, s) for s in edges])
    assert once == again and all(len(ids) == 4 for ids, _ in once)


@pytest.mark.slow
def test_greedy_requests_mean_the_same_on_both_engines(hf_engine, vllm_engine, tok):
    """Field by field: tokens, finish reason, and logprobs to 1e-4 (fp32 on both)."""
    prompts = [tok.encode(t) for t in ["What is 12 + 7?", "Hello", "def add(a, b):"]]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    free, _ = completions(hf_engine, [(prompts[0], greedy)])
    ids = free[0][0]
    texts = [tok.decode([t]) for t in ids]
    assert len(texts[1]) >= 1 and len(texts[2]) >= 2  # a stop string over tokens 1 and 2
    requests = [(p, greedy) for p in prompts] + [
        (prompts[0], dataclasses.replace(greedy, stop_token_ids=[ids[2]])),
        (prompts[0], dataclasses.replace(greedy, stop=[texts[1][-1] + texts[2][0]])),
        (prompts[0], dataclasses.replace(greedy, stop=[texts[2][:2]], max_tokens=3)),
        (prompts[1], dataclasses.replace(greedy, max_tokens=1)),
        ((prompts[0] * 400)[: CONTEXT_LEN - 1], dataclasses.replace(greedy, max_tokens=5)),
        # over the prompt's last token and the completion's first: only the completion's
        # own text ends it, so this one runs to max_tokens
        (prompts[0], dataclasses.replace(greedy, stop=[tok.decode(prompts[0][-1:]) + texts[0]])),
    ]
    hf, hf_logprobs = completions(hf_engine, requests)
    vllm, vllm_logprobs = completions(vllm_engine, requests)
    assert hf == vllm
    for a, b in zip(hf_logprobs, vllm_logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)
    stop_at = ids.index(ids[2]) + 1  # 3: the first greedy token with that id is token 2
    expected = [
        (ids[:stop_at], "stop"),  # stop token
        (ids[:3], "stop"),  # the stop string ends in token 2
        (ids[:3], "stop"),  # ... the last allowed token (max_tokens=3)
        (hf[1][0][:1], "length"),  # max_tokens=1
        (hf[7][0], "length"),  # the prompt leaves 2048 - 2047 = 1 token of context
        (ids, "length"),  # all 12 tokens
    ]
    assert hf[3:] == expected
    assert len(hf[7][0]) == 1


@pytest.mark.slow
def test_eos_on_the_last_allowed_token_is_a_stop_on_both_engines(hf_engine, vllm_engine, tok):
    """EOS is kept and ends the completion with ``stop``, on the last allowed token too.
    The head row of EOS is made 1.5 x that of a token the greedy completion picks, so EOS
    takes over at that step or sooner; the engines get their weights back afterwards."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model())
    prompt = tok.encode("What is 12 + 7?")
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    [(ids, _)], _ = completions(hf_engine, [(prompt, greedy)])
    head = model.lm_head.weight.detach()
    edited = head.clone()
    edited[tok.eos_token_id] = head[ids[4]] * 1.5
    engines = (hf_engine, vllm_engine)
    try:
        for engine in engines:
            engine.update_weights([("lm_head.weight", edited)])
        [(free, reason)], _ = completions(hf_engine, [(prompt, greedy)])
        assert free[-1] == tok.eos_token_id and reason == "stop" and len(free) <= 5
        at_limit = dataclasses.replace(greedy, max_tokens=len(free))
        requests = [(prompt, greedy), (prompt, at_limit)]
        hf, hf_logprobs = completions(hf_engine, requests)
        vllm, vllm_logprobs = completions(vllm_engine, requests)
        assert hf == vllm == [(free, "stop"), (free, "stop")]
        for a, b in zip(hf_logprobs, vllm_logprobs, strict=True):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)
    finally:
        for engine in engines:
            engine.update_weights([("lm_head.weight", head)])
