"""A transformers causal LM in-process: one request per ``generate``, batched with what is queued.

``HFEngine`` is a ``LocalEngine`` (``skyrl.inference.local``): ``generate`` queues the
request; the serving thread waits for one, keeps collecting while more keep arriving
(``LocalEngine.take_burst``: until ``QUIET_S`` passes without one, ``MAX_WAIT_S`` after
the first, or ``max_batch_size``), decodes the batch and resolves each request; what arrives meanwhile
forms the next batch.

Departure from the usual implementation: no ``model.generate``. The batch runs through
this module's own decode loop (left padding, position ids from the attention mask, a
``DynamicCache``, fp32 logits), because ``generate`` can give neither of:
- per-request seeds: each request's ``sampling.seed`` drives its own ``torch.Generator``
  (``generate`` draws from the global RNG, so a sample depended on its batch mates). A row
  draws one uniform per step and takes that quantile of its (truncated) distribution, so
  a request and seed give the same tokens whatever else is in the batch: the ~1e-6 logit
  noise of other padding moves a token only if the uniform lands within ~1e-6 of a step
  of the CDF;
- tempered, untruncated logprobs (the convention of ``skyrl.inference.base``):
  ``log_softmax(logits / T)`` at the sampled token, while the token is drawn from the
  min-p, then top-k, then top-p truncated distribution (vLLM's order). ``generate``
  exposes only raw logits or the processed (truncated) scores.
A completion ends where the model's context does (``max_position_embeddings``; finish
reason ``length``) and a prompt that fills it is refused, as vLLM does with its
``max_model_len``. Finished rows (EOS, stop token, stop string, max_tokens) are dropped
from the batch and its KV cache once a quarter of the batch has finished, so stragglers
run at their size.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import gc
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast

import torch

from skyrl.inference.base import (
    Completion,
    SamplingParams,
    WeightItems,
    iter_named_tensors,
    logprob_temperature,
    report_once,
    seed_refusal,
    truncate_at_stop,
)
from skyrl.inference.local import LocalEngine, Request
from skyrl.models.lora import PEFT_PREFIX, is_adapter_name, param_name

PRUNE_FRACTION = 0.25
"""Finished rows are dropped from the batch once they are this fraction of it."""


class UnknownParameterError(KeyError):
    """``update_weights`` got a tensor under a name the model does not have. One line naming
    it and the model's closest names (a ``KeyError``, whose ``str`` is otherwise the repr)."""

    def __init__(self, name: str, known: list[str]):
        module, _, leaf = name.rpartition(".")
        adapted = f"{module}.base_layer.{leaf}"  # PEFT's name of a LoRA-adapted layer's own
        if adapted in known:
            hint = (
                f"the engine serves a LoRA adapter on that layer: it takes the adapter's "
                f"tensors (lora_A / lora_B), and the layer's own as {adapted!r}"
            )
        else:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = (
                f"closest: {', '.join(close)}" if close else f"it has {', '.join(known[:3])}, ..."
            )
        super().__init__(f"update_weights: the model has no parameter {name!r}; {hint}")

    def __str__(self) -> str:
        return str(self.args[0])


class HFEngine(LocalEngine):
    """An engine over a transformers causal LM on this process's device."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        max_batch_size: int = 64,
        dtype: str = "float32",
        device: str | None = None,
        lora: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
    ):
        """``lora``: the fields of a ``LoraConfig``; the engine then serves the policy's LoRA
        adapter (PEFT layers in the model, B = 0 until the first ``update_weights``), and
        ``update_weights`` takes adapter tensors under their wire names.
        ``trust_remote_code``: run the model's and tokenizer's own code (their ``auto_map``)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

        super().__init__()
        if not isinstance(max_batch_size, int) or max_batch_size < 1:  # 0: serve never runs one
            raise ValueError(f"hf engine: max_batch_size must be >= 1, got {max_batch_size!r}")
        torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(
                "hf engine: dtype must name a torch dtype (float32, bfloat16, float16), "
                f"got {dtype!r}"
            )
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_path or model_path, trust_remote_code=trust_remote_code
        )
        from skyrl.models.resolve import IN_MEMORY
        from skyrl.workers.models import check_lm_head

        loaded = AutoModelForCausalLM.from_pretrained(
            model_path,
            dtype=torch_dtype,
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            **IN_MEMORY,
        )
        model, loading = cast(tuple[PreTrainedModel, dict], loaded)
        # a checkpoint without LM-head weights (a reward model, a bare body) is refused as the
        # policy worker refuses it: transformers would serve a randomly initialised head
        check_lm_head(model, model_path, loading["missing_keys"])
        self.lora = lora is not None
        if lora is not None:
            from skyrl.config.root import LoraConfig
            from skyrl.models.lora import add_adapters

            # the transformers model with the adapter layers injected (forward unchanged)
            model = add_adapters(model, LoraConfig(**lora), inference=True).get_base_model()
        self.model = model.to(self.device)  # type: ignore[arg-type]  # transformers' stub
        self.model.eval()
        self.max_batch_size = max_batch_size
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in eos + [self.tokenizer.eos_token_id] if e is not None}
        self.context_len: int | None = getattr(
            self.model.config.get_text_config(), "max_position_embeddings", None
        )
        """Positions the model has: prompt + completion stay within them (vLLM's max_model_len)."""
        self._pending: list[Request] = []
        """Requests collected beyond ``max_batch_size``: the head of the next batch."""
        self.sync_group = None
        """The broadcast weight-sync group (``join_weight_sync``)."""

    # -- serving ------------------------------------------------------------------------

    def _serve_until(self, done: Future) -> None:
        while True:
            batch = self._next_batch(done)
            if batch is None:
                return
            if batch:
                self._run(batch)

    def _next_batch(self, done: Future) -> list[Request] | None:
        """Up to ``max_batch_size`` requests (module docstring); [] when woken with none
        (a control call ran); None once ``done`` is done and nothing is queued."""
        requests, self._pending = self._pending, []
        if not requests:
            requests = self.take(block=not done.done())
        if not requests:
            return None if done.done() else []
        requests = self.take_burst(requests, done, limit=self.max_batch_size)
        self._pending = requests[self.max_batch_size :]
        return requests[: self.max_batch_size]

    def _run(self, batch: list[Request]) -> None:
        """Decode ``batch`` and resolve each request; a bad request (``_refusal``) fails
        alone, a failure of the decode fails the whole batch."""
        if self.model is None:  # shutdown() released it
            for request in batch:
                request.fail(RuntimeError("hf engine: generate after shutdown()"))
            return
        decodable = []
        for request in batch:
            refusal = self._refusal(request)
            if refusal is not None:
                request.fail(ValueError(f"hf engine: {refusal}"))
            elif request.sampling.max_tokens <= 0:
                request.resolve(Completion([], [], "length"))
            else:
                request.sampling = self._within_context(request)
                decodable.append(request)
        batch = decodable
        if not batch:
            return
        try:
            completions = self._decode([r.prompt_ids for r in batch], [r.sampling for r in batch])
        except Exception as exc:
            for request in batch:
                request.fail(exc)
            return
        except BaseException as exc:  # serving ends: nobody would answer the others
            for request in batch + self._pending:
                request.fail(exc)
            self._pending = []
            raise
        for request, completion in zip(batch, completions, strict=True):
            request.resolve(completion)

    def _refusal(self, request: Request) -> str | None:
        """Why ``request`` cannot join a batch (None: it can): an empty prompt, a prompt
        that fills the model's context (as in vLLM: no room for a token), a token id outside
        the embedding (both an IndexError, on CUDA a device assert, for the whole batch), an
        empty stop string (in every text: the completion would end at its first token), a
        stop token id outside it (vLLM refuses it), a seed torch cannot take (``seed_refusal``)."""
        ids = request.prompt_ids
        if not ids:
            return "empty prompt"
        if self.context_len is not None and len(ids) >= self.context_len:
            return (
                f"a prompt of {len(ids)} tokens leaves no room in the model's context of "
                f"{self.context_len} tokens (max_position_embeddings)"
            )
        vocab_size = self.model.get_input_embeddings().num_embeddings
        if min(ids) < 0 or max(ids) >= vocab_size:
            bad = next(i for i in ids if not 0 <= i < vocab_size)
            return f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})"
        sampling = request.sampling
        if "" in sampling.stop:
            return "empty stop string (every text holds one)"
        unknown = [t for t in sampling.stop_token_ids if not 0 <= t < vocab_size]
        if unknown:  # as vLLM: no token has that id, the request would never stop on it
            return f"stop_token_ids {unknown} are outside the vocabulary [0, {vocab_size})"
        return seed_refusal(sampling.seed)

    def _within_context(self, request: Request) -> SamplingParams:
        """``request.sampling`` with ``max_tokens`` cut to the room its prompt leaves in the
        context: as in vLLM, the completion then ends there with finish_reason ``length``."""
        sampling = request.sampling
        if self.context_len is None:
            return sampling
        room = self.context_len - len(request.prompt_ids)
        if sampling.max_tokens <= room:
            return sampling
        return dataclasses.replace(sampling, max_tokens=room)

    # -- the decode loop ----------------------------------------------------------------

    @torch.no_grad()
    def _decode(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
        """One completion per (prompt, sampling) row, all rows decoded as one batch."""
        from transformers import DynamicCache

        width, max_new = max(len(p) for p in prompts), max(p.max_tokens for p in params)
        stop_sets = [self.eos_ids | set(p.stop_token_ids) for p in params]
        rows = _Rows.build(prompts, params, stop_sets, self.model.config.vocab_size, self.device)
        out = _Outputs.empty(prompts, params, self.device)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
        inputs, positions = ids.to(self.device), rows.prefill_positions(width)
        cache = DynamicCache(config=self.model.config)
        for step in range(max_new):
            logits = self.model(
                input_ids=inputs,
                attention_mask=rows.mask[:, : width + step],
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits
            new, new_logprobs = rows.sample(logits[:, -1].float(), step)
            out.tokens[rows.index, step], out.logprobs[rows.index, step] = new, new_logprobs
            self._mark_ended(rows, new, step, out, params)
            alive = sum(rows.alive)
            if alive == 0:
                break
            if len(rows.alive) - alive >= max(1, PRUNE_FRACTION * len(rows.alive)):
                keep = torch.tensor([b for b, a in enumerate(rows.alive) if a], device=self.device)
                cache.batch_select_indices(keep)
                rows, new = rows.select(keep), new[keep]
            positions = rows.prompt_lengths + step
            if self.context_len is not None:  # a row ended by the context, not yet dropped
                positions = positions.clamp(max=self.context_len - 1)
            inputs, positions = new[:, None], positions[:, None]
        tokens, logprobs = out.tokens.cpu(), out.logprobs.cpu()
        return [
            truncate_at_stop(
                tokens[i, : out.lengths[i]].tolist(),
                logprobs[i, : out.lengths[i]].tolist(),
                stop_sets[i],
                p.stop if out.by_string[i] else [],
                functools.partial(self._text_after, prompts[i][-1:]),
                p.max_tokens,
            )
            for i, p in enumerate(params)
        ]

    def _mark_ended(
        self, rows: _Rows, new: torch.Tensor, step: int, out: _Outputs, params: list[SamplingParams]
    ) -> None:
        """Finish the live rows whose token ``new`` (of step ``step``) is a stop token, is
        their last, or completes a stop string (found by decoding only the tail that can
        hold one: a token is at least one byte, a character at most four)."""
        ended = (rows.stop_ids == new[:, None]).any(-1) | (rows.max_tokens <= step + 1)
        new_ids = new.tolist() if out.texts else []
        for b, end in enumerate(ended.tolist()):
            if not rows.alive[b]:
                continue
            i = rows.request[b]
            if i in out.texts:
                out.texts[i].append(new_ids[b])
                stops = params[i].stop
                window = out.texts[i][-(4 * max(map(len, stops)) + 8) :]
                whole = len(window) == len(out.texts[i])  # the completion's start: in context
                tail = self._text_after(out.contexts[i] if whole else [], window)
                out.by_string[i] = any(s in tail for s in stops)
                end = end or out.by_string[i]
            if end:
                out.lengths[i], rows.alive[b] = step + 1, False

    def _text_after(self, context: list[int], token_ids: list[int]) -> str:
        """The text of ``token_ids`` as it reads after ``context`` (a prompt's last token, or
        [] for none), as vLLM decodes a completion after its prompt: decoded alone, the first
        token of a SentencePiece tokenizer's "▁word" reads "word", and a stop " word" there
        was missed."""
        text = str(self.tokenizer.decode(token_ids))
        if not context:
            return text
        before = str(self.tokenizer.decode(context))
        joined = str(self.tokenizer.decode(context + token_ids))
        return joined[len(before) :] if joined.startswith(before) else text

    # -- control ------------------------------------------------------------------------

    def update_weights(self, weights: WeightItems) -> None:
        """Copy named tensors into the model's parameters (names as in ``state_dict``)."""
        self.on_owner(self._load_weights, weights)

    def _load_weights(self, weights: WeightItems) -> None:
        targets = self._targets()
        if not isinstance(weights, Iterator):  # readable twice: refuse before loading any
            for name, tensor in iter_named_tensors(weights):
                self._target(targets, name, list(tensor.shape))
        with torch.no_grad():
            for name, tensor in iter_named_tensors(weights):
                target = self._target(targets, name, list(tensor.shape))
                target.copy_(tensor.to(target.device, target.dtype))

    def _targets(self) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers by name, with the aliases of tied weights
        (lm_head.weight), which ``state_dict`` holds too."""
        if self.model is None:
            raise RuntimeError("hf engine: update_weights after shutdown()")
        params = dict(self.model.named_parameters(remove_duplicate=False))
        buffers = self.model.named_buffers(remove_duplicate=False)
        return {**params, **{name: b for name, b in buffers if name not in params}}

    def _target(
        self, targets: dict[str, torch.Tensor], name: str, shape: list[int]
    ) -> torch.Tensor:
        """The parameter (or buffer) a tensor ``name`` of ``shape`` loads into; an
        ``UnknownParameterError`` or a ``ValueError`` (shape) naming it."""
        if self.lora and is_adapter_name(name):  # wire name -> the injected layer's
            name = param_name(name).removeprefix(PEFT_PREFIX)
        target = targets.get(name)
        if target is None:
            raise UnknownParameterError(name, list(targets))
        if list(shape) != list(target.shape):  # copy_ would broadcast it over the parameter
            raise ValueError(
                f"update_weights: {name!r} is a tensor of shape {shape}; "
                f"the model's parameter has shape {list(target.shape)}"
            )
        return target

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Join the broadcast group of ``skyrl.inference.weight_sync`` as rank ``first_rank``."""
        from skyrl.inference.weight_sync import join_group

        def join() -> None:
            self.sync_group = join_group(host, port, first_rank, world_size, backend)

        self.on_owner(join)

    def receive_weights(self, plan: list) -> None:
        """Receive the buckets of ``plan`` from the broadcast group and load them. A plan
        naming a tensor the model cannot take (name, shape) is refused before anything is
        loaded, its buckets still received so the sender does not wait in the broadcast."""
        from skyrl.inference.weight_sync import receive_stream

        def receive() -> None:
            if self.sync_group is None:
                raise RuntimeError("hf engine: receive_weights before join_weight_sync")
            stream = receive_stream(self.sync_group, plan, self.device)
            targets = self._targets()
            try:
                for name, shape, _ in (spec for bucket in plan for spec in bucket):
                    self._target(targets, name, shape)
            except (KeyError, ValueError):
                for _ in stream:  # take every bucket (the sender blocks until all do), load none
                    pass
                raise
            self._load_weights(stream)

        self.on_owner(receive)

    def reset_prefix_cache(self) -> None:
        """No KV cache outlives a batch in this engine: nothing to reset."""

    def sleep(self) -> None:
        report_once("hf engine: sleep() is a no-op")

    def wake_up(self) -> None:
        report_once("hf engine: wake_up() is a no-op")

    def shutdown(self) -> None:
        """Drop the model (and its memory); the engine is unusable afterwards."""
        self.on_owner(self._release)

    def _release(self) -> None:
        self.model = None
        gc.collect()
        if str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()


@dataclass
class _Outputs:
    """What one batch has generated, one entry per request of the batch."""

    tokens: torch.Tensor
    """``[requests, max_new]`` (past a row's length: junk)."""
    logprobs: torch.Tensor
    lengths: list[int]
    by_string: list[bool]
    """The request ended on a stop string."""
    texts: dict[int, list[int]]
    """The tokens so far of the requests with stop strings."""
    contexts: dict[int, list[int]]
    """The last prompt token of the requests with stop strings (``HFEngine._text_after``)."""

    @classmethod
    def empty(cls, prompts: list[list[int]], params: list[SamplingParams], device: str) -> _Outputs:
        shape = (len(params), max(p.max_tokens for p in params))
        return cls(
            tokens=torch.zeros(shape, dtype=torch.long, device=device),
            logprobs=torch.zeros(shape, dtype=torch.float32, device=device),
            lengths=[shape[1]] * len(params),
            by_string=[False] * len(params),
            texts={i: [] for i, p in enumerate(params) if p.stop},
            contexts={i: prompts[i][-1:] for i, p in enumerate(params) if p.stop},
        )


@dataclass
class _Rows:
    """The per-row state of one decoding batch, one entry per row still in the batch."""

    request: list[int]
    """Row -> index of its request in the batch as it started."""
    index: torch.Tensor
    """``request`` as a tensor on the device."""
    alive: list[bool]
    """The row has not finished."""
    mask: torch.Tensor
    """Attention mask over prompt (left padded) and new tokens, ``[rows, width + max_new]``."""
    prompt_lengths: torch.Tensor
    max_tokens: torch.Tensor
    stop_ids: torch.Tensor
    """Stop token ids (EOS and the request's own), padded with -1, ``[rows, max_stops]``."""
    temperature: torch.Tensor
    """Logprob temperature (``logprob_temperature``: 1 for greedy rows)."""
    greedy: torch.Tensor
    top_k: torch.Tensor
    """0 = off."""
    top_p: torch.Tensor
    min_p: torch.Tensor
    uniforms: torch.Tensor
    """One uniform per step from each row's own generator, ``[rows, max_new]``."""
    any_greedy: bool
    all_greedy: bool
    max_top_k: int
    """Largest top_k in the batch (0: no row truncates by top-k)."""
    any_top_p: bool
    any_min_p: bool

    @classmethod
    def build(
        cls,
        prompts: list[list[int]],
        params: list[SamplingParams],
        stop_sets: list[set[int]],
        vocab_size: int,
        device: str,
    ) -> _Rows:
        n, width = len(prompts), max(len(p) for p in prompts)
        max_new = max(p.max_tokens for p in params)
        mask = torch.ones((n, width + max_new), dtype=torch.long)
        uniforms = torch.zeros((n, max_new))
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            mask[i, : width - len(prompt)] = 0
            if p.temperature > 0:
                generator = torch.Generator()
                if p.seed is None:
                    generator.seed()
                else:
                    generator.manual_seed(p.seed)
                uniforms[i, : p.max_tokens] = torch.rand(p.max_tokens, generator=generator)
        max_stops = max(len(s) for s in stop_sets)
        stop_ids = torch.tensor([sorted(s) + [-1] * (max_stops - len(s)) for s in stop_sets])
        top_k = [p.top_k if 0 < p.top_k < vocab_size else 0 for p in params]
        greedy = [p.temperature == 0 for p in params]

        def tensor(values, dtype=None) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            request=list(range(n)),
            index=tensor(list(range(n))),
            alive=[True] * n,
            mask=mask.to(device),
            prompt_lengths=tensor([len(p) for p in prompts]),
            max_tokens=tensor([p.max_tokens for p in params]),
            stop_ids=stop_ids.to(device),
            temperature=tensor([logprob_temperature(p.temperature) for p in params], torch.float32),
            greedy=tensor(greedy),
            top_k=tensor(top_k),
            top_p=tensor([p.top_p for p in params], torch.float32),
            min_p=tensor([p.min_p for p in params], torch.float32),
            uniforms=uniforms.to(device),
            any_greedy=any(greedy),
            all_greedy=all(greedy),
            max_top_k=max((k for k, g in zip(top_k, greedy, strict=True) if not g), default=0),
            any_top_p=any(p.top_p < 1 and p.temperature > 0 for p in params),
            any_min_p=any(p.min_p > 0 and p.temperature > 0 for p in params),
        )

    def select(self, keep: torch.Tensor) -> _Rows:
        """Only the rows ``keep`` (a device index tensor)."""
        kept = keep.tolist()
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                fields[f.name] = value[keep]
            elif isinstance(value, list):
                fields[f.name] = [value[k] for k in kept]
            else:
                fields[f.name] = value  # flags: a superset of the kept rows' stays correct
        return _Rows(**fields)

    def prefill_positions(self, width: int) -> torch.Tensor:
        """Position ids of the left-padded prompts: 0 at each row's first real token."""
        return (self.mask[:, :width].cumsum(-1) - 1).clamp(min=0)

    def sample(self, logits: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens for step ``step`` from fp32 ``logits [rows, vocab]``, and their tempered,
        untruncated logprobs."""
        logprobs = torch.log_softmax(logits / self.temperature[:, None], dim=-1)
        if self.all_greedy:
            tokens = logits.argmax(-1)
        else:
            probs = self.truncate(logprobs.exp())
            cdf = probs.cumsum(-1)
            total = cdf[:, -1:]
            # the first token whose CDF step passes u (u < total, so that token has p > 0)
            u = torch.minimum(
                self.uniforms[:, step, None] * total,
                torch.nextafter(total, torch.zeros_like(total)),
            )
            tokens = torch.searchsorted(cdf, u, right=True).squeeze(1)
            if self.any_greedy:
                tokens = torch.where(self.greedy, logits.argmax(-1), tokens)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)

    def truncate(self, probs: torch.Tensor) -> torch.Tensor:
        """``probs`` with the tokens outside each row's min-p (relative to the top token),
        then top-k, then top-p (of the mass the two left) set to 0 (not renormalised).
        vLLM's order: min-p is one of its logits processors, run before top-k / top-p."""
        if self.any_min_p:
            floor = self.min_p[:, None] * probs.amax(-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)
        if self.max_top_k:
            kth = probs.topk(self.max_top_k, dim=-1).values  # ties with the k-th are kept
            kth = kth.gather(
                1, (self.top_k.clamp(min=1) - 1).clamp(max=self.max_top_k - 1)[:, None]
            )
            probs = probs.masked_fill((self.top_k[:, None] > 0) & (probs < kth), 0.0)
        if self.any_top_p:
            ranked, order = probs.sort(dim=-1, descending=True)
            mass_before = ranked.cumsum(-1) - ranked
            cut = mass_before >= self.top_p[:, None] * ranked.sum(-1, keepdim=True)
            cut &= (self.top_p < 1)[:, None]
            probs = probs.masked_fill(torch.zeros_like(cut).scatter_(1, order, cut), 0.0)
        return probs
