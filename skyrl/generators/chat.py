"""Chat-template rendering in token space, so sampled tokens are never re-rendered.

The first prompt is rendered with the tokenizer's chat template. After each
assistant turn the conversation is EXTENDED, never re-rendered: the exact
sampled tokens stay, then the template's own text closing an assistant message
(ChatML: ``<|im_end|>\\n``, or only its ``"\\n"`` when the reply already ended on
``<|im_end|>``; a sampled EOS that is not the turn end is kept and then closed) plus
the observation messages and the next generation prompt are tokenized and
appended. Those appended tokens are the toolkit's, so their loss mask is 0. The turn
end is read from the template, not from the tokenizer's EOS: Qwen2.5 base models have
EOS ``<|endoftext|>`` but a ChatML template whose turns end with ``<|im_end|>``; Phi-3's
turns end ``<|end|>\\n``, and the EOS its template writes after the last message of a
conversation without a generation prompt is no part of the turn end.
"""

from __future__ import annotations

from jinja2.exceptions import TemplateError

from skyrl.config.errors import ConfigError
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


class NotAppendOnly(ConfigError):
    """The chat template re-renders earlier turns when messages are added (a setup error, not
    the env's): this model's template cannot serve ``generator.max_turns`` > 1. A
    ``ConfigError``, so the CLI prints it as one line naming the key."""

    def __init__(self) -> None:
        super().__init__(
            "generator.max_turns",
            "the chat template re-renders earlier turns when messages are added (an "
            "assistant message renders differently once it is no longer the last, as "
            "Qwen3's drops its <think> block), and multi-turn rollouts extend the context "
            "token for token: use max_turns=1 or a model whose chat template only appends",
        )

    def __reduce__(self):  # rebuilt from nothing wherever it is re-raised (pickled)
        return (NotAppendOnly, ())


class RefusedObservations(ConfigError):
    """The chat template raises on the env's observations after a reply (its
    ``raise_exception``: Gemma-2's and Mistral's "roles must alternate" on a tool message): a
    setup error, this model with this multi-turn env, on every trajectory that gets there.
    A ``ConfigError``, so the CLI prints it as one line naming the key."""

    def __init__(self, roles: str, reason: str) -> None:
        self.roles, self.reason = roles, reason
        super().__init__(
            "generator.max_turns",
            f"the chat template refuses the env's observations after a reply (roles: {roles}): "
            f"{reason}; use max_turns=1, an env whose observations it renders, or a model whose "
            "chat template does",
        )

    def __reduce__(self):  # rebuilt from its arguments wherever it is re-raised (pickled)
        return (RefusedObservations, (self.roles, self.reason))


class ChatTokens:
    """Token-level view of a tokenizer's chat template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.supports_tools = renders_tools(tokenizer)
        """Whether the chat template renders ``tools=``."""
        self.eos_id: int = tokenizer.eos_token_id
        self.conversation_end = self._conversation_end()
        """What the template writes after the last message only when no generation prompt
        follows (Phi-3's ``{% else %}{{ eos_token }}``; usually ""): no part of a turn end."""
        self.turn_end, self.turn_end_id, self.assistant_tail = self._turn_end()
        end = self.turn_end_id
        self.turn_stop_ids: list[int] = [] if end is None or end == self.eos_id else [end]
        """Stop ids a reply needs beside the engine's EOS: the turn end when it is not EOS
        (Qwen2.5 base: EOS ``<|endoftext|>``, turns end ``<|im_end|>``), so a sampled turn end
        ends the reply instead of the model inventing the next turn."""
        decoder = getattr(tokenizer, "added_tokens_decoder", {})
        self.special_ids = frozenset(tokenizer.all_special_ids) | {
            i for i, token in decoder.items() if getattr(token, "special", False)
        }
        """Every special token id (``decode`` skips these)."""

    def _conversation_end(self) -> str:
        """EOS, when the probe render without a generation prompt ends with it after the reply
        and the render with one has the generation prompt in its place (Phi-3's and
        Phi-4-mini's templates: ``{% else %}{{ eos_token }}``); else ""."""
        eos, reply = self.tokenizer.eos_token or "", _PROBE[-1]["content"]
        base = self.render_text(_PROBE)
        at = len(base) - len(eos)  # where EOS would start
        if not eos or not base.endswith(eos) or not 0 <= base.rfind(reply) <= at - len(reply):
            return ""
        try:  # a template may refuse a generation prompt after an assistant message
            prompted = self.render_text(_PROBE, add_generation_prompt=True)
        except Exception:
            return ""
        return eos if prompted[:at] == base[:at] and not prompted.startswith(eos, at) else ""

    def _turn_end(self) -> tuple[str, int | None, str]:
        """``(turn_end, turn_end_id, assistant_tail)``: the template's text after an assistant
        message's content (ChatML: ``"<|im_end|>\\n"``), the token in it a reply stops on
        (EOS if the text holds it, else its first token when that is a special token:
        ``<|im_end|>``), and the text after that token (``"\\n"``). Read once from a probe
        render, without its ``conversation_end`` (Phi-3's turns end ``<|end|>\\n``, its EOS
        only closes a whole conversation): dates and tools only ever appear before the turn
        end."""
        base = self.render_text(_PROBE).removesuffix(self.conversation_end)
        reply, eos = _PROBE[-1]["content"], self.tokenizer.eos_token or ""
        cut = base.rfind(reply)
        if cut >= 0:
            turn_end = base[cut + len(reply) :]
        else:  # the template rewrites the content: assume the turn ends at the last EOS
            turn_end = base[base.rfind(eos) :] if eos and eos in base else ""
        if eos and eos in turn_end:
            return turn_end, self.eos_id, turn_end[turn_end.index(eos) + len(eos) :]
        first = self.encode(turn_end)[:1]
        stop = self.tokenizer.added_tokens_decoder.get(first[0]) if first else None
        if stop is None or not stop.special or not turn_end.startswith(stop.content):
            return turn_end, None, turn_end  # plain text ("\n\n"): a reply never ends it
        return turn_end, first[0], turn_end[len(stop.content) :]

    def ends_turn(self, response_ids: list[int]) -> bool:
        """Whether a reply ended on the template's turn-end token, so only
        ``assistant_tail`` is left of the turn end. Otherwise (cut off; stopped on an EOS that
        is not the turn end: Qwen2.5 base's ``<|endoftext|>``, kept as sampled; a template
        whose turn end is plain text) the whole ``turn_end`` still follows the reply."""
        return bool(response_ids) and response_ids[-1] == self.turn_end_id

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
        response_ended: bool,
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Tokens to append after an assistant turn: the turn end (only its tail when the
        reply ended, ``ends_turn``), observations, generation prompt. A template that raises
        on them (``TemplateError``) raises ``RefusedObservations``, one that re-renders the
        reply ``NotAppendOnly``."""
        # rendered together: a template that prints today's date renders both the same day
        probe = self.render_text(_PROBE, tools=tools).removesuffix(self.conversation_end)
        try:
            full = self.render_text(_PROBE + observations, add_generation_prompt=True, tools=tools)
        except TemplateError as exc:  # its raise_exception (a role it refuses), on every env
            roles = ", ".join(dict.fromkeys(str(m.get("role")) for m in observations))
            raise RefusedObservations(roles, str(exc)) from exc
        if not full.startswith(probe):
            raise NotAppendOnly()
        close = self.assistant_tail if response_ended else self.turn_end
        return self.encode(close + full[len(probe) :])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def reply_text(
        self,
        response_ids: list[int],
        keep_special: bool,
        stopped: bool,
        stop_strings: list[str] | tuple[str, ...] = (),
    ) -> str:
        """A reply's text for the env. ``keep_special``: special tokens stay in it, all but
        the one it stopped on: a tool-call parser needs them where a model's ``<tool_call>``
        is a special token (vLLM's hermes parser keeps them for the same reason). The stop is
        EOS or ``turn_stop_ids``, or, for a reply that ``stopped`` (finish reason ``stop``),
        any special token last in it: the engine also stops on the model's
        ``generation_config`` EOS ids and ``stop_token_ids`` (Qwen2.5-Instruct's
        ``<|endoftext|>``, Llama 3.1's ``<|eom_id|>``), which the env never sees in vLLM's
        text either; a stop string (``stop_strings``, kept in the text) is not dropped.
        Otherwise ``decode``: no special tokens."""
        if not keep_special:
            return self.decode(response_ids)
        ids = list(response_ids)
        if ids and (
            ids[-1] in (self.eos_id, *self.turn_stop_ids)
            or stopped
            and ids[-1] in self.special_ids
            and self.tokenizer.decode(ids[-1:]) not in stop_strings
        ):
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False)
