"""A run stopped by Ctrl-C or SIGTERM still prints the summary of the steps it finished and
writes their plot, before the interrupt goes on to the caller (the CLI's one line)."""

import json

import pytest

import skyrl.api as api
import skyrl.trainer.trainer as trainer_module
from skyrl.config.preflight import Preflight
from skyrl.tracking import metric_names as names


class StoppedInStep3:
    """Logs steps 1 and 2 to metrics.jsonl, then is interrupted; records shutdown."""

    shut_down = False

    def __init__(self, cfg, output_dir, prompts=None):
        self.output_dir = output_dir

    def train(self):
        with open(self.output_dir / "metrics.jsonl", "w") as f:
            for step, reward in ((1, 0.25), (2, 0.75)):
                f.write(json.dumps({"step": step, names.REWARD: reward}) + "\n")
        raise KeyboardInterrupt

    def shutdown(self):
        StoppedInStep3.shut_down = True


def test_a_run_stopped_by_ctrl_c_prints_the_summary_of_its_steps(tmp_path, monkeypatch, capsys):
    # before: no summary and no metrics.png; metrics.jsonl held both steps
    monkeypatch.setattr(trainer_module, "RLTrainer", StoppedInStep3)
    monkeypatch.setattr(api, "_ray_keeping_sigterm_handler", lambda cfg: None)
    cfg = api.validate(api.compose(["experiment=smoke"]))
    with pytest.raises(KeyboardInterrupt):
        api._run(Preflight(cfg, None, []), tmp_path)
    out = capsys.readouterr().out
    assert StoppedInStep3.shut_down
    assert out.startswith("stopped early; the steps it finished:\nsteps run: 2\n")
    # first vs last of 2 steps: 0.25 -> 0.75
    assert "training reward: first step 0.250 -> last step 0.750" in out
    assert (tmp_path / "metrics.png").is_file()


def test_an_interrupt_before_any_step_prints_no_summary(tmp_path, monkeypatch, capsys):
    class StoppedAtStart(StoppedInStep3):
        def train(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "RLTrainer", StoppedAtStart)
    monkeypatch.setattr(api, "_ray_keeping_sigterm_handler", lambda cfg: None)
    cfg = api.validate(api.compose(["experiment=smoke"]))
    with pytest.raises(KeyboardInterrupt):
        api._run(Preflight(cfg, None, []), tmp_path)
    assert capsys.readouterr().out == ""
    assert not (tmp_path / "metrics.png").exists()
