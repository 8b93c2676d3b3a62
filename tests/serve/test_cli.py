"""``skyrl-serve``'s answers to a user's mistakes (a subprocess each, the real entry point):
one ``error:`` line naming the key, exit 2, before any engine loads; and Ctrl-C or SIGTERM
while the server starts: one line, exit 128 + the signal, no traceback."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from added_tokens import tokenizer_with_added_tokens

SKYRL_SERVE = str(Path(sys.executable).parent / "skyrl-serve")


def serve(run: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SKYRL_SERVE, "model.path=skyrl-tiny", "generator=hf", f"hydra.run.dir={run}", *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=run,
    )  # fmt: skip


def last_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


def test_a_port_out_of_range_is_refused(tmp_path):
    # before: the port wrapped around (70000 - 65536 = 4464) and the server listened there
    line = last_line(serve(tmp_path, "serve.port=70000"))
    assert line == "error: serve.port: must be 0..65535 (0: any free port), got 70000"


def test_a_port_in_use_is_found_before_the_engine_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(tmp_path, f"serve.port={port}")
    line = last_line(result)
    assert line == f"error: serve.port: 127.0.0.1:{port} is already in use"
    assert "Loading weights" not in result.stderr  # the engine never started
    assert "ERROR:" not in result.stderr  # nor uvicorn's own log line


def test_an_unknown_tool_parser_is_refused_before_the_engine_loads(tmp_path):
    # before: it served, and every request declaring tools got a 500
    result = serve(tmp_path, "generator.tool_parser=hermez", "serve.port=0")
    line = last_line(result)
    assert line.startswith(
        "error: generator.tool_parser: unknown tool parser 'hermez' (did you mean 'hermes'?)"
    ), line
    assert "Loading weights" not in result.stderr


def test_a_host_that_is_no_address_names_serve_host(tmp_path):
    # before: "error: serve.port: the endpoint could not listen on 999.1.1.1:8000 (3)"
    line = last_line(serve(tmp_path, "serve.host=999.1.1.1", "serve.port=0"))
    assert line.startswith("error: serve.host: cannot listen on 999.1.1.1: "), line


def test_an_empty_host_is_refused(tmp_path):
    # before: it listened on every interface and printed the base URL http://:8000/v1
    line = last_line(serve(tmp_path, "serve.host=", "serve.port=0"))
    assert line == "error: serve.host: empty (0.0.0.0 listens on every interface)"


@pytest.mark.parametrize("name", ["", "'  '"])
def test_an_empty_model_name_is_refused(tmp_path, name):
    # before: the server started and served the model as model.path ("skyrl-tiny")
    line = last_line(serve(tmp_path, f"serve.model_name={name}", "serve.port=0"))
    assert line == (
        "error: serve.model_name: is empty; leave it unset (null) to serve the model as model.path"
    )


def test_a_folder_without_a_tokenizer_names_model_path(tmp_path):
    # the user set model.path only: the line must not blame model.tokenizer_path
    empty = tmp_path / "empty"
    empty.mkdir()
    line = last_line(serve(tmp_path, f"model.path={empty}"))
    assert line.startswith(f"error: model.path: cannot load a tokenizer from {empty}: "), line
    # transformers' message runs over several lines, the first ending "from one of:": the line
    # goes on to the end of that sentence (it used to stop at the colon)
    assert line.endswith("to instantiate and convert."), line


def test_a_folder_without_a_model_config_names_model_path(tmp_path, tiny_model_path):
    # before: a transformers traceback ("Unrecognized model in ...") after the tokenizer loaded
    folder = tmp_path / "tokenizer_only"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model_path) / name, folder / name)
    line = last_line(serve(tmp_path, f"model.path={folder}"))
    assert line.startswith(f"error: model.path: {folder} is not a model folder: "), line


def test_a_tokenizer_larger_than_the_models_vocab_is_refused_before_the_engine_loads(tmp_path):
    # the pre-flight's check, as skyrl-train makes it: 2 tokens added to the tiny model's
    # tokenizer give ids vocab_size and vocab_size + 1, which have no embedding row (the
    # engine failed on the first request holding one)
    folder, vocab_size = tokenizer_with_added_tokens(tmp_path, 2)
    line = last_line(serve(tmp_path, f"model.tokenizer_path={folder}"))
    assert line == (
        f"error: model.tokenizer_path: the tokenizer (model.tokenizer_path) has "
        f"{vocab_size + 2} tokens, added ones included, but model.path's vocab_size is "
        f"{vocab_size}: ids {vocab_size} to {vocab_size + 1} have no embedding row"
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_starting_is_one_line(tmp_path, signum):
    # before: Ctrl-C printed a KeyboardInterrupt traceback (exit -2); SIGTERM killed it silently
    marker = tmp_path / "engine_started"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "SKYRL_SLOW_ENGINE_MARKER": str(marker),
    }
    proc = subprocess.Popen(
        [SKYRL_SERVE, "model.path=skyrl-tiny", "generator=hf", "serve.port=0", f"hydra.run.dir={tmp_path}",
         "imports=[slow_backend]", "generator.backend=slow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the slow engine never started"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)  # the slow engine would take 60 s
    finally:
        proc.kill()  # a no-op once it has ended
    what = "interrupted" if signum == signal.SIGINT else "terminated (SIGTERM)"
    assert proc.returncode == 128 + signum, err[-2000:]  # 130 for SIGINT, 143 for SIGTERM
    assert "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == f"skyrl-serve: {what} while starting; nothing was served"


def test_an_option_before_the_overrides_is_honoured(tmp_path):
    # before: "skyrl-serve: error: unrecognized arguments: model.path=skyrl-tiny ..." (the
    # run-dir override went in front of --cfg and split the overrides in two)
    result = subprocess.run(
        [SKYRL_SERVE, "--cfg", "job", "model.path=skyrl-tiny", "serve.port=8123"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "serve:\n  host: 127.0.0.1\n  port: 8123\n" in result.stdout


def test_help_says_what_skyrl_serve_does_and_starts_nothing(tmp_path):
    result = serve(tmp_path, "serve.port=0", "--help")  # with overrides given too: help only
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: skyrl-serve [GROUP=OPTION ...] [KEY=VALUE ...]\n")
    assert "OpenAI-compatible endpoint" in result.stdout and "_schema" not in result.stdout
    assert not list(tmp_path.iterdir())  # nothing composed: no run directory written
