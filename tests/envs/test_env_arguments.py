"""User mistakes in the env kwargs named by key, model-written tool calls that come back as
errors, and reasoning-gym scorers that raise on a model's answer."""

from __future__ import annotations

import pytest

from skyrl.config import ConfigError
from skyrl.config.environment import EnvironmentConfig
from skyrl.envs import make_checked_env, reasoning_gym_env
from skyrl.envs.reasoning_gym_env import ReasoningGymEnv
from skyrl.envs.tool_env import ToolEnv

MIB_16 = 16 << 20  # 16 * 1024 * 1024 = 16777216


@pytest.mark.parametrize(
    ("name", "fields", "key", "message"),
    [
        (  # was keyed environment.name: "cannot build the environment: ValueError: ..."
            "tools",
            {"kwargs": {"tool_format": "natve"}},
            "environment.kwargs.tool_format",
            "must be auto, native or tags, got 'natve'",
        ),
        (  # was "environment.kwargs: ... '<' not supported between 'str' and 'float'"
            "tools",
            {"kwargs": {"tool_timeout_s": "abc"}},
            "environment.kwargs.tool_timeout_s",
            "must be a number of seconds > 0, got 'abc'",
        ),
        (  # was accepted: every python call "timed out after -1 s"
            "tools",
            {"kwargs": {"tool_timeout_s": -1}},
            "environment.kwargs.tool_timeout_s",
            "must be a number of seconds > 0, got -1",
        ),
        (
            "tools",
            {"kwargs": {"step_timeout_s": "x"}},
            "environment.kwargs.step_timeout_s",
            "must be a number of seconds > 0, got 'x'",
        ),
        (  # was accepted: every python call raised in the child's preexec_fn
            "tools",
            {"kwargs": {"tool_memory_bytes": "1G"}},
            "environment.kwargs.tool_memory_bytes",
            f"must be a whole number of bytes >= 16 MiB ({MIB_16}), got '1G'",
        ),
        (  # was accepted: every trajectory's init an env error (content 5, not a string)
            "tools",
            {"kwargs": {"system_prompt": 5}},
            "environment.kwargs.system_prompt",
            "must be text or null, got 5",
        ),
        (  # was accepted: every tool step an env error ('<=' between 'int' and 'str')
            "tools",
            {"kwargs": {"max_observation_chars": "abc"}},
            "environment.kwargs.max_observation_chars",
            "must be a whole number of characters >= 1, got 'abc'",
        ),
        (
            "math",
            {"kwargs": {"max_observation_chars": 0}},
            "environment.kwargs.max_observation_chars",
            "must be a whole number of characters >= 1, got 0",
        ),
        (  # was accepted: every step an env error "Dataset 'basic_arithmetc' not registered"
            "reasoning_gym",
            {"dataset": "basic_arithmetc"},
            "environment.dataset",
            "reasoning-gym: Dataset 'basic_arithmetc' not registered (did you mean "
            "'basic_arithmetic'?)",
        ),
        (  # registered, but its default config lists no datasets: each step AssertionError
            "reasoning_gym",
            {"dataset": "composite"},
            "environment.dataset",
            "reasoning-gym: dataset 'composite' cannot be generated from its default config: "
            "Must specify at least one dataset",
        ),
        (
            "reasoning_gym",
            {"dataset": "chain_sum", "kwargs": {"dataset": 3}},
            "environment.kwargs.dataset",
            "must be a reasoning-gym dataset name, got 3",
        ),
    ],
)
def test_a_bad_env_setting_is_refused_naming_its_key(name, fields, key, message):
    with pytest.raises(ConfigError) as err:
        make_checked_env(EnvironmentConfig(name=name, **fields))
    assert (err.value.key, err.value.message) == (key, message)
    assert err.value.__context__ is None


def test_good_settings_still_build():
    env = make_checked_env(
        EnvironmentConfig(
            name="tools",
            kwargs={"tool_timeout_s": 2, "tool_memory_bytes": MIB_16, "system_prompt": None},
        )
    )
    assert (env.tool_timeout_s, env.tool_memory_bytes) == (2, MIB_16)
    env = make_checked_env(EnvironmentConfig(name="reasoning_gym", dataset="chain_sum"))
    assert env.dataset == "chain_sum"
    assert ReasoningGymEnv().dataset is None  # the rows may name it (extras["dataset"])


@pytest.mark.parametrize(
    ("code", "error"),
    [  # each raised out of Popen: the step was an env error, the trajectory cut at reward 0
        ("print(1)\x00", "error: source code string cannot contain null bytes"),
        ("print('\ud800')", "error: the code is not valid text: a lone surrogate at index 7"),
        (  # Linux takes one argument of 32 pages (4 KiB) with its NUL: 131072 - 1 = 131071
            "x = 1\n" * 40_000 + "print(x)",  # 6 * 40000 + 8 = 240008 bytes
            "error: the code is 240008 bytes long; the python tool takes up to 131071",
        ),
    ],
)
def test_python_code_the_sandbox_cannot_take_comes_back_as_an_error(code, error):
    env = ToolEnv(tool_format="tags")
    env.init("What is 6 * 7?", {"answer": "42"})
    result = env.step(f"<python>{code}</python>")
    assert (result.observations, result.reward, result.done) == (
        [{"role": "tool", "content": error}],
        0.0,
        False,
    )


def test_an_answer_the_scorer_cannot_read_is_wrong_not_an_env_error():
    """prime_factorization's scorer does int() on each factor: "abc" raised ValueError out of
    step (an env error, logged once per distinct answer); the gold answer still scores 1."""
    from skyrl.data.generated import reasoning_gym_rows

    (row,) = reasoning_gym_rows("prime_factorization", 1, seed=0)
    env = ReasoningGymEnv(dataset="prime_factorization")
    env.init(row.prompt, row.extras)
    result = env.step("<answer>abc</answer>")
    assert (result.reward, result.done, result.observations) == (0.0, True, [])
    assert result.info["score_error"] == "ValueError: invalid literal for int() with base 10: 'abc'"
    env.init(row.prompt, row.extras)
    assert env.step(f"<answer>{row.extras['entry']['answer']}</answer>").reward == 1.0


class _BrokenScorer:
    def score_answer(self, answer, entry):
        raise KeyError("metadata")


def test_a_scorer_that_fails_on_the_gold_answer_too_is_refused_at_init(monkeypatch):
    # the row's entry is checked when the prompts load (init), not at each of its steps
    monkeypatch.setattr(reasoning_gym_env, "_scorer", lambda name: _BrokenScorer())
    env = ReasoningGymEnv(dataset="chain_sum")
    with pytest.raises(ValueError) as err:
        env.init("q", {"entry": {"answer": "3"}})
    assert str(err.value) == (
        "reasoning-gym 'chain_sum' score_answer fails on the entry's own answer '3': "
        "KeyError: 'metadata'"
    )


@pytest.mark.parametrize(
    ("expression", "output"),
    [  # a float product past 1.8e308 became inf (no OverflowError), and the inf spread:
        # 2**0.5 * 10**300 * 10**10 is 1.414e310, which was "inf"
        ("2**0.5 * 10**300 * 10**10", "error: result too large for a float"),
        # inf - inf was "nan"; 1 / inf was "0" (the true value is about 7.07e-311)
        ("2**0.5 * 10**300 * 10**10 - 2**0.5 * 10**300 * 10**10", "error: result too large for a float"),
        ("1 / (2**0.5 * 10**300 * 10**10)", "error: result too large for a float"),
    ],
)  # fmt: skip
def test_a_float_that_overflows_is_an_error_not_inf_or_nan(expression, output):
    from skyrl.envs.tools import calculator

    assert calculator(expression) == output


def test_a_whole_float_past_2_to_the_53_prints_as_python_prints_it():
    """sqrt(2) * 10**20 is 141421356237309504880.17; the float nearest it is the integer
    141421356237309509632, which was printed as if exact (its last 5 digits wrong). Past
    2**53 (9007199254740992) a float's integers are spaced > 1 apart: printed as Python does."""
    from skyrl.envs.tools import calculator

    assert calculator("2**0.5 * 10**20") == "1.4142135623730951e+20"
    assert calculator("(10**20)**0.5") == "10000000000"  # 1e10, below 2**53: whole
    assert calculator("4**0.5") == "2"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (  # was "error: environment.name: cannot build the environment: ValueError: ..."
            ("environment=tools", "+environment.kwargs.tool_format=natve"),
            "error: environment.kwargs.tool_format: must be auto, native or tags, got 'natve'",
        ),
        (  # was "error: environment.kwargs: ... '<' not supported between ..."
            ("environment=tools", "+environment.kwargs.tool_timeout_s=abc"),
            "error: environment.kwargs.tool_timeout_s: must be a number of seconds > 0, got 'abc'",
        ),
    ],
)
def test_the_cli_refuses_a_bad_env_kwarg_in_one_line_naming_it(tmp_path, overrides, expected):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "skyrl", "experiment=smoke", "trainer.dry_run=true"]
        + [f"trainer.output_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'hydra'}"]
        + list(overrides),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [expected]
    assert not (tmp_path / "out").exists()
