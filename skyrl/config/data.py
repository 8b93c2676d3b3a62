"""Schema of the ``data`` group: where training and eval prompts come from."""

from __future__ import annotations

from dataclasses import dataclass, field

from skyrl.config.errors import require, require_choice


@dataclass
class DataConfig:
    """Prompt source: files, a built-in generated task, or fake rollouts."""

    source: str = "arithmetic"
    """``files`` (parquet/jsonl), ``arithmetic``, ``reasoning_gym`` or ``fake`` (random tokens, no generator)."""
    train_files: list[str] = field(default_factory=list)
    """files: training prompt files (.parquet, .jsonl)."""
    eval_files: list[str] = field(default_factory=list)
    """files: held-out prompt files."""
    prompt_key: str = "prompt"
    """Column holding the prompt (a string or a list of chat messages)."""
    num_train_prompts: int = 512
    """Generated sources: training prompts to generate."""
    num_eval_prompts: int = 64
    """Generated sources: held-out prompts to generate."""
    seed: int = 1234
    """Seed of generated datasets (independent of trainer.seed)."""

    def __post_init__(self) -> None:
        require_choice(self.source, ("files", "arithmetic", "reasoning_gym", "fake"), "source")
        require(
            self.num_train_prompts >= 1,
            "num_train_prompts",
            f"must be >= 1, got {self.num_train_prompts}",
        )
        require(
            self.num_eval_prompts >= 0,
            "num_eval_prompts",
            f"must be >= 0, got {self.num_eval_prompts}",
        )
        if self.source == "files":
            require(
                len(self.train_files) > 0,
                "train_files",
                "source=files needs at least one training file",
            )
