"""A session's reply that stopped on a special token other than the template's turn end (an
EOS that is not the turn end: Qwen2.5 base's ``<|endoftext|>``; a stop token id such as
the model's other generation_config EOS), sent back by the agent as it got it, continues the
row as the built-in loop's turn does: the sampled token kept, then the template's whole turn
end (``ChatTokens.observation_ids`` with ``response_ended=False``). The reply's text leaves
the token out and the template renders ``<|im_end|>`` in its place, so the session forked
the row (``rerendered``) on every such reply. The engine is scripted (``scripted_engine``)."""

from __future__ import annotations

import openai
import pytest
from conftest import endpoint
from scripted_engine import ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session


def _tokenizer(path, eos):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)  # own copy: its EOS may change
    tok.eos_token = eos
    return tok


@pytest.mark.parametrize(
    "eos, then, stop_ids",
    [
        # Qwen2.5 base: the EOS is <|endoftext|>, turns end <|im_end|>; the model ends on EOS
        ("<|endoftext|>", "", []),
        # Qwen2.5 instruct: the EOS is the turn end; the engine also stops on <|endoftext|>
        ("<|im_end|>", "<|endoftext|>", ["<|endoftext|>"]),
    ],
)
def test_a_reply_ending_on_a_hidden_special_token_continues_the_row(
    tiny_model_path, eos, then, stop_ids
):
    tok = _tokenizer(tiny_model_path, eos)
    ended_on = tok.convert_tokens_to_ids("<|endoftext|>")
    engine = ScriptedEngine(tok, then=then)
    with endpoint(engine, tok, max_prompt=128, max_gen=64) as (url, backend):
        sampling = SamplingParams(seed=11, stop_token_ids=tok.convert_tokens_to_ids(stop_ids))
        row = PromptRow("q", "toy", {}, uid="p7")
        session = backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine)))
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:four"}]
        r = client.chat.completions.create(model="tiny", messages=messages)
        assert r.choices[0].message.content == "four"
        messages += [r.choices[0].message.model_dump(), {"role": "user", "content": "SAY:ok"}]
        client.chat.completions.create(model="tiny", messages=messages)
    first, second = session.records
    four = tok.encode("four", add_special_tokens=False)
    assert first.response_ids == four + [ended_on]
    assert (second.decision.kind, second.decision.reason) == ("realigned", "")
    # the built-in loop's row: prompt, the reply as sampled (its <|endoftext|> kept), the
    # template's whole turn end, the next user message and the generation prompt
    closing = "<|im_end|>\n<|im_start|>user\nSAY:ok<|im_end|>\n<|im_start|>assistant\n"
    expected = engine.prompts[0] + four + [ended_on] + tok.encode(closing, add_special_tokens=False)
    assert engine.prompts[1] == expected == second.decision.prompt_ids
    assert second.decision.row_prompt_len == len(engine.prompts[0])
    assert session.chain is not None and session.chain.counts["fork"] == 0


def test_a_reply_ending_on_the_turn_end_still_appends(tiny_tokenizer):
    # the template renders the turn end back itself: nothing hidden, the prompt extends the
    # chain token for token
    engine = ScriptedEngine(tiny_tokenizer)
    with endpoint(engine, tiny_tokenizer, max_prompt=128, max_gen=64) as (url, backend):
        row = PromptRow("q", "toy", {}, uid="p7")
        session = backend.sessions.open(
            Session(row, 0, SamplingParams(seed=11), EngineBinding(engine))
        )
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:four"}]
        r = client.chat.completions.create(model="tiny", messages=messages)
        messages += [r.choices[0].message.model_dump(), {"role": "user", "content": "SAY:ok"}]
        client.chat.completions.create(model="tiny", messages=messages)
    assert [rec.decision.kind for rec in session.records] == ["first", "append"]
    assert session.chain is not None and session.chain.unsent == ""
