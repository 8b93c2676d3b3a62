"""Chat-template rendering in token space, so sampled tokens are never re-rendered.

The first prompt is rendered with the tokenizer's chat template. After each
assistant turn the conversation is EXTENDED, never re-rendered: the exact
sampled tokens stay, then the template's own text after an assistant message
(e.g. ``"\\n"`` after ``<|im_end|>`` in ChatML) plus the observation messages
and the next generation prompt are tokenized and appended. Those appended
tokens are the toolkit's, so their loss mask is 0.
"""

from __future__ import annotations

from skyrl.envs.base import Message

_PROBE = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"}]


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders ``tools=`` (a heuristic on its source)."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def render_prompt_ids(tokenizer, messages: list, tools: list[dict] | None = None) -> list[int]:
    """A conversation with the generation prompt appended, as token ids (``tools`` declared
    to the template): how every first prompt and every endpoint request is encoded."""
    kwargs = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return tokenizer.encode(text, add_special_tokens=False)


class ChatTokens:
    """Token-level view of a tokenizer's chat template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.supports_tools = renders_tools(tokenizer)
        """Whether the chat template renders ``tools=``."""
        self.eos_id: int = tokenizer.eos_token_id
        base = self.render_text(_PROBE)
        eos = tokenizer.eos_token or ""
        cut = base.rfind(eos) if eos else -1
        # Template text following the assistant's EOS (ChatML: "\n").
        self.assistant_tail = base[cut + len(eos) :] if cut >= 0 else ""
        self._probe_text = base

    def render_text(
        self,
        messages: list[Message],
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
    ) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The opening prompt with the generation prompt appended (``tools`` declared to the
        template: ``skyrl.generators.tool_calls``)."""
        return render_prompt_ids(self.tokenizer, messages, tools)

    def observation_ids(
        self,
        observations: list[Message],
        response_ended_with_eos: bool,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Tokens to append after an assistant turn: [EOS], template tail, observations, generation prompt."""
        probe = self.render_text(_PROBE, tools=tools) if tools else self._probe_text
        full = self.render_text(_PROBE + observations, add_generation_prompt=True, tools=tools)
        if not full.startswith(probe):
            raise ValueError(
                "the chat template re-renders earlier turns when messages are added; "
                "token-level multi-turn needs an append-only template"
            )
        ids = [] if response_ended_with_eos else [self.eos_id]
        return ids + self.encode(self.assistant_tail + full[len(probe) :])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
