"""The hf engine: greedy equals model.generate, logprobs are tempered and untruncated, each
request's seed alone fixes its tokens, stops, weight updates, and serving from a thread."""

import asyncio
import dataclasses
import threading
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl.inference.base import SamplingParams
from skyrl.inference.hf import HFEngine, _Rows
from skyrl.inference.local import generate_batch, run_serving
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


@pytest.fixture(scope="module")
def engine(setup):
    """A shared engine for the tests that leave its weights alone."""
    return HFEngine(setup[0])


def forward_logits(model, prompt, response):
    """fp32 logits predicting each response token, from one forward over prompt + response."""
    with torch.no_grad():
        return model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()


def at(logprobs, tokens):
    return logprobs.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def serve_all(engine, requests):
    """One completion per ``(prompt, sampling)``, all in flight at once."""

    async def run():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in requests))

    return run_serving(engine, run())


def test_greedy_matches_generate_and_forward(setup):
    path, tok, prompts = setup
    engine = HFEngine(path, max_batch_size=3)  # 4 prompts: two batches
    out = generate_batch(engine, prompts, SamplingParams(temperature=0.0, max_tokens=12))
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
        expected = at(torch.log_softmax(forward_logits(model, prompt, ref), -1), ref)
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("truncation", [{}, {"top_p": 0.8}, {"top_k": 20}])
def test_logprobs_tempered_and_untruncated(setup, engine, truncation):
    path, tok, prompts = setup
    sp = SamplingParams(n=2, temperature=0.7, max_tokens=10, seed=3, **truncation)
    out = generate_batch(engine, prompts, sp)
    for prompt, group in zip(prompts, out, strict=True):
        for c in group:
            logits = forward_logits(engine.model, prompt, c.token_ids)
            tempered = torch.log_softmax(logits / 0.7, -1)
            # the logprob is the full tempered distribution's, truncated or not (to fp32
            # noise: the engine pads the batch's rows, 1.2e-5 seen; untempered or truncated
            # distributions differ by > 1e-2)
            torch.testing.assert_close(
                torch.tensor(c.logprobs), at(tempered, c.token_ids), atol=1e-4, rtol=0
            )
            # ...while the token came from the truncated one
            chosen = at(logits, c.token_ids)[:, None]
            rank = (logits > chosen).sum(-1)
            mass_before = (tempered.exp() * (logits > chosen)).sum(-1)
            if "top_k" in truncation:
                assert (rank < 20).all()
            if "top_p" in truncation:
                assert (mass_before < 0.8 + 1e-5).all()


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_truncation_to_the_top_token_is_greedy(setup, engine, truncation):
    path, tok, prompts = setup
    greedy = generate_batch(engine, prompts, SamplingParams(temperature=0.0, max_tokens=8))
    sp = SamplingParams(temperature=1.0, max_tokens=8, seed=5, **truncation)
    sampled = generate_batch(engine, prompts, sp)
    assert [g[0].token_ids for g in sampled] == [g[0].token_ids for g in greedy]


def test_sampling_takes_the_quantile_of_the_truncated_distribution():
    # p = (.1, .2, .3, .4): CDF (.1, .3, .6, 1.0); u = .05, .25, .55, .95 pick 0, 1, 2, 3.
    # top_k=2 keeps (0, 0, .3, .4): CDF (0, 0, .3, .7); u * .7 = .035, .175, .385, .665
    # pick 2, 2, 3, 3. min_p=0.6 keeps p >= .24: the same two tokens.
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().repeat(4, 1)
    uniforms = torch.tensor([0.05, 0.25, 0.55, 0.95])
    for extra, expected in [
        ({}, [0, 1, 2, 3]),
        ({"top_k": 2}, [2, 2, 3, 3]),
        ({"min_p": 0.6}, [2, 2, 3, 3]),
    ]:
        params = [SamplingParams(temperature=1.0, max_tokens=1, **extra)] * 4
        rows = _Rows.build([[0]] * 4, params, [set()] * 4, vocab_size=4, device="cpu")
        rows.uniforms = uniforms[:, None]
        tokens, logprobs = rows.sample(logits, step=0)
        assert tokens.tolist() == expected
        torch.testing.assert_close(logprobs, torch.tensor([0.1, 0.2, 0.3, 0.4])[expected].log())


def test_min_p_applies_before_top_k_and_top_p_as_in_vllm():
    # p = (.45, .30, .15, .10), min_p=0.3, top_p=0.8. vLLM (Sampler.sample) applies min-p
    # first: floor .3 x .45 = .135 drops token 3; renormalised (.5, .333, .167), top-p keeps
    # the fewest tokens reaching .8: .5 + .333 = .833, so {0, 1}. Top-p first over the full
    # mass kept {0, 1, 2} (.45 + .30 = .75 < .8 needs token 2), min-p then dropped nothing.
    # With top_k=3 as well the answer is the same (top-k after min-p keeps the 3 left).
    probs = torch.tensor([[0.45, 0.30, 0.15, 0.10]])
    for extra in ({}, {"top_k": 3}):
        sp = SamplingParams(temperature=1.0, top_p=0.8, min_p=0.3, max_tokens=1, **extra)
        rows = _Rows.build([[1]], [sp], [set()], vocab_size=4, device="cpu")
        kept = rows.truncate(probs.clone())
        assert (kept > 0)[0].tolist() == [True, True, False, False], extra
        torch.testing.assert_close(kept[0, :2], probs[0, :2])  # not renormalised


def test_a_requests_seed_alone_fixes_its_tokens(setup, engine):
    path, tok, prompts = setup
    sp = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=11)
    [alone] = serve_all(engine, [(prompts[0], sp)])
    others = [  # different lengths and sampling, in front of and behind it
        (prompts[1], SamplingParams(temperature=0.0, max_tokens=3)),
        (prompts[2], dataclasses.replace(sp, seed=1)),
        (prompts[3] * 3, SamplingParams(temperature=0.5, top_k=5, max_tokens=12, seed=2)),
        (prompts[1] * 2, dataclasses.replace(sp, seed=None, max_tokens=5)),
        (prompts[3], SamplingParams(temperature=1.0, min_p=0.1, max_tokens=12)),
    ]
    batch = serve_all(engine, others[:2] + [(prompts[0], sp)] + others[2:])
    assert batch[2].token_ids == alone.token_ids
    torch.testing.assert_close(batch[2].logprobs, alone.logprobs, atol=1e-5, rtol=0)
    [again] = serve_all(engine, [(prompts[0], sp)])
    assert again.token_ids == alone.token_ids
    [other_seed, unseeded_a, unseeded_b] = serve_all(
        engine,
        [(prompts[0], dataclasses.replace(sp, seed=12))]
        + [(prompts[0], dataclasses.replace(sp, seed=None))] * 2,
    )
    assert other_seed.token_ids != alone.token_ids
    assert unseeded_a.token_ids != unseeded_b.token_ids


def test_rows_finish_individually(setup, engine):
    path, tok, prompts = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    alone = [serve_all(engine, [(p, greedy)])[0].token_ids for p in prompts]
    # the two short rows finish first and are dropped from the batch and its KV cache
    lengths = [2, 12, 3, 12, 12, 12]
    mixed = serve_all(
        engine,
        [
            (prompts[i % 4], dataclasses.replace(greedy, max_tokens=n))
            for i, n in enumerate(lengths)
        ],
    )
    for i, (c, n) in enumerate(zip(mixed, lengths, strict=True)):
        assert c.token_ids == alone[i % 4][:n] and c.finish_reason == "length"


def test_stop_strings_and_stop_token_ids(setup, engine):
    path, tok, prompts = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    [free] = serve_all(engine, [(prompts[0], greedy)])
    stop_tok = free.token_ids[2]
    first = free.token_ids.index(stop_tok)
    text = tok.decode(free.token_ids[:3])
    stop = text.strip()[-1]
    by_token, by_string = serve_all(
        engine,
        [
            (prompts[0], dataclasses.replace(greedy, stop_token_ids=[stop_tok])),
            (prompts[0], dataclasses.replace(greedy, stop=[stop])),
        ],
    )
    assert by_token.token_ids == free.token_ids[: first + 1] and by_token.finish_reason == "stop"
    assert stop in tok.decode(by_string.token_ids) and by_string.finish_reason == "stop"
    assert stop not in tok.decode(by_string.token_ids[:-1])
    assert by_string.token_ids == free.token_ids[: len(by_string.token_ids)]
    # a stop string completed by the last allowed token is still a stop
    cut = dataclasses.replace(greedy, stop=[stop], max_tokens=len(by_string.token_ids))
    [at_limit] = serve_all(engine, [(prompts[0], cut)])
    assert at_limit.token_ids == by_string.token_ids and at_limit.finish_reason == "stop"


def test_a_bad_request_fails_alone(setup, engine):
    path, tok, prompts = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=4)

    async def run():
        return await asyncio.gather(
            engine.generate([], greedy),
            engine.generate(prompts[0], dataclasses.replace(greedy, max_tokens=0)),
            engine.generate(prompts[0], greedy),
            return_exceptions=True,
        )

    empty_prompt, no_tokens, fine = run_serving(engine, run())
    assert isinstance(empty_prompt, ValueError)
    assert no_tokens.token_ids == [] and no_tokens.finish_reason == "length"
    assert len(fine.token_ids) == 4


def test_an_unknown_token_id_or_an_empty_stop_fails_that_request_alone(setup, engine):
    """An id outside the vocabulary failed the whole batch (IndexError in the embedding; on
    CUDA a device assert); a stop "" ended every completion at its first token ("" is in
    every text). Each now fails its own request; the batch mates are answered."""
    path, tok, prompts = setup
    vocab_size = engine.model.get_input_embeddings().num_embeddings
    assert vocab_size == 468  # the tiny model's tokenizer: ids 0..467
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    empty_stop = dataclasses.replace(greedy)
    empty_stop.stop = ["</answer>", ""]  # past SamplingConfig's check, as a driver may build it
    [alone] = serve_all(engine, [(prompts[0], greedy)])

    async def run():
        return await asyncio.gather(
            engine.generate(prompts[0], greedy),
            engine.generate([prompts[0][0], 468], greedy),
            engine.generate([-1, prompts[0][0]], greedy),
            engine.generate(prompts[0], empty_stop),
            engine.generate(prompts[0], greedy),
            return_exceptions=True,
        )

    first, too_high, negative, stops_at_once, last = run_serving(engine, run())
    assert isinstance(too_high, ValueError)
    assert "token id 468 is outside the vocabulary [0, 468)" in str(too_high)
    assert isinstance(negative, ValueError) and "token id -1 is outside" in str(negative)
    assert isinstance(stops_at_once, ValueError) and "empty stop string" in str(stops_at_once)
    assert first.token_ids == last.token_ids == alone.token_ids and len(alone.token_ids) == 4


def test_update_weights_takes_a_tied_models_state_dict(setup):
    """A tied model's ``state_dict`` holds ``lm_head.weight``, an alias of the embedding that
    ``named_parameters()`` leaves out: the update raised KeyError (vLLM takes it)."""
    tied = {"arch": "llama", "tie_word_embeddings": True}
    engine = HFEngine(build_tiny_model(**tied))
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1, **tied))
    assert "lm_head.weight" in other.state_dict()
    prompt = setup[2][0]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    [[before]] = generate_batch(engine, [prompt], greedy)
    engine.update_weights(other.state_dict())
    [[c]] = generate_batch(engine, [prompt], greedy)
    expected = at(torch.log_softmax(forward_logits(other, prompt, c.token_ids), -1), c.token_ids)
    # cached decode vs one full forward, fp32: the reviewer measured 1.9e-6
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-5, rtol=0)
    # the old weights' logprobs are far from the new model's: the update did something
    old = at(
        torch.log_softmax(forward_logits(other, prompt, before.token_ids), -1), before.token_ids
    )
    assert (torch.tensor(before.logprobs) - old).abs().max() > 1e-2
    assert engine.model.lm_head.weight is engine.model.get_input_embeddings().weight  # still tied


def test_update_weights_changes_logprobs(setup):
    path, tok, prompts = setup
    engine = HFEngine(path)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    named = list(other.state_dict().items())
    engine.update_weights([named[:5], dict(named[5:])])  # bucketed, mixed forms
    [[c]] = generate_batch(engine, prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))
    expected = at(
        torch.log_softmax(forward_logits(other, prompts[0], c.token_ids), -1), c.token_ids
    )
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    with pytest.raises(KeyError, match="nope"):
        engine.update_weights([("nope", torch.zeros(1))])


def test_requests_arriving_at_different_times_all_complete(setup, engine, monkeypatch):
    path, tok, prompts = setup
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    alone = [serve_all(engine, [(p, greedy)])[0].token_ids for p in prompts]
    batch_sizes = []
    decode = engine._decode

    def recording(prompt_ids, params):
        batch_sizes.append(len(prompt_ids))
        return decode(prompt_ids, params)

    monkeypatch.setattr(engine, "_decode", recording)

    async def one(i, delay):
        await asyncio.sleep(delay)
        return i, await engine.generate(prompts[i % 4], greedy)

    async def run():
        delays = [0, 0, 0, 0, 0.002, 0.02, 0.05, 0.1]
        return await asyncio.gather(*(one(i, d) for i, d in enumerate(delays)))

    out = run_serving(engine, run())
    assert len(out) == 8 and all(c.token_ids == alone[i % 4] for i, c in out)
    assert sum(batch_sizes) == 8 and max(batch_sizes) > 1  # the simultaneous ones batched


def test_control_call_from_another_thread_runs_on_the_serving_thread(setup):
    path, tok, prompts = setup
    engine = HFEngine(path)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=1))
    threads = []
    load = engine._load_weights
    engine._load_weights = lambda w: (threads.append(threading.get_ident()), load(w))
    greedy = SamplingParams(temperature=0.0, max_tokens=6)

    async def run():
        before = await engine.generate(prompts[0], greedy)
        await asyncio.to_thread(engine.update_weights, other.state_dict())
        return before, await engine.generate(prompts[0], greedy)

    before, after = run_serving(engine, run())
    assert threads == [threading.get_ident()]  # run_serving serves on this thread
    expected = at(
        torch.log_softmax(forward_logits(other, prompts[0], after.token_ids), -1), after.token_ids
    )
    torch.testing.assert_close(torch.tensor(after.logprobs), expected, atol=1e-4, rtol=0)
    assert before.logprobs != after.logprobs


def test_shutdown_releases_the_model(setup):
    engine = HFEngine(setup[0])
    model = weakref.ref(engine.model)
    engine.shutdown()
    assert engine.model is None and model() is None
    # a request after it raised AttributeError ('NoneType' ... 'get_input_embeddings') out
    # of serve; now it fails alone with one line
    with pytest.raises(RuntimeError, match=r"^hf engine: generate after shutdown\(\)$"):
        serve_all(engine, [([5, 6], SamplingParams(max_tokens=2))])


def test_update_weights_refuses_a_tensor_of_another_shape(setup):
    """``copy_`` broadcasts: a [64] tensor for the [468, 64] embedding was accepted and
    overwrote every row with it (vLLM's loader refuses a size mismatch). Now a ValueError
    names the parameter and both shapes, and the parameter is left as it was."""
    engine = HFEngine(setup[0])
    embedding = engine.model.get_input_embeddings().weight
    before = embedding.detach().clone()
    with pytest.raises(ValueError) as error:
        engine.update_weights({"model.embed_tokens.weight": torch.zeros(64)})
    assert str(error.value) == (
        "update_weights: 'model.embed_tokens.weight' is a tensor of shape [64]; "
        "the model's parameter has shape [468, 64]"
    )
    assert torch.equal(embedding, before)


def _engine_from_config(config, tok, folder) -> HFEngine:
    """An hf engine of a model built from ``config`` (seed 0), saved with ``tok`` in ``folder``."""
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return HFEngine(str(folder))


@pytest.fixture(scope="module")
def short_context_engine(setup, tmp_path_factory):
    """The tiny model with a 16-token context and learned absolute positions (GPT-2): a
    position past the context is an index outside its position embedding."""
    from transformers import GPT2Config

    path, tok, _ = setup
    folder = tmp_path_factory.mktemp("gpt2-context-16")
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=16,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return _engine_from_config(config, tok, folder)


def test_a_prompt_filling_the_context_fails_alone(setup, short_context_engine):
    """A prompt of at least the context's 16 tokens failed the whole batch with a bare
    IndexError ("index out of range in self"; on CUDA a device assert). As vLLM does, such
    a prompt is refused with the limit named, and the batch mates are answered."""
    engine, prompt = short_context_engine, setup[2][0][:8]
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    [alone] = serve_all(engine, [(prompt, greedy)])

    async def run():
        return await asyncio.gather(
            engine.generate(prompt, greedy),
            engine.generate(prompt * 2, greedy),  # 16 tokens: no room for one more
            engine.generate(prompt * 3, greedy),  # 24 tokens
            engine.generate(prompt, greedy),
            return_exceptions=True,
        )

    first, full, over, last = run_serving(engine, run())
    for refused, n in [(full, 16), (over, 24)]:
        assert isinstance(refused, ValueError)
        assert str(refused) == (
            f"hf engine: a prompt of {n} tokens leaves no room in the model's context of "
            "16 tokens (max_position_embeddings)"
        )
    assert first.token_ids == last.token_ids == alone.token_ids and len(alone.token_ids) == 4


def test_a_completion_ends_at_the_end_of_the_context(setup, short_context_engine):
    """Decoding past the context failed the whole batch with the same IndexError. As in
    vLLM, a completion ends with the context, finish_reason "length": an 8-token prompt
    in a 16-token context has room for 16 - 8 = 8 new tokens, whatever max_tokens asks."""
    engine, prompt = short_context_engine, setup[2][0][:8]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[])
    sampled = SamplingParams(temperature=1.0, max_tokens=8, seed=3)
    # with no EOS among the first 8 greedy tokens, the cap alone ends the completion
    [fits] = serve_all(engine, [(prompt, greedy)])
    assert len(fits.token_ids) == 8 and fits.finish_reason == "length"
    [fits_sampled] = serve_all(engine, [(prompt, sampled)])
    capped, capped_sampled, short = serve_all(
        engine,
        [
            (prompt, dataclasses.replace(greedy, max_tokens=30)),
            (prompt, dataclasses.replace(sampled, max_tokens=30)),
            (prompt[:4], dataclasses.replace(greedy, max_tokens=3)),
        ],
    )
    assert capped.token_ids == fits.token_ids and capped.finish_reason == "length"
    # the seed's stream is the same, cut at the context
    assert capped_sampled.token_ids == fits_sampled.token_ids
    assert capped_sampled.finish_reason == fits_sampled.finish_reason
    assert len(short.token_ids) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # batches of 0 requests: serve took the requests and never ran one (a busy hang)
        ({"max_batch_size": 0}, "hf engine: max_batch_size must be >= 1, got 0"),
        # AttributeError: module 'torch' has no attribute 'fp16'
        (
            {"dtype": "fp16"},
            "hf engine: dtype must name a torch dtype (float32, bfloat16, float16), got 'fp16'",
        ),
    ],
)
def test_a_bad_constructor_argument_is_one_line_naming_it(setup, kwargs, message):
    with pytest.raises(ValueError) as error:
        HFEngine(setup[0], **kwargs)
    assert str(error.value) == message


@pytest.fixture(scope="module")
def sentencepiece_style_engine(tmp_path_factory):
    """A tiny Llama with a Metaspace tokenizer (SentencePiece's: Llama-2, Mistral, Gemma):
    a word's leading space is its token's "▁", dropped when the text starts there."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    spm = Tokenizer(models.BPE(unk_token="<unk>"))
    spm.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    spm.decoder = decoders.Metaspace(prepend_scheme="first")
    corpus = ["the cat sat on the mat. Question: what is it? Answer: the cat"] * 20
    spm.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["</s>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=spm, eos_token="</s>", pad_token="</s>")
    folder = tmp_path_factory.mktemp("sentencepiece-style")
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return _engine_from_config(config, tok, folder)


def test_a_stop_string_at_the_first_token_keeps_its_leading_space(sentencepiece_style_engine):
    """The completion was decoded alone: with a SentencePiece tokenizer its first token
    "▁word" read "word", so the stop " word" (as in " Question:") never matched there, while
    vLLM, decoding the completion after its prompt, stops. Now the completion's text is
    read after the prompt's last token: " word", a stop."""
    engine = sentencepiece_style_engine
    tok = engine.tokenizer
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    prompt = tok.encode("the cat")
    [free] = serve_all(engine, [(prompt, greedy)])
    assert tok.convert_ids_to_tokens(free.token_ids[0]) == "▁Question"  # the random model's
    stop = " Question"
    assert not tok.decode(free.token_ids[:1]).startswith(" ")  # decoded alone: no space
    [stopped] = serve_all(engine, [(prompt, dataclasses.replace(greedy, stop=[stop]))])
    assert stopped.token_ids == free.token_ids[:1] and stopped.finish_reason == "stop"


def test_a_row_capped_by_the_context_does_not_overrun_it_while_others_decode(
    setup, short_context_engine
):
    """A finished row stays in the batch until a quarter of it has finished; a row ended by
    the context kept being fed at the positions after it (16, 17, ... past the 16 there are)."""
    engine, prompt = short_context_engine, setup[2][0][:8]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[])
    [capped_alone] = serve_all(engine, [(prompt, greedy)])
    [short_alone] = serve_all(engine, [(prompt[:2], greedy)])
    # 1 of 5 rows ends at step 8 (16 - 8 = 8 tokens): under a quarter, it is not dropped
    capped, *shorts = serve_all(engine, [(prompt, greedy)] + [(prompt[:2], greedy)] * 4)
    assert capped.token_ids == capped_alone.token_ids and len(capped.token_ids) == 8
    assert all(s.token_ids == short_alone.token_ids for s in shorts)
