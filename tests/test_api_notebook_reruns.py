"""``skyrl.compose`` and ``skyrl.train`` as a notebook drives them: values straight from
numpy or pandas, a config group set to None, a second run in the same kernel, and a
relative run dir after the kernel changed its working directory."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import skyrl
from skyrl import api
from skyrl.config.errors import ConfigError


def test_numpy_bools_and_arrays_compose_as_their_python_values():
    # before: "trainer.dry_run is a bool; a mapping's values are None, bool, ..." (np.bool_'s
    # type name is bool in numpy 2), and an array was refused the same way
    flags = np.array([True, False])
    cfg = skyrl.compose(
        {"trainer.dry_run": flags[0], "trainer.policy_optimizer.betas": np.array([0.8, 0.9])}
    )
    assert cfg.trainer.dry_run is True
    assert list(cfg.trainer.policy_optimizer.betas) == [0.8, 0.9]


def test_bytes_are_refused_naming_the_key():
    # before: b"ab" became the list [97, 98], refused as "Cannot convert 'list' to string"
    with pytest.raises(TypeError) as err:
        skyrl.compose({"trainer.output_dir": b"ab"})
    assert str(err.value).startswith("skyrl.compose: trainer.output_dir is a bytes; ")


@pytest.mark.parametrize(
    ("overrides", "key", "got"),
    [
        ({"experiment": None}, "experiment", "None"),
        (["algorithm=null"], "algorithm", "None"),
        ({"algorithm": 3}, "algorithm", "the int 3"),
    ],
)
def test_a_config_group_set_to_no_option_name_is_named(overrides, key, got):
    # before: Hydra's ValueError "Config group override must be a string or a list. Got
    # NoneType", with its traceback, naming no key
    with pytest.raises(ConfigError) as err:
        skyrl.compose(overrides)
    assert err.value.key == key
    assert err.value.message.startswith("is a config group: its value names one of its options")
    assert err.value.message.endswith(f"got {got}")


def test_the_group_message_lists_the_options():
    with pytest.raises(ConfigError) as err:
        skyrl.compose({"algorithm": None})
    # skyrl/conf/algorithm/*.yaml
    options = "cispo, dapo, dr_grpo, grpo, gspo, ppo, reinforce_pp, rloo"
    assert str(err.value) == (
        f"algorithm: is a config group: its value names one of its options ({options}); got None"
    )


def test_a_second_run_in_the_kernel_shows_its_warnings_again(tmp_path, monkeypatch):
    """Python shows a warning once per text and place: a notebook's second run of the same
    config hid the warnings (dynamic sampling's, say) that its first run had shown."""
    from skyrl.rollouts.sync import filled_batch

    def run(checked, out):  # a step whose dynamic sampling ran out of rounds
        filled_batch(good=[], flat=["a"], need=1, num_rounds=4, step=1)
        return api.TrainResult(out)

    monkeypatch.setattr(api, "_run", run)
    from skyrl.models.smollm2 import cache_root

    monkeypatch.setenv("SKYRL_CACHE_DIR", str(cache_root()))  # the tiny model, built already
    # a files source: a generated one's pre-flight changes the warning filters itself, and
    # that resets Python's record of the warnings shown as a side effect
    rows = "".join(
        json.dumps({"prompt": f"{n} + 1 =", "answer": str(n + 1)}) + "\n" for n in range(8)
    )
    (tmp_path / "train.jsonl").write_text(rows)
    cfg = skyrl.compose(
        {
            "experiment": "smoke",
            "data.source": "files",
            "data.train_files": [str(tmp_path / "train.jsonl")],
            "data.num_eval_prompts": 0,
        }
    )
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # Python's own: once per text and place
        skyrl.train(cfg, tmp_path / "a")
        skyrl.train(cfg, tmp_path / "b")
    message = (
        "step 1: dynamic sampling: 0 informative groups after 4 rounds "
        "(algorithm.max_sample_batches); topped up with 1 flat groups"
    )
    assert [str(w.message) for w in shown] == [message, message]


@pytest.mark.parametrize("how", ["trainer.output_dir", "output_dir"])
def test_a_relative_output_dir_is_made_absolute(tmp_path, monkeypatch, how):
    """Ray's actors keep the working directory Ray started in: after a notebook's
    ``os.chdir`` (``%cd``), a relative run dir sent the workers' checkpoints and ``final_hf``
    to the old directory while the driver wrote the metrics and looked for them in the new."""
    from skyrl.models.smollm2 import cache_root

    monkeypatch.setenv("SKYRL_CACHE_DIR", str(cache_root()))  # the tiny model, built already
    monkeypatch.chdir(tmp_path)
    seen = []
    monkeypatch.setattr(api, "_run", lambda checked, out: seen.append(out) or api.TrainResult(out))
    overrides = {"experiment": "smoke"}
    if how == "output_dir":
        result = skyrl.train(skyrl.compose(overrides), output_dir="runs/a")
    else:
        result = skyrl.train(skyrl.compose({**overrides, "trainer.output_dir": "runs/a"}))
    assert seen == [tmp_path / "runs" / "a"]  # what the trainer and its workers are given
    assert result.output_dir == tmp_path / "runs" / "a"
