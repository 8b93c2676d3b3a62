"""An env whose ``close`` fails is logged once per distinct failure, on one line: each
trajectory logged ``env.close failed`` with a 16-line traceback (a few thousand lines a step
at 256 trajectories), where a failing ``init`` or ``step`` is one warning line in all."""

import logging
import time

from agent_loop_helpers import FakeEngine, make

from skyrl.data.prompts import PromptRow
from skyrl.envs.base import StepResult, TextEnv
from skyrl.inference.base import SamplingParams

ROWS = [PromptRow(f"q{i}", "s", {}, uid=f"u{i}") for i in range(4)]


class BadClose(TextEnv):
    def step(self, action_text):
        if self.extras.get("slow_step"):
            time.sleep(0.6)  # past the 0.3 s limit: closed on the step's thread afterwards
        return StepResult([], 1.0, True)

    def close(self):
        raise RuntimeError("sandbox already closed")


class SlowClose(TextEnv):
    def step(self, action_text):
        return StepResult([], 1.0, True)

    def close(self):
        time.sleep(0.6)


def loop_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "skyrl.generators.agent_loop"]


def test_a_close_that_raises_is_one_line_for_the_whole_run(tok, caplog):
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), BadClose, False).generate(ROWS, 2, SamplingParams())
    assert out.rewards == [1.0] * 8  # the trajectories were done: a close changes no reward
    records = loop_records(caplog)
    assert [r.getMessage() for r in records] == [
        "BadClose.close: raised RuntimeError: sandbox already closed"
    ]
    assert records[0].exc_info is None and records[0].levelno == logging.WARNING


def test_a_close_past_the_time_limit_is_one_line(tok, caplog):
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        make(tok, FakeEngine(tok), SlowClose, False, timeout=0.3).generate(
            ROWS[:2], 1, SamplingParams()
        )
    assert [r.getMessage() for r in loop_records(caplog)] == [
        "SlowClose.close: ran past environment.timeout_s=0.3"
    ]


def test_a_close_run_after_a_hung_step_is_logged_the_same_way(tok, caplog):
    rows = [PromptRow("q", "s", {"slow_step": True}, uid=f"h{i}") for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="skyrl.generators.agent_loop"):
        out = make(tok, FakeEngine(tok), BadClose, False, timeout=0.3).generate(
            rows, 1, SamplingParams()
        )
        assert out.stop_reasons == ["env_error", "env_error"]
        deadline = time.monotonic() + 10
        while "BadClose.close" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)  # the steps return after 0.6 s, then their envs close
        time.sleep(0.3)  # the second close, if it were logged again
    closes = [r for r in loop_records(caplog) if "close" in r.getMessage()]
    assert [r.getMessage() for r in closes] == [
        "BadClose.close: raised RuntimeError: sandbox already closed"
    ]
    assert closes[0].exc_info is None
