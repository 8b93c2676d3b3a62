"""The reconciler on hand-made token ids: a clean chain is one row, a re-tokenized reply
realigns, edited history and re-rendered replies fork, and the counts say so."""

from __future__ import annotations

from collections import Counter

from skyrl.data.prompts import PromptRow
from skyrl.generators import Trajectory, trajectories_to_output
from skyrl.serve.reconcile import (
    APPEND,
    FIRST,
    FORK,
    REALIGNED,
    Chain,
    RequestRecord,
    fork_counts,
    to_turns,
)  # fmt: skip

# A toy vocabulary: most ids are one letter; 50 = "cd" and 51 = "cde" span letters.
VOCAB = {i: chr(ord("a") + i - 1) for i in range(1, 27)} | {50: "cd", 51: "cde"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def answer(chain: Chain, rendered, sampled, records):
    d = chain.decide(rendered)
    chain.record(d, sampled)
    records.append(RequestRecord(d, list(sampled), [-1.0] * len(sampled), "stop"))
    return d


def rows(records):
    row = PromptRow("q", "toy", {}, uid="u")
    traj = Trajectory(row, "u/0", to_turns(records), 1.0, "stop")
    out = trajectories_to_output([traj], step_wise=False)
    out.validate()
    return out


def test_a_clean_chain_is_one_row_with_observations_masked():
    chain, recs = Chain(decode), []
    # turn 0: prompt [1 2 3] samples [4 5]; turn 1 renders [1 2 3 4 5] + observation [6 7]
    assert answer(chain, [1, 2, 3], [4, 5], recs).kind == FIRST
    assert answer(chain, [1, 2, 3, 4, 5, 6, 7], [8], recs).kind == APPEND
    out = rows(recs)
    assert out.prompt_token_ids == [[1, 2, 3]]
    assert out.response_token_ids == [[4, 5, 6, 7, 8]]
    assert out.loss_masks == [[1, 1, 0, 0, 1]]  # sampled 4 5, observation 6 7, sampled 8
    assert out.rollout_logprobs == [[-1.0, -1.0, 0.0, 0.0, -1.0]]
    assert out.forks == [""] and fork_counts(chain)["agent/forks"] == 0


def test_a_reply_tokenized_differently_realigns_to_the_sampled_tokens():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3, 4], recs)  # "ab" + sampled "c" "d"
    # the agent sends "cd" back and the template tokenizes it as the single id 50
    d = answer(chain, [1, 2, 50, 5], [6], recs)
    assert d.kind == REALIGNED
    assert d.prompt_ids == [1, 2, 3, 4, 5]  # the engine sees what it sampled, then "e"
    out = rows(recs)
    assert out.response_token_ids == [[3, 4, 5, 6]] and out.loss_masks == [[1, 1, 0, 1]]
    assert fork_counts(chain)["agent/realigned"] == 1


def test_a_token_straddling_the_reply_forks_as_rerendered():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3, 4], recs)
    # id 51 = "cde": no token boundary where the text equals "abcd"
    d = answer(chain, [1, 2, 51, 6], [7], recs)
    assert (d.kind, d.reason) == (FORK, "rerendered")


def test_edited_history_forks_into_a_new_row():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2, 3], [4, 5], recs)
    answer(chain, [1, 2, 3, 4, 5, 6], [7], recs)  # append
    # the agent rewrote its system prompt (token 2 -> 9) and kept going: an edit
    d = answer(chain, [1, 9, 3, 4, 5, 6, 7, 8], [10, 11], recs)
    assert (d.kind, d.reason) == (FORK, "edited")
    # then it replaced the last reply with a summary: a re-render
    d = answer(chain, [1, 9, 3, 4, 5, 6, 7, 8, 12, 13], [14], recs)
    assert (d.kind, d.reason) == (FORK, "rerendered")
    out = rows(recs)
    assert out.prompt_token_ids == [
        [1, 2, 3],
        [1, 9, 3, 4, 5, 6, 7, 8],
        [1, 9, 3, 4, 5, 6, 7, 8, 12, 13],
    ]
    assert out.response_token_ids == [[4, 5, 6, 7], [10, 11], [14]]
    assert out.loss_masks == [[1, 1, 0, 1], [1, 1], [1]]
    assert out.forks == ["", "edited", "rerendered"]
    assert out.is_last_step == [False, False, True] and out.rewards == [0.0, 0.0, 1.0]
    counts = fork_counts(chain)
    assert counts == {
        "agent/requests": 4.0, "agent/forks": 2.0, "agent/forks_edited": 1.0,
        "agent/forks_rerendered": 1.0, "agent/realigned": 0.0,
    }  # fmt: skip


def test_step_wise_rows_are_one_per_request_with_the_fork_marked():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3], recs)
    answer(chain, [1, 2, 3, 4], [5], recs)
    answer(chain, [1, 8], [9], recs)
    row = PromptRow("q", "toy", {}, uid="u")
    out = trajectories_to_output([Trajectory(row, "u/0", to_turns(recs), 1.0, "stop")], True)
    out.validate()  # the prefix check is skipped only at the fork
    assert out.prompt_token_ids == [[1, 2], [1, 2, 3, 4], [1, 8]]
    assert out.forks == ["", "", "edited"]


def test_after_a_realignment_a_fork_from_the_last_reply_alone_is_rerendered():
    chain, recs = Chain(decode), []
    answer(chain, [1, 2], [3, 4], recs)  # "ab" + sampled "c" "d"
    # "cd" comes back as id 50: realigned, the engine got [1 2 3 4 5]; sampled "f" "g"
    assert answer(chain, [1, 2, 50, 5], [6, 7], recs).kind == REALIGNED
    # the history is sent unchanged ("ab" "cd" "e", the tokens as the agent renders them),
    # only the last reply "fg" comes back as "fx": in tokens it differs at index 2 (50 vs
    # the chain's 3), before the last prompt's end (5), but in text "abcde" is unchanged
    d = answer(chain, [1, 2, 50, 5, 6, 24, 8], [9], recs)
    assert (d.kind, d.reason) == (FORK, "rerendered")
    # a change before the last reply is still an edit: "ab" -> "xb"
    d = answer(chain, [24, 2, 50, 5, 6, 24, 8, 9, 10], [11], recs)
    assert (d.kind, d.reason) == (FORK, "edited")
    counts = fork_counts(chain)
    assert (counts["agent/forks_rerendered"], counts["agent/forks_edited"]) == (1.0, 1.0)


# -- the text boundary of a realignment --------------------------------------------------


def reference_decide(decode, chain: list[int], rendered: list[int]) -> tuple[str, list[int]]:
    """The decision as the first implementation made it, decoding every prefix of
    ``rendered`` from the divergence on (quadratic; the reference for the kind and the
    engine's prompt), with a boundary's splice required to decode to ``rendered``'s text."""
    same = 0
    while same < min(len(chain), len(rendered)) and chain[same] == rendered[same]:
        same += 1
    if same == len(chain):
        return APPEND, list(rendered)
    want = decode(chain)
    if decode(rendered).startswith(want):
        for j in range(same, len(rendered) + 1):
            text = decode(rendered[:j])
            if text == want and decode(chain + rendered[j:]) == decode(rendered):
                return REALIGNED, chain + rendered[j:]
            if len(text) > len(want):
                break
    return FORK, list(rendered)


def retokenized(tok, ids: list[int], rng) -> list[int]:
    """``ids`` with some tokens split into their single bytes (byte-level BPE: the same
    bytes, other tokens; a split inside a multi-byte character makes partial characters)."""
    out = []
    for t in ids:
        piece = tok.convert_ids_to_tokens(t)
        if len(piece) > 1 and t not in tok.all_special_ids and rng.random() < 0.5:
            out += tok.convert_tokens_to_ids(list(piece))
        else:
            out.append(t)
    return out


def test_the_boundary_is_the_reference_one_on_re_tokenized_multi_byte_text(tiny_tokenizer):
    import random

    tok = tiny_tokenizer

    def dec(ids):
        return tok.decode(ids, skip_special_tokens=False)

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    rng = random.Random(0)
    texts = [
        "héllo wörld € 日本語 𝄞 ok",
        "<|im_start|>user\nnaïve café?<|im_end|>\n<|im_start|>assistant\n",
        "the quick brown fox jumps",
        "ééé€€日日",
    ]
    suffixes = ["", "<|im_end|>\n<|im_start|>user\nmore", "é", "€x", " 本"]
    kinds = Counter()
    for text in texts:
        full = enc(text)
        for cut in range(1, len(full) + 1):  # every chain end, mid-character ones included
            for suffix in suffixes:
                rendered = enc(text + suffix)
                edited = enc(text.replace(text[len(text) // 2], "Z", 1) + suffix)
                for chain in (full[:cut], retokenized(tok, full[:cut], rng)):
                    for r in (rendered, retokenized(tok, rendered, rng), edited):
                        want = reference_decide(dec, chain, r)
                        c = Chain(dec, ids=list(chain), last_prompt_len=len(chain))
                        d = c.decide(r)
                        assert (d.kind, d.prompt_ids) == want, (chain, r)
                        if d.kind == REALIGNED:  # the engine's prompt is the agent's text
                            assert dec(d.prompt_ids) == dec(r)
                        kinds[d.kind] += 1
    # every outcome was met, realignments at partial characters among them
    assert kinds[APPEND] and kinds[REALIGNED] > 100 and kinds[FORK] > 100, kinds


def test_the_boundary_search_decodes_a_logarithmic_number_of_prefixes():
    # a 2003-token chain whose "cd" the agent's template tokenizes as the single id 50, with
    # 1999 letters after it; the rendered prompt is [1 2 50] + 1999 letters + [5], 2003
    # tokens. The first implementation decoded every prefix of it from the divergence
    # (index 2) to the boundary (2002): 2001 + 2 decodes.
    body = [1 + k % 26 for k in range(1999)]
    calls = []

    def counted(ids):
        calls.append(len(ids))
        return decode(ids)

    chain = Chain(counted, ids=[1, 2, 3, 4] + body, last_prompt_len=2)
    d = chain.decide([1, 2, 50] + body + [5])
    assert d.kind == REALIGNED and d.prompt_ids == [1, 2, 3, 4] + body + [5]
    # now: the chain and the rendered prompt once each, a bisection over the candidate ends
    # 2..2003 (2002 of them: ceil(log2 2002) = 11 prefixes, the boundary 2002 among them)
    # and the splice (chain + [5]) once
    assert len(calls) <= 2 + 11 + 1, len(calls)


# -- replies whose text the client got differently ---------------------------------------

TAIL = "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
"""What the tiny model's template renders after an assistant reply followed by the user
message ``next``."""


def byte_ids(tok, text: str) -> list[int]:
    """``text`` as one token per byte (what a byte-level model may sample)."""
    pieces = [
        p for t in tok.encode(text, add_special_tokens=False) for p in tok.convert_ids_to_tokens(t)
    ]
    return tok.convert_tokens_to_ids(pieces)


def sent_back(tok, sampled: list[int], content: str) -> tuple[Chain, list[int], list[int]]:
    """``(chain, its first prompt, the rendered second request)``: the first request
    sampled ``sampled``; the agent sends ``content`` back and says ``next``."""
    from skyrl.serve.chat_format import ChatFormat

    fmt = ChatFormat(tok)
    first = [{"role": "user", "content": "hi"}]
    prompt = fmt.prompt_ids(first)
    chain = Chain(lambda ids: tok.decode(ids, skip_special_tokens=False))
    chain.record(chain.decide(prompt), sampled)
    follow = first + [
        {"role": "assistant", "content": content},
        {"role": "user", "content": "next"},
    ]
    return chain, prompt, fmt.prompt_ids(follow)


def test_a_reply_cut_inside_a_character_realigns_without_stray_bytes(tiny_tokenizer):
    # max_tokens cut the reply after "caf" + the first byte of "é" (0xC3); the client got
    # "caf\ufffd" and sends it back, which the template encodes as the 3 bytes EF BF BD.
    # "caf" + EF (or EF BF) decodes to the chain's text too, but splicing there would give
    # the engine BF BD (or BD) after the sampled C3: bytes nobody produced. The boundary is
    # after the whole U+FFFD: the engine gets the sampled bytes, then the template.
    tok = tiny_tokenizer
    sampled = byte_ids(tok, "caf") + byte_ids(tok, "é")[:1]
    chain, prompt, rendered = sent_back(tok, sampled, "caf\ufffd")
    d = chain.decide(rendered)
    assert d.kind == REALIGNED
    assert d.prompt_ids[: len(prompt) + len(sampled)] == prompt + sampled
    added = d.prompt_ids[len(prompt) + len(sampled) :]
    assert added == tok.encode(TAIL, add_special_tokens=False)
    assert chain.decode(d.prompt_ids) == chain.decode(rendered)  # what the agent sent, as text


def test_a_reply_without_its_stop_string_realigns_at_the_end_of_the_text_sent(tiny_tokenizer):
    # the reply stopped on the stop string "\nObservation:"; the client got the text before
    # it (as OpenAI answers) and sends that back. The engine is given everything sampled,
    # the stop string included, then the template: the row the built-in loop would make.
    tok = tiny_tokenizer
    sampled = tok.encode("Action: look\nObservation:", add_special_tokens=False)
    chain, prompt, rendered = sent_back(tok, sampled, "Action: look")
    assert chain.decide(rendered).kind == FORK  # the client was given all of it
    chain.unsent = "\nObservation:"
    d = chain.decide(rendered)
    assert d.kind == REALIGNED
    assert d.prompt_ids == prompt + sampled + tok.encode(TAIL, add_special_tokens=False)
    # an agent that re-adds the stop string itself continues the sampled text as before
    _, _, again = sent_back(tok, sampled, "Action: look\nObservation: 4")
    d = chain.decide(again)
    assert d.kind in (APPEND, REALIGNED)
    assert d.prompt_ids == prompt + sampled + tok.encode(" 4" + TAIL, add_special_tokens=False)
    # text that is not what the client was given still forks
    _, _, other = sent_back(tok, sampled, "Action: jump")
    assert chain.decide(other).kind == FORK
