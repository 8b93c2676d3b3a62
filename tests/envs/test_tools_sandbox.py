"""The tools' resource bounds: calculator result size, and the Python child's output,
stdin and leftover processes."""

from __future__ import annotations

import os
import sys
import time

from skyrl.envs.tool_env import ToolEnv
from skyrl.envs.tools import calculator, run_python


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (killed, not yet reaped by init) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _dies_within(pid: int, seconds: float) -> bool:
    # SIGKILL is delivered asynchronously: give the kernel a moment to finish it
    end = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > end:
            os.kill(pid, 9)  # do not leave it behind when the test fails
            return False
        time.sleep(0.02)
    return True


def test_calculator_refuses_nested_powers_quickly():
    # every exponent is <= 100, but 9**99**99**99 has ~10**6 digits before the last **
    start = time.monotonic()
    out = calculator("(((9**99)**99)**99)**99")
    assert time.monotonic() - start < 1.0
    assert out.startswith("error:") and "too large" in out
    assert calculator("(2**5000)*(2**5000)").startswith("error:")


def test_calculator_keeps_ordinary_arithmetic():
    assert calculator("2**100") == str(2**100)
    assert calculator("(9**99)**10 % 1000") == str((9**99) ** 10 % 1000)
    assert calculator("1.5 ** 2") == "2.25"
    assert calculator("7 / 2") == "3.5"
    assert calculator("2.0 ** -100") == str(2.0**-100)  # rounded: 7.888609052210118e-31


def test_a_huge_calculator_result_is_error_text_not_an_exception():
    env = ToolEnv()
    env.use_native_tools(None, "tags")
    env.init("What is (10**100)**50?", {"answer": "0"})
    # before the fix str() of this 5000-digit int raised out of step()
    obs = env.step("<calculator>(10**100)**50</calculator>").observations
    assert obs[0]["content"].startswith("error:")


def test_a_calculator_result_too_long_to_print_is_error_text():
    # (10**100)**7 is under MAX_INT_BITS; with the lowest digit limit str() of it raises
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert calculator("(10**100)**7").startswith("error: Exceeds the limit")
    finally:
        sys.set_int_max_str_digits(limit)


def test_python_output_that_is_not_utf8_is_replaced():
    out = run_python("import sys; sys.stdout.buffer.write(b'ok \\xff\\n')")
    assert out == "ok \ufffd\n"


def test_python_cannot_read_the_callers_stdin():
    # pytest puts /dev/null on fd 0; stand in a pipe with data, as a piped trainer would have
    read_end, write_end = os.pipe()
    os.write(write_end, b"secret\n")
    os.close(write_end)
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        out = run_python("import sys; print(repr(sys.stdin.read()))")
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
    assert out.strip() == "''"


def test_python_output_is_capped_while_it_is_read():
    start = time.monotonic()
    out = run_python("while True: print('x' * 1000)", timeout_s=5.0)
    assert time.monotonic() - start < 2.0  # stopped at the cap, not at the timeout
    assert len(out) < 100_000 and "output cut at" in out


def test_a_setsid_grandchild_is_killed_when_the_call_returns():
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        "    for fd in (0, 1, 2): os.close(fd)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid)\n"
    )
    pid = int(run_python(code, timeout_s=5.0))
    assert _dies_within(pid, 1.0)


def test_a_background_child_holding_the_pipes_neither_stalls_nor_survives_the_call():
    code = "import subprocess; print(subprocess.Popen(['sleep', '60']).pid, flush=True)"
    start = time.monotonic()
    out = run_python(code, timeout_s=5.0)
    assert time.monotonic() - start < 2.0  # not held open until the timeout
    assert _dies_within(int(out), 1.0)


def test_a_timed_out_child_takes_its_process_group_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    code = (
        "import subprocess\n"
        "p = subprocess.Popen(['sleep', '60'], stdout=subprocess.DEVNULL)\n"
        f"with open({str(pid_file)!r}, 'w') as f: f.write(str(p.pid))\n"
        "while True: pass\n"
    )
    assert "timed out" in run_python(code, timeout_s=1.0)
    assert _dies_within(int(pid_file.read_text()), 1.0)


def test_the_calculator_is_exact():
    # it is declared to the model as exact, but computed in floats: 0.1 + 0.2 gave
    # 0.30000000000000004 and 4.35 * 100 gave 434.99999999999994, which grade as wrong
    assert calculator("0.1 + 0.2") == "0.3"
    assert calculator("1.1 * 3") == "3.3"
    assert calculator("4.35 * 100") == "435"
    assert calculator("19.99 * 3") == "59.97"
    assert calculator("123456789012345678 / 2") == "61728394506172839"  # float: ...840
    assert calculator("10**25 / 5") == "2" + "0" * 24
    assert calculator("1e308 * 10") == "1" + "0" * 309  # float: inf
    assert calculator("7 // 2.5") == "2" and calculator("7.5 % 2") == "1.5"
    assert calculator("-0.5 ** 2") == "-0.25"  # -(0.5 ** 2), as Python reads it
    # a decimal ending within 16 places is exact: 1/2**16 = 0.0000152587890625 (16 places)
    assert calculator("1 / 2**16") == "0.0000152587890625"
    assert calculator("1e-3 + 1") == "1.001"


def test_a_result_that_does_not_end_within_16_decimals_is_rounded_to_16_digits():
    # 1/3 and 2/3 never end; 2**-100 ends after 100 places: 16 significant digits, rounded
    # half to even, in a float's notation (as the calculator printed them before)
    assert calculator("1 / 3") == "0.3333333333333333"
    assert calculator("2 / 3") == "0.6666666666666667"  # float: ...666 (it rounds 2/3 down)
    assert calculator("10**20 / 3") == "3.333333333333333e+19"
    assert calculator("2.0 ** -100") == "7.888609052210118e-31"
    assert calculator("-1 / 7") == "-0.1428571428571429"
    # 3333333333333333.33..: 16 digits hold no decimal, and it is not shown as an integer
    assert calculator("10**16 / 3") == "3333333333333333.0"
    # a power that is not a whole number is a float, as before
    assert calculator("2 ** 0.5") == "1.4142135623730951" and calculator("4 ** 0.5") == "2"
    assert calculator("(-8) ** (1/3)") == "error: the result is not a real number"  # complex


def test_the_calculator_refuses_huge_decimal_literals_and_divides_by_zero_in_words():
    start = time.monotonic()
    assert calculator("1e100000000 + 1").startswith("error: ")
    assert calculator("1e-100000000 + 1").startswith("error: ")
    assert calculator("(0.5 ** 100) ** 100").startswith("error: ")
    assert time.monotonic() - start < 1.0
    assert calculator("1 / 0") == "error: division by zero"
    assert calculator("1.5 % 0") == "error: division by zero"
