"""OpenAI chat messages in and out of a tokenizer's chat template, tool calls included.

Requests' messages are normalized (content parts joined, tool-call arguments
given to the template as objects), rendered with ``apply_chat_template`` (with
``tools=`` when the request declares tools) and encoded exactly as the
built-in loop encodes a first prompt (``skyrl.generators.chat.ChatTokens``).
Tool calls are parsed from the model's output by vLLM's maintained tool parsers
(``generator.tool_parser``, ``hermes`` by default; ``skyrl.generators.tool_calls``),
imported on the first request that declares tools, from the reply's text as the built-in
loop's env gets it (``ChatTokens.reply_text``: without the token it stopped on, EOS, the
turn end or another special stop token). A reply's content before its calls
leaves out the whitespace the template writes itself before a call
(``ChatFormat.content_as_sampled``), so the reply sent back renders as sampled. A reply's
text reads as it does after its prompt, as vLLM's server gives it (``ChatFormat.reply_lead``:
a SentencePiece reply "▁the ▁cat" is " the cat", not the "the cat" of its decode alone).

Logprobs give each sampled token's raw bytes (``ChatFormat.token_bytes``), as OpenAI's
``bytes`` are: a byte-level BPE token that holds part of a multi-byte character is that part,
not the U+FFFD its lone decode gives, so the tokens' bytes joined are the reply's UTF-8.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from typing import Any

from skyrl.generators.chat import ChatTokens, render_prompt_ids, renders_tools
from skyrl.generators.tool_calls import ToolCallParser


class FormatError(ValueError):
    """A malformed request field; ``param`` names it (``messages[2].content``)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


ROLES = ("system", "developer", "user", "assistant", "tool")


def _text(content: Any, param: str) -> str:
    """A message's content as text: a string, or the text of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise FormatError(f"{param}[{k}]", "only text content parts are supported")
            if not isinstance(part.get("text"), str):
                raise FormatError(
                    f"{param}[{k}].text", f"must be a string, got {part.get('text')!r}"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise FormatError(param, f"must be a string or a list of content parts, got {content!r}")


def normalize_messages(messages: Any) -> list[dict]:
    """OpenAI messages as chat-template messages (``FormatError`` naming the bad field; as
    OpenAI requires, a message has content unless it is an assistant's with tool calls, and a
    tool message's ``tool_call_id`` must name a call of the assistant message before it)."""
    if not isinstance(messages, list) or not messages:
        raise FormatError("messages", "must be a non-empty list of messages")
    out = []
    answered: tuple[int, list] | None = None  # (index, call ids) a tool message here answers
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise FormatError(where, f"must be an object, got {m!r}")
        role = m.get("role")
        if role not in ROLES:
            raise FormatError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        if m.get("content") is None and not (role == "assistant" and m.get("tool_calls")):
            needs = "content or tool_calls" if role == "assistant" else "content"
            article = "an" if role == "assistant" else "a"
            raise FormatError(f"{where}.content", f"{article} {role} message needs {needs}")
        msg: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _text(m.get("content"), f"{where}.content"),
        }
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None and not isinstance(calls, list):
            raise FormatError(f"{where}.tool_calls", f"must be a list of tool calls, got {calls!r}")
        if calls:
            msg["tool_calls"] = [
                _template_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)
            ]
        if role == "tool" and "tool_call_id" in m:
            if not isinstance(m["tool_call_id"], str):
                raise FormatError(f"{where}.tool_call_id", "must be a string")
            _check_answer(m["tool_call_id"], answered, f"{where}.tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        if role == "assistant":
            answered = (i, [c["id"] for c in msg["tool_calls"]]) if calls else None
        elif role != "tool":
            answered = None
        out.append(msg)
    return out


def _check_answer(call_id: str, answered: tuple[int, list] | None, where: str) -> None:
    """A tool message's ``tool_call_id`` must name a call of the assistant message just before
    it (tool messages aside), as OpenAI requires: else the template renders a result for a
    call nobody made."""
    if answered is None:
        raise FormatError(
            where,
            f"{call_id!r} answers no tool call: no assistant message with tool_calls comes "
            "just before it (tool messages aside)",
        )
    at, ids = answered
    if call_id in ids:
        return
    named = [i for i in ids if i is not None]
    if not named:
        raise FormatError(
            where,
            f"{call_id!r} answers no tool call of messages[{at}]: its tool calls have no id "
            "(give each the id its tool message names)",
        )
    its = ", ".join(repr(i) for i in named)
    raise FormatError(where, f"{call_id!r} answers no tool call of messages[{at}] (its ids: {its})")


def _template_call(call: Any, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise FormatError(where, "a tool call needs function.name")
    args = {} if fn.get("arguments") is None else fn["arguments"]
    if not isinstance(args, (str, dict)):
        raise FormatError(f"{where}.function.arguments", "must be a JSON string or an object")
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string; templates want objects
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # rendered as sent
    call_id = call.get("id")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise FormatError(f"{where}.id", f"must be a non-empty string, got {call_id!r}")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


TOOL_FIELDS = {
    "description": (str, "a string"),
    "parameters": (dict, "a JSON schema object"),
    "strict": (bool, "true or false"),
}
"""A tool function's optional fields and the type each must have (as the tool parser's
request model reads them), with how the error says it."""


def check_tools(tools: Any) -> list[dict] | None:
    """The request's ``tools`` (None when absent or empty), checked as far as the chat
    template and the tool parser read them, so a bad tool is refused before sampling."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise FormatError("tools", "must be a list of tools")
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise FormatError(
                f"tools[{k}]", 'must be {"type": "function", "function": {"name": ...}}'
            )
        if tool.get("type", "function") != "function":
            raise FormatError(f"tools[{k}].type", f'must be "function", got {tool["type"]!r}')
        for name, (kind, said) in TOOL_FIELDS.items():
            if fn.get(name) is not None and not isinstance(fn[name], kind):
                raise FormatError(
                    f"tools[{k}].function.{name}", f"must be {said}, got {fn[name]!r}"
                )
    return tools


def _decoder_kind(tokenizer) -> str:
    """How the tokenizer's token strings hold bytes: ``byte_level`` (GPT-2's byte-to-unicode
    alphabet), ``sentencepiece`` (U+2581 for a space, ``<0xNN>`` byte fallback), or ``""``
    (unknown: a token's bytes are those of its decoded text)."""
    if hasattr(tokenizer, "byte_decoder"):  # a slow GPT-2-style tokenizer
        return "byte_level"
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    state = decoder.__getstate__().decode() if decoder is not None else ""
    if '"ByteLevel"' in state:
        return "byte_level"
    if '"ByteFallback"' in state or '"Metaspace"' in state or hasattr(tokenizer, "sp_model"):
        return "sentencepiece"
    return ""


BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
"""A sentencepiece byte-fallback token."""


def token_text(raw: bytes) -> str:
    """A token's ``token`` text in logprobs: its bytes as UTF-8, bytes that are not (part of a
    character) escaped as ``\\xNN``, as OpenAI writes them."""
    return raw.decode("utf-8", errors="backslashreplace")


class ChatFormat:
    """Render requests and parse replies for one tokenizer."""

    def __init__(self, tokenizer, tool_parser: str = "hermes"):
        self.tokenizer = tokenizer
        self.supports_tools = renders_tools(tokenizer)
        """Whether the chat template renders ``tools`` (else tool requests are refused)."""
        self.parser = ToolCallParser(tokenizer, tool_parser)

    @cached_property
    def chat_tokens(self) -> ChatTokens:
        """The template's token-level view (read from it once, on first use)."""
        return ChatTokens(self.tokenizer)

    @cached_property
    def turn_stop_ids(self) -> list[int]:
        """Stop ids of chat requests beside the engine's EOS (``ChatTokens.turn_stop_ids``)."""
        return self.chat_tokens.turn_stop_ids

    def hidden_end(self, response_ids: list[int], finish_reason: str, chat: bool = True) -> str:
        """The text of the special token a reply stopped on when neither its text nor the
        template gives it back (``""`` otherwise): any but the template's turn end, e.g. an
        EOS that is not the turn end (Qwen2.5 base's ``<|endoftext|>``). The reply's text
        leaves it out, and sent back the reply renders the turn end in its place; the
        built-in loop keeps the token and then closes the turn
        (``ChatTokens.observation_ids``), so a session's chain does too (``Chain.unsent``).
        A completion (not ``chat``) has no template to give any token back: the turn end
        too (an agent continues a reply that ended on EOS with its prompt + text + more)."""
        tokens, ids = self.chat_tokens, response_ids
        if finish_reason != "stop" or not ids or ids[-1] not in tokens.special_ids:
            return ""
        if chat and ids[-1] == tokens.turn_end_id:
            return ""
        return self.tokenizer.decode(ids[-1:], skip_special_tokens=False)

    def left_out(self, response_ids: list[int], upto: int) -> list[tuple[int, str]]:
        """The special tokens of a reply before character ``upto`` of its text (decoded with
        them) that the text its client is given leaves out (a decode without special tokens,
        as vLLM's server and the built-in loop's env read a reply), as ``(offset, text)``:
        ``<|im_start|>`` written mid-reply. Not a last token that is the template's turn end
        (the template writes it back). An offset is where the token starts in the decode of
        the whole reply, not in its pieces decoded one by one: a SentencePiece decoder drops
        the prefix space of a text's first token ("▁sat" alone reads "sat")."""
        pieces = []
        for k, tok in enumerate(response_ids):
            if self.token_bytes(tok) is not None or (
                k == len(response_ids) - 1 and tok == self.chat_tokens.turn_end_id
            ):
                continue
            at = len(self.tokenizer.decode(response_ids[:k], skip_special_tokens=False))
            piece = self.tokenizer.decode([tok], skip_special_tokens=False)
            if at + len(piece) > upto:
                break
            pieces.append((at, piece))
        return pieces

    @cached_property
    def _decoder_kind(self) -> str:
        return _decoder_kind(self.tokenizer)

    @cached_property
    def _byte_decoder(self) -> dict[str, int]:
        """A byte-level token string's characters -> its bytes (GPT-2's alphabet, inverted)."""
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        return {c: b for b, c in bytes_to_unicode().items()}

    @cached_property
    def _added(self) -> dict[int, bytes | None]:
        """Added tokens' bytes: their text, never byte-encoded (``<tool_call>``); None for a
        special one, which a decode without special tokens leaves out."""
        added = {
            i: None if t.special else t.content.encode()
            for i, t in self.tokenizer.added_tokens_decoder.items()
        }
        return added | dict.fromkeys(self.tokenizer.all_special_ids)

    def token_bytes(self, token_id: int) -> bytes | None:
        """The token's raw bytes (None for a special token: the reply's text leaves it out)."""
        if token_id in self._added:
            return self._added[token_id]
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if self._decoder_kind == "byte_level" and all(c in self._byte_decoder for c in piece):
            return bytes(self._byte_decoder[c] for c in piece)
        if self._decoder_kind == "sentencepiece":
            byte = BYTE_TOKEN.fullmatch(piece)
            return bytes([int(byte[1], 16)]) if byte else piece.replace("\u2581", " ").encode()
        return self.tokenizer.decode([token_id]).encode()

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The conversation with the generation prompt appended, as token ids."""
        return render_prompt_ids(self.tokenizer, messages, tools)

    def reply_lead(self, prompt_ids: list[int], response_ids: list[int], keep_special: bool) -> str:
        """The text a reply starts with after its prompt that its decode alone drops: a
        SentencePiece decoder (Llama, Mistral) strips the prefix space of a text's first token,
        so a reply "▁the ▁cat" reads "the cat" alone and " the cat" after its prompt, as
        vLLM's server gives it (its decode stream is primed with the prompt) and as the
        session's chain holds it. ``""`` for byte-level BPE (Qwen, Llama 3), whose decode does
        not depend on what came before. Read from the prompt's tail from its last text
        token (a decode without special tokens starts there; ``keep_special``: decoded with
        them)."""
        backwards = range(len(prompt_ids) - 1, -1, -1)
        start = next((j for j in backwards if self.token_bytes(prompt_ids[j]) is not None), None)
        if start is None or not response_ids:
            return ""
        context = list(prompt_ids[start:])
        decode = self.tokenizer.decode
        before = decode(context, skip_special_tokens=not keep_special)
        after = decode(context + list(response_ids), skip_special_tokens=not keep_special)
        alone = decode(list(response_ids), skip_special_tokens=not keep_special)
        if not after.startswith(before) or not after.endswith(alone):
            return ""  # not a prefix the decode alone drops (a prompt ending mid-character)
        return after[len(before) : len(after) - len(alone)]

    def reply_text(
        self,
        response_ids: list[int],
        keep_special: bool,
        stopped: bool = False,
        prompt_ids: list[int] | None = None,
    ) -> str:
        """The sampled text without the token it stopped on, as the built-in loop's env gets
        it (``ChatTokens.reply_text``): EOS, the template's turn end where that is another
        token (a chat request stops on either), or, for a reply that ``stopped``, any special
        token last in it (the engine's other stop ids: a model's generation_config EOS). With
        ``prompt_ids``, as it reads after them (``reply_lead``)."""
        text = self.chat_tokens.reply_text(list(response_ids), keep_special, stopped)
        if not prompt_ids:
            return text
        return self.reply_lead(prompt_ids, response_ids, keep_special) + text

    def parse_reply(
        self,
        response_ids: list[int],
        tools: list[dict] | None,
        messages: list[dict],
        stopped: bool = False,
        prompt_ids: list[int] | None = None,
    ) -> tuple[str | None, list[dict]]:
        """``(content, tool_calls)`` of a reply, tool calls in the OpenAI format (the content
        as ``content_as_sampled`` gives it); ``stopped``: its finish reason is ``stop``;
        ``prompt_ids``: the prompt it was sampled for (its text is read after it)."""
        if not tools:
            return self.reply_text(response_ids, False, stopped, prompt_ids), []
        sampled = self.reply_text(response_ids, True, stopped, prompt_ids)
        content, calls = self.parser.parse(sampled, tools)
        if not calls:
            return self.reply_text(response_ids, False, stopped, prompt_ids), []
        return self.content_as_sampled(content, calls, sampled, messages, tools), calls

    def content_as_sampled(
        self,
        content: str | None,
        calls: list[dict],
        sampled: str,
        messages: list[dict],
        tools: list[dict],
    ) -> str | None:
        """The content of a reply with tool calls, such that the chat template renders the
        reply back to the ``sampled`` text. The parser's content is all the text before the
        first call, the separator the model wrote before it included ("Let me compute.\n");
        a template that puts that separator back itself (Qwen2.5's: ``'\n' + content +
        '\n<tool_call>'``) rendered it twice when the agent sent the reply back, so every
        reply with text before its call forked the session's row. The longest of the content
        and its cuts in its trailing whitespace (down to none of it) that renders back to the
        sampled text; else as parsed (a template that renders the reply otherwise)."""
        from jinja2 import TemplateError

        text = content or ""
        kept = len(text.rstrip())
        if kept == len(text):
            return content
        ids_calls = [_template_call(c, "tool_calls") for c in calls]
        kwargs = {"tools": tools, "tokenize": False}
        try:
            head = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, **kwargs
            )
            for end in range(len(text), kept - 1, -1):
                candidate = text[:end] or None
                reply = {"role": "assistant", "content": candidate, "tool_calls": ids_calls}
                whole = self.tokenizer.apply_chat_template(messages + [reply], **kwargs)
                if whole.startswith(head + sampled):
                    return candidate
        except TemplateError:  # the template refuses the reply: nothing to match
            pass
        return content
