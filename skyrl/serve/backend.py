"""What the OpenAI-compatible endpoint does with a request, HTTP aside.

``OpenAIBackend`` turns a request body into engine calls and an OpenAI
response: ``chat`` (``/v1/chat/completions``), ``completion``
(``/v1/completions``) and ``models`` (``/v1/models``). Errors are ``APIError``
(HTTP status + OpenAI error object). A request is checked whole (a 400 naming the
bad field) before the engine or its session sees it: a refused request samples
nothing and records nothing.

Sessions. A training run opens one ``Session`` per trajectory and gives its key
to the agent as the API key (the ``Authorization: Bearer`` value every OpenAI
client sends). A session's requests are:

- checked against the training sampling (``generator.sampling``): a
  temperature, top_p, top_k or min_p that differs is refused (400) or overridden and counted
  (``generator.agent_sampling_drift``), because the trainer's logprobs assume it.
  An eval session (``Session.evaluating``: the eval pass, in training or ``skyrl-eval``)
  trains nothing: it is served with ``generator.eval_sampling`` whatever its requests ask,
  neither checked nor counted;
- seeded like the built-in loop's turns (``request_seed(base, uid, sample,
  turn)``), whatever seed the client sends;
- decided against the session's chain (``skyrl.serve.reconcile``) before the
  engine sees them, and bounded like the built-in loop's turns: the first
  prompt by ``generator.max_prompt_length``, the tokens after a row's prompt by
  ``max_generate_length``, a row (a forked one's prompt may be longer) by their sum (a
  request's ``max_tokens`` is capped to what is left);
- recorded: the prompt ids the engine got, the sampled ids, their logprobs,
  the finish reason and the policy versions at dispatch and finish.

Without a session (``skyrl-serve``), requests are plain inference: the client's
sampling (``top_k`` and ``min_p`` too, as vLLM's server reads them) and seed, ``max_tokens``
up to ``generator.max_generate_length`` (a 400 above it), capped to
``generator.max_tokens_per_turn`` when set, as a session's turn is; ``n`` up to 128,
OpenAI's limit (a session's must be 1).

Chat requests, in a session or not, also stop on the chat template's turn end when it is not
the tokenizer's EOS (Qwen2.5 base: EOS ``<|endoftext|>``, turns end ``<|im_end|>``), as the
built-in loop's turns do: the reply ends there instead of the model inventing the next turns.
``/v1/completions`` prompts need not be chats: they stop at EOS and ``stop`` only. A text
prompt is encoded as vLLM's server encodes it: with the special tokens the tokenizer adds (a
Llama's or Gemma's BOS) unless ``add_special_tokens`` is false; token ids are taken as they are.

A reply that stopped on a stop string (the request's ``stop``; in a session without one, the
training ``generator.sampling.stop``) is answered without it, as OpenAI answers: the text (or
content) ends where the first stop string in it starts. The token ids (``return_token_ids``,
logprobs, usage, the session's record) keep it: the engines sample it and training sees what
was sampled. A session's chain knows the text its client was not given
(``reconcile.Chain.unsent``): an agent that sends the reply back as it got it continues the
row, the engine given the stop string's tokens as sampled and then the rest of the prompt (the
row the built-in loop makes with the same stop string). So with a reply that stopped on a special
token its text leaves out and the template does not write back (``ChatFormat.hidden_end``: an
EOS that is not the turn end, Qwen2.5 base's ``<|endoftext|>``): the engine is given it, then
the turn end and the rest, as the built-in loop closes such a turn; a completion's EOS (no
template writes any token back) is given, then the rest of the agent's prompt. So with the
special tokens inside a reply (``<|im_start|>`` written mid-reply): its text leaves them out,
as vLLM's server does, and the engine is given them as sampled (``reconcile.Chain.left_out``).

Fields the engines cannot honour are refused (a 400 naming them) unless they have their
default values, which agents commonly send: ``tool_choice`` other than ``auto`` or ``none``,
``parallel_tool_calls`` false where tools are offered, ``response_format`` other than text,
a ``reasoning_effort`` (vLLM's server renders it into the chat template, and
``enable_thinking`` with it: ``"none"`` gives a Qwen3 prompt without thinking),
``top_logprobs`` or completions ``logprobs`` above 0 (``logprobs=0`` gives the sampled
tokens' own), a non-empty ``logit_bias``, non-zero ``presence_penalty`` or
``frequency_penalty``, and vLLM's own fields that no engine here honours, sent with the
``openai`` client's ``extra_body`` (``VLLM_EXTENSIONS``: ``repetition_penalty``,
``chat_template_kwargs``, ``stop_token_ids``, ...). Numbers must be finite (Python's json sends
NaN and Infinity). As OpenAI refuses them: ``tool_choice`` without ``tools``,
``stream_options`` without ``stream`` (or with an ``include_usage`` neither true nor false),
a message without content (an assistant's may have tool calls instead).

Logprobs give each token's raw bytes (``bytes``; null for a special token such as the EOS a
reply stops on, which its text leaves out) and ``token`` as their text, bytes that are only
part of a character escaped (``\\xc3``), as OpenAI gives them; completions' ``text_offset``
counts the characters before each token.

Engine calls run where the engine's callers must run them: ``EngineBinding``
carries the event loop of the rollout driver that opened the session (the
version clock's gate and the async source's in-flight counting live there) and
hands the call to it; without one the call runs on the server's loop.
"""

from __future__ import annotations

import asyncio
import codecs
import copy
import dataclasses
import json
import math
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from skyrl.config.errors import ConfigError
from skyrl.data.prompts import PromptRow
from skyrl.generators.trajectory import VersionClock
from skyrl.inference.base import Completion, InferenceEngine, SamplingParams, request_seed
from skyrl.serve.chat_format import (
    ChatFormat,
    FormatError,
    check_tools,
    normalize_messages,
    token_text,
)
from skyrl.serve.reconcile import FIRST, FORK, Chain, Decision, RequestRecord

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


@dataclass
class EngineBinding:
    """An engine, the version clock of its weights, and the loop its calls must run on."""

    engine: InferenceEngine
    clock: VersionClock = field(default_factory=VersionClock)
    loop: asyncio.AbstractEventLoop | None = None
    """The rollout driver's loop (None: the caller's)."""

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route_key: str | None
    ) -> tuple[Completion, int, int, float, float]:
        """``(completion, version at dispatch, at finish, dispatched_at, finished_at)``."""
        call = self._generate(prompt_ids, sampling, route_key)
        if self.loop is None or self.loop is asyncio.get_running_loop():
            return await call
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self.loop))

    async def _generate(self, prompt_ids, sampling, route_key):
        version = await self.clock.dispatch_version()
        started = time.monotonic()
        out = await self.engine.generate(prompt_ids, sampling, route_key)
        return out, version, self.clock.current, started, time.monotonic()


@dataclass
class Limits:
    """Token limits of the requests (the ``generator`` group's)."""

    max_prompt_length: int
    max_generate_length: int
    max_tokens_per_turn: int | None = None
    """Cap on one request's ``max_tokens``, with a session or without (None: no cap)."""


@dataclass
class Session:
    """One trajectory of an external agent: its requests, recorded."""

    row: PromptRow
    sample: int
    sampling: SamplingParams
    """What the session's requests are sampled with: the training sampling (the eval
    sampling in an eval session); ``seed`` is the base of the per-request seeds."""
    binding: EngineBinding
    drift: str = "error"
    """``generator.agent_sampling_drift``."""
    evaluating: bool = False
    """An eval pass's session: its requests are not checked against ``sampling`` (no
    training logprobs assume it), just served with it."""
    key: str = field(default_factory=lambda: "sk-skyrl-" + secrets.token_hex(16))
    chain: Chain | None = None
    records: list[RequestRecord] = field(default_factory=list)
    sampling_overrides: int = 0
    lock: asyncio.Lock | None = None
    """Serializes the session's requests (made on the server's loop)."""

    @property
    def trajectory_id(self) -> str:
        return f"{self.row.uid}/{self.sample}"


class SessionStore:
    """Open sessions by key (thread-safe: drivers open them, the server reads them)."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, session: Session) -> Session:
        with self._lock:
            self._sessions[session.key] = session
        return session

    def close(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.key, None)

    def get(self, key: str | None) -> Session | None:
        with self._lock:
            return self._sessions.get(key) if key else None


def _number(body: dict, name: str, kind: type, default: Any, low: float | None = None) -> Any:
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


def _check_drift(body: dict, session: Session) -> None:
    """A training session's request asking for another temperature, top_p, top_k or min_p
    than the training sampling: refused (400) or, with
    ``generator.agent_sampling_drift=override``, counted (the request is sampled with the
    session's sampling either way)."""
    for name, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("min_p", float)):
        asked, used = _number(body, name, kind, None), getattr(session.sampling, name)
        if asked is None or asked == float(used):
            continue
        if session.drift == "error":
            raise APIError(
                400,
                f"{name} {asked} differs from the training {name} {used} "
                f"(generator.sampling.{name}): the trainer's logprobs assume it; set "
                "generator.agent_sampling_drift=override to use the training value",
                param=name,
            )
        session.sampling_overrides += 1


def _before_stop(text: str, stops: list[str]) -> int:
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


def _refuse_unsupported(body: dict, chat: bool) -> None:
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
        if _number(body, name, float, 0.0) != 0:
            raise refuse(name, "0")
    if body.get("logit_bias") not in (None, {}):
        raise refuse("logit_bias", "{} or null")
    if not chat:  # completions: logprobs is how many alternatives per token
        if _number(body, "logprobs", int, 0, low=0) > 0:
            raise refuse("logprobs", "0: the sampled tokens' own logprobs")
        if _number(body, "best_of", int, 1, low=1) > 1:
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
    if _number(body, "top_logprobs", int, 0, low=0) > 0:
        raise refuse("top_logprobs", "0: the sampled tokens' own logprobs")


def _check_flags(body: dict, chat: bool) -> None:
    """A 400 naming a true-or-false field that is neither (nor null): ``"stream": "false"``
    would otherwise be read as true."""
    chat_only = ("logprobs", "parallel_tool_calls")
    names = ("stream", "return_token_ids") + (chat_only if chat else ("echo", "add_special_tokens"))
    for name in names:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise APIError(400, f"{name} must be true or false, got {value!r}", param=name)


def _include_usage(body: dict) -> bool:
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


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if isinstance(stops, list) and all(isinstance(s, str) for s in stops):
        if "" in stops:  # in every text: each reply would end at its first token
            raise APIError(400, "stop cannot contain an empty string", param="stop")
        return list(stops)
    raise APIError(400, f"stop must be a string or a list of strings, got {stop!r}", param="stop")


class OpenAIBackend:
    """The endpoint's logic for one model (see the module docstring)."""

    def __init__(
        self,
        tokenizer,
        model_names: list[str],
        limits: Limits,
        binding: EngineBinding | None = None,
        sessions: SessionStore | None = None,
        tool_parser: str = "hermes",
        max_requests: int | None = None,
    ):
        self.format = ChatFormat(tokenizer, tool_parser)
        self.tokenizer = tokenizer
        self.model_names = list(model_names)
        self.limits = limits
        self.binding = binding
        """Where session-less requests go (None: only sessions are served)."""
        self.sessions = sessions or SessionStore()
        self.max_requests = max_requests
        """Requests a session may make (``generator.max_turns``; None: any number)."""
        self.created = int(time.time())

    # -- endpoints -------------------------------------------------------------------

    def models(self) -> dict:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": self.created, "owned_by": "skyrl"}
                for name in self.model_names
            ],
        }

    async def chat(self, body: Any, key: str | None) -> dict | AsyncIterator[str]:
        body = self._body(body)
        _refuse_unsupported(body, chat=True)
        _check_flags(body, chat=True)
        usage = _include_usage(body)
        session = self._session(key)
        messages, tools, rendered = self._chat_request(body)
        stop_ids, stops = self.format.turn_stop_ids, self._stop_strings(body, session)
        sent = copy.deepcopy(body["messages"])  # the record's: as sent, not as rendered
        choices, prompt_ids = await self._sample(body, session, rendered, sent, stop_ids)
        out = []
        for k, (completion, record) in enumerate(choices):
            stopped = completion.finish_reason == "stop"  # its last token may be a stop, not text
            content, calls = self.format.parse_reply(
                completion.token_ids, tools, messages, stopped, prompt_ids
            )
            if content:
                content = content[: _before_stop(content, stops)]
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            if record is not None:
                record.reply = message
            finish = "tool_calls" if calls else completion.finish_reason
            choice: dict[str, Any] = {"index": k, "message": message, "finish_reason": finish}
            choice["logprobs"] = self._chat_logprobs(completion) if body.get("logprobs") else None
            out.append(self._with_ids(body, choice, completion))
        response = self._response("chat.completion", "chatcmpl", body, out, prompt_ids, choices)
        if not body.get("stream"):
            return response
        return self._chat_stream(response, usage)

    async def completion(self, body: Any, key: str | None) -> dict | AsyncIterator[str]:
        body = self._body(body)
        _refuse_unsupported(body, chat=False)
        _check_flags(body, chat=False)
        usage = _include_usage(body)
        session = self._session(key)
        if body.get("echo"):
            raise APIError(400, "echo is not supported", param="echo")
        rendered = self._prompt_ids(body.get("prompt"), body.get("add_special_tokens") is not False)
        stops = self._stop_strings(body, session)
        choices, prompt_ids = await self._sample(body, session, rendered, [], [], chat=False)
        logprobs = body.get("logprobs") is not None  # 0: the sampled tokens' own
        out = []
        for k, (completion, record) in enumerate(choices):
            text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            text = self.format.reply_lead(prompt_ids, completion.token_ids, False) + text
            text = text[: _before_stop(text, stops)]
            if record is not None:  # no messages were sent: the reply is the text given
                record.reply = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {
                "index": k,
                "text": text,
                "finish_reason": completion.finish_reason,
                "logprobs": self._completion_logprobs(completion) if logprobs else None,
            }
            out.append(self._with_ids(body, choice, completion))
        response = self._response("text_completion", "cmpl", body, out, prompt_ids, choices)
        if not body.get("stream"):
            return response
        return self._completion_stream(response, usage)

    # -- request checks: all made before the engine or the session sees the request ----

    def _chat_request(self, body: dict) -> tuple[list[dict], list[dict] | None, list[int]]:
        """``(messages, tools to parse the reply for, prompt ids)`` of a chat request (a 400
        naming the bad field). ``tool_choice: "none"`` keeps the tools in the prompt, as
        vLLM's server does by default (the prompt an agent's row grew, and the one its
        deployment shows), and parses no call from the reply."""
        from jinja2 import TemplateError, TemplateSyntaxError  # what chat templates render with

        try:
            messages = normalize_messages(body.get("messages"))
            tools = check_tools(body.get("tools"))
        except FormatError as exc:
            raise APIError(400, f"{exc.param}: {exc}", param=exc.param) from None
        callable_tools = tools if body.get("tool_choice") != "none" else None  # else "auto"
        if callable_tools and not self.format.supports_tools:
            raise APIError(400, "this model's chat template does not render tools", param="tools")
        problem = self.format.parser.unavailable() if callable_tools else None
        if problem is not None:
            raise APIError(500, problem, type="server_error", param="tools")
        rendered = tools if self.format.supports_tools else None
        try:
            return messages, callable_tools, self.format.prompt_ids(messages, rendered)
        except TemplateSyntaxError:
            raise  # the template itself is broken: a server error
        except TemplateError as exc:  # its raise_exception(): e.g. roles must alternate
            message = f"messages: the chat template refuses them: {exc}"
            raise APIError(400, message, param="messages") from None

    def _prompt_ids(self, prompt: Any, add_special_tokens: bool) -> list[int]:
        """A completion request's prompt as token ids (text is encoded, with the special tokens
        the tokenizer adds where ``add_special_tokens``, as vLLM's server encodes it)."""
        if isinstance(prompt, str) and prompt:
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
            raise APIError(
                400, "prompt must be a non-empty string or list of token ids", param="prompt"
            )
        vocab_size = len(self.tokenizer)
        for k, t in enumerate(prompt):
            if not 0 <= t < vocab_size:
                raise APIError(
                    400,
                    f"prompt[{k}]: token id {t} is not in the vocabulary (0 to {vocab_size - 1})",
                    param=f"prompt[{k}]",
                )
        return list(prompt)

    # -- the common path ---------------------------------------------------------------

    def _body(self, body: Any) -> dict:
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        model = body.get("model")
        if model not in self.model_names:
            raise APIError(
                404,
                f"model {model!r} does not exist; this endpoint serves {', '.join(self.model_names)}",
                param="model",
                code="model_not_found",
            )
        return body

    def _session(self, key: str | None) -> Session | None:
        session = self.sessions.get(key)
        if session is None and self.binding is None:
            raise APIError(
                401,
                "unknown session key: during training each trajectory's agent gets its own API key",
                type="authentication_error",
                code="invalid_api_key",
            )
        return session

    async def _sample(
        self,
        body: dict,
        session: Session | None,
        rendered: list[int],
        messages: list[dict],
        stop_ids: list[int],
        chat: bool = True,
    ) -> tuple[list[tuple[Completion, RequestRecord | None]], list[int]]:
        """``stop_ids``: token ids the request stops on beside EOS and the session's own;
        ``messages``: the request's, as sent (a session's record keeps them); ``chat``: a
        chat request (else a completion: no template renders its reply back)."""
        n = _number(body, "n", int, 1, low=1)
        if n > MAX_N:  # its engine calls are made on the server's loop: it would stall
            raise APIError(400, f"n must be <= {MAX_N} (as in OpenAI's API), got {n}", param="n")
        if session is None:
            return await self._sample_free(body, rendered, n, stop_ids), rendered
        if n != 1:
            raise APIError(400, "n must be 1 in a training session", param="n")
        if session.lock is None:
            session.lock = asyncio.Lock()
        async with session.lock:
            return await self._sample_session(body, session, rendered, messages, stop_ids, chat)

    async def _sample_free(self, body: dict, prompt: list[int], n: int, stop_ids: list[int]):
        lim = self.limits
        if len(prompt) > lim.max_prompt_length:
            raise self._too_long(len(prompt))
        max_tokens = self._max_tokens(body, lim.max_generate_length)
        if max_tokens > lim.max_generate_length:
            name = self._max_tokens_field(body)
            raise APIError(
                400,
                f"{name} {max_tokens} is over generator.max_generate_length="
                f"{lim.max_generate_length}",
                param=name,
            )
        max_tokens = min(max_tokens, lim.max_tokens_per_turn or max_tokens)  # as a session's
        seed = _number(body, "seed", int, None)
        if seed is not None and not -(2**63) <= seed < 2**63:
            raise APIError(400, f"seed must fit in 64 bits (signed), got {seed}", param="seed")
        try:  # SamplingParams checks the values' ranges: a 400 naming the field, not a 500
            base = SamplingParams(
                temperature=_number(body, "temperature", float, 1.0, low=0),
                top_p=_number(body, "top_p", float, 1.0),
                top_k=_number(body, "top_k", int, -1),  # vLLM's server reads these two too
                min_p=_number(body, "min_p", float, 0.0),
                stop=_stops(body),
                stop_token_ids=list(stop_ids),
                max_tokens=max_tokens,
            )
        except ConfigError as exc:
            raise APIError(400, f"{exc.key} {exc.message}", param=exc.key) from None

        def one(j: int) -> SamplingParams:
            s = None if seed is None else (seed if n == 1 else request_seed(seed, "0", j, 0))
            return dataclasses.replace(base, seed=s)

        assert self.binding is not None
        key = uuid.uuid4().hex
        results = await asyncio.gather(
            *(self._engine_call(self.binding, prompt, one(j), key) for j in range(n))
        )
        return [(r[0], None) for r in results]

    async def _sample_session(
        self,
        body: dict,
        session: Session,
        rendered: list[int],
        messages: list[dict],
        stop_ids: list[int],
        chat: bool,
    ):
        lim = self.limits
        if self.max_requests is not None and len(session.records) >= self.max_requests:
            raise APIError(
                400,
                f"the trajectory has made its generator.max_turns={self.max_requests} requests",
                code="max_turns_reached",
            )
        if session.chain is None:
            session.chain = Chain(lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False))
        # off the server's loop: a long chain's decision decodes it (the other sessions'
        # requests go on); this session's lock keeps its chain as it is meanwhile
        decision = await asyncio.to_thread(session.chain.decide, rendered)
        room = self._room(decision)
        own = list(session.sampling.stop_token_ids)
        sampling = dataclasses.replace(
            session.sampling,
            n=1,
            stop=self._stop_strings(body, session),
            stop_token_ids=own + [t for t in stop_ids if t not in own],
            max_tokens=min(self._max_tokens(body, room), room, lim.max_tokens_per_turn or room),
        )
        if not session.evaluating:
            _check_drift(body, session)
        base = session.sampling.seed
        turn = len(session.records)
        if base is not None:
            sampling.seed = request_seed(base, session.row.uid, session.sample, turn)
        completion, v0, v1, t0, t1 = await self._engine_call(
            session.binding, decision.prompt_ids, sampling, session.row.uid
        )
        # the client gets the reply's text without the stop string or the special token
        # (not the turn end) it stopped on: the chain knows, so the next request realigns
        # after the text it was given
        alone = self.tokenizer.decode(completion.token_ids, skip_special_tokens=False)
        lead = self.format.reply_lead(decision.prompt_ids, completion.token_ids, True)
        text = lead + alone  # as it reads after the prompt: as the client and the chain read it
        unsent = text[_before_stop(text, sampling.stop) :] or self.format.hidden_end(
            completion.token_ids, completion.finish_reason, chat
        )
        left_out = self.format.left_out(completion.token_ids, len(alone) - len(unsent))
        session.chain.record(decision, completion.token_ids, unsent, left_out)
        record = RequestRecord(
            decision, list(completion.token_ids), list(completion.logprobs),
            completion.finish_reason, v0, v1, t0, t1, messages=messages,
        )  # fmt: skip
        session.records.append(record)
        return [(completion, record)], decision.prompt_ids

    def _room(self, d: Decision) -> int:
        """New tokens the request may sample (a 400 when there is no room): what is left of
        ``max_generate_length`` after the row's prompt, and of ``max_prompt_length +
        max_generate_length`` (the longest row) after the whole prompt. A forked row's prompt
        holds earlier replies and may be longer than ``max_prompt_length``; the second bound
        keeps the row, and the engine's request, within the longest row."""
        lim = self.limits
        if d.kind == FIRST and len(d.prompt_ids) > lim.max_prompt_length:
            raise self._too_long(len(d.prompt_ids))
        max_seq_len = lim.max_prompt_length + lim.max_generate_length
        used = len(d.prompt_ids) - d.row_prompt_len  # 0 for a first or forked request
        room = min(lim.max_generate_length - used, max_seq_len - len(d.prompt_ids))
        if room >= 1:
            return room
        if max_seq_len - len(d.prompt_ids) < 1:
            new_row = " (it starts a new row)" if d.kind == FORK else ""
            spent = (
                f"the conversation is {len(d.prompt_ids)} tokens{new_row}, which leaves no "
                f"room under generator.max_prompt_length + max_generate_length = {max_seq_len}"
            )
        else:
            spent = (
                f"the conversation has {used} tokens after its first prompt, which leaves no "
                f"room under generator.max_generate_length={lim.max_generate_length}"
            )
        raise APIError(400, spent, param="messages", code="context_length_exceeded")

    def _too_long(self, n: int) -> APIError:
        return APIError(
            400,
            f"the prompt is {n} tokens (after the chat template), over "
            f"generator.max_prompt_length={self.limits.max_prompt_length}",
            param="messages",
            code="context_length_exceeded",
        )

    @staticmethod
    def _max_tokens_field(body: dict) -> str:
        """``max_completion_tokens``, or ``max_tokens`` where it is absent or null."""
        given = body.get("max_completion_tokens") is not None
        return "max_completion_tokens" if given else "max_tokens"

    @classmethod
    def _max_tokens(cls, body: dict, default: int) -> int:
        """The request's ``_max_tokens_field``."""
        return _number(body, cls._max_tokens_field(body), int, default, low=1)

    @staticmethod
    def _stop_strings(body: dict, session: Session | None) -> list[str]:
        """The request's stop strings; in a session, the training ones where it has none."""
        return _stops(body) or (list(session.sampling.stop) if session is not None else [])

    async def _engine_call(self, binding: EngineBinding, prompt, sampling, key):
        from skyrl.inference.client import EngineDiedError

        try:
            return await binding.generate(prompt, sampling, key)
        except EngineDiedError as exc:
            raise APIError(503, str(exc), type="server_error", code="engine_unavailable") from None

    # -- response bodies -------------------------------------------------------------

    @staticmethod
    def _with_ids(body: dict, choice: dict, completion: Completion) -> dict:
        """The choice, with its sampled ids when the request asked (``return_token_ids``)."""
        if body.get("return_token_ids"):
            choice["token_ids"] = list(completion.token_ids)
        return choice

    def _response(self, obj, prefix, body, choices, prompt_ids, sampled) -> dict:
        completion_tokens = sum(len(c.token_ids) for c, _ in sampled)
        response: dict[str, Any] = {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": obj,
            "created": int(time.time()),
            "model": body["model"],
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }
        if body.get("return_token_ids"):
            response["prompt_token_ids"] = list(prompt_ids)
        return response

    def _token_pieces(self, completion: Completion) -> list[tuple[str, bytes | None]]:
        """Each sampled token's ``(token, bytes)`` as OpenAI's logprobs give them: its raw
        bytes (``ChatFormat.token_bytes``; None for a special token) and their text."""
        pieces = []
        for tok in completion.token_ids:
            raw = self.format.token_bytes(tok)
            pieces.append((self.tokenizer.decode([tok]) if raw is None else token_text(raw), raw))
        return pieces

    def _chat_logprobs(self, completion: Completion) -> dict:
        pieces = self._token_pieces(completion)
        content = [
            {
                "token": text,
                "logprob": lp,
                "bytes": None if raw is None else list(raw),
                "top_logprobs": [],
            }
            for (text, raw), lp in zip(pieces, completion.logprobs, strict=True)
        ]
        return {"content": content}

    def _completion_logprobs(self, completion: Completion) -> dict:
        """``text_offset``: the characters of the text before each token (a token that ends
        inside a character counts it from the token that completes it)."""
        pieces = self._token_pieces(completion)
        chars, offsets = codecs.getincrementaldecoder("utf-8")(errors="replace"), []
        at = 0
        for _, raw in pieces:
            offsets.append(at)
            at += len(chars.decode(raw or b""))
        return {
            "tokens": [text for text, _ in pieces],
            "token_logprobs": list(completion.logprobs),
            "top_logprobs": None,
            "text_offset": offsets,
        }

    @staticmethod
    async def _chat_stream(response: dict, usage: bool) -> AsyncIterator[str]:
        """The response as server-sent events: per choice its role, its content and tool
        calls in one delta each, then its finish reason; usage last when asked
        (``stream_options.include_usage``). The choice's logprobs ride on its first delta
        after the role's (the finish chunk's for an empty reply), and a null content stays
        null (a reply that is only tool calls): the ``openai`` client's accumulation of the
        stream rebuilds the whole response's choice."""
        head = {k: response[k] for k in ("id", "created", "model")}
        head["object"] = "chat.completion.chunk"

        def chunk(index: int, delta: dict, finish=None, extra=None) -> str:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            choice.update(extra or {})
            return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"

        for c in response["choices"]:
            msg = c["message"]
            opening = "" if msg["content"] is not None else None
            yield chunk(c["index"], {"role": "assistant", "content": opening})
            logprobs = {"logprobs": c["logprobs"]}  # sent once, on the next chunk
            if msg.get("content"):
                yield chunk(c["index"], {"content": msg["content"]}, extra=logprobs)
                logprobs = {}
            if msg.get("tool_calls"):
                calls = [{"index": k, **call} for k, call in enumerate(msg["tool_calls"])]
                yield chunk(c["index"], {"tool_calls": calls}, extra=logprobs)
                logprobs = {}
            ids = {"token_ids": c["token_ids"]} if "token_ids" in c else {}
            yield chunk(c["index"], {}, c["finish_reason"], {**logprobs, **ids})
        if usage:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': response['usage']})}\n\n"
        yield "data: [DONE]\n\n"

    @staticmethod
    async def _completion_stream(response: dict, usage: bool) -> AsyncIterator[str]:
        """The response as server-sent events: per choice its text, then its finish reason;
        usage last when asked (``stream_options.include_usage``)."""
        head = {k: response[k] for k in ("id", "object", "created", "model")}
        for c in response["choices"]:
            text = {"index": c["index"], "text": c["text"], "logprobs": c["logprobs"]}
            yield f"data: {json.dumps({**head, 'choices': [{**text, 'finish_reason': None}]})}\n\n"
            end = {"index": c["index"], "text": "", "logprobs": None}
            end["finish_reason"] = c["finish_reason"]
            yield f"data: {json.dumps({**head, 'choices': [end]})}\n\n"
        if usage:
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': response['usage']})}\n\n"
        yield "data: [DONE]\n\n"
