"""One data-parallel rank of one role (policy, reference or critic), run as a Ray actor.

Every call takes the chunk that the dispatch layer staged for this rank. A
chunk is packed into token-budget micro batches; all ranks agree on the
micro-batch count (all-reduce MAX, then empty zero-loss fillers), because
DeepSpeed's collectives hang or leak gradients when counts differ.

Loss scaling: ``loss_weights`` were computed on the whole mini-batch before it
was split, so the mini-batch loss is the sum of ``(per_token_loss *
loss_weights)`` over every micro batch of every rank. DeepSpeed AVERAGES
gradients over ranks, so each rank's loss is multiplied by ``dp_size``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import pickle
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from skyrl.batch import TrainingInputBatch
from skyrl.batch.budget import gpu_micro_batch_tokens, micro_batch_tokens, text_config
from skyrl.batch.packing import (
    PackedMicroBatch,
    micro_batch_metrics,
    pad_micro_batches,
    plan_micro_batches,
    unpack_to_rows,
)
from skyrl.config.errors import ConfigError, exception_line
from skyrl.config.root import SkyRLConfig
from skyrl.inference.base import logprob_temperature
from skyrl.workers.deepspeed_setup import final_grad_norm, forget_grad_norm
from skyrl.workers.distributed import all_reduce_max, init_distributed, set_dist_env
from skyrl.workers.logprobs import accepts_logits_to_keep, packed_logprobs
from skyrl.workers.stats import LossSums, PackingStats, TrainStats

OLD_LOGPROBS_FROM_TRAINING = "old_logprobs_from_training"
"""Batch-level metadata key: the chunk carries no old logprobs; the step is exactly on-policy
and the training forward's own logprobs, detached, are the old ones
(``skyrl.trainer.on_policy``)."""

ROLES = ("policy", "reference", "critic")

HEAD_ONLY_DROPOUT = ("classif", "summary", "qa_", "pooler")
"""Words of model-config dropout fields that only other heads read (sequence/token
classification, GPT-2's multiple-choice summary, question answering, a pooler), never a
causal LM's forward: ``TrainingWorker.active_dropout`` leaves them out."""


class TrainingWorker:
    """A DeepSpeed engine for one role on one rank."""

    def __init__(
        self,
        role: str,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        cfg: SkyRLConfig,
        total_optimizer_steps: int,
        driver_cwd: str | None = None,
        driver_parts: dict[str, bytes] | None = None,
    ):
        """``driver_parts``: the driver's policy loss and KL estimator
        (``skyrl.workers.group.pickled_driver_parts``), registered here under their configured
        names once ``cfg.imports`` ran, over anything registered under those names."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if cfg.trainer.precision == "auto":  # a config built without ``validate``
            from skyrl.config.validate import resolve_precision

            precision = resolve_precision(cfg)  # this worker's own device
            cfg = dataclasses.replace(
                cfg, trainer=dataclasses.replace(cfg.trainer, precision=precision)
            )
        self.role, self.rank, self.world_size, self.cfg = role, rank, world_size, cfg
        self.lora = role == "policy" and cfg.model.lora.enabled
        """The policy trains LoRA adapters on a frozen base (``model.lora``)."""
        _run_imports(cfg.imports, driver_cwd)
        if driver_parts:
            _use_driver_parts(driver_parts)
        trainer = cfg.trainer
        torch.set_num_threads(max(1, int(trainer.num_cpus_per_worker)))
        set_dist_env(rank, world_size, master_addr, master_port, trainer.collective_timeout_min)
        init_distributed(trainer.collective_timeout_min)
        _seed_everything(trainer.seed)
        self.engine = self._build_engine(total_optimizer_steps)
        if self.lora:
            _leave_out_every_name_of_frozen_weights(self.engine)
        self.device = torch.device(self.engine.device)
        self.max_tokens = self._micro_batch_budget()
        """Tokens per packed micro batch (``skyrl.batch.budget``)."""
        self.share_prompts = trainer.share_prompts and trainer.packed_attention == "per_sequence"
        """Pack a prompt several rows share once (``trainer.share_prompts``)."""
        # the engines' logprob convention (skyrl.inference.base): tempered, untruncated
        self.temperature = logprob_temperature(cfg.generator.sampling.temperature)
        self.logits_to_keep = role != "critic" and accepts_logits_to_keep(self.engine)
        """The LM projects only the positions that predict loss tokens (``packed_logprobs``)."""

    def _micro_batch_budget(self) -> int:
        """``trainer.micro_batch_max_tokens``, or unset: the CPU default, or on a GPU what
        fits its free memory now that the model and optimizer state are on it."""
        if self.device.type != "cuda":
            return micro_batch_tokens(self.cfg)
        t, m = self.cfg.trainer, self.cfg.model
        path = (t.critic_model_path or m.path) if self.role == "critic" else m.path
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        return gpu_micro_batch_tokens(self.cfg, text_config(path, m.trust_remote_code), free_bytes)

    def _build_engine(self, total_optimizer_steps: int):
        from skyrl.workers.deepspeed_setup import build_engine
        from skyrl.workers.models import load_causal_lm, load_value_model

        t, m = self.cfg.trainer, self.cfg.model
        model: torch.nn.Module
        if self.role == "critic":
            model = load_value_model(
                t.critic_model_path or m.path,
                t.precision,
                m.trust_remote_code,
                t.gradient_checkpointing,
                t.packed_attention,
            )
            return build_engine(model, t, t.critic_optimizer, total_optimizer_steps)
        model = load_causal_lm(
            m.path,
            t.precision,
            m.trust_remote_code,
            t.gradient_checkpointing and self.role == "policy",
            t.packed_attention,
        )
        if self.role == "reference":
            model.requires_grad_(False)
            return build_engine(model, t, None, total_optimizer_steps)
        if self.lora:  # frozen base + adapters: the optimizer gets the adapters only
            from skyrl.models.lora import add_adapters

            model = add_adapters(model, m.lora)
        return build_engine(model, t, t.policy_optimizer, total_optimizer_steps)

    # -- micro batches -------------------------------------------------------------

    def _micro_batches(self, chunk: TrainingInputBatch) -> list[PackedMicroBatch]:
        """This rank's packed micro batches, as many as the busiest rank needs."""
        own = (
            plan_micro_batches(chunk, self.max_tokens, share_prefixes=self.share_prompts)
            if len(chunk)
            else []
        )
        micro = pad_micro_batches(own, chunk, max(1, all_reduce_max(len(own))))
        if self.device.type == "cpu":
            return micro
        return [
            dataclasses.replace(
                mb,
                input_ids=mb.input_ids.to(self.device),
                position_ids=mb.position_ids.to(self.device),
            )
            for mb in micro
        ]

    def _model_out(self, mb: PackedMicroBatch, compute_entropy: bool = False):
        """Per-token logprobs (and entropy) of the policy/reference, or values of the critic, ``[1, T]``."""
        if self.role == "critic":
            values = self.engine(
                input_ids=mb.input_ids,
                position_ids=mb.position_ids,
                attention_mask=None,
                use_cache=False,
            )
            # V(state before token t) sits at t: the value at t's predictor, 0 where a
            # sequence starts.
            parents = mb.parents.to(values.device)
            shifted = values[0, parents.clamp(min=0)].masked_fill(parents < 0, 0.0)
            return shifted.unsqueeze(0), None
        return packed_logprobs(
            self.engine,
            mb,
            temperature=self.temperature,
            compute_entropy=compute_entropy,
            loss_tokens_only=True,
            logits_to_keep=self.logits_to_keep,
        )

    # -- calls -----------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, chunk: TrainingInputBatch) -> dict[str, Any]:
        """``logprobs`` (policy/reference) or ``values`` (critic) for every chunk row, ``[rows, S]``,
        plus the chunk's ``source_rows`` so the caller can put real rows back in order."""
        started = time.perf_counter()
        self.engine.eval()
        micro = self._micro_batches(chunk)
        outputs = [self._model_out(mb)[0].float().cpu() for mb in micro]
        key = "values" if self.role == "critic" else "logprobs"
        values = unpack_to_rows(micro, outputs, len(chunk)) if len(chunk) else torch.zeros(0, 0)
        return {
            key: values,
            "source_rows": chunk.metadata.get("source_rows"),
            "compute_s": time.perf_counter() - started,
        }

    @torch.no_grad()
    def reference_forward(self, chunk: TrainingInputBatch) -> dict[str, Any]:
        """``forward`` with the adapters switched off: the reference policy's logprobs from a
        LoRA policy, without a reference worker group or a second copy of the weights."""
        if not self.lora:
            raise RuntimeError(f"reference_forward needs a LoRA policy; this is a {self.role}")
        with self.engine.module.disable_adapter():
            return self.forward(chunk)

    def train_mini_batch(self, chunk: TrainingInputBatch) -> TrainStats:
        """Backward over every micro batch, then exactly ONE optimizer step; this rank's record
        (``WorkerGroup.train_mini_batch`` combines the ranks').

        A non-finite loss or gradient on any rank refuses the step on every rank: weights,
        optimizer state, LR schedule and step count stay as they were, the gradients are
        dropped, and the record says ``nonfinite`` with a NaN grad norm. A non-finite loss, or
        at ZeRO 0/1 a non-finite local gradient, is caught here before ``step()``. Where the
        gradients live in the optimizer's own buffers (ZeRO 2/3; ZeRO 1 in bf16 or offloaded)
        DeepSpeed's ``step()`` finds their norm non-finite (all ranks', reduced) and skips the
        update itself and leaves the schedule, but counts the call in ``global_steps`` and
        ``skipped_steps`` and reports an inf grad norm; that step is refused here too, and what
        the skip left of the gradients (offloaded, it kept them for the next step) is dropped."""
        started = time.perf_counter()
        self.engine.train()
        micro = self._micro_batches(chunk)
        on_policy = self.role == "policy" and bool(chunk.metadata.get(OLD_LOGPROBS_FROM_TRAINING))
        sums = LossSums()
        finite = True
        outputs = []
        for mb in micro:
            loss, mb_sums, out = self._micro_batch_loss(chunk, mb, on_policy)
            finite = finite and bool(torch.isfinite(loss.detach()))
            self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
            sums = sums + mb_sums
            if on_policy:
                outputs.append(out.detach().float().cpu())
        refused = all_reduce_max(int(not (finite and self._local_grads_finite()))) > 0
        lr = float(self.engine.get_lr()[0])  # before step(): the lr this step applies
        if refused:
            self._drop_gradients()
        else:
            skipped = self.engine.skipped_steps
            self.engine.step()
            refused = self.engine.skipped_steps > skipped  # non-finite gradients, DeepSpeed's
            if refused:  # what its skipped step leaves behind (ZeRO 1/2 offloaded)
                self._drop_gradients()
        raw_norm = None if refused else self.engine.get_global_grad_norm()
        grad_norm = float(raw_norm) if raw_norm is not None else math.nan
        return TrainStats(
            losses=sums,
            grad_norm=grad_norm,
            lr=lr,
            nonfinite=refused or not math.isfinite(grad_norm),
            compute_s=time.perf_counter() - started,
            packing=PackingStats(**micro_batch_metrics(micro, self.max_tokens)),
            logprobs=unpack_to_rows(micro, outputs, len(chunk)) if on_policy else None,
            source_rows=chunk.metadata.get("source_rows") if on_policy else None,
        )

    def _local_grads_finite(self) -> bool:
        """At ZeRO 0/1 the accumulated gradients are still local ``.grad`` tensors (at ZeRO 1
        in bf16 or offloaded, part of them at most: the sum is in the optimizer's buffers); at
        2/3 they live in the optimizer's partitions and are not checked here: ``engine.step()``
        checks their (reduced) norm and skips a non-finite step itself (``train_mini_batch``,
        ``test_an_inf_gradient_under_a_finite_loss_refuses_the_step``,
        ``test_after_a_refused_step_the_next_is_a_fresh_first_step_in_every_layout``). One
        fused pass: the total norm is non-finite when any entry is (or when it overflows, which
        would have made the step's grad norm non-finite too); ~12x faster than an ``isfinite``
        per tensor on SmolLM2's 135M gradients (0.065 vs 0.76 s on one thread here). On a lone
        ZeRO-0 fp32 rank this is the step's own grad norm, which clipping then reuses."""
        if self.cfg.trainer.zero_stage >= 2:
            return True
        norm = final_grad_norm(self.engine)
        if norm is None:
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else None
        return norm is None or bool(torch.isfinite(norm))

    def _drop_gradients(self) -> None:
        """Forget this mini-batch's gradients without an optimizer step. ZeRO 1/2 accumulate
        them in the optimizer's own partitions, which ``zero_grad`` leaves: they are cleared
        as DeepSpeed's own overflow step clears them (the next step added them before), and
        the micro-step count goes back as ``step()`` sets it (with offload, a count above 0
        made the next step's first backward add the dropped CPU gradients to its own). ZeRO 3
        clears them with its own overflow clean-up."""
        forget_grad_norm(self.engine)
        optimizer = self.engine.optimizer
        if self.engine.zero_optimization():
            optimizer.zero_grad(set_to_none=True)
        if hasattr(optimizer, "_overflow_clean_up"):  # ZeRO 3 (DeepSpeedZeroOptimizer_Stage3)
            optimizer._overflow_clean_up(optimizer.loss_scale)
        elif hasattr(optimizer, "averaged_gradients"):  # ZeRO 1/2 (DeepSpeedZeroOptimizer)
            optimizer._release_preflattened_grad_buffers()
            if getattr(optimizer, "cpu_offload", False):
                optimizer.reset_cpu_buffers()
                optimizer._offload_accumulated_param_ids = set()
            for partitions in (optimizer.averaged_gradients, optimizer.all_grad_tensors):
                for group in list(partitions):
                    partitions[group] = None
            optimizer.micro_step_id = -1  # DeepSpeed's INITIAL_MICRO_STEP_ID, as step() sets it
        self.engine.zero_grad()
        if hasattr(self.engine, "_unmanaged_backward_count"):
            self.engine._unmanaged_backward_count = 0

    def _micro_batch_loss(
        self, chunk: TrainingInputBatch, mb: PackedMicroBatch, on_policy: bool = False
    ) -> tuple[torch.Tensor, LossSums, torch.Tensor]:
        """The micro batch's loss, its sums, and the model output it came from ``[1, T]``.
        ``on_policy``: the rows' old logprobs are this forward's own, detached."""
        from skyrl.workers.losses import critic_loss, policy_loss

        out, entropy = self._model_out(mb, compute_entropy=self.cfg.algorithm.entropy_coef > 0)
        if mb.is_empty:  # a filler: zero loss, but its backward keeps ZeRO's collectives in step
            return out.sum() * 0.0, LossSums(), out
        rows = chunk.select_rows(mb.row_indices).to(self.device)
        unpacked = mb.unpack(out)
        ent = mb.unpack(entropy) if entropy is not None else None
        if self.role == "critic":
            return *critic_loss(unpacked, rows, self.cfg.algorithm), out
        if on_policy:
            rows = rows.replace(old_logprobs=unpacked.detach() * rows.loss_mask)
        return *policy_loss(unpacked, ent, rows, self.cfg.algorithm), out

    def active_dropout(self) -> list[str]:
        """What makes this rank's training forward random: dropout layers with ``p > 0`` and
        dropout, jitter or noise fields of the model config above 0 (e.g. ``lora_dropout``
        layers, a config's ``attention_dropout``, a MoE router's ``router_jitter_noise``), but
        not those of heads a causal LM does not run (``HEAD_ONLY_DROPOUT``: GPT-NeoX's
        ``classifier_dropout``, GPT-2's ``summary_first_dropout``).
        Empty = the training forward computes what ``forward`` does."""
        module = self.engine.module
        found = [
            f"{name} (p={m.p:g})"
            for name, m in module.named_modules()
            if isinstance(m, torch.nn.Dropout) and m.p > 0
        ]
        config = getattr(module, "config", None)
        for key, value in sorted(vars(config).items() if config is not None else ()):
            dropout_key = any(word in key for word in ("dropout", "pdrop", "jitter", "noise"))
            head_only = any(word in key for word in HEAD_ONLY_DROPOUT)
            if dropout_key and not head_only and isinstance(value, float) and value > 0:
                found.append(f"config.{key}={value:g}")
        return found

    def optimizer_state_bytes(self) -> int:
        """Bytes of this rank's Adam moments (``exp_avg``, ``exp_avg_sq``): with LoRA only the
        adapters'; under ZeRO-1/2/3 this rank's partition."""
        opt = self.engine.optimizer
        while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
            opt = opt.optimizer
        return sum(
            t.numel() * t.element_size()
            for state in opt.state.values()
            for key, t in state.items()
            if key in ("exp_avg", "exp_avg_sq")
        )

    def global_steps(self) -> int:
        """Optimizer steps taken by the DeepSpeed engine (its ``global_steps`` also counts
        the steps it skipped over non-finite gradients at ZeRO 2/3)."""
        return int(self.engine.global_steps - self.engine.skipped_steps)

    # -- weights ---------------------------------------------------------------------

    def _sync_view(self) -> str:
        """What a weight sync sends: ``full`` weights, or with LoRA the ``adapter`` tensors
        only or the adapters ``merged`` into the base weights (``trainer.lora_sync``)."""
        return self.cfg.trainer.lora_sync if self.lora else "full"

    def _sync_sources(self, view: str):
        """``(name, parameter, parameters to gather, build)`` per tensor of ``view``, in the
        model's order; ``build()`` makes the tensor once the parameters are gathered. Names:
        HF names for ``full`` and ``merged``, PEFT's saved names for ``adapter``
        (``skyrl.models.lora``)."""
        from skyrl.models.lora import ADAPTER, base_name, is_adapter_name, merged_weight, wire_name

        module = self.engine.module
        named = list(module.named_parameters())
        if view == "full":
            for name, param in named:
                yield name, param, [param], param.detach
            return
        if view == "adapter":
            for name, param in named:
                if is_adapter_name(name):
                    yield wire_name(name), param, [param], param.detach
            return
        layers = dict(module.named_modules())
        for name, param in named:
            if is_adapter_name(name):
                continue
            owner, sep, leaf = name.rpartition(".base_layer.")
            layer = layers.get(owner) if sep and leaf == "weight" else None
            if layer is None or ADAPTER not in getattr(layer, "lora_A", {}):
                yield base_name(name), param, [param], param.detach
                continue
            adapters = [layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight]

            def merged(param=param, layer=layer) -> torch.Tensor:
                return merged_weight(param.detach(), layer)  # in fp32, rounded once

            yield base_name(name), param, [param, *adapters], merged

    def _gathered_params(self, view: str | None = None):
        """``(name, full tensor)`` of ``view`` (default: what a sync sends) one at a time;
        under ZeRO-3 every rank must take part in each gather."""
        import deepspeed

        for name, _, params, build in self._sync_sources(view or self._sync_view()):
            if any(hasattr(p, "ds_id") for p in params):
                with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                    yield name, build().clone()
            else:
                yield name, build()

    def state_dict_for_sync(
        self, all_ranks: bool = False, view: str | None = None
    ) -> dict[str, torch.Tensor] | None:
        """What a weight sync sends (or ``view``: ``full``, ``adapter``, ``merged``), named as
        the inference engine expects; rank 0's copy, None elsewhere (every rank's own copy
        with ``all_ranks``, to check they agree)."""
        keep = all_ranks or self.rank == 0
        weights = {}
        for name, tensor in self._gathered_params(view):
            if keep:
                weights[name] = tensor.cpu().clone()
        return weights if keep else None

    def iter_weight_buckets(self, bucket_bytes: int = 256 << 20):
        """Streaming variant: yields ``{name: tensor}`` buckets of about ``bucket_bytes`` (rank 0 only;
        other ranks take part in the gathers and yield nothing)."""
        for bucket, tensors in self._planned_buckets(self.weight_sync_plan(bucket_bytes)):
            if self.rank == 0:
                yield {spec[0]: t.cpu().clone() for spec, t in zip(bucket, tensors, strict=True)}

    def write_shared_weights(self, weights) -> None:
        """Rank 0 copies the full weights into the shared-memory file ``weights``
        (``skyrl.inference.shared_weights.SharedWeights``, laid out by its plan); every rank
        takes part in the gathers (ZeRO-3)."""
        start = 0
        for bucket, tensors in self._planned_buckets(weights.plan):
            if self.rank == 0:
                weights.write(start, tensors)
            start += len(bucket)

    def weight_sync_plan(self, bucket_bytes: int) -> list:
        """The buckets (name, shape, dtype) that both sync paths send, in the model's order."""
        from skyrl.inference.weight_sync import plan_buckets, tensor_spec

        specs = (
            tensor_spec(name, getattr(param, "ds_shape", param.shape), param.dtype)
            for name, param, _, _ in self._sync_sources(self._sync_view())
        )
        return plan_buckets(specs, bucket_bytes)

    def weight_sync_address(self) -> tuple[str, int]:
        """Where this rank will host the broadcast group's TCPStore."""
        from skyrl.workers.distributed import find_free_port, node_ip

        return node_ip(), find_free_port()

    def join_weight_sync(self, host: str, port: int, world_size: int, backend: str) -> None:
        """Rank 0 joins the broadcast group as its sender (rank 0); other ranks do nothing."""
        if self.rank == 0:
            from skyrl.inference.weight_sync import join_group

            self.sync_group = join_group(host, port, 0, world_size, backend)

    def leave_weight_sync(self) -> None:
        """Rank 0 lets go of the broadcast group after a failed broadcast: the group's
        destructor closes its connections, which ends the engines' wait in the broadcast
        ("Connection closed by peer") instead of gloo's timeout."""
        import gc

        self.__dict__.pop("sync_group", None)
        gc.collect()  # the group, were it in a reference cycle

    def broadcast_weights(self, plan: list) -> None:
        """Rank 0 broadcasts the full weights bucket by bucket, as ``plan`` lays them out;
        every rank takes part in the gathers (ZeRO-3)."""
        from skyrl.inference.weight_sync import send_bucket

        for bucket, tensors in self._planned_buckets(plan):
            if self.rank == 0:
                send_bucket(self.sync_group, bucket, tensors)

    def _planned_buckets(self, plan: list):
        """``(bucket, tensors)`` per bucket of ``plan``, the names checked against the model's;
        every rank takes part in the gathers (ZeRO-3), only rank 0 keeps the tensors (None
        elsewhere)."""
        params = self._gathered_params()
        for bucket in plan:
            tensors = []
            for spec in bucket:
                name, tensor = next(params)
                if name != spec[0]:
                    raise RuntimeError(f"weight sync plan expects {spec[0]}, model gave {name}")
                tensors.append(tensor if self.rank == 0 else None)
            yield bucket, tensors
        for name, _ in params:
            raise RuntimeError(f"weight sync plan misses parameter {name}")

    # -- checkpoints -----------------------------------------------------------------

    def save_checkpoint(self, ckpt_dir: str, client_state: dict[str, Any] | None = None) -> None:
        """Model, optimizer, scheduler, step counters (DeepSpeed) and this rank's RNG states."""
        path = Path(ckpt_dir) / self.role
        self.engine.save_checkpoint(
            str(path),
            tag="state",
            client_state=client_state or {},
            exclude_frozen_parameters=self.lora,  # LoRA: adapters and their optimizer only
        )
        torch.save(_rng_state(), path / f"rng_rank{self.rank}.pt")
        if self.lora and self.rank == 0:  # what the adapter tensors mean, for skyrl-eval
            from skyrl.models.lora import peft_config

            peft_config(self.cfg.model.lora).save_pretrained(str(path))

    def load_checkpoint(self, ckpt_dir: str) -> dict[str, tuple[Any, Any]]:
        """Restore what ``save_checkpoint`` wrote, then put the config's AdamW settings over the
        saved ones (``_apply_optimizer_config``); returns those that differed."""
        path = Path(ckpt_dir) / self.role
        load_optim = self.role != "reference"
        self.engine.load_checkpoint(
            str(path),
            tag="state",
            load_optimizer_states=load_optim,
            load_lr_scheduler_states=load_optim,
            load_module_strict=not self.lora,  # LoRA: the frozen base comes from model.path
        )
        _set_rng_state(torch.load(path / f"rng_rank{self.rank}.pt", weights_only=False))
        return self._apply_optimizer_config() if load_optim else {}

    def optimizer_settings(self) -> dict[str, Any]:
        """AdamW's betas, eps and weight decay in force (the lr is each step's ``lr``)."""
        group = self.engine.lr_scheduler.optimizer.param_groups[0]
        return {"betas": [float(b) for b in group["betas"]], "eps": group["eps"],
                "weight_decay": group["weight_decay"]}  # fmt: skip

    def _apply_optimizer_config(self) -> dict[str, tuple[Any, Any]]:
        """The config's lr, betas, eps and weight decay over those a checkpoint restored.

        DeepSpeed loads torch's optimizer and LambdaLR state dicts, which carry the saved
        hyperparameters (the LambdaLR its ``base_lrs``; the schedule's shape is the config's,
        rebuilt at start). A resume with a changed ``trainer.*_optimizer`` key would otherwise
        train on at the saved values. Returns ``{config key: (saved, config value)}`` for each
        that differed."""
        key = "critic_optimizer" if self.role == "critic" else "policy_optimizer"
        cfg = getattr(self.cfg.trainer, key)
        scheduler = self.engine.lr_scheduler  # built on the torch AdamW (``build_engine``)
        saved = {"lr": float(scheduler.base_lrs[0]), **self.optimizer_settings()}
        wanted = {"lr": cfg.lr, "betas": [float(b) for b in cfg.betas], "eps": cfg.eps,
                  "weight_decay": cfg.weight_decay}  # fmt: skip
        multiplier = scheduler.lr_lambdas[0](scheduler.last_epoch)
        for group in scheduler.optimizer.param_groups:
            group.update(
                lr=cfg.lr * multiplier,
                betas=tuple(wanted["betas"]),
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
            )
        scheduler.base_lrs = [cfg.lr] * len(scheduler.base_lrs)
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
        return {
            f"trainer.{key}.{name}": (saved[name], value)
            for name, value in wanted.items()
            if saved[name] != value
        }

    def export_hf(
        self, out_dir: str, tokenizer_path: str | None = None, adapter_dir: str | None = None
    ) -> None:
        """A ``from_pretrained``-loadable copy of the policy (and its tokenizer); with LoRA the
        adapters merged in, and the PEFT adapter directory at ``adapter_dir``."""
        lora = self.lora
        weights = self.state_dict_for_sync(view="merged" if lora else "full")
        adapter = self.state_dict_for_sync(view="adapter") if lora else None
        if self.rank != 0:
            return
        from transformers import AutoTokenizer

        module = self.engine.module
        base = module.get_base_model() if lora else module
        base.config.use_cache = True  # off for training only (models.py): not the model's
        try:
            base.save_pretrained(out_dir, state_dict=weights, safe_serialization=True)
        finally:
            base.config.use_cache = False
        tok_path = tokenizer_path or self.cfg.model.tokenizer_path or self.cfg.model.path
        tokenizer = AutoTokenizer.from_pretrained(
            tok_path, trust_remote_code=self.cfg.model.trust_remote_code
        )
        tokenizer.save_pretrained(out_dir)
        if adapter is not None and adapter_dir is not None:
            from skyrl.models.lora import write_adapter_dir

            write_adapter_dir(adapter_dir, adapter, self.cfg.model.lora, self.cfg.model.path)
            tokenizer.save_pretrained(adapter_dir)

    def pid(self) -> int:
        return os.getpid()


def _leave_out_every_name_of_frozen_weights(engine) -> None:
    """DeepSpeed's ``exclude_frozen_parameters`` drops frozen weights by their
    ``named_parameters()`` names, which list a tied weight once: every LoRA checkpoint of a
    tied-embedding model (SmolLM2) kept the frozen embedding as ``lm_head.weight``. The
    engine's module state dict now leaves out each name of a frozen weight."""
    own = engine.module_state_dict

    def module_state_dict(*args, exclude_frozen_parameters: bool = False, **kwargs):
        states = own(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kwargs)
        if exclude_frozen_parameters:
            for name, param in engine.module.named_parameters(remove_duplicate=False):
                if not param.requires_grad:
                    states.pop(name, None)
        return states

    engine.module_state_dict = module_state_dict


def _run_imports(modules: list[str], driver_cwd: str | None) -> None:
    """The config's ``imports`` (e.g. a recipe's registered loss), importable from the
    directory the run was started in, as on the driver."""
    if driver_cwd and driver_cwd not in sys.path:
        sys.path.insert(0, driver_cwd)
    for module in modules:
        importlib.import_module(module)


def _use_driver_parts(pickled: dict[str, bytes]) -> None:
    """Load the driver's algorithm parts and register them here (``use_driver_parts``); one
    that does not load (a module the worker cannot import) is an error naming its key."""
    from skyrl.workers.losses import use_driver_parts

    parts = {}
    for key, blob in pickled.items():
        try:
            parts[key] = pickle.loads(blob)
        except Exception as exc:
            raise ConfigError(
                f"algorithm.{key}",
                f"the driver's function does not load in the worker: {exception_line(exc)}",
            ) from None
    use_driver_parts(parts)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
