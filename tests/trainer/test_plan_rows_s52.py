"""Rows of the run plan that said less than the run does: ``data=fake`` starts no engine
(``FakeRollouts.engine`` is None) but the plan said ``inference engines  1 x hf``; a LoRA run's
policy row read as full fine-tuning; ``environment=tools`` with one turn went unwarned."""

from __future__ import annotations

from hydra import compose, initialize_config_module

from skyrl.config import register_configs
from skyrl.config.validate import validate
from skyrl.trainer.plan import format_plan, make_plan


def _plan_text(*overrides: str) -> str:
    register_configs()
    with initialize_config_module(config_module="skyrl.conf", version_base="1.3"):
        cfg = validate(compose(config_name="config", overrides=list(overrides)))
    return format_plan(make_plan(cfg))


def test_the_plan_of_a_fake_data_run_names_no_engine():
    text = _plan_text("data=fake")
    [line] = [row for row in text.splitlines() if "inference engines" in row]
    assert line.split("inference engines")[1].strip() == (
        "none (data=fake: random rollouts, nothing generates)"
    )


def test_the_plan_of_a_generating_run_names_its_engines():
    text = _plan_text("generator=hf", "generator.num_engines=1")
    [line] = [row for row in text.splitlines() if "inference engines" in row]
    assert line.split("inference engines")[1].strip() == "1 x hf"


def test_the_plan_says_the_policy_trains_lora_adapters():
    # model.lora.rank > 0 trains adapters only; the plan's policy row said nothing of it
    text = _plan_text("model.lora.rank=4", "model.lora.alpha=8")
    [line] = [row for row in text.splitlines() if "policy workers" in row]
    row = line.split("policy workers")[1].strip()
    # the precision is this CPU's (trainer.precision=auto: bf16 with AMX)
    assert row.startswith("1 x DeepSpeed ZeRO-0 ")
    assert row.endswith(", LoRA rank 4 alpha 8 on all-linear")
    [line] = [row for row in _plan_text().splitlines() if "policy workers" in row]
    assert "LoRA" not in line


TOOLS_WARNING = (
    "environment=tools with generator.max_turns=1: a tool call ends its trajectory before the "
    "tool's result comes back (reward 0); raise generator.max_turns "
    "(experiment=multi_turn_tools uses 3)"
)


def test_the_plan_warns_of_the_tools_environment_with_one_turn():
    # environment=tools at the default max_turns=1 ran silently: each tool call ended its
    # trajectory with reward 0, the tool's output never shown to the model
    warnings = [r for r in _plan_text("environment=tools").splitlines() if "warning" in r]
    assert [w.split("warning", 1)[1].strip() for w in warnings] == [TOOLS_WARNING]
    for overrides in (
        ("environment=tools", "generator.max_turns=3"),
        ("experiment=multi_turn_tools",),
        (),
    ):
        assert TOOLS_WARNING not in _plan_text(*overrides)
