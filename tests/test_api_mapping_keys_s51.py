"""``skyrl.compose`` with a mapping whose own keys hold characters of Hydra's override grammar
(``environment.kwargs``, a free-form mapping): each key reads back as itself, or is refused
naming it. Before: keys went into the override bare, and ``{"http://host:8000": 1}`` composed
as ``{"http": "//host:8000:1"}``, ``{" lead": 1}`` as ``{"lead": 1}``, without a word; a key
Hydra cannot read (``é``) was "cannot parse this override" about an override the user never
wrote."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import skyrl
from skyrl.config.errors import ConfigError


def kwargs_of(mapping: dict) -> dict:
    cfg = skyrl.compose({"experiment": "smoke", "+environment.kwargs": mapping})
    return OmegaConf.to_container(cfg.environment.kwargs, resolve=False)


@pytest.mark.parametrize(
    "key",
    ["http://host:8000", "x:y", " lead", "trail ", "a=b", "a,b", "a[0]", "a{b}", "(x)",
     "tab\there", "a\\:b", "${x}", "a b"],
)  # fmt: skip
def test_a_mapping_key_reads_back_as_itself(key):
    assert kwargs_of({key: 1}) == {key: 1}


def test_nested_mapping_keys_read_back_too():
    assert kwargs_of({"a:b": {"c d": [1, {"e=f": "g"}]}}) == {"a:b": {"c d": [1, {"e=f": "g"}]}}


@pytest.mark.parametrize(
    ("key", "reads_as"),
    [("1", "the int 1"), ("true", "the bool True"), ("null", "None")],
)
def test_a_key_hydra_reads_as_another_value_is_refused_naming_it(key, reads_as):
    with pytest.raises(ConfigError) as err:
        kwargs_of({key: 1})
    assert err.value.key == "+environment.kwargs"
    assert err.value.message == (
        f"the mapping key {key!r} cannot be written in a Hydra override: it reads back as "
        f"{reads_as}; rename it"
    )


@pytest.mark.parametrize("key", ["é", "a'b", ""])
def test_a_key_hydra_cannot_read_is_refused_naming_it(key):
    with pytest.raises(ConfigError) as err:
        kwargs_of({"fine": {key: 1}})
    assert err.value.key == "+environment.kwargs.fine"
    assert err.value.message == (
        f"the mapping key {key!r} cannot be written in a Hydra override (its grammar has no "
        "way to write it); rename it"
    )


def test_keys_that_are_not_strings_keep_their_type():
    cfg = skyrl.compose({"experiment": "smoke", "+environment.kwargs.table": {1: "a", 2.5: "b"}})
    assert OmegaConf.to_container(cfg.environment.kwargs.table) == {1: "a", 2.5: "b"}
