"""Schema of the ``data`` group: where training and eval prompts come from."""

from __future__ import annotations

from dataclasses import dataclass, field

from skyrl.config.errors import require, require_choice

NO_TRAIN_FILES = "source=files needs at least one training file"
"""The message of the rule an eval, which reads no training files, has no use for."""


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
    """Column holding the prompt (a string or a list of chat messages, each with a string
    ``content`` and a role of system, user, assistant or tool)."""
    num_train_prompts: int = 512
    """Generated sources: training prompts to generate."""
    num_eval_prompts: int = 64
    """Generated sources: held-out prompts to generate."""
    seed: int = 1234
    """Seed of generated datasets (independent of trainer.seed)."""
    overlong_prompts: str = "error"
    """A prompt longer than generator.max_prompt_length tokens (counted after the env's
    ``init`` and the chat template, as the agent loop renders it), found when the prompts are
    loaded, before anything starts: ``error`` stops with the first such file row (or generated
    prompt), its length and how many there are; ``drop`` drops them with one warning giving
    the count per split (the dry-run plan shows it too)."""

    def __post_init__(self) -> None:
        require_choice(self.source, ("files", "arithmetic", "reasoning_gym", "fake"), "source")
        require_choice(self.overlong_prompts, ("error", "drop"), "overlong_prompts")
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
                NO_TRAIN_FILES,
            )
