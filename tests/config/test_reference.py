"""docs/config-reference.md is generated from the schemas: it is current, and every field is
documented by the string literal below its declaration."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from skyrl.config import reference, register_configs
from skyrl.config.generator import HFGeneratorConfig, VLLMGeneratorConfig
from skyrl.config.trainer import OptimizerConfig, TrainerConfig

REGENERATE = "run `python -m skyrl.config.reference` to regenerate"


def test_every_schema_field_has_a_doc():
    missing = reference.undocumented()
    assert not missing, "fields without a doc string (add one right below each):\n" + "\n".join(
        missing
    )


def test_committed_reference_is_current():
    path = reference.REFERENCE_PATH
    assert path.is_file(), f"{path} is missing; {REGENERATE}"
    assert path.read_text() == reference.render_reference(), (
        f"docs/config-reference.md is stale; {REGENERATE}"
    )


# -- reading the docs ----------------------------------------------------------------


@dataclass
class _Inner:
    """A nested node."""

    x: float = 1.0
    """Documented x."""


@dataclass
class _Partly:
    """A schema with one field left undocumented."""

    a: int = 1
    """First line
    continues here."""
    b: list[int] = field(default_factory=lambda: [1, 2])
    inner: _Inner = field(default_factory=lambda: _Inner(x=2.5))
    """The nested node."""


def test_rows_read_docs_types_and_factory_defaults():
    rows = {r.key: r for r in reference.schema_rows(_Partly, "demo")}
    assert list(rows) == ["demo.a", "demo.b", "demo.inner", "demo.inner.x"]
    assert rows["demo.a"].doc == "First line continues here."
    assert (rows["demo.b"].type, rows["demo.b"].default, rows["demo.b"].doc) == (
        "list[int]",
        [1, 2],
        None,
    )
    assert rows["demo.inner.x"].default == 2.5  # the factory's value, not the class default


def test_undocumented_names_the_field(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reference, "all_rows", lambda: reference.schema_rows(_Partly, "demo"))
    assert reference.undocumented() == ["demo.b (list[int])"]


def test_nested_optimizers_keep_their_own_defaults():
    rows = {r.key: r for r in reference.schema_rows(TrainerConfig, "trainer")}
    assert rows["trainer.policy_optimizer.lr"].default == OptimizerConfig().lr
    assert rows["trainer.critic_optimizer.lr"].default == 5.0e-6
    assert rows["trainer.train_batch_size"].doc == "Prompts per training step."


def test_schema_variants_list_only_their_own_keys():
    vllm = {r.key: r.default for r in reference.schema_extra_rows("generator", VLLMGeneratorConfig)}
    hf = {r.key: r.default for r in reference.schema_extra_rows("generator", HFGeneratorConfig)}
    assert vllm["generator.backend"] == "vllm" and "generator.kv_cache_memory_bytes" in vllm
    assert "generator.n_samples_per_prompt" not in vllm
    assert "generator.backend" not in hf and "generator.max_batch_size" in hf


def test_option_settings_are_the_changes_from_the_schema_default():
    options = {o.name: o for o in reference.group_options("algorithm")}
    dapo = options["dapo"]
    assert dapo.schema == "algorithm_schema"
    assert dapo.settings["eps_clip_high"] == 0.28
    assert "advantage_estimator" not in dapo.settings  # grpo is the schema default
    assert options["grpo"].settings == {}


def test_every_documented_key_exists_in_the_composed_config():
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["generator=vllm"])
    keys = [r.key for r in reference.all_rows()]
    missing = [k for k in keys if OmegaConf.select(cfg, k, default="<absent>") == "<absent>"]
    hf_only = [r.key for r in reference.schema_extra_rows("generator", HFGeneratorConfig)]
    assert sorted(missing) == sorted(hf_only)


# -- command line --------------------------------------------------------------------


def test_check_fails_on_a_stale_file_and_passes_after_writing(tmp_path: Path, capsys):
    out = tmp_path / "ref.md"
    out.write_text("# old\n")
    assert reference.main(["--check", "--output", str(out)]) == 1
    assert "python -m skyrl.config.reference" in capsys.readouterr().err
    assert reference.main(["--output", str(out)]) == 0
    assert reference.main(["--check", "--output", str(out)]) == 0


def test_module_entry_point_checks_the_committed_file():
    result = subprocess.run(
        [sys.executable, "-m", "skyrl.config.reference", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_placeholders_survive_markdown_outside_code_only():
    assert reference._prose("a <answer> and ``<dir>/x`` and `<n>`") == (
        "a &lt;answer> and ``<dir>/x`` and `<n>`"
    )


def test_the_main_job_table_lists_what_config_yaml_changes():
    # config.yaml samples its evals (temperature 1, 4 samples) where the schema is greedy; a
    # reader of the schema tables alone took the main job's eval for greedy
    from skyrl.config.reference import main_job_rows

    rows = {key: (default, value) for key, default, value in main_job_rows()}
    assert rows["generator.eval_sampling.temperature"] == (0.0, 1.0)
    assert rows["generator.backend"] == ("hf", "vllm")  # the group option's schema default
    assert "trainer.seed" not in rows  # kept at the schema default
