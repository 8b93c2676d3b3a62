"""An engine that says what it is told: the text after the last ``SAY:`` in the prompt (up
to the end of that message), then EOS, logprob -0.5 per token. Replies are then known in
advance (a tool call, a given text) where the tiny random model's would be noise.
``scripted_backend`` registers it as ``generator.backend=scripted`` for ``skyrl-serve``."""

from __future__ import annotations

from skyrl.inference.base import Completion
from skyrl.inference.client import EngineDiedError
from skyrl.inference.local import LocalEngine


class ScriptedEngine(LocalEngine):
    def __init__(self, tokenizer, dead: bool = False):
        super().__init__()
        if isinstance(tokenizer, str):  # a directory (the backend below)
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.dead = dead
        self.prompts: list[list[int]] = []

    def reply(self, prompt_ids: list[int], max_tokens: int) -> Completion:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        said = text.rsplit("SAY:", 1)[1].split("<|im_end|>", 1)[0] if "SAY:" in text else "ok"
        ids = self.tokenizer.encode(said, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        reason = "stop" if len(ids) <= max_tokens else "length"
        ids = ids[:max_tokens]
        return Completion(ids, [-0.5] * len(ids), reason)

    def _serve_until(self, done) -> None:
        while not done.done():
            for r in self.take(block=True):
                self.prompts.append(r.prompt_ids)
                if self.dead:
                    r.fail(EngineDiedError("inference engine actor died during generate: killed"))
                else:
                    r.resolve(self.reply(r.prompt_ids, r.sampling.max_tokens))

    def shutdown(self) -> None:
        pass
