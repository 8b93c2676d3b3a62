"""A reply with text before its tool call that stopped on a special token other than EOS and
the template's turn end (a stop token id, as vLLM stops on a model's other generation_config
EOS: Qwen2.5-Instruct's ``<|endoftext|>``) gets the content the built-in loop's env would
(``ChatTokens.reply_text`` drops any special token a stopped reply ends on). The text the
endpoint read kept the token, so the content could not be matched to the sampled text and
kept the newline the template writes itself before a call: sent back, the reply rendered two
newlines where the model sampled one and the session's row forked. The engine is scripted
(``scripted_engine``)."""

from __future__ import annotations

import openai
from conftest import endpoint
from scripted_engine import CALC, CALL, ScriptedEngine

from skyrl.data.prompts import PromptRow
from skyrl.inference.base import SamplingParams
from skyrl.serve.backend import EngineBinding, Session


def test_a_tool_reply_stopped_on_another_stop_token_comes_back_as_sampled(tiny_tokenizer):
    tok = tiny_tokenizer  # EOS <|im_end|>, the template's turn end
    end = tok.convert_tokens_to_ids("<|endoftext|>")
    engine = ScriptedEngine(tok, then="<|endoftext|>")
    with endpoint(engine, tok, max_prompt=1024, max_gen=256) as (url, backend):
        sampling = SamplingParams(temperature=1.0, seed=11, stop_token_ids=[end])
        row = PromptRow("q", "toy", {}, uid="p7")
        session = backend.sessions.open(Session(row, 0, sampling, EngineBinding(engine)))
        client = openai.OpenAI(base_url=url, api_key=session.key, max_retries=0, timeout=120)
        messages = [{"role": "user", "content": f"SAY:Let me compute.\n{CALL}"}]
        first = client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls"
        # the newline before the call is the template's, not the content's
        assert msg.content == "Let me compute."
        (call,) = msg.tool_calls
        tool = {"role": "tool", "tool_call_id": call.id, "content": "4 SAY:four"}
        messages += [msg.model_dump(exclude_none=True), tool]
        client.chat.completions.create(model="tiny", messages=messages, tools=[CALC])
    a, b = session.records
    said = tok.encode(f"Let me compute.\n{CALL}", add_special_tokens=False)
    assert a.response_ids == said + [end]
    # the row goes on: the reply as sampled (its <|endoftext|> kept), then the template's
    # whole turn end and the tool result
    assert (b.decision.kind, b.decision.reason) == ("realigned", "")
    chain = engine.prompts[0] + a.response_ids
    rest = "<|im_end|>\n<|im_start|>user\n<tool_response>\n4 SAY:four\n</tool_response>"
    assert engine.prompts[1][: len(chain)] == chain
    assert tok.decode(engine.prompts[1][len(chain) :], skip_special_tokens=False).startswith(rest)
