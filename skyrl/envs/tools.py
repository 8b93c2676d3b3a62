"""Tools the multi-turn tool env offers: a calculator and a sandboxed Python subprocess.

The calculator computes exactly, in fractions (``0.1 + 0.2`` is ``0.3``, not a float's
``0.30000000000000004``); a result that is not an integer prints exactly when its decimal
ends within ``MAX_DECIMALS`` places, else rounded to that many significant digits. It runs
in-process, so it refuses numbers past ``MAX_INT_BITS`` before computing them: one huge
power would hold the GIL for minutes, and no timeout around the call can interrupt it.

The Python sandbox is a best effort, not a security boundary: a fresh
interpreter in isolated mode (``-I``) in a temporary working directory, with
a CPU-time and address-space limit (``resource``), a wall-clock timeout, an
empty environment, no stdin, and ``socket`` replaced so that opening a
connection raises (no network). Its output is read up to a byte cap, and when
the call returns every process it started is killed: its process group, and
on Linux any process that left the group (``setsid``) but still carries the
call's tag in its environment. ``RLIMIT_NPROC`` is not used: it counts every
process and thread of the user (the trainer's included) and root ignores it.
"""

from __future__ import annotations

import ast
import contextlib
import math
import operator
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Any

Number = Fraction | float
"""A calculator value: exact, or a float from a power whose exponent is not a whole number."""

_OPS: dict[type[ast.operator | ast.unaryop], Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


MAX_INT_BITS = 10_000
"""Largest integer the calculator builds, as a result or as a fraction's numerator or
denominator (about 3,000 digits)."""
MAX_DECIMALS = 16
"""A result that is not an integer prints exactly when its decimal ends within this many
places (``0.3``, ``59.97``); otherwise rounded to this many significant digits, in a float's
notation (``1/3``: ``0.3333333333333333``; ``2**-100``: ``7.888609052210118e-31``; never
shown as an integer: ``10**16/3`` is ``3333333333333333.0``)."""
_LOG2_10 = math.log2(10)


def _check_bits(numerator_bits: float, denominator_bits: float = 0.0) -> None:
    """Refuse a result whose numerator or denominator is past ``MAX_INT_BITS``, saying which:
    a denominator that big is a tiny or too precise result (``10**-5000``), not a large one."""
    if denominator_bits > MAX_INT_BITS:
        raise ValueError(
            f"result too small or too precise (its denominator is over {MAX_INT_BITS} bits)"
        )
    if numerator_bits > MAX_INT_BITS:
        raise ValueError(f"result too large (over {MAX_INT_BITS} bits)")


def _log2(n: int) -> float:
    return math.log2(n) if n else 0.0


def _literal(node: ast.Constant, source: str) -> Fraction:
    """A number as written: ``0.1`` is 1/10, not the float nearest it. A decimal's exponent
    is bounded before its power of ten is built (``1e100000000``), one past what ``Decimal``
    holds (19 digits and more) too; zero is zero whatever its exponent (``0e20000``)."""
    if isinstance(node.value, int):
        _check_bits(node.value.bit_length())  # hex literals have no digit limit
        return Fraction(node.value)
    text = ast.get_source_segment(source, node) or repr(node.value)
    if not Decimal(re.split("[eE]", text)[0]):
        return Fraction(0)
    try:
        written = Decimal(text)
    except InvalidOperation:  # its message is "[<class 'decimal.InvalidOperation'>]"
        if "e-" in text.lower():
            _check_bits(0, math.inf)
        _check_bits(math.inf)
        raise
    _, digits, exponent = written.as_tuple()
    assert isinstance(exponent, int)  # a literal is finite
    _check_bits(  # the numerator, and the denominator: a power of ten
        (len(digits) + max(exponent, 0)) * _LOG2_10, -min(exponent, 0) * _LOG2_10
    )
    return Fraction(written)


def _apply(op: ast.operator, left: Number, right: Number) -> Number:
    """``left op right``, refusing a power past ``MAX_INT_BITS`` before computing it."""
    if isinstance(op, ast.Pow):  # a float result overflows, raising, instead of growing
        if isinstance(left, Fraction) and isinstance(right, Fraction) and right.denominator == 1:
            # (p/q)**n has |n| log2 p bits above the line and |n| log2 q below (swapped for n < 0)
            n = right.numerator
            top, bottom = abs(left.numerator), left.denominator
            if n < 0:
                top, bottom = bottom, top
            _check_bits(abs(n) * _log2(top), abs(n) * _log2(bottom))
    value = _OPS[type(op)](left, right)  # a non-integer power of a Fraction is a float
    if isinstance(value, complex):  # (-8) ** (1/3)
        raise ValueError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):  # * and / overflow to inf
        raise OverflowError
    if isinstance(value, int):  # // of Fractions is an int
        value = Fraction(value)
    if isinstance(value, Fraction):  # + - * / build at most twice their operands' bits
        _check_bits(value.numerator.bit_length(), value.denominator.bit_length())
    return value


def _format(value: Number) -> str:
    """An integer in full; else see ``MAX_DECIMALS``; a float (inexact) as Python prints it,
    but a whole one below ``2**53`` (past it, its whole numbers are spaced more than 1 apart)
    without its ``.0``."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else str(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    places = _decimal_places(value.denominator)
    if places is not None:
        digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
        return f"{sign}{digits[:-places]}.{digits[-places:]}"
    with localcontext() as context:  # (its keyword arguments are Python 3.11+)
        context.prec, context.rounding = MAX_DECIMALS, ROUND_HALF_EVEN
        rounded = (Decimal(abs(value.numerator)) / value.denominator).normalize()
    exponent = rounded.adjusted()
    if -4 <= exponent < MAX_DECIMALS:
        text = format(rounded, "f")
        return sign + (text if "." in text else f"{text}.0")  # not an integer: never shown as one
    digits = "".join(map(str, rounded.as_tuple().digits))
    mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{exponent:+03d}"


def _decimal_places(denominator: int) -> int | None:
    """The places a fraction of this (reduced) denominator takes as a decimal, if it ends
    within ``MAX_DECIMALS`` (the denominator is 2^a 5^b: max(a, b) places); else None."""
    twos = (denominator & -denominator).bit_length() - 1
    rest, fives = denominator >> twos, 0
    while rest % 5 == 0 and fives <= MAX_DECIMALS:
        rest, fives = rest // 5, fives + 1
    places = max(twos, fives)
    return places if rest == 1 and places <= MAX_DECIMALS else None


_TAKES = "the calculator takes numbers, + - * / // % ** and ( )"
_DIGIT_LIMIT = "integer string conversion"
"""In the parser's error for an integer literal past Python's digit limit (4,300 by default:
past ``MAX_INT_BITS`` too)."""


def _unsupported(node: ast.AST, source: str) -> str:
    """What the calculator cannot evaluate, as written (not as an AST dump), and what it can."""
    written = ast.get_source_segment(source, node) or ast.unparse(node)
    if len(written) > 60:
        written = written[:57] + "..."
    hint = (
        " (^ is not a power: write **)" if isinstance(getattr(node, "op", None), ast.BitXor) else ""
    )
    return f"unsupported: {written}{hint}; {_TAKES}"


def calculator(expression: str) -> str:
    """Evaluate + - * / // % ** on numbers, exactly (fractions; a power whose exponent is not
    a whole number is a float); errors come back as text. How results print: ``MAX_DECIMALS``.
    ``True`` and ``False`` are names, refused as ``None`` is, not the numbers 1 and 0."""
    source = expression.strip()
    if not source:  # ast's own message: "invalid syntax (<unknown>, line 0)"
        return f"error: the call is empty; {_TAKES}"

    def ev(node) -> Number:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not a bool
            return _literal(node, source)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _apply(node.op, ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(_unsupported(node, source))

    try:  # the model sees the error and may retry
        return _format(ev(ast.parse(source, mode="eval").body))
    except ZeroDivisionError:  # Fraction's own message is "Fraction(1, 0)"
        return "error: division by zero"
    except OverflowError:  # a float power: its own message is "(34, 'Numerical result ...')"
        return "error: result too large for a float"
    except (RecursionError, MemoryError):  # the parser's depth limit: a MemoryError, no message
        return "error: the expression is nested too deeply; split it into several calls"
    except SyntaxError as exc:
        if _DIGIT_LIMIT in str(exc):  # Python's advice (sys.set_int_max_str_digits) is not ours
            return f"error: result too large (over {sys.get_int_max_str_digits()} digits)"
        return f"error: {exc}"
    except Exception as exc:
        return f"error: {exc}"


_PRELUDE = """
import socket as _s
def _no_net(*a, **k):
    raise OSError("network disabled in the python tool")
_s.socket = _no_net
_s.create_connection = _no_net
def _hook(kind, value, tb):  # print the traceback without the prelude's own frame
    import sys
    tb = tb and tb.tb_next
    sys.__excepthook__(kind, value.with_traceback(tb), tb)
__import__("sys").excepthook = _hook
del _s, _no_net, _hook
exec(compile(__import__("sys").argv.pop(), "<string>", "exec"))
"""
"""Run before the call's code, which it compiles on its own (passed as the last argument), so
that a traceback's line numbers are those of the code the model wrote."""


def _limits(memory_bytes: int, cpu_s: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))

    return apply


MAX_CODE_BYTES = (128 << 10) - 1
"""Longest code the python tool runs, in UTF-8 bytes: it is passed as one command-line
argument, and Linux refuses one longer than 32 pages of 4 KiB, its NUL included
(``MAX_ARG_STRLEN``)."""

_TAG = "SKYRL_PY_TOOL_CALL"
"""Environment variable naming each call, to find its processes that left the process group."""


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_bytes: int = 512 << 20,
    max_output_bytes: int = 64 << 10,
) -> str:
    """Run ``code`` in a sandboxed subprocess; return stdout + stderr (or a timeout note).

    Output past ``max_output_bytes`` is not read: the child is stopped there and a note
    says where it was cut. Bytes that are not UTF-8 come back as U+FFFD. Code that cannot be
    passed to the child (a NUL byte, a lone surrogate, over ``MAX_CODE_BYTES``) comes back as
    an error the model can act on, instead of raising out of the call (an env error).
    """
    problem = _code_problem(code)
    if problem is not None:
        return f"error: {problem}"
    token = secrets.token_hex(8)
    with (
        tempfile.TemporaryDirectory(prefix="skyrl-py-") as cwd,
        subprocess.Popen(
            [sys.executable, "-I", "-c", _PRELUDE, code],
            cwd=cwd,
            env={"PATH": os.defpath, "HOME": cwd, _TAG: token},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as a whole
            preexec_fn=_limits(memory_bytes, int(timeout_s) + 1),
        ) as proc,
    ):
        try:
            out, err, ending = _read_capped(proc, token, timeout_s, max_output_bytes)
        finally:
            _kill_all(proc.pid, token)
    if ending == "timeout":
        return f"error: timed out after {round(timeout_s, 2):g} s"
    text = _decode(out) + _decode(err)
    if ending == "cut":
        text += f"\n...[output cut at {max_output_bytes} bytes]"
    return text if text else f"(no output, exit code {proc.returncode})"


def _code_problem(code: str) -> str | None:
    """Why ``code`` cannot be the child's command-line argument (None: it can)."""
    if "\x00" in code:  # Python's own message for it (the calculator's too)
        return "source code string cannot contain null bytes"
    try:
        num_bytes = len(code.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"the code is not valid text: a lone surrogate at index {exc.start}"
    if num_bytes > MAX_CODE_BYTES:
        return f"the code is {num_bytes} bytes long; the python tool takes up to {MAX_CODE_BYTES}"
    return None


def _read_capped(
    proc: subprocess.Popen, token: str, timeout_s: float, max_bytes: int
) -> tuple[bytes, bytes, str]:
    """Read the child's stdout and stderr until both close, ``max_bytes`` in all, or the timeout.

    Returns both and how reading ended: ``"eof"``, ``"cut"`` or ``"timeout"``. Once the
    child exits, what it left running is killed, so that a background process holding the
    pipes open does not keep the call waiting.
    """
    assert proc.stdout is not None and proc.stderr is not None  # both piped by run_python
    deadline = time.monotonic() + timeout_s
    stdout, stderr = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {stdout: bytearray(), stderr: bytearray()}
    exited = timed_out = False
    num_bytes = 0
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = not exited
                break
            for key, _ in sel.select(min(left, 0.1)):
                chunk = os.read(key.fd, min(1 << 16, max_bytes + 1 - num_bytes))
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                bufs[key.fd] += chunk
                num_bytes += len(chunk)
                if num_bytes > max_bytes:  # one byte past the cap: there was more
                    del bufs[key.fd][-1]
                    return bytes(bufs[stdout]), bytes(bufs[stderr]), "cut"
            if not exited and proc.poll() is not None:
                # reaped, but its group id stays reserved while any member lives
                exited = True
                _kill_all(proc.pid, token)
                deadline = min(deadline, time.monotonic() + 0.5)  # for a holder we missed
    return bytes(bufs[stdout]), bytes(bufs[stderr]), "timeout" if timed_out else "eof"


def _decode(data: bytes) -> str:
    # as ``text=True`` would, but never raising on bytes that are not UTF-8
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


def _kill_all(pgid: int, token: str) -> None:
    """SIGKILL the call's process group, then every process still tagged with ``token``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if not os.path.isdir("/proc"):
        return  # not Linux: the process group is all we can find
    entry = f"{_TAG}={token}".encode()
    killed: set[int] = set()
    for _ in range(20):  # again until a pass finds none: one may fork while a pass runs
        found = set()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in killed:
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if entry in f.read().split(b"\0"):
                        os.kill(int(name), signal.SIGKILL)
                        found.add(int(name))
            except OSError:  # gone, or not ours to read
                continue
        if not found:
            return
        killed |= found
