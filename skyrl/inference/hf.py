"""transformers ``generate`` in-process: batched, KV cache, left padding.

Departure from plain ``generate``: logprobs are taken from the RAW logits
(``output_logits``), not from the processed scores, so they equal a forward
pass of the model whatever the temperature / top-p; this matches vLLM's
default (``raw_logprobs``) and what off-policy correction needs.
"""

from __future__ import annotations

import torch

from skyrl.inference.base import (
    Completion,
    SamplingParams,
    WeightItems,
    iter_named_tensors,
    report_once,
    truncate_at_stop,
)


class HFEngine:
    """An engine over a transformers causal LM on this process's device."""

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None = None,
        max_batch_size: int = 64,
        dtype: str = "float32",
        device: str | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=getattr(torch, dtype)
        ).to(self.device)
        self.model.eval()
        self.max_batch_size = max_batch_size
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {e for e in eos + [self.tokenizer.eos_token_id] if e is not None}

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        sampling: SamplingParams | list[SamplingParams],
    ) -> list[list[Completion]]:
        """Per prompt, ``n`` completions. ``sampling`` is one for all or one per prompt.

        Rows whose sampling differs only in ``max_tokens`` share a batch (run to the
        longest, then cut), sorted by length so batches pad little.
        """
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompt_token_ids)
        seeds = [p.seed for p in params if p.seed is not None]
        if seeds:
            torch.manual_seed(seeds[0])
        rows = [(i, j) for i, p in enumerate(params) for j in range(p.n)]
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for i, j in rows:
            p = params[i]
            key = (p.temperature, p.top_p, p.top_k, p.min_p, tuple(p.stop), tuple(p.stop_token_ids))
            groups.setdefault(key, []).append((i, j))
        done: dict[tuple[int, int], Completion] = {}
        for members in groups.values():
            members.sort(key=lambda ij: len(prompt_token_ids[ij[0]]))
            for start in range(0, len(members), self.max_batch_size):
                chunk = members[start : start + self.max_batch_size]
                outs = self._generate_batch(
                    [prompt_token_ids[i] for i, _ in chunk], [params[i] for i, _ in chunk]
                )
                done.update(zip(chunk, outs, strict=True))
        return [[done[(i, j)] for j in range(p.n)] for i, p in enumerate(params)]

    @torch.no_grad()
    def _generate_batch(
        self, rows: list[list[int]], params: list[SamplingParams]
    ) -> list[Completion]:
        sp = params[0]
        max_new = max(p.max_tokens for p in params)
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        stop_ids = self.eos_ids | set(sp.stop_token_ids)
        greedy = sp.temperature == 0
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max_new,
            do_sample=not greedy,
            temperature=None if greedy else sp.temperature,
            top_p=None if greedy else sp.top_p,
            top_k=0 if greedy or sp.top_k < 0 else sp.top_k,
            min_p=None if greedy or sp.min_p == 0 else sp.min_p,
            eos_token_id=sorted(stop_ids),
            pad_token_id=self.pad_id,
            stop_strings=sp.stop or None,
            tokenizer=self.tokenizer if sp.stop else None,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # [B, T, V], raw, on the model's device
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        new, logprobs = new.cpu(), logprobs.cpu()
        return [
            truncate_at_stop(
                new[i, : p.max_tokens].tolist(),
                logprobs[i, : p.max_tokens].tolist(),
                stop_ids,
                sp.stop,
                self.tokenizer.decode,
                p.max_tokens,
            )
            for i, p in enumerate(params)
        ]

    def update_weights(self, weights: WeightItems) -> None:
        """Copy named tensors into the model's parameters (names as in ``state_dict``)."""
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for name, tensor in iter_named_tensors(weights):
                target = params.get(name, buffers.get(name))
                if target is None:
                    raise KeyError(f"update_weights: unknown parameter {name!r}")
                target.copy_(tensor.to(target.device, target.dtype))

    def join_weight_sync(
        self, host: str, port: int, first_rank: int, world_size: int, backend: str
    ) -> None:
        """Join the broadcast group of ``skyrl.inference.weight_sync`` as rank ``first_rank``."""
        from skyrl.inference.weight_sync import join_group

        self.sync_group = join_group(host, port, first_rank, world_size, backend)

    def receive_weights(self, plan: list) -> None:
        """Receive the buckets of ``plan`` from the broadcast group and load them."""
        from skyrl.inference.weight_sync import receive_stream

        self.update_weights(receive_stream(self.sync_group, plan, self.device))

    def reset_prefix_cache(self) -> None:
        """No prefix cache across calls in this engine: nothing to reset."""

    def sleep(self) -> None:
        report_once("hf engine: sleep() is a no-op")

    def wake_up(self) -> None:
        report_once("hf engine: wake_up() is a no-op")
