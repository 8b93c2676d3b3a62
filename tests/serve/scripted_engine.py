"""An engine that says what it is told: the text after the last ``SAY:`` in the prompt (up
to the end of that message), then ``then`` (empty unless given), then EOS, logprob -0.5 per
token, cut after the first token that is EOS or in the request's ``stop_token_ids`` or that
completes one of its ``stop`` strings (kept, as the hf and vLLM engines keep them). Replies
are then known in advance (a tool call, a given text) where the tiny random model's would be
noise. ``scripted_backend`` registers it as
``generator.backend=scripted`` for ``skyrl-serve``."""

from __future__ import annotations

import functools

from skyrl.inference.base import Completion, SamplingParams
from skyrl.inference.client import EngineDiedError
from skyrl.inference.local import LocalEngine


class ScriptedEngine(LocalEngine):
    def __init__(self, tokenizer, dead: bool = False, then: str = ""):
        super().__init__()
        if isinstance(tokenizer, str):  # a directory (the backend below)
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.dead = dead
        self.then = then
        """Text the model writes after what it was told (e.g. an invented next turn)."""
        self.prompts: list[list[int]] = []
        self.samplings: list[SamplingParams] = []

    def reply(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        said = text.rsplit("SAY:", 1)[1].split("<|im_end|>", 1)[0] if "SAY:" in text else "ok"
        eos = self.tokenizer.eos_token_id
        ids = self.tokenizer.encode(said + self.then, add_special_tokens=False) + [eos]
        stops = {eos, *sampling.stop_token_ids}
        ids = ids[: next(i + 1 for i, t in enumerate(ids) if t in stops)]
        if sampling.stop:
            decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
            ends = (
                k
                for k in range(1, len(ids) + 1)
                if any(s in decode(ids[:k]) for s in sampling.stop)
            )
            ids = ids[: next(ends, len(ids))]
        reason = "stop" if len(ids) <= sampling.max_tokens else "length"
        ids = ids[: sampling.max_tokens]
        return Completion(ids, [-0.5] * len(ids), reason)

    def _serve_until(self, done) -> None:
        while not done.done():
            for r in self.take(block=True):
                self.prompts.append(r.prompt_ids)
                self.samplings.append(r.sampling)
                if self.dead:
                    r.fail(EngineDiedError("inference engine actor died during generate: killed"))
                else:
                    r.resolve(self.reply(r.prompt_ids, r.sampling))

    def shutdown(self) -> None:
        pass


CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
"""A calculator tool as an OpenAI request declares it (the tool-call tests' ``tools``)."""
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
"""A hermes-format call of ``CALC`` for the engine to ``SAY:``."""
