"""The composed config has the schema's shape: its keys, and containers where it declares them.

OmegaConf enforces most of this itself, with three gaps this check closes, for the
CLI and the Python API alike (``validate`` calls it first):

- Hydra's ``+key=value`` and ``++key=value`` open the struct flag to add a key, so a
  dataclass node can hold a key its schema lacks. ``OmegaConf.to_object`` then sets it
  as a stray attribute on the instance, and nothing ever reads it.
- ``~key`` can delete a field of the root node; the run would then silently use the
  field's default, or fail later at first access.
- A container field set to an interpolation (``trainer.policy_optimizer=${trainer.seed}``)
  is not type-checked when it resolves: ``to_object`` would put the int where the
  ``OptimizerConfig`` belongs.

Keys under a field typed as a free-form mapping (``environment.kwargs: dict[str, Any]``)
are the user's own and pass; so does the root's ``hydra`` node, which belongs to Hydra.
"""

from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, ListConfig, OmegaConf

from skyrl.config.errors import ConfigError, did_you_mean, require

HYDRA_KEY = "hydra"


def check_structure(node: DictConfig, path: str = "") -> None:
    """Raise ``ConfigError`` for the first key, under ``node``, that its schema lacks, a
    schema field that was deleted, or a container interpolation of the wrong kind."""
    schema = OmegaConf.get_type(node)
    fields = (
        [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else None
    )
    for field in fields or []:
        require(
            field in node.keys(),  # a key whose value is ??? stays a key (reported later)
            _join(path, field),
            "required by the schema; it cannot be deleted with ~ (set a value instead)",
        )
    for key in node:
        key_path = _join(path, str(key))
        if not path and key == HYDRA_KEY:
            continue
        if fields is not None and key not in fields:
            raise ConfigError(key_path, f"unknown key{did_you_mean(str(key), fields)}")
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and child._is_interpolation():
            _check_interpolated_container(node, str(key), key_path)
        elif isinstance(child, DictConfig) and not (child._is_missing() or child._is_none()):
            check_structure(child, key_path)


def _check_interpolated_container(node: DictConfig, key: str, key_path: str) -> None:
    """A dict, list or dataclass field set to ``${...}`` must resolve to one of that kind."""
    child = node._get_node(key)
    assert child is not None  # the caller iterates node's own keys
    resolved = node[key]  # a broken interpolation raises OmegaConf's own error here
    expected = child._metadata.ref_type
    if resolved is None and child._metadata.optional:
        return
    if isinstance(child, ListConfig):
        ok, wanted = isinstance(resolved, ListConfig), "a list"
    elif dataclasses.is_dataclass(expected):
        ok = isinstance(resolved, DictConfig) and _is_subclass(
            OmegaConf.get_type(resolved), expected
        )
        wanted = expected.__name__
    else:
        ok, wanted = isinstance(resolved, DictConfig), "a mapping"
    require(ok, key_path, f"{child._value()} resolves to {_describe(resolved)}, not {wanted}")


def _is_subclass(kind: object, expected: type) -> bool:
    return isinstance(kind, type) and issubclass(kind, expected)


def _describe(value: object) -> str:
    if isinstance(value, DictConfig):
        kind = OmegaConf.get_type(value)
        return kind.__name__ if dataclasses.is_dataclass(kind) else "a mapping"
    return "a list" if isinstance(value, ListConfig) else f"{type(value).__name__} {value!r}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
