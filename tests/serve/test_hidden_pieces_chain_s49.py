"""A session whose replies each stop on a stop string (or a special token) the client is not
given, the agent sending every reply back as it got it: every request after the first
continues the one row. The chain knew only the LAST reply's unsent text, so from the third
request on the client's conversation missed an earlier stop string the row holds and the
request forked, as ``edited`` (the ReAct text protocol: ``stop=["\\nObservation:"]``, the
agent writing the observation as the next user message). The engine is scripted
(``scripted_engine``): it says what the prompt's last ``SAY:`` tells it."""

from __future__ import annotations

import openai
from conftest import endpoint
from scripted_engine import ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.generators import Trajectory, trajectories_to_output
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session
from skyrl.serve.reconcile import to_turns


def test_every_reply_sent_back_without_its_stop_string_continues_the_row(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok)
    with endpoint(engine, tok, max_prompt=512, max_gen=256) as (url, backend):
        row = PromptRow("q", "toy", {}, uid="p7")
        sampling = SamplingParams(seed=11, stop=["\nObservation:"])  # the training stop string
        session = backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine)))
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:Action: a\nObservation: made up"}]
        for turn in range(3):
            r = client.chat.completions.create(model="tiny", messages=messages)
            assert r.choices[0].message.content == "Action: " + "abc"[turn]
            said = (
                f"Observation: {turn} SAY:Action: {'abc'[turn + 1 : turn + 2] or 'd'}\nObservation:"
            )
            messages += [r.choices[0].message.model_dump(), {"role": "user", "content": said}]
        client.chat.completions.create(model="tiny", messages=messages)
    records = session.records
    assert [r.decision.kind for r in records] == ["first", "realigned", "realigned", "realigned"]
    assert session.chain is not None and session.chain.counts["fork"] == 0
    # each engine prompt is the one before + everything sampled for it (its stop string
    # included) + the template after the reply and the agent's next message
    for k in (1, 2, 3):
        chain = engine.prompts[k - 1] + records[k - 1].response_ids
        said = messages[2 * k]["content"]
        tail = f"<|im_end|>\n<|im_start|>user\n{said}<|im_end|>\n<|im_start|>assistant\n"
        assert engine.prompts[k] == chain + tok.encode(tail, add_special_tokens=False)
    out = trajectories_to_output(
        [Trajectory(row, "p7/0", to_turns(records), 1.0, "stop")], step_wise=False
    )
    assert out.forks == [""]  # one row: every sampled token, every template token
    assert out.prompt_token_ids[0] + out.response_token_ids[0] == (
        engine.prompts[3] + records[3].response_ids
    )


def test_an_edit_after_a_realignment_still_forks_as_edited(tiny_tokenizer):
    # what the client was not given is left out of the comparison, nothing else: history
    # rewritten before the last reply is an edit
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok)
    with endpoint(engine, tok, max_prompt=512, max_gen=256) as (url, backend):
        row = PromptRow("q", "toy", {}, uid="p7")
        sampling = SamplingParams(seed=11, stop=["\nObservation:"])
        session = backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine)))
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:Action: a\nObservation: made up"}]
        for turn in range(2):
            r = client.chat.completions.create(model="tiny", messages=messages)
            said = f"Observation: {turn} SAY:Action: b\nObservation:"
            messages += [r.choices[0].message.model_dump(), {"role": "user", "content": said}]
        messages[1]["content"] = "Action: z"  # the first reply, rewritten
        client.chat.completions.create(model="tiny", messages=messages)
    kinds = [(r.decision.kind, r.decision.reason) for r in session.records]
    assert kinds == [("first", ""), ("realigned", ""), ("fork", "edited")]
