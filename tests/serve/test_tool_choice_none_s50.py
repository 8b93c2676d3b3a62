"""``tool_choice: "none"`` keeps the tools in the prompt, as vLLM's server does by default:
the model is told of them and answers without a call (no reply is parsed into calls). It
rendered the prompt without them, so an agent forcing a final answer that way (a ReAct
loop's last turn) sent a prompt that was not the one its row had grown (the tools block
gone: a fork, ``edited``) and trained at that turn on a prompt its deployment never shows.
The engine is scripted (``scripted_engine``): it says what the prompt's last ``SAY:``
tells it."""

from __future__ import annotations

import openai
from conftest import endpoint, training_session
from scripted_engine import CALC, CALL, ScriptedEngine


def test_a_final_turn_with_tool_choice_none_continues_the_row(tiny_tokenizer):
    tok = tiny_tokenizer
    engine = ScriptedEngine(tok)
    with endpoint(engine, tok, max_prompt=512, max_gen=256) as (url, backend):
        session = training_session(backend, engine, "p3", seed=5)
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0)
        messages = [{"role": "user", "content": "SAY:" + CALL}]
        r = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
        call = r.choices[0].message
        assert call.tool_calls  # the scripted reply is a call
        messages += [
            call.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "SAY:" + CALL},
        ]
        r = client.chat.completions.create(
            model="tiny", messages=messages, tools=[CALC], tool_choice="none"
        )
    # the model wrote a call again (then the tool response's end, the scripted engine saying
    # the rest of that message); with tool_choice none it is the reply's text
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content.startswith(CALL)
    kinds = [(rec.decision.kind, rec.decision.reason) for rec in session.records]
    assert kinds[1][0] != "fork", kinds
    assert "calculator" in tok.decode(engine.prompts[-1])  # the tools are still described
