"""A session on a SentencePiece tokenizer (Llama-2, Mistral: a word's leading space is its
token's ``▁``, which a decode drops at the start of a text; ``<0xNN>`` byte fallback) with a
Mistral-like chat template, built here. The agent sends each reply back as it got it; the
session's row goes on. The engine is scripted: it says the prompt's last ``SAY:``."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import endpoint, training_session
from scripted_engine import ScriptedEngine

from skyrl.inference.base import Completion

MISTRAL_V3 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% elif m['role'] == 'assistant' %}"
    "{{ ' ' + m['content']|trim + eos_token }}{% endif %}{% endfor %}"
)
"""Mistral v0.3's shape: the template writes the space before a reply itself."""


def sentencepiece_tokenizer(template: str):
    """A Llama tokenizer (Metaspace, byte fallback, prefix space stripped on decode) with a
    vocabulary trained here, ``[INST]``, ``[/INST]`` and ``[TOOL_CALLS]`` special."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizer

    spm = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    spm.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    corpus = ["SAY: the cat sat on the mat ok"] * 20
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    spm.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=320, special_tokens=specials))
    model = json.loads(spm.to_str())["model"]
    tok = LlamaTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]])
    tok.add_special_tokens({"additional_special_tokens": ["[INST]", "[/INST]", "[TOOL_CALLS]"]})
    tok.chat_template = template
    return tok


class InstEngine(ScriptedEngine):
    """Says what the prompt's last ``SAY:`` says up to `` [/INST]``, then EOS."""

    def reply(self, prompt_ids, sampling):
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        said = text.rsplit("SAY:", 1)[1].split(" [/INST]", 1)[0]
        ids = self.tokenizer.encode(said, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), "stop")


def converse(tok, first: str, then: list[str]):
    """``(engine, session, replies)``: the agent says ``first``, then each of ``then`` after
    the reply before it, sent back as it got it."""
    engine = InstEngine(tok)
    replies = []
    with endpoint(engine, tok, max_prompt=256, max_gen=128) as (url, backend):
        session = training_session(backend, engine, seed=11)
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:" + first}]
        for said in [*then, None]:
            reply = client.chat.completions.create(model="tiny", messages=messages).choices[0]
            replies.append(reply.message.content)
            if said is not None:
                messages += [reply.message.model_dump(), {"role": "user", "content": "SAY:" + said}]
    return engine, session, replies


@pytest.fixture(scope="module")
def v3_tokenizer():
    return sentencepiece_tokenizer(MISTRAL_V3)


def test_special_tokens_after_a_prefix_spaced_word_are_left_out_where_they_are(v3_tokenizer):
    """Two special tokens mid-reply, each followed by a "▁word": the second one's offset was
    counted from the text between them decoded alone ("sat", not " sat"), one character
    short, so the reply sent back forked the row (rerendered) instead of realigning."""
    tok = v3_tokenizer
    engine, session, replies = converse(tok, "the cat[TOOL_CALLS] sat[TOOL_CALLS] on", ["ok"])
    special = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    first, second = session.records
    assert first.response_ids.count(special) == 2
    assert replies[0].strip() == "the cat sat on"  # the text leaves the special tokens out
    assert (second.decision.kind, second.decision.reason) == ("realigned", "")
    # the engine continues from what it sampled, both special tokens included
    rest = tok.encode("[INST] SAY:ok [/INST]", add_special_tokens=False)
    assert engine.prompts[1] == engine.prompts[0] + first.response_ids + rest


MISTRAL_V2 = MISTRAL_V3.replace("' ' + m['content']|trim", "m['content']")
"""Mistral v0.1/v0.2's shape (and any template writing a reply right after the generation
prompt): the reply's own first token carries the space."""


def vllm_text(tok, prompt_ids: list[int], reply_ids: list[int]) -> str:
    """The reply's text as vLLM's server gives it: a decode stream primed with the prompt,
    special tokens skipped (``FastIncrementalDetokenizer``)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=prompt_ids, skip_special_tokens=True)
    return "".join(stream.step(tok._tokenizer, t) or "" for t in reply_ids)


def test_a_reply_reads_as_after_its_prompt_and_sent_back_extends_the_row():
    """The reply's text was its decode alone, "the cat": vLLM's server answers " the cat",
    and sent back after "[/INST]" it rendered a text the row does not hold, so every turn of
    every session on such a model forked the row (rerendered)."""
    tok = sentencepiece_tokenizer(MISTRAL_V2)
    engine, session, replies = converse(tok, "the cat", ["sat on", "ok"])
    assert replies == [" the cat", " sat on", " ok"]
    records = session.records
    said = [vllm_text(tok, p, r.response_ids) for p, r in zip(engine.prompts, records, strict=True)]
    assert replies == said
    assert [(r.decision.kind, r.decision.reason) for r in records] == [
        ("first", ""),
        ("append", ""),
        ("append", ""),
    ]


def test_a_completion_text_reads_as_after_its_prompt():
    # "Q: the cat" + "▁sat ▁on": the text is " sat on" (vLLM's), as the tokens' own logprob
    # texts and offsets say (" sat" at 0, " on" at 4); it was "sat on" with the offsets of
    # " sat on", so prompt + text read "Q: the catsat on"
    tok = sentencepiece_tokenizer(MISTRAL_V2)
    engine = ScriptedEngine(tok, then="")
    with endpoint(engine, tok, max_prompt=256, max_gen=128) as (url, _):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        choice = client.completions.create(
            model="tiny",
            prompt="Q: the cat SAY:sat on",
            logprobs=0,
            extra_body={"return_token_ids": True},
        ).choices[0]
    sampled = choice.model_extra["token_ids"]
    assert choice.text == " sat on" == vllm_text(tok, engine.prompts[0], sampled)
    assert choice.logprobs.tokens[:2] == [" sat", " on"]
    assert choice.logprobs.text_offset[:2] == [0, 4]


@pytest.mark.parametrize("add_special_tokens", [None, True, False])
def test_a_completion_prompt_is_encoded_with_the_tokenizers_bos(add_special_tokens):
    """As vLLM's server encodes a /v1/completions text prompt: with the special tokens the
    tokenizer adds (Llama-2's, Mistral's, Gemma's BOS), unless ``add_special_tokens`` is false.
    It was encoded without them, so a completions agent on such a model sampled, and trained,
    on a prompt with no BOS, a context its deployment never gives the model."""
    tok = sentencepiece_tokenizer(MISTRAL_V2)
    tok.add_bos_token = True  # Llama-2's and Mistral's tokenizer_config
    engine = ScriptedEngine(tok)
    prompt = "Q: the cat SAY:ok"
    extra = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
    with endpoint(engine, tok, max_prompt=256, max_gen=128) as (url, backend):
        session = training_session(backend, engine, seed=11)
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        text = client.completions.create(model="tiny", prompt=prompt, extra_body=extra)
        more = prompt + text.choices[0].text + " more"
        client.completions.create(model="tiny", prompt=more, extra_body=extra)
    bos = [] if add_special_tokens is False else [tok.bos_token_id]
    assert engine.prompts[0] == bos + tok.encode(prompt, add_special_tokens=False)
    # the agent's next prompt (its first + the text it got + more) still extends the row
    assert [r.decision.kind for r in session.records] == ["first", "realigned"]
