"""Reading and checking an OpenAI request's fields, before the endpoint acts on them.

Each reader returns the field's value or raises ``APIError`` (HTTP 400 and the OpenAI error
object) naming it: numbers must be numbers, finite (Python's json sends NaN and Infinity) and
in range; true-or-false fields must be booleans (``"stream": "false"`` would read as true);
``stop`` a string or a list of non-empty strings.

Fields the engines cannot honour are refused (a 400 naming them) unless they have their
default values, which agents commonly send: ``tool_choice`` other than ``auto`` or ``none``,
``parallel_tool_calls`` false where tools are offered, ``response_format`` other than text,
a ``reasoning_effort`` (vLLM's server renders it into the chat template, and
``enable_thinking`` with it: ``"none"`` gives a Qwen3 prompt without thinking),
``top_logprobs`` or completions ``logprobs`` above 0 (``logprobs=0`` gives the sampled
tokens' own), a non-empty ``logit_bias``, non-zero ``presence_penalty`` or
``frequency_penalty``, and vLLM's own fields that no engine here honours, sent with the
``openai`` client's ``extra_body`` (``VLLM_EXTENSIONS``: ``repetition_penalty``,
``chat_template_kwargs``, ``stop_token_ids``, ...). As OpenAI refuses them: ``tool_choice``
without ``tools``, ``stream_options`` without ``stream`` (or with an ``include_usage`` neither
true nor false).
"""

from __future__ import annotations

import math
from typing import Any

MAX_N = 128
"""Samples one request may ask for (``n``), OpenAI's limit."""


class APIError(Exception):
    """An OpenAI error response: HTTP ``status`` and the error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type, param, code,
        )  # fmt: skip

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def read_number(body: dict, name: str, kind: type, default: Any, low: float | None = None) -> Any:
    """Field ``name`` as ``kind`` (``default`` when absent or null): a number (not a bool),
    finite, whole for an int, at least ``low``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, f"{name} must be a number, got {value!r}", param=name)
    if isinstance(value, float) and not math.isfinite(value):  # Python's json sends NaN
        raise APIError(400, f"{name} must be a finite number, got {value!r}", param=name)
    if kind is int and value != int(value):
        raise APIError(400, f"{name} must be an integer, got {value!r}", param=name)
    if low is not None and value < low:
        raise APIError(400, f"{name} must be >= {low:g}, got {value!r}", param=name)
    return kind(value)


def before_stop(text: str, stops: list[str]) -> int:
    """Where ``text`` ends without its stop string: the start of the first one in it (the
    end of ``text`` when there is none)."""
    return min((at for at in (text.find(s) for s in stops) if at >= 0), default=len(text))


VLLM_EXTENSIONS: dict[str, tuple[tuple[Any, ...], str]] = {
    "repetition_penalty": ((1,), "1: no penalty"),
    "min_tokens": ((0,), "0: a reply may end at once"),
    "ignore_eos": ((False,), "false: replies end at EOS"),
    "stop_token_ids": (([],), "[]: stop strings (stop) instead"),
    "skip_special_tokens": ((True,), "true: the text leaves special tokens out"),
    "include_stop_str_in_output": ((False,), "false: the text ends before its stop string"),
    "use_beam_search": ((False,), "false: each reply is sampled"),
    "guided_json": ((), "null: no output format can be forced"),
    "guided_regex": ((), "null: no output format can be forced"),
    "guided_choice": ((), "null: no output format can be forced"),
    "guided_grammar": ((), "null: no output format can be forced"),
    "structured_outputs": ((), "null: no output format can be forced"),
    "bad_words": (([],), "[]: no word can be banned"),
    "allowed_token_ids": ((), "null: every token may be sampled"),
    "truncate_prompt_tokens": ((), "null: a prompt is never cut; one too long is a 400"),
    "prompt_logprobs": ((), "null: only the sampled tokens have logprobs"),
    "logprob_token_ids": ((), "null: only the sampled tokens have logprobs"),
    "return_tokens_as_token_ids": ((False,), "false: logprobs give each token's text"),
    "thinking_token_budget": ((), "null: thinking is not budgeted"),
}
"""vLLM's request fields beyond OpenAI's that no engine here honours, with the values that
pass (their defaults; null always does) and how the error says it. ``top_k`` and ``min_p``
are read (without a session: ``SamplingParams``)."""
VLLM_CHAT_EXTENSIONS: dict[str, tuple[tuple[Any, ...], str]] = {
    "chat_template": ((), "null: the model's own chat template renders the messages"),
    "chat_template_kwargs": (({},), "null: the chat template is rendered without arguments"),
    "continue_final_message": ((False,), "false: each reply is a new assistant turn"),
    "add_generation_prompt": ((True,), "true: each reply is a new assistant turn"),
    "add_special_tokens": ((False,), "false: the chat template writes the special tokens"),
    "documents": ((), "null: the chat template is rendered without documents"),
    "echo": ((False,), "false: a reply is the assistant's text only"),
}
"""``VLLM_EXTENSIONS`` of chat requests only."""


def _refuse_extensions(body: dict, chat: bool) -> None:
    """A 400 naming a ``VLLM_EXTENSIONS`` field (chat: ``VLLM_CHAT_EXTENSIONS`` too) that
    has another value than its default: sent with ``extra_body``, it was ignored."""
    fields = VLLM_EXTENSIONS | (VLLM_CHAT_EXTENSIONS if chat else {})
    for name, (defaults, allowed) in fields.items():
        got = body.get(name)
        if got is not None and got not in defaults:
            raise APIError(400, f"{name} {got!r} is not supported (only {allowed})", param=name)


def refuse_unsupported(body: dict, chat: bool) -> None:
    """A 400 naming a field the endpoint cannot honour, unless it has its default value
    (which agents commonly send): ``tool_choice`` auto or none, ``response_format`` text,
    no ``reasoning_effort``, ``top_logprobs`` 0, completions ``logprobs`` 0, ``best_of`` 1 and no ``suffix``, no
    ``logit_bias``, penalties 0, ``parallel_tool_calls`` true where tools are offered, and
    none of the old ``functions`` (``function_call`` auto or none): ``tools`` declares
    functions. A ``tool_choice`` without ``tools`` is refused whatever its value, as OpenAI
    refuses it."""

    def refuse(name: str, allowed: str) -> APIError:
        got = body[name]
        return APIError(400, f"{name} {got!r} is not supported (only {allowed})", param=name)

    _refuse_extensions(body, chat)
    for name in ("presence_penalty", "frequency_penalty"):
        if read_number(body, name, float, 0.0) != 0:
            raise refuse(name, "0")
    if body.get("logit_bias") not in (None, {}):
        raise refuse("logit_bias", "{} or null")
    if not chat:  # completions: logprobs is how many alternatives per token
        if read_number(body, "logprobs", int, 0, low=0) > 0:
            raise refuse("logprobs", "0: the sampled tokens' own logprobs")
        if read_number(body, "best_of", int, 1, low=1) > 1:
            raise refuse("best_of", "1: each request is one sample")
        if body.get("suffix") not in (None, ""):
            raise refuse("suffix", "null: no text is inserted before a suffix")
        return
    if body.get("tool_choice") is not None and not body.get("tools"):  # as OpenAI answers
        message = "tool_choice is only allowed when tools are specified"
        raise APIError(400, message, param="tool_choice")
    if body.get("functions") not in (None, []):
        raise refuse("functions", "null: declare them as tools")
    if body.get("function_call") not in (None, "auto", "none"):
        raise refuse("function_call", '"auto" or "none": no call can be forced')
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise refuse("tool_choice", '"auto" or "none": no tool call can be forced')
    offered = body.get("tools") and body.get("tool_choice") != "none"
    if offered and body.get("parallel_tool_calls") is False:
        raise refuse("parallel_tool_calls", "true: a reply may hold several tool calls")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise refuse("response_format", '{"type": "text"}: no output format can be forced')
    if body.get("reasoning_effort") is not None:  # vLLM's server renders it into the template
        raise refuse("reasoning_effort", "null: the chat template is rendered without it")
    if read_number(body, "top_logprobs", int, 0, low=0) > 0:
        raise refuse("top_logprobs", "0: the sampled tokens' own logprobs")


def check_flags(body: dict, chat: bool) -> None:
    """A 400 naming a true-or-false field that is neither (nor null): ``"stream": "false"``
    would otherwise be read as true."""
    chat_only = ("logprobs", "parallel_tool_calls")
    names = ("stream", "return_token_ids") + (chat_only if chat else ("echo", "add_special_tokens"))
    for name in names:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise APIError(400, f"{name} must be true or false, got {value!r}", param=name)


def include_usage(body: dict) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``), as
    OpenAI's do: without it every chunk has a choice. As OpenAI answers, a 400 for
    ``stream_options`` without ``stream``, and for one that is not an object or whose
    ``include_usage`` is not true or false (``"false"`` would otherwise be read as true)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not body.get("stream"):
        message = "stream_options is only allowed when stream is true"
        raise APIError(400, message, param="stream_options")
    if not isinstance(options, dict):
        message = f"stream_options must be an object, got {options!r}"
        raise APIError(400, message, param="stream_options")
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        message = f"stream_options.include_usage must be true or false, got {usage!r}"
        raise APIError(400, message, param="stream_options.include_usage")
    return bool(usage)


def read_stops(body: dict) -> list[str]:
    """``stop`` as a list: a string or a list of strings, none of them empty."""
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if isinstance(stops, list) and all(isinstance(s, str) for s in stops):
        if "" in stops:  # in every text: each reply would end at its first token
            raise APIError(400, "stop cannot contain an empty string", param="stop")
        return list(stops)
    raise APIError(400, f"stop must be a string or a list of strings, got {stop!r}", param="stop")
