"""``skyrl.compose`` given a researcher's mistakes in a notebook: one ``ConfigError`` naming
the key (as ``skyrl-train``'s ``error:`` line does), not Hydra's advice for a command line;
the caller's own Hydra left as it was; and ``skyrl.train``'s output dir under ``~``."""

from __future__ import annotations

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import skyrl
from skyrl.config.errors import ConfigError


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.trian_batch_size=1"],
        {"trainer.trian_batch_size": 1},
        {"trainer": {"trian_batch_size": 1}},  # merged into its node
    ],
)
def test_an_unknown_key_names_it_and_the_near_key(overrides):
    # before: Hydra's "Could not override 'trainer.trian_batch_size'. To append to your config
    # use +trainer.trian_batch_size=1", advice that validate then refuses as an unknown key
    with pytest.raises(ConfigError) as err:
        skyrl.compose(overrides)
    assert str(err.value) == (
        "trainer.trian_batch_size: unknown key (did you mean 'train_batch_size'?)"
    )


def test_a_wrong_type_and_an_unknown_option_name_their_key():
    with pytest.raises(ConfigError) as err:
        skyrl.compose(["trainer.train_batch_size=abc"])
    assert (err.value.key, err.value.message) == (
        "trainer.train_batch_size",
        "Value 'abc' of type 'str' could not be converted to Integer",
    )
    with pytest.raises(ConfigError) as err:
        skyrl.compose({"algorithm": "rlo"})
    assert err.value.key == "algorithm=rlo"
    assert err.value.message.startswith(
        "no such option in group 'algorithm' (did you mean 'rloo'?)"
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # before: "mismatched input '<EOF>' expecting {...}", the override named nowhere
        ("trainer.policy_optimizer.lr=1e-5,", "mismatched input '<EOF>' expecting"),
        ("experiment", "missing EQUAL at '<EOF>'"),
        # "trainer.total_steps" is 19 characters: the space is the 20th
        ("trainer.total_steps = 3", "unexpected ' ' at character 20"),
    ],
)
def test_an_override_that_does_not_parse_is_named(line, reason):
    with pytest.raises(ConfigError) as err:
        skyrl.compose(["experiment=smoke", line])
    assert err.value.key == line
    assert err.value.message.startswith(f"cannot parse this override: {reason}")


def test_a_sweep_value_says_compose_makes_one_config():
    # before: "Ambiguous value ... 3. To sweep over it, add --multirun to your command line"
    with pytest.raises(ConfigError) as err:
        skyrl.compose(["experiment=smoke", "trainer.seed=1,2"])
    one_config = (
        "is a sweep, and skyrl.compose makes one config: compose one value at a time "
        "(skyrl-train -m runs sweeps)"
    )
    assert str(err.value) == (
        f"trainer.seed: '1,2' {one_config}, or write a list as [1,2] or a string as '1,2'"
    )
    with pytest.raises(ConfigError) as err:  # no list or string was meant here
        skyrl.compose(["experiment=smoke", "trainer.seed=range(1,3)"])
    assert str(err.value) == f"trainer.seed: 'range(1,3)' {one_config}"


@pytest.mark.parametrize(("overrides", "what"), [([3], "an int: 3"), (None, "None")])
def test_an_override_that_is_no_string_is_named(overrides, what):
    # before: TypeError: 'int' object is not iterable (from inside Hydra)
    with pytest.raises(TypeError) as err:
        skyrl.compose(overrides)
    assert str(err.value).startswith("skyrl.compose takes a list of 'key=value' override strings")
    assert str(err.value).endswith(what)


def test_the_callers_own_hydra_is_left_initialized(tmp_path):
    """A notebook that uses ``hydra.initialize_config_dir`` for its own configs: before,
    ``skyrl.compose`` cleared it and its next ``hydra.compose`` failed ("GlobalHydra is not
    initialized")."""
    (tmp_path / "mine.yaml").write_text("lr: 0.5\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        skyrl.compose(["experiment=smoke"])
        with pytest.raises(ConfigError):  # an error inside compose restores it too
            skyrl.compose(["trainer.nokey=1"])
        assert hydra_compose("mine").lr == 0.5
    assert not GlobalHydra.instance().is_initialized()
    assert skyrl.compose(["trainer.seed=3"]).trainer.seed == 3  # and compose still works


@pytest.mark.parametrize("how", ["trainer.output_dir", "output_dir"])
def test_an_output_dir_under_home_is_expanded(tmp_path, monkeypatch, how):
    """``~/runs/a`` is the home's ``runs/a``, as ``trainer.resume`` and ``eval.checkpoint``
    read it; before, the run went to a folder named ``~`` in the working directory, where
    ``trainer.resume=~/runs/a`` and ``skyrl-eval eval.checkpoint=~/runs/a`` never looked."""
    from skyrl.models.smollm2 import cache_root

    monkeypatch.setenv("SKYRL_CACHE_DIR", str(cache_root()))  # the tiny model, built already
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    overrides = {"experiment": "smoke", "trainer.dry_run": True}
    if how == "output_dir":
        result = skyrl.train(skyrl.compose(overrides), output_dir="~/runs/a")
    else:  # quoted: Hydra's grammar refuses an unquoted ~ (trainer.output_dir='~/runs/a')
        result = skyrl.train(skyrl.compose({**overrides, "trainer.output_dir": "~/runs/a"}))
    assert result.output_dir == home / "runs" / "a"
    assert (home / "runs" / "a" / "resolved_config.yaml").exists()
    assert not (work / "~").exists()
