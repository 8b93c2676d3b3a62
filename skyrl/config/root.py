"""The root schema and its registration in Hydra's ConfigStore.

Each group option YAML under ``conf/`` names its schema first in its defaults
list (e.g. ``trainer/deepspeed.yaml`` -> ``trainer_schema``), so every key is
typed and a typo fails at compose time with the key path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from skyrl.config.algorithm import AlgorithmConfig
from skyrl.config.data import DataConfig
from skyrl.config.environment import EnvironmentConfig
from skyrl.config.errors import require
from skyrl.config.generator import GeneratorConfig, HFGeneratorConfig, VLLMGeneratorConfig
from skyrl.config.trainer import TrainerConfig

LORA_MAX_RANK = 512
"""The largest adapter rank vLLM serves (its ``max_lora_rank`` choices end at 512)."""


@dataclass
class LoraConfig:
    """LoRA adapters on the policy (PEFT): only the adapters train and sync; rank 0 = off."""

    rank: int = 0
    """Adapter rank ``r``; 0 trains the full weights."""
    alpha: int = 16
    """Scale numerator: the adapter's update is ``(alpha / rank) * B @ A``."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0 keeps training deterministic)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names (suffixes, PEFT's rule) that get adapters; ``all-linear`` = every linear
    layer but the output layer. Checked against the model before a run starts."""

    def __post_init__(self) -> None:
        require(
            0 <= self.rank <= LORA_MAX_RANK,
            "rank",
            f"must be 0 (off) to {LORA_MAX_RANK} (the largest rank vLLM serves), got {self.rank}",
        )
        require(self.alpha > 0, "alpha", f"must be > 0, got {self.alpha}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        require(len(self.target_modules) > 0, "target_modules", "names no module")
        for i, name in enumerate(self.target_modules):
            require(bool(str(name).strip()), f"target_modules[{i}]", "is empty")
            require(
                name != "all-linear" or len(self.target_modules) == 1,
                f"target_modules[{i}]",
                "all-linear must be the only entry",
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class ModelConfig:
    """The policy model (and the reference, which starts as a copy of it)."""

    path: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """Local directory or HF model id (resolved offline first: ``skyrl.models.resolve``)."""
    tokenizer_path: str | None = None
    """Tokenizer directory or HF id, resolved like ``path``; None = ``path``."""
    trust_remote_code: bool = False
    """Run the model's and tokenizer's own code (``auto_map`` in their config): passed to
    every transformers ``from_pretrained`` of the policy, reference and critic models and
    tokenizer (workers, engines, export) and to vLLM."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (``model.lora.rank`` > 0); the reference is the policy, adapters off."""


@dataclass
class EvalConfig:
    """``skyrl-eval``: which weights to evaluate and where the results go (the prompts and
    sampling are the composed ``data`` and ``generator.eval_sampling``)."""

    checkpoint: str | None = None
    """A run directory (its ``final_hf``, else its latest checkpoint) or one checkpoint
    (``<run>/checkpoints/global_step_N``); None = ``model.path``. A run's ``final_hf`` is
    used unless the run's latest checkpoint is of a later step than the one ``final_hf``
    records (``skyrl_export.json``: a run resumed past its export that did not export
    again); then that checkpoint is evaluated, with a line saying why."""
    output_file: str | None = None
    """The results as JSON; None = ``eval_results.json`` in the run directory of the eval."""


@dataclass
class ServeConfig:
    """``skyrl-serve``: where the OpenAI-compatible endpoint listens."""

    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = 8000
    """TCP port; 0 = any free port (printed with the base URL)."""
    model_name: str | None = None
    """The model id clients send (``model``); None = ``model.path``."""

    def __post_init__(self) -> None:
        # keys in full: validate builds this node with the root (it is no group), unprefixed
        require(
            0 <= self.port <= 65535,
            "serve.port",
            f"must be 0..65535 (0: any free port), got {self.port}",
        )
        require(bool(self.host), "serve.host", "empty (0.0.0.0 listens on every interface)")
        require(
            self.model_name is None or bool(self.model_name.strip()),
            "serve.model_name",
            "is empty; leave it unset (null) to serve the model as model.path",
        )


@dataclass
class SkyRLConfig:
    """A whole run: the five groups plus the model and extra imports."""

    trainer: TrainerConfig = MISSING
    generator: GeneratorConfig = MISSING
    algorithm: AlgorithmConfig = MISSING
    environment: EnvironmentConfig = MISSING
    data: DataConfig = MISSING
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    imports: list[str] = field(default_factory=list)
    """Modules imported before validation, e.g. a recipe that registers its own loss."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """``skyrl-eval`` only."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """``skyrl-serve`` only."""


GROUP_SCHEMAS: dict[str, dict[str, type]] = {
    "trainer": {"trainer_schema": TrainerConfig},
    "generator": {"hf_schema": HFGeneratorConfig, "vllm_schema": VLLMGeneratorConfig},
    "algorithm": {"algorithm_schema": AlgorithmConfig},
    "environment": {"environment_schema": EnvironmentConfig},
    "data": {"data_schema": DataConfig},
}
"""Schema names each group's option YAMLs may list in their defaults."""


def register_configs() -> None:
    """Store the root and group schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="skyrl_schema", node=SkyRLConfig)
    for group, schemas in GROUP_SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=group, name=name, node=node)
