"""``skyrl-eval`` stopped by SIGTERM (a scheduler's stop, ``timeout``, ``kill``) ends as Ctrl-C
does: its engines shut down, one line saying the eval in progress wrote no results, exit 143
(128 + SIGTERM 15), as ``skyrl-train`` ends on SIGTERM. Before: Python's default action, exit
143 with no line of its own; with its engines in Ray actors (``generator.num_cpus_per_engine=1``)
Ray's C++ stack banner, SIGABRT (exit 134), and the Ray agents it started outlived it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest


def eval_main(monkeypatch, argv: list[str]) -> int:
    """``skyrl.eval_cli.main()`` in this process; its exit code (the final ``os._exit`` is
    replaced by ``SystemExit``)."""
    from hydra.core.global_hydra import GlobalHydra

    import skyrl.cli
    from skyrl import eval_cli

    def exit_now(code: int):
        raise SystemExit(code)

    monkeypatch.setattr(skyrl.cli, "_exit_now", exit_now)
    monkeypatch.setattr(sys, "argv", ["skyrl-eval", *argv])
    try:
        with pytest.raises(SystemExit) as exited:
            eval_cli.main()
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(exited.value.code, int)
    return exited.value.code


def test_sigterm_during_the_eval_ends_it_in_one_line(tmp_path, monkeypatch, capfd):
    from skyrl import eval_cli

    before = signal.getsignal(signal.SIGTERM)
    reached: list[str] = []

    def generating(cfg, rows, tokenizer, samples_file):  # the eval pass, as the signal comes
        reached.append(cfg.model.path)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler interrupts the sleep
        raise AssertionError("SIGTERM did not stop the eval")

    monkeypatch.setattr(eval_cli, "_run_eval", generating)
    code = eval_main(monkeypatch, ["experiment=smoke", f"hydra.run.dir={tmp_path / 'e'}"])
    err = capfd.readouterr().err
    assert reached  # the signal came during the eval, past every check
    assert code == 143  # 128 + SIGTERM (15); before: the process was killed by it, no line
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "terminated (SIGTERM): the eval in progress wrote no results"
    )
    assert not (tmp_path / "e" / eval_cli.RESULTS_FILE).exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler back


def test_ctrl_c_keeps_its_line(monkeypatch, capfd, tmp_path):
    from skyrl import eval_cli

    def interrupted(cfg, rows, tokenizer, samples_file):
        raise KeyboardInterrupt

    monkeypatch.setattr(eval_cli, "_run_eval", interrupted)
    code = eval_main(monkeypatch, ["experiment=smoke", f"hydra.run.dir={tmp_path / 'e'}"])
    assert code == 130  # 128 + SIGINT (2)
    assert capfd.readouterr().err.strip().splitlines()[-1] == eval_cli.INTERRUPTED


KEEPS_HANDLER = """
import signal

import skyrl
from skyrl import api
from skyrl.config.validate import validate


def mine(signum, frame):
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, mine)
api.ray_for_engines(validate(skyrl.compose(["experiment=smoke", "generator.num_cpus_per_engine=1"])))
print("kept" if signal.getsignal(signal.SIGTERM) is mine else signal.getsignal(signal.SIGTERM))
"""


def test_the_engines_ray_keeps_the_callers_sigterm_handler(tmp_path):
    """``ray.init`` put Ray's handler in place of skyrl-eval's (and skyrl-serve's, while it
    starts): a SIGTERM once the engine actors were up aborted the process (exit 134) after
    Ray's stack banner. A fresh process: the suite's Ray is up already, and no ``ray.init``
    would run."""
    import subprocess

    import skyrl

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray
    env["PYTHONPATH"] = str(Path(skyrl.__file__).parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", KEEPS_HANDLER],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "kept"
