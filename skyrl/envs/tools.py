"""Tools the multi-turn tool env offers: a calculator and a sandboxed Python subprocess.

The Python sandbox is a best effort, not a security boundary: a fresh
interpreter in isolated mode (``-I``) in a temporary working directory, with
a CPU-time and address-space limit (``resource``), a wall-clock timeout, an
empty environment, and ``socket`` replaced so that opening a connection
raises (no network).
"""

from __future__ import annotations

import ast
import operator
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

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


def calculator(expression: str) -> str:
    """Evaluate + - * / // % ** on numbers; errors come back as text."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            right = ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](ev(node.left), right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:60]}")

    try:
        value = ev(ast.parse(expression.strip(), mode="eval").body)
    except Exception as exc:  # the model sees the error and may retry
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


_PRELUDE = """
import socket as _s
def _no_net(*a, **k):
    raise OSError("network disabled in the python tool")
_s.socket = _no_net
_s.create_connection = _no_net
del _s, _no_net
"""


def _limits(memory_bytes: int, cpu_s: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))

    return apply


def run_python(code: str, timeout_s: float = 5.0, memory_bytes: int = 512 << 20) -> str:
    """Run ``code`` in a sandboxed subprocess; return stdout + stderr (or a timeout note)."""
    with tempfile.TemporaryDirectory(prefix="skyrl-py-") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _PRELUDE + code],
                cwd=cwd,
                env={"PATH": os.defpath, "HOME": cwd},
                capture_output=True,
                text=True,
                timeout=timeout_s,
                preexec_fn=_limits(memory_bytes, int(timeout_s) + 1),
            )
        except subprocess.TimeoutExpired:
            return f"error: timed out after {timeout_s} s"
    out = proc.stdout + proc.stderr
    return out if out else f"(no output, exit code {proc.returncode})"
