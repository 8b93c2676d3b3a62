"""An external agent's requests as training rows: exact tokens, merged while they chain.

An agent talking to the endpoint sends its whole conversation with every
request; the server renders it with the chat template. Each request is decided
against the session's CHAIN (the previous request's prompt + the tokens sampled
for it) when it arrives, before the engine sees it:

- ``append``: the rendered prompt extends the chain token for token. The turn
  continues the current training row; the tokens after the chain (template,
  tool results, the next user message) get loss mask 0.
- ``realigned``: the prompt does not extend the chain in tokens but does in
  text, at a token boundary (the agent sent the reply back and it tokenized
  differently, or a tool call was re-serialized to the same text). The engine is
  given the chain's own tokens followed by the rest of the rendered prompt, so
  the model continues from exactly what it sampled; the row goes on. The splice
  must decode to the agent's text: a boundary inside a character (a reply cut
  by ``max_tokens`` mid-character comes back as U+FFFD, three other bytes) is
  not one. A reply that stopped on a stop string was answered without it (as
  OpenAI does; ``Chain.unsent``): the prompt may extend the chain's text without
  it, and the engine is then given the stop string's tokens too, as sampled. So
  with a special token a reply stopped on that its text leaves out and the
  template does not render back (an EOS that is not the turn end), and with the
  special tokens inside a reply, which its text leaves out too
  (``Chain.left_out``: ``<|im_start|>`` written mid-reply). The row goes
  on holding what the client was never given (``Chain.hidden``): the requests
  after it still extend the row, their text compared without those pieces.
- ``fork``: anything else. The turn starts a new training row of the same
  trajectory (``Turn.fork`` says why: ``edited`` when the context before the last
  reply changed in text, e.g. the agent dropped or rewrote history; ``rerendered`` when
  only the last reply came back different, e.g. thinking dropped by the template
  or a tool call serialized another way).

The session's first request starts the first row. Counts of each decision are
kept per session (``agent/forks``, ``agent/forks_edited``,
``agent/forks_rerendered``, ``agent/realigned``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from skyrl.generators.trajectory import Turn

APPEND, REALIGNED, FORK, FIRST = "append", "realigned", "fork", "first"
EDITED, RERENDERED = "edited", "rerendered"


@dataclass
class Decision:
    """How one request relates to its session's chain."""

    kind: str
    """``first``, ``append``, ``realigned`` or ``fork``."""
    prompt_ids: list[int]
    """What the engine is given: the rendered prompt, or the chain + the rest (realigned)."""
    reason: str = ""
    """Why it forks: ``edited`` or ``rerendered`` (``""`` otherwise)."""
    row_prompt_len: int = 0
    """Length of the prompt of the training row this request belongs to."""
    hidden: list[tuple[int, str]] = field(default_factory=list)
    """Pieces of the prompt's text its client was not given, as ``(offset, text)`` in the
    decoded ``prompt_ids`` (a realignment past what the earlier replies stopped on)."""


def _without(text: str, pieces: list[tuple[int, str]]) -> str | None:
    """``text`` less the ``(offset, piece)`` pieces (None where a piece is not at its
    offset: the text is not the one they were found in)."""
    kept, at = [], 0
    for offset, piece in sorted(pieces):
        if offset < at or text[offset : offset + len(piece)] != piece:
            return None
        kept.append(text[at:offset])
        at = offset + len(piece)
    return "".join(kept) + text[at:]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Chain:
    """The session's current training row, as the tokens the next request should extend."""

    decode: Callable[[list[int]], str]
    """Token ids -> text, special tokens kept."""
    ids: list[int] | None = None
    """The last request's prompt + its sampled tokens (None before the first request)."""
    last_prompt_len: int = 0
    """Where the last request's sampled tokens start in ``ids``."""
    row_prompt_len: int = 0
    """Length of the current row's prompt."""
    unsent: str = ""
    """The end of the chain's text the client was not given: the stop string the last
    reply stopped on and what follows it, or the special token it stopped on that the
    template does not render back (``""``: it was given all of it)."""
    left_out: list[tuple[int, str]] = field(default_factory=list)
    """The special tokens inside the last reply its client was given the text without
    (``<|im_start|>`` written mid-reply), as ``(characters from the end of the chain's
    text, text)``."""
    hidden: list[tuple[int, str]] = field(default_factory=list)
    """The earlier replies' ``unsent`` and ``left_out`` pieces the row still holds, as
    ``(offset, text)`` in the chain's text: the client's conversation has them nowhere."""
    counts: Counter = field(default_factory=Counter)
    """Decisions so far, by kind and fork reason."""

    def decide(self, rendered: list[int]) -> Decision:
        """The decision for a request whose conversation renders to ``rendered``."""
        if self.ids is None:
            return Decision(FIRST, list(rendered), row_prompt_len=len(rendered))
        chain = self.ids
        same = _common_prefix(chain, rendered)
        if same == len(chain):
            return Decision(APPEND, list(rendered), row_prompt_len=self.row_prompt_len)
        text, want = self.decode(rendered), self.decode(chain)
        cut, hidden = self._text_boundary(rendered, same, text, want, want), []
        if cut is None and want.endswith(self.unsent):  # the text as the client has it
            last = [(len(want) - back, piece) for back, piece in self.left_out]
            if self.unsent:
                last.append((len(want) - len(self.unsent), self.unsent))
            hidden = self.hidden + last
            shown = _without(want, hidden) if hidden else None
            if shown is not None:
                cut = self._text_boundary(rendered, 0, text, want, shown)
        if cut is not None:
            prompt = chain + rendered[cut:]
            return Decision(REALIGNED, prompt, row_prompt_len=self.row_prompt_len, hidden=hidden)
        reason = RERENDERED if self._context_kept(same, text) else EDITED
        return Decision(FORK, list(rendered), reason, row_prompt_len=len(rendered))

    def _text_boundary(
        self, rendered: list[int], lo: int, text: str, want: str, shown: str
    ) -> int | None:
        """The first ``j >= lo`` with ``decode(rendered[:j]) == shown`` (the chain's text
        ``want`` as the client was given it) whose splice ``decode(chain + rendered[j:])``
        is ``want + text[len(shown):]`` (``text``: the decoded ``rendered``), looked for
        until a prefix decodes longer than ``shown``; None when ``text`` does not start
        with ``shown``. The splice check refuses a ``j`` inside a character: there the
        prefix decodes to ``shown`` (a partial character is one replacement character)
        but the chain + the rest holds bytes nobody produced.

        The decoded length of a prefix never shrinks as tokens are added (byte-level BPE and
        SentencePiece decoders: a partial character is one replacement character until it is
        whole), so the first prefix as long as ``shown`` is found by bisection, and the
        boundary is at most a few tokens (those completing a character) after it:
        O(log n) decodes, not one per prefix. A returned ``j`` is checked by its own decode
        and its splice's."""
        assert self.ids is not None
        if not text.startswith(shown):
            return None
        decoded: dict[int, str] = {len(rendered): text}

        def prefix(j: int) -> str:
            if j not in decoded:
                decoded[j] = self.decode(rendered[:j])
            return decoded[j]

        hi = len(rendered)  # len(prefix(hi)) >= len(shown): text starts with it
        while lo < hi:
            mid = (lo + hi) // 2
            if len(prefix(mid)) >= len(shown):
                hi = mid
            else:
                lo = mid + 1
        rest = text[len(shown) :]
        for j in range(lo, len(rendered) + 1):
            piece = prefix(j)
            if piece == shown and self.decode(self.ids + rendered[j:]) == want + rest:
                return j
            if len(piece) > len(shown):
                return None
        return None

    def _context_kept(self, same: int, text: str) -> bool:
        """Whether the context before the last reply is unchanged, in tokens or in text
        (``text``: the decoded request; after a realignment the chain holds the sampled
        tokens where the agent's rendering holds its own)."""
        assert self.ids is not None
        if same >= self.last_prompt_len:
            return True
        before = _without(self.decode(self.ids[: self.last_prompt_len]), self.hidden)
        return before is not None and text.startswith(before)

    def record(
        self,
        decision: Decision,
        response_ids: list[int],
        unsent: str = "",
        left_out: list[tuple[int, str]] | None = None,
    ) -> None:
        """The request was answered: its prompt + sampled tokens are the new chain, the
        client given its text but for ``unsent`` at the end and the ``left_out`` pieces
        (``(offset, text)`` in the reply's text) before it."""
        self.counts[decision.kind] += 1
        if decision.reason:
            self.counts[f"{FORK}_{decision.reason}"] += 1
        self.ids = decision.prompt_ids + list(response_ids)
        self.last_prompt_len = len(decision.prompt_ids)
        self.row_prompt_len = decision.row_prompt_len
        self.unsent = unsent
        reply_len = len(self.decode(list(response_ids))) if left_out else 0
        self.left_out = [(reply_len - at, piece) for at, piece in left_out or []]
        self.hidden = list(decision.hidden)


@dataclass
class RequestRecord:
    """One answered request of a session, as the engine saw it."""

    decision: Decision
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    version_dispatched: int = 0
    version_finished: int = 0
    dispatched_at: float = 0.0
    finished_at: float = 0.0
    messages: list[dict] = field(default_factory=list)
    """The conversation the request sent (OpenAI message dicts; none for a
    ``/v1/completions`` request)."""
    reply: dict = field(default_factory=dict)
    """The assistant message the server answered with (a ``/v1/completions`` reply: its text
    as given, as the message's content)."""


def to_turns(records: list[RequestRecord]) -> list[Turn]:
    """The session's turns, in request order: each turn's ``appended_ids`` are the tokens the
    next request added after it (when that request continues the row), and a forked request
    starts a new row (``Turn.fork``)."""
    turns = []
    for k, rec in enumerate(records):
        d = rec.decision
        turn = Turn(
            list(d.prompt_ids), list(rec.response_ids), list(rec.logprobs), rec.finish_reason,
            version_dispatched=rec.version_dispatched, version_finished=rec.version_finished,
            dispatched_at=rec.dispatched_at, finished_at=rec.finished_at,
            fork=d.reason if d.kind == FORK else "",
        )  # fmt: skip
        if k + 1 < len(records) and records[k + 1].decision.kind in (APPEND, REALIGNED):
            chain = len(d.prompt_ids) + len(rec.response_ids)
            turn.appended_ids = list(records[k + 1].decision.prompt_ids[chain:])
        turns.append(turn)
    return turns


def fork_counts(chain: Chain) -> dict[str, float]:
    """``agent/...`` counts of one session."""
    c = chain.counts
    return {
        "agent/requests": float(sum(c[k] for k in (FIRST, APPEND, REALIGNED, FORK))),
        "agent/forks": float(c[FORK]),
        "agent/forks_edited": float(c[f"{FORK}_{EDITED}"]),
        "agent/forks_rerendered": float(c[f"{FORK}_{RERENDERED}"]),
        "agent/realigned": float(c[REALIGNED]),
    }
