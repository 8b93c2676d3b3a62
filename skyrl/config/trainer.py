"""Schema of the ``trainer`` group: batch sizes, DeepSpeed, optimizer, schedule.

Batch sizes are counted in PROMPTS, not sequences: a training step takes
``train_batch_size`` prompts; each policy mini-batch holds all sequences of
``policy_mini_batch_size`` prompts, however many samples and turns they produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skyrl.config.errors import require, require_choice, require_finite


@dataclass
class OptimizerConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = 1.0e-6
    """Peak learning rate (after warm-up)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW beta1, beta2."""
    eps: float = 1.0e-8
    """AdamW epsilon, > 0 (at 0 a weight whose gradient is exactly 0 steps by 0 / 0)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global L2 norm; 0 disables clipping."""
    lr_scheduler: str = "constant"
    """``constant`` or ``cosine`` (after warm-up)."""
    lr_warmup_steps: int = 0
    """Linear warm-up length, in OPTIMIZER steps (not training steps)."""
    min_lr_ratio: float = 0.0
    """Cosine floor as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        require(len(self.betas) == 2, "betas", f"needs two values, got {list(self.betas)}")
        require(
            all(0 <= b < 1 for b in self.betas),
            "betas",
            f"must be in [0, 1), got {list(self.betas)}",
        )
        # torch's AdamW refuses eps < 0 only when a worker builds it, and eps 0 updates a weight
        # whose gradient is exactly 0 (an embedding row unseen so far) by 0 / (sqrt(0) + 0) = nan
        require(self.eps > 0, "eps", f"must be > 0, got {self.eps}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require_finite(self, ("lr", "eps", "weight_decay"))
        require(self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0, got {self.max_grad_norm}")
        require_choice(self.lr_scheduler, ("constant", "cosine"), "lr_scheduler")
        require(
            self.lr_warmup_steps >= 0,
            "lr_warmup_steps",
            f"must be >= 0, got {self.lr_warmup_steps}",
        )
        require(
            0 <= self.min_lr_ratio <= 1,
            "min_lr_ratio",
            f"must be in [0, 1], got {self.min_lr_ratio}",
        )
        require(
            self.min_lr_ratio == 0 or self.lr_scheduler == "cosine",
            "min_lr_ratio",
            "is the cosine schedule's floor, and lr_scheduler is constant (the lr stays at lr "
            "after warm-up): set lr_scheduler=cosine, or min_lr_ratio=0",
        )


@dataclass
class TrainerConfig:
    """The RL loop and the DeepSpeed workers that train the policy (and critic)."""

    strategy: str = "deepspeed"
    """Training backend; ``deepspeed`` is the only one."""
    seed: int = 42
    """Seed for data order, sampling and model init (the same on every rank); 0 to 2**32 - 1
    (numpy's range)."""
    dry_run: bool = False
    """Validate, run the pre-flight check a real run also starts with (data files and every
    row, prompt lengths, model paths, env, rollout driver; only the tokenizer is loaded, no
    weights fetched), print the plan (batch sizes, optimizer steps, world layout, prompt
    counts) and exit."""

    epochs: int = 1
    """Sets the run's steps: ``epochs`` x batches per epoch (training prompts //
    ``train_batch_size``), the length of the LR schedules; ignored when ``total_steps`` is
    set. One pass over the training prompts each, except with
    ``algorithm.dynamic_sampling=filter``: there each sampling round of a step draws a new
    batch from the loader, which keeps drawing past the end of the prompts, so an epoch
    passes over them up to ``algorithm.max_sample_batches`` times (a prompt may be trained
    on more than once); use ``total_steps`` to set the step count directly."""
    total_steps: int | None = None
    """Training steps to run; None = ``epochs`` x batches per epoch (training prompts //
    ``train_batch_size``)."""
    train_batch_size: int = 16
    """Prompts per training step."""
    policy_mini_batch_size: int = 8
    """Prompts per policy mini-batch; one optimizer step each."""
    critic_mini_batch_size: int = 8
    """Prompts per critic mini-batch (PPO with a critic)."""
    update_epochs_per_batch: int = 1
    """Passes over each training batch; optimizer steps per training step =
    train_batch_size / policy_mini_batch_size * update_epochs_per_batch."""
    reuse_training_logprobs: bool = True
    """Skip the old-policy logprob forward when a step is exactly on-policy (one policy
    mini-batch, one update epoch, a step the policy trains on (not one of a critic's
    ``critic_only_steps``), no KL in the reward, no dropout in the policy):
    the training forward's own logprobs, detached, are then the old logprobs, and the PPO
    ratio is exactly 1 (``skyrl.trainer.on_policy``). False always runs the separate forward."""
    micro_batch_max_tokens: int | None = None
    """Token budget of one packed micro batch; None = 2048 or the maximum sequence length
    (generator.max_prompt_length + generator.max_generate_length), whichever is longer, on
    CPU ranks; on a GPU rank, grown from that by powers of two up to 32768 while half of the
    GPU's free memory allows. It packs several sequences, each attending only to itself, so
    it may exceed the model's context (which bounds each sequence); a memory estimate is
    checked before the run (``skyrl.batch.budget``)."""
    packed_attention: str = "per_sequence"
    """Attention over a packed micro batch in the workers: ``per_sequence`` attends each
    sequence to itself only (SDPA per sequence; on CPU short consecutive sequences share one
    kernel call of at most 96 queries under a mask; on a GPU in bf16/fp16 one
    flash-attention varlen call per micro batch; the cost of a budget above one
    sequence's length grows with the sequences, not with the budget squared), ``masked`` is
    transformers' ``sdpa`` with a block-diagonal mask (every block computed; it also applies
    Llama 4's chunked attention, which ``per_sequence`` does not: the pre-flight refuses
    ``per_sequence`` when a sequence can pass one chunk) (``skyrl.workers.packed_attention``)."""
    share_prompts: bool = True
    """Rows of a micro batch with the same prompt (the samples of one prompt, before their
    first loss token) are packed with that prompt once, and each row's own tokens attend to
    it: the prompt's forward and backward are computed once, not once per sample; the
    gradients are the same. Needs ``packed_attention=per_sequence`` (with ``masked`` every
    row is packed whole)."""
    critic_only_steps: int = 0
    """Training steps at the start that train only the critic (PPO warm-up)."""

    dp_size: int = 2
    """Data-parallel DeepSpeed workers per role (Ray actors)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage, 0-3."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` (bf16 weights, fp32 master weights and optimizer state), or ``auto``:
    bf16 on GPUs and on CPUs with AMX-BF16 (``amx_bf16``), fp32 on other CPUs, where bf16
    runs 50-100x slower (``skyrl.config.validate.resolve_precision``). In bf16 the micro
    batches' gradients add up in fp32 at ``zero_stage`` >= 1, and in bf16 at
    ``zero_stage=0`` (DeepSpeed has no fp32 gradient accumulation without ZeRO; about 0.6%
    relative error over 32 micro batches of the tiny test model)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    offload_optimizer: bool = False
    """Keep optimizer state in CPU memory (ZeRO offload; needs ``zero_stage`` >= 1)."""
    colocate_policy_ref: bool = True
    """Place the reference model on the policy workers' bundles."""
    num_cpus_per_worker: float = 1.0
    """Logical Ray CPUs per worker actor (fractions allowed)."""
    num_gpus_per_worker: float = 0.0
    """GPUs per worker actor; 0 on CPU machines."""
    collective_timeout_min: int = 30
    """Timeout of torch.distributed collectives, in minutes."""

    policy_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer of the policy."""
    critic_optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=5.0e-6))
    """Optimizer of the critic."""
    critic_model_path: str | None = None
    """Initial critic weights (a directory or hub id, resolved like ``model.path``); None = the
    policy model with a fresh value head (zeros). A reward model's one-output head (``score``,
    ``value_head``, ``v_head``) starts the value head. Only with a critic
    (``advantage_estimator=gae``)."""

    ckpt_interval: int = 0
    """Save a checkpoint every N training steps; 0 = only at the end."""
    max_ckpts_to_keep: int = 2
    """Older checkpoints beyond this count are deleted; 0 keeps all."""
    resume: str = "auto"
    """``auto`` (latest checkpoint of this output dir, if any), ``none`` (fresh; refused in an
    output dir holding checkpoints), or a checkpoint path."""
    export_hf: bool = True
    """Write a from_pretrained-loadable copy of the final policy."""
    eval_interval: int = 0
    """Evaluate every N training steps; 0 = only at the end."""
    eval_before_train: bool = False
    """Evaluate once before the first step."""
    max_consecutive_nonfinite: int = 3
    """Abort after this many consecutive steps with a NaN/inf loss or grad norm."""
    weight_sync_bucket_mb: int = 256
    """Weight sync to the engines streams the policy in buckets of about this many MiB."""
    weight_sync: str = "auto"
    """How weights reach the engines: ``shared_memory`` (policy rank 0 writes them into one
    file in /dev/shm, the engines load from views of it; one machine), ``object_store``
    (buckets through Ray; any cluster), ``broadcast`` (a torch.distributed group from policy
    rank 0 to the engines: NCCL on GPU, gloo on CPU), or ``auto`` (broadcast when policy and
    engines have GPUs of their own, else shared_memory on a one-node Ray cluster, else
    object_store; object_store too, with a line saying why, when /dev/shm is missing, refuses
    a new file or has no room for the weights)."""
    lora_sync: str = "adapter"
    """With LoRA (``model.lora.rank`` > 0): ``adapter`` sends only the adapter tensors and the
    engines serve them as a LoRA adapter per policy version; ``merged`` merges the adapters
    into the base weights and sends the full weights (for an engine that serves no adapters)."""
    weight_sync_timeout_s: float = 600.0
    """A weight sync (waiting for in-flight requests included) that takes longer ends the run
    with one error line naming what it waited for; the last checkpoint stays loadable."""
    max_staleness: int = 0
    """Policy versions generation may run ahead of training. 0 = the synchronous loop (generate,
    then train). k >= 1 = asynchronous: the engines (Ray actors with CPUs or GPUs of their own,
    ``generator.num_cpus_per_engine`` / ``num_gpus_per_engine``) keep generating while the
    workers train, and every trained group's oldest turn was dispatched at most k versions
    before the weights it is trained with (``docs/async.md``)."""
    partial_rollouts: bool = False
    """Asynchronous mode: requests in flight at a weight sync continue under the new weights
    (their turns record both versions). False = new requests wait while the weights load and
    those in flight finish first, under the old weights."""
    dump_rollouts: bool = False
    """Write each step's training rollouts (tokens, text, loss masks, rewards) to
    ``<output_dir>/rollouts/step_<N>.jsonl``."""
    loggers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Metric sinks by name, checked against ``skyrl.tracking.SINKS`` after ``imports`` ran: built
    in console, jsonl (always on), tensorboard, wandb, mlflow, or one a recipe registers."""
    output_dir: str | None = None
    """Where checkpoints and metrics go; None = Hydra's run directory."""

    def __post_init__(self) -> None:
        require_choice(self.strategy, ("deepspeed",), "strategy")
        require(
            0 <= self.seed < 2**32, "seed", f"must be in [0, 2**32), got {self.seed}"
        )  # np.random.seed's range, checked before any worker seeds it
        require(self.epochs >= 1, "epochs", f"must be >= 1, got {self.epochs}")
        require(
            self.total_steps is None or self.total_steps >= 1,
            "total_steps",
            f"must be >= 1 or null, got {self.total_steps}",
        )
        for key in (
            "train_batch_size",
            "policy_mini_batch_size",
            "critic_mini_batch_size",
            "update_epochs_per_batch",
            "dp_size",
        ):
            value = getattr(self, key)
            require(value >= 1, key, f"must be >= 1, got {value}")
        mbt = self.micro_batch_max_tokens
        require(
            mbt is None or mbt >= 1, "micro_batch_max_tokens", f"must be >= 1 or null, got {mbt}"
        )
        require(
            self.critic_only_steps >= 0,
            "critic_only_steps",
            f"must be >= 0, got {self.critic_only_steps}",
        )
        require(
            self.zero_stage in (0, 1, 2, 3),
            "zero_stage",
            f"must be 0, 1, 2 or 3, got {self.zero_stage}",
        )
        require(
            not (self.offload_optimizer and self.zero_stage == 0),
            "offload_optimizer",
            "ZeRO offload needs trainer.zero_stage >= 1 (at 0 the optimizer state would stay "
            "where the weights are)",
        )
        require_choice(self.precision, ("fp32", "bf16", "auto"), "precision")
        require_choice(self.packed_attention, ("per_sequence", "masked"), "packed_attention")
        require(
            self.num_cpus_per_worker > 0,
            "num_cpus_per_worker",
            f"must be > 0, got {self.num_cpus_per_worker}",
        )
        require(
            self.num_gpus_per_worker >= 0,
            "num_gpus_per_worker",
            f"must be >= 0, got {self.num_gpus_per_worker}",
        )
        require(
            self.collective_timeout_min >= 1,
            "collective_timeout_min",
            f"must be >= 1, got {self.collective_timeout_min}",
        )
        require(
            self.weight_sync_bucket_mb >= 1,
            "weight_sync_bucket_mb",
            f"must be >= 1, got {self.weight_sync_bucket_mb}",
        )
        require_choice(
            self.weight_sync, ("auto", "shared_memory", "object_store", "broadcast"), "weight_sync"
        )
        require_choice(self.lora_sync, ("adapter", "merged"), "lora_sync")
        require(
            self.weight_sync_timeout_s > 0,
            "weight_sync_timeout_s",
            f"must be > 0, got {self.weight_sync_timeout_s}",
        )
        # Ray refuses an inf resource request; Future.result(timeout=inf) raises OverflowError
        require_finite(
            self, ("num_cpus_per_worker", "num_gpus_per_worker", "weight_sync_timeout_s")
        )
        require(self.max_staleness >= 0, "max_staleness", f"must be >= 0, got {self.max_staleness}")
        require(self.ckpt_interval >= 0, "ckpt_interval", f"must be >= 0, got {self.ckpt_interval}")
        require(
            self.max_ckpts_to_keep >= 0,
            "max_ckpts_to_keep",
            f"must be >= 0, got {self.max_ckpts_to_keep}",
        )
        require(self.eval_interval >= 0, "eval_interval", f"must be >= 0, got {self.eval_interval}")
        require(
            self.max_consecutive_nonfinite >= 1,
            "max_consecutive_nonfinite",
            f"must be >= 1, got {self.max_consecutive_nonfinite}",
        )
