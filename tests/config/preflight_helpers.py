"""What the pre-flight tests share: a validated smoke config with overrides, a prompts file,
and the ``ConfigError`` a config is refused with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyrl
from skyrl.config import ConfigError
from skyrl.config.preflight import preflight
from skyrl.config.validate import validate


def cfg_for(*overrides: str):
    return validate(skyrl.compose(["experiment=smoke", *overrides]))


def write_jsonl(path: Path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return str(path)


def refused(cfg, for_run: bool = False) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        preflight(cfg, for_run=for_run)
    return err.value
