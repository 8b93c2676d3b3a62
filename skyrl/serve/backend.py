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

The request's fields are read and checked in ``skyrl.serve.fields``: those the engines cannot
honour are refused there (a 400 naming the field) unless they have their default values. A
message without content is refused as OpenAI refuses it (an assistant's may have tool calls
instead: ``chat_format.normalize_messages``).

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
from skyrl.serve.fields import (
    MAX_N,
    APIError,
    before_stop,
    check_flags,
    include_usage,
    read_number,
    read_stops,
    refuse_unsupported,
)
from skyrl.serve.reconcile import FIRST, FORK, Chain, Decision, RequestRecord


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


def _check_drift(body: dict, session: Session) -> None:
    """A training session's request asking for another temperature, top_p, top_k or min_p
    than the training sampling: refused (400) or, with
    ``generator.agent_sampling_drift=override``, counted (the request is sampled with the
    session's sampling either way)."""
    for name, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("min_p", float)):
        asked, used = read_number(body, name, kind, None), getattr(session.sampling, name)
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
        refuse_unsupported(body, chat=True)
        check_flags(body, chat=True)
        usage = include_usage(body)
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
                content = content[: before_stop(content, stops)]
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
        refuse_unsupported(body, chat=False)
        check_flags(body, chat=False)
        usage = include_usage(body)
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
            text = text[: before_stop(text, stops)]
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
        n = read_number(body, "n", int, 1, low=1)
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
        seed = read_number(body, "seed", int, None)
        if seed is not None and not -(2**63) <= seed < 2**63:
            raise APIError(400, f"seed must fit in 64 bits (signed), got {seed}", param="seed")
        try:  # SamplingParams checks the values' ranges: a 400 naming the field, not a 500
            base = SamplingParams(
                temperature=read_number(body, "temperature", float, 1.0, low=0),
                top_p=read_number(body, "top_p", float, 1.0),
                top_k=read_number(body, "top_k", int, -1),  # vLLM's server reads these two too
                min_p=read_number(body, "min_p", float, 0.0),
                stop=read_stops(body),
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
        unsent = text[before_stop(text, sampling.stop) :] or self.format.hidden_end(
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
        return read_number(body, cls._max_tokens_field(body), int, default, low=1)

    @staticmethod
    def _stop_strings(body: dict, session: Session | None) -> list[str]:
        """The request's stop strings; in a session, the training ones where it has none."""
        return read_stops(body) or (list(session.sampling.stop) if session is not None else [])

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
