"""``environment._target_`` naming something that is not an env (a class that does not
subclass ``TextEnv``) is one ``ConfigError`` naming the key and the missing methods, at the
pre-flight check: it raised ``AttributeError: 'Plain' object has no attribute 'close'`` out
of the CLI as a traceback (and, past that, on every trajectory)."""

import pytest

from skyrl.config import ConfigError
from skyrl.config.environment import EnvironmentConfig
from skyrl.envs import StepResult, TextEnv, make_checked_env

HERE = __name__


class Plain:
    """init and step, duck-typed: no tool_schemas, no close."""

    def init(self, prompt, extras):
        return [{"role": "user", "content": str(prompt)}], {}

    def step(self, action_text):
        return StepResult([], 1.0, True)


class Closes:
    """Only a close: closed again once refused."""

    closed = 0

    def close(self):
        Closes.closed += 1


class Duck(Plain):
    """Every method the loop calls, without subclassing TextEnv: still taken."""

    def tool_schemas(self):
        return None

    def close(self):
        pass


class Real(TextEnv):
    def step(self, action_text):
        return StepResult([], 1.0, True)


def make_real(**kwargs):
    return Real(**kwargs)


@pytest.mark.parametrize(
    ("name", "missing"),
    [("Plain", "tool_schemas, close"), ("Closes", "init, step, tool_schemas")],
)
def test_a_target_without_the_loops_methods_names_the_key_and_them(name, missing):
    Closes.closed = 0
    with pytest.raises(ConfigError) as err:
        make_checked_env(EnvironmentConfig(_target_=f"{HERE}.{name}"))
    assert err.value.key == "environment._target_"
    assert err.value.message == (
        f"{HERE}.{name} built a {name}, which has no {missing} (the agent loop calls them): "
        "make it a subclass of skyrl.envs.TextEnv"
    )
    assert err.value.__context__ is None
    assert Closes.closed == (name == "Closes")  # what it built is closed, when it can be


@pytest.mark.parametrize("name", ["Duck", "Real", "make_real"])
def test_an_env_with_the_loops_methods_is_still_built(name):
    env = make_checked_env(EnvironmentConfig(_target_=f"{HERE}.{name}"))
    assert type(env).__name__ == ("Real" if name == "make_real" else name)
