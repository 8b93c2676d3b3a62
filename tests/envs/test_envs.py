"""Built-in envs: grading, registry, reasoning-gym scoring, tools and their sandbox."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from skyrl.config.environment import EnvironmentConfig
from skyrl.envs import env_class, make_env_factory
from skyrl.envs.grading import extract_answer, grade
from skyrl.envs.tool_env import ToolEnv
from skyrl.envs.tools import calculator, run_python


def test_extract_and_grade():
    assert extract_answer("so #### 1,234.") == "1234"
    assert extract_answer("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}"
    assert extract_answer("<answer> 7 </answer> #### 9") == "7"
    assert grade("The answer is \\boxed{0.5}", "1/2") == 1.0
    assert grade("#### 19", "19") == 1.0
    assert grade("19", "19") == 0.0  # strict: no answer marker, no reward
    assert grade("#### 18", "19") == 0.0


def test_registry_and_target():
    math_env = make_env_factory(EnvironmentConfig(name="math"))()
    msgs, _ = math_env.init("What is 1+1?", {"answer": "2"})
    assert msgs == [{"role": "user", "content": "What is 1+1?"}]
    res = math_env.step("It is \\boxed{2}")
    assert res.done and res.reward == 1.0 and res.observations == []
    from skyrl.envs.tool_env import ToolEnv

    assert env_class(name="math", target="skyrl.envs.tool_env.ToolEnv") is ToolEnv
    with pytest.raises(KeyError, match="registered"):
        env_class("nope")


def test_checked_env_names_the_key():
    from skyrl.config import ConfigError
    from skyrl.envs import make_checked_env
    from skyrl.envs.tool_env import ToolEnv

    assert isinstance(make_checked_env(EnvironmentConfig(name="tools")), ToolEnv)
    cases = [
        (EnvironmentConfig(name="mathh"), "environment.name", "unknown environment 'mathh' (did"),
        (EnvironmentConfig(_target_="no.such.Env"), "environment._target_", "cannot import"),
        (EnvironmentConfig(_target_="NoDots"), "environment._target_", "cannot import 'NoDots'"),
        (
            EnvironmentConfig(_target_="skyrl.envs.tools.calculator"),  # not built with kwargs
            "environment.kwargs",
            "cannot build the environment: TypeError: ",
        ),
        (
            EnvironmentConfig(name="tools", kwargs={"tool_timeout_s": 20.0}),
            "environment.kwargs.tool_timeout_s",
            "must be < environment.timeout_s (10)",
        ),
    ]
    for cfg, key, start in cases:
        with pytest.raises(ConfigError) as err:
            make_checked_env(cfg)
        assert err.value.key == key and err.value.message.startswith(start), err.value
        assert err.value.__context__ is None


def test_reasoning_gym_env_uses_dataset_scorer():
    from skyrl.data.generated import reasoning_gym_rows

    rows = reasoning_gym_rows("basic_arithmetic", 3, seed=1)
    assert rows[0].data_source == "reasoning_gym/basic_arithmetic"
    env = make_env_factory(EnvironmentConfig(name="reasoning_gym", dataset="basic_arithmetic"))()
    env.init(rows[0].prompt, rows[0].extras)
    gold = rows[0].extras["entry"]["answer"]
    assert env.step(f"<answer>{gold}</answer>").reward == 1.0
    env.init(rows[0].prompt, rows[0].extras)
    assert env.step("<answer>nonsense</answer>").reward == 0.0


def test_tool_env_multi_turn_and_truncation():
    env = make_env_factory(EnvironmentConfig(name="tools", max_observation_chars=20))()
    msgs, _ = env.init("What is 6*7?", {"answer": "42"})
    assert msgs[0]["role"] == "system" and msgs[1]["content"] == "What is 6*7?"
    r1 = env.step("let me <calculator>6*7</calculator>")
    assert not r1.done and r1.observations == [{"role": "tool", "content": "42"}]
    r2 = env.step("<python>print('x' * 100)</python>")
    assert r2.observations[0]["content"].startswith("x" * 20 + "\n...[truncated 81 chars]")
    r3 = env.step("<answer>42</answer>")
    assert r3.done and r3.reward == 1.0


def test_the_tool_calls_of_one_step_share_a_deadline_below_the_step_limit():
    # 4 native calls of a tool that sleeps 5 s, 1 s each: 4 s run one after another, past the
    # step limit of 3 s. They share a deadline 3 - min(1, 0.1 * 3) = 2.7 s in: call 1 times
    # out at 1 s, call 2 at 1 s or what is left, call 3 gets what is left (<= 0.7 s) if any,
    # and call 4 starts after >= 1 + 1 + 0.7 s (each call runs its whole limit): not run.
    env = ToolEnv(tool_timeout_s=1.0, step_timeout_s=3.0)
    sleep = {"name": "python", "arguments": {"code": "import time; time.sleep(5)"}}
    env.use_native_tools(lambda text: [sleep] * 4, None)
    env.init("What is 6*7?", {"answer": "42"})
    start = time.monotonic()
    result = env.step("four calls")
    elapsed = time.monotonic() - start
    assert 2.7 <= elapsed < 3.0, elapsed
    notes = [o["content"] for o in result.observations]
    assert notes[0] == "error: timed out after 1 s"
    assert notes[1].startswith("error: timed out after ")
    assert notes[2].startswith(("error: timed out after 0.", "error: not run"))
    assert notes[3] == "error: not run: this turn's tool calls used up their 2.7 s"
    assert not result.done and result.reward == 0.0


def test_tool_timeout_s_must_be_below_the_step_limit():
    with pytest.raises(ValueError, match=r"must be < environment.timeout_s \(4\)"):
        ToolEnv(tool_timeout_s=4.0, step_timeout_s=4.0)
    # the factory hands the env environment.timeout_s as its step limit
    env = make_env_factory(EnvironmentConfig(name="tools", timeout_s=7.0, tool_timeout_s=6.0))()
    assert env.step_timeout_s == 7.0


def test_calculator_and_python_sandbox():
    assert calculator("2 * (3 + 4) / 2") == "7"
    assert calculator("__import__('os')").startswith("error")
    assert run_python("print(sum(range(5)))").strip() == "10"
    assert "timed out" in run_python("while True: pass", timeout_s=1.0)
    assert "network disabled" in run_python(
        "import socket; socket.create_connection(('1.1.1.1', 80))"
    )
    assert "MemoryError" in run_python("x = bytearray(2 << 30)", memory_bytes=256 << 20)
    assert run_python("import os; print(os.listdir('.'))").strip() == "[]"


def test_grading_works_off_the_main_thread():
    # math-verify's signal-based timeout raises in threads; that must not become reward 0
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        # a non-numeric gold, so math-verify runs (a numeric one wants a plain number)
        assert pool.submit(grade, "\\boxed{0.5}", "\\frac{1}{2}").result() == 1.0


@pytest.mark.parametrize(
    ("name", "kwargs", "key", "message"),
    [
        (  # a typo: the tools prompt stayed the default and nothing said so
            "tools",
            {"system_promt": "Answer in French."},
            "environment.kwargs.system_promt",
            "ToolEnv takes no argument 'system_promt' (did you mean 'system_prompt'?); it takes: "
            "max_observation_chars, step_timeout_s, system_prompt, tool_format, "
            "tool_memory_bytes, tool_timeout_s",
        ),
        (
            "math",
            {"strict_format": True},
            "environment.kwargs.strict_format",
            "MathEnv takes no argument 'strict_format'; it takes: max_observation_chars",
        ),
        (  # math grades extras["answer"]; a dataset in its kwargs did nothing
            "math",
            {"dataset": "gsm8k"},
            "environment.kwargs.dataset",
            "MathEnv takes no argument 'dataset'; it takes: max_observation_chars",
        ),
        (
            "reasoning_gym",
            {"datset": "chain_sum"},
            "environment.kwargs.datset",
            "ReasoningGymEnv takes no argument 'datset' (did you mean 'dataset'?); it takes: "
            "dataset, max_observation_chars",
        ),
        (  # several: the key is the mapping, the message names each
            "math",
            {"b_arg": 1, "a_arg": 2},
            "environment.kwargs",
            "MathEnv takes no arguments 'a_arg', 'b_arg'; it takes: max_observation_chars",
        ),
    ],
)
def test_unknown_env_kwargs_are_refused_naming_the_key(name, kwargs, key, message):
    from skyrl.config import ConfigError
    from skyrl.envs import make_checked_env

    extra = {"dataset": "chain_sum"} if name == "reasoning_gym" else {}
    with pytest.raises(ConfigError) as err:
        make_checked_env(EnvironmentConfig(name=name, kwargs=kwargs, **extra))
    assert (err.value.key, err.value.message) == (key, message)
    assert err.value.__context__ is None


def test_a_built_in_env_built_by_hand_refuses_an_unknown_argument():
    with pytest.raises(TypeError, match=r"^ToolEnv takes no argument 'system_promt' \(did you"):
        ToolEnv(system_promt="x")


def test_a_user_env_under_a_built_in_name_is_refused_before_the_built_ins_load():
    """The built-ins registered on the first lookup, so a user's ``math`` registered before
    it was silently replaced by ``MathEnv``. ``register_env`` now loads them first (a fresh
    interpreter: nothing loaded yet) and refuses the clash unless ``override=True``. A
    built-in's module imported on its own first (``tool_env``) does not recurse."""
    script = textwrap.dedent(
        """
        import skyrl.envs.tool_env
        from skyrl.envs import ENV_REGISTRY, TextEnv, env_class, register_env
        try:
            @register_env("math")
            class MyMath(TextEnv):
                pass
        except ValueError as exc:
            print(exc)
        print(sorted(ENV_REGISTRY), env_class("math").__qualname__)

        @register_env("math", override=True)
        class MyMath(TextEnv):
            pass
        print(env_class("math").__qualname__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parents[2],  # this checkout's skyrl first on the path
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "environment 'math' is already registered as skyrl.envs.math_env.MathEnv; pass "
        "override=True to replace it with __main__.MyMath",
        "['math', 'reasoning_gym', 'tools'] MathEnv",
        "MyMath",
    ]


def test_register_env_takes_the_same_class_again_but_refuses_another():
    """A notebook cell run again defines a new class of the same module and qualified name:
    it replaces the old one. A different class under a taken name needs ``override=True``."""
    from skyrl.envs import register_env
    from skyrl.envs.base import ENV_REGISTRY, TextEnv

    def define() -> type[TextEnv]:  # one cell, run twice
        @register_env("test_twice")
        class Twice(TextEnv):
            pass

        return Twice

    class Other(TextEnv):
        pass

    try:
        first, again = define(), define()
        assert again is not first and ENV_REGISTRY["test_twice"] is again
        with pytest.raises(ValueError) as err:
            register_env("test_twice")(Other)
        assert str(err.value) == (
            "environment 'test_twice' is already registered as "
            f"{__name__}.{again.__qualname__}; pass override=True to replace it with "
            f"{__name__}.{Other.__qualname__}"
        )
        assert ENV_REGISTRY["test_twice"] is again
        assert register_env("test_twice", override=True)(Other) is Other
        assert ENV_REGISTRY["test_twice"] is Other
    finally:
        ENV_REGISTRY.pop("test_twice", None)


def test_environment_dataset_goes_only_to_envs_that_take_it():
    # data=reasoning_gym reads environment.dataset for its rows (which carry an "answer"), so
    # math or tools may grade them: the env is not handed a dataset it does not take
    from skyrl.envs import register_env
    from skyrl.envs.base import ENV_REGISTRY, TextEnv
    from skyrl.envs.math_env import MathEnv

    assert isinstance(make_env_factory(EnvironmentConfig(dataset="chain_sum"))(), MathEnv)

    @register_env("test_takes_dataset")
    class TakesDataset(TextEnv):
        def __init__(self, dataset: str | None = None, **kwargs):
            super().__init__(**kwargs)
            self.dataset = dataset

    try:
        cfg = EnvironmentConfig(name="test_takes_dataset", dataset="chain_sum")
        env = make_env_factory(cfg)()
    finally:
        ENV_REGISTRY.pop("test_takes_dataset")
    assert isinstance(env, TakesDataset) and env.dataset == "chain_sum"
    env = make_env_factory(
        EnvironmentConfig(name="reasoning_gym", dataset="chain_sum", max_observation_chars=7)
    )()
    assert (env.dataset, env.max_observation_chars) == ("chain_sum", 7)


def test_a_tools_env_of_its_own_name_or_target_gets_the_tool_settings():
    """A ToolEnv subclass registered under its own name, or ToolEnv by ``_target_``, is a
    tools env: it gets environment.tool_* and timeout_s (it got the constructor's defaults,
    5 s / 10 s / auto / 512 MiB), and the deadline rule names the key that was set."""
    from skyrl.config import ConfigError
    from skyrl.envs import make_checked_env, register_env
    from skyrl.envs.tool_env import ToolEnv

    @register_env("test_my_tools")
    class MyTools(ToolEnv):
        pass

    settings = dict(timeout_s=4.0, tool_timeout_s=2.0, tool_format="tags",
                    tool_memory_bytes=64 << 20)  # fmt: skip
    for cfg in (
        EnvironmentConfig(name="test_my_tools", **settings),
        EnvironmentConfig(_target_="skyrl.envs.tool_env.ToolEnv", **settings),
    ):
        env = make_checked_env(cfg)
        got = (env.tool_timeout_s, env.step_timeout_s, env.tool_format, env.tool_memory_bytes)
        assert got == (2.0, 4.0, "tags", 64 << 20), cfg
        env.close()
    too_slow = EnvironmentConfig(name="test_my_tools", timeout_s=4.0, tool_timeout_s=5.0)
    with pytest.raises(ConfigError) as err:
        make_checked_env(too_slow)
    assert err.value.key == "environment.tool_timeout_s"
    assert err.value.message.startswith("must be < environment.timeout_s (4)")


def test_an_env_whose_constructor_takes_no_arguments_is_built_with_the_observation_limit():
    """``def __init__(self): super().__init__()`` was refused: the factory always passed
    ``max_observation_chars``, and the error blamed ``environment.kwargs`` (empty). Now it is
    passed only to a constructor that takes it, and set on the built env otherwise, so
    ``truncate`` still keeps to environment.max_observation_chars."""
    from skyrl.envs import make_checked_env, register_env
    from skyrl.envs.base import ENV_REGISTRY, StepResult, TextEnv

    @register_env("test_plain_init")
    class Counter(TextEnv):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def step(self, action_text):
            return StepResult([], 1.0, True)

    try:
        env = make_checked_env(EnvironmentConfig(name="test_plain_init", max_observation_chars=5))
        again = make_env_factory(EnvironmentConfig(name="test_plain_init"))()
    finally:
        ENV_REGISTRY.pop("test_plain_init")
    assert isinstance(env, Counter) and env.calls == 0
    # 12 chars cut at 5: "abcde" + a note of the 7 cut
    assert env.truncate("abcdefghijkl") == "abcde\n...[truncated 7 chars]"
    assert again.max_observation_chars == 2048  # the config's default
