"""A ``/v1/completions`` session reply that ended on EOS, continued by the agent as a
completions agent does (its prompt + the text it got + more), continues the row: the engine is
given the EOS as sampled, then the rest, as a chat session is given an EOS the template does not
write back. No template writes a completion's EOS back, and the text leaves it out, so every
such request forked the row (``rerendered``) though the agent had changed nothing. The engine is
scripted (``scripted_engine``)."""

from __future__ import annotations

import openai
from conftest import endpoint, training_session
from scripted_engine import ScriptedEngine

PROMPT = "Q: SAY:four"
"""The model writes "four", then EOS."""


def continued(tok, then: str):
    """``(engine, session, first reply)``: the agent's second prompt is its first + the text
    it got + ``then``."""
    engine = ScriptedEngine(tok)
    with endpoint(engine, tok, max_prompt=256, max_gen=128) as (url, backend):
        session = training_session(backend, engine, seed=11)
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        first = client.completions.create(model="tiny", prompt=PROMPT).choices[0]
        client.completions.create(model="tiny", prompt=PROMPT + first.text + then)
    return engine, session, first


def test_a_completion_that_ended_on_eos_continues_the_row(tiny_tokenizer):
    tok = tiny_tokenizer
    engine, session, first = continued(tok, " more")
    assert (first.text, first.finish_reason) == ("four", "stop")
    records = session.records
    four = tok.encode("four", add_special_tokens=False)
    assert records[0].response_ids == four + [tok.eos_token_id]  # the EOS was sampled
    assert (records[1].decision.kind, records[1].decision.reason) == ("realigned", "")
    more = tok.encode(" more", add_special_tokens=False)
    assert engine.prompts[1] == engine.prompts[0] + four + [tok.eos_token_id] + more
    assert session.chain is not None and session.chain.counts["fork"] == 0


def test_a_completion_sent_back_with_its_eos_written_still_appends(tiny_tokenizer):
    # the EOS written out as text encodes to the token: the prompt extends the row as it is
    _, session, _ = continued(tiny_tokenizer, tiny_tokenizer.eos_token)
    assert [r.decision.kind for r in session.records] == ["first", "append"]
