"""Rewards and tool output as a model sees them: grading, the tools, when an episode ends."""

from skyrl.envs.grading import grade
from skyrl.envs.tool_env import ToolEnv
from skyrl.envs.tools import calculator, run_python


def _tags_env() -> ToolEnv:
    env = ToolEnv(tool_format="tags")
    env.use_native_tools(None, "no tool support")
    env.init("What is 6 * 7?", {"answer": "42"})
    return env


def test_a_mention_of_the_answer_tag_is_not_an_answer():
    """Only a closed ``<answer>..</answer>`` ends the episode: a reply that names the tag
    and calls a tool gets the tool's output (6 * 7 = 42), not reward 0 and the end."""
    env = _tags_env()
    result = env.step("I will end with <answer> tags. First <calculator>6 * 7</calculator>")
    assert (result.observations, result.reward, result.done) == (
        [{"role": "tool", "content": "42"}],
        0.0,
        False,
    )
    result = env.step("<answer>42</answer>")
    assert (result.reward, result.done) == (1.0, True)


def test_calculator_powers_within_the_bit_limit():
    """The limit is MAX_INT_BITS (10,000) bits, not an exponent of 100."""
    assert calculator("2**101") == str(2**101)  # 102 bits
    assert calculator("2**1000 // 2**999") == "2"  # 2^(1000-999)
    assert calculator("10**200") == "1" + "0" * 200  # 200 * log2(10) = 665 bits
    assert calculator("2**20000").startswith("error: result too large")
    assert calculator("2**5000.5") == "error: result too large for a float"  # past 1.8e308


def test_python_tracebacks_name_the_models_own_lines():
    """The model's code starts at line 1: the sandbox's prelude does not shift its lines."""
    out = run_python("x = 1\ny = x / 0\n")
    assert out.count('File "<string>"') == 1, out  # the model's frame alone
    assert 'File "<string>", line 2, in <module>' in out, out
    assert out.rstrip().endswith("ZeroDivisionError: division by zero"), out
    out = run_python("print(1)\nprint(\n")
    assert "line 2" in out and "SyntaxError" in out, out
    assert run_python("if __name__ == '__main__':\n    print('main')") == "main\n"


def test_a_float_gold_is_graded_as_the_number_it_is():
    """str(1e-05) is "1e-05" and str(1e16) "1e+16", neither a plain number: the right
    answers 0.00001 and 10000000000000000 (1 and 16 zeros) scored 0."""
    assert grade("#### 0.00001", 1e-05) == 1.0
    assert grade("#### 10000000000000000", 1e16) == 1.0
    assert grade("#### 0.0001", 1e-05) == 0.0  # 10x the gold
    assert grade("#### 18", 18.0) == 1.0
