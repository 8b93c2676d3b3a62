"""Prompt datasets: local files, local ``datasets``, built-in generated tasks, and the checked
loading a run uses (``load_checked_prompts``: row validation and the over-long policy)."""

from __future__ import annotations

from skyrl.data.checked import PromptSplits, SplitReport, check_prompts, load_checked_prompts
from skyrl.data.generated import arithmetic_rows, reasoning_gym_rows
from skyrl.data.prompts import (
    PromptDataError,
    PromptRow,
    iter_prompt_file,
    load_hf_dataset,
    load_prompt_file,
    row_from_record,
    uid_prefixes,
)


def load_prompts(data_cfg, env_cfg=None, split: str = "train") -> list[PromptRow]:
    """The ``train`` or ``eval`` prompts a ``DataConfig`` describes, as they are (a run loads
    them through ``load_checked_prompts``, which also applies ``data.overlong_prompts``)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    train = split == "train"
    if data_cfg.source == "files":
        files = data_cfg.train_files if train else data_cfg.eval_files
        prefixes = uid_prefixes(files)
        return [
            row
            for f, prefix in zip(files, prefixes, strict=True)
            for row in load_prompt_file(f, data_cfg.prompt_key, prefix)
        ]
    n = data_cfg.num_train_prompts if train else data_cfg.num_eval_prompts
    if data_cfg.source == "arithmetic":
        return arithmetic_rows(n, data_cfg.seed, split)
    if data_cfg.source == "reasoning_gym":
        dataset = getattr(env_cfg, "dataset", None)
        if not dataset:
            raise ValueError("data.source=reasoning_gym needs environment.dataset=<name>")
        return reasoning_gym_rows(dataset, n, data_cfg.seed, split, data_cfg.num_train_prompts)
    raise ValueError(f"data.source={data_cfg.source!r} has no prompt rows")


__all__ = [
    "PromptDataError",
    "PromptRow",
    "PromptSplits",
    "SplitReport",
    "arithmetic_rows",
    "check_prompts",
    "iter_prompt_file",
    "load_checked_prompts",
    "load_hf_dataset",
    "load_prompt_file",
    "load_prompts",
    "reasoning_gym_rows",
    "row_from_record",
    "uid_prefixes",
]
