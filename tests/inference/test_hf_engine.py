"""The hf engine: greedy tokens equal model.generate, logprobs equal a forward, weight updates land."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine
from skyrl.models import build_tiny_model


@pytest.fixture(scope="module")
def setup():
    path = build_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [
        tok.encode(t)
        for t in ["What is 12 + 7?", "Hello", "The quick brown fox jumps over", "def add(a, b):"]
    ]
    return path, tok, prompts


def forward_logprobs(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_greedy_matches_generate_and_forward(setup):
    path, tok, prompts = setup
    engine = HFEngine(path, max_batch_size=3)
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))
    model = AutoModelForCausalLM.from_pretrained(path)
    for prompt, [c] in zip(prompts, out, strict=True):
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
        )[0, len(prompt) :].tolist()
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        assert c.token_ids == ref
        assert c.finish_reason == ("stop" if ref[-1] == tok.eos_token_id else "length")
        expected = forward_logprobs(model, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_sampling_n_seed_and_raw_logprobs(setup):
    path, tok, prompts = setup
    engine = HFEngine(path)
    sp = SamplingParams(n=3, temperature=1.5, top_p=0.9, top_k=50, max_tokens=8, seed=7)
    a = engine.generate(prompts[:2], sp)
    b = engine.generate(prompts[:2], sp)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert len(a) == 2 and all(len(g) == 3 for g in a)
    model = engine.model
    for prompt, group in zip(prompts[:2], a, strict=True):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) and c.finish_reason in ("stop", "length")
            # raw (untempered) logprobs, as a plain forward computes them
            expected = forward_logprobs(model, prompt, c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_stop_strings_and_stop_token_ids(setup):
    path, tok, prompts = setup
    engine = HFEngine(path)
    [[free]] = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=10))
    stop_tok = free.token_ids[2]
    [[c]] = engine.generate(
        prompts[:1], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_tok])
    )
    first = free.token_ids.index(stop_tok)
    assert c.token_ids == free.token_ids[: first + 1] and c.finish_reason == "stop"
    text = tok.decode(free.token_ids[:3])
    stop = text[-1] if text.strip() else None
    if stop:
        [[s]] = engine.generate(
            prompts[:1], SamplingParams(temperature=0.0, max_tokens=10, stop=[stop])
        )
        assert stop in tok.decode(s.token_ids) and s.finish_reason == "stop"
        assert stop not in tok.decode(s.token_ids[:-1])


def test_update_weights_changes_logprobs(setup):
    path, tok, prompts = setup
    engine = HFEngine(path)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    named = list(other.state_dict().items())
    buckets = [named[:5], dict(named[5:])]  # bucketed, mixed forms
    engine.update_weights(buckets)
    [[c]] = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))
    expected = forward_logprobs(other, prompts[0], c.token_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    with pytest.raises(KeyError, match="nope"):
        engine.update_weights([("nope", torch.zeros(1))])
