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
import functools
import types
import typing

from omegaconf import DictConfig, ListConfig, OmegaConf

from skyrl.config.errors import ConfigError, did_you_mean, require

HYDRA_KEY = "hydra"
MAX_PLACES_NAMED = 3
"""Most other places of an unknown key's name that its hint lists."""


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
            raise ConfigError(key_path, f"unknown key{unknown_key_hint(key_path, schema)}")
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and child._is_interpolation():
            _check_interpolated_container(node, str(key), key_path)
        elif isinstance(child, DictConfig) and not (child._is_missing() or child._is_none()):
            check_structure(child, key_path)


def unknown_key_hint(key_path: str, schema: object) -> str:
    """What follows ``unknown key`` for ``key_path`` under a node of ``schema`` (``""`` if
    nothing helps): the group option that has the key (``generator.gpu_memory_utilization``
    with ``generator=hf``: ``(generator=vllm has it, not generator=hf)``), else the key's
    name where the schema has it (``trainer.max_prompt_length``: ``(did you mean
    'generator.max_prompt_length'?)``), else the closest field of ``schema``."""
    from skyrl.config.root import GROUP_SCHEMAS

    parent, _, name = key_path.rpartition(".")
    options = GROUP_SCHEMAS.get(parent, {})
    having = [o for o, kind in options.items() if kind is not schema and name in _fields(kind)]
    current = [o for o, kind in options.items() if kind is schema]
    if having and current:
        names = " or ".join(f"{parent}={_option(o)}" for o in having)
        return f" ({names} has it, not {parent}={_option(current[0])})"
    group = key_path.partition(".")[0]
    places = [p for p in _schema_keys().get(name, []) if p != key_path]
    places = sorted(places, key=lambda p: p.partition(".")[0] != group)[:MAX_PLACES_NAMED]
    if places:
        return f" (did you mean {' or '.join(repr(p) for p in places)}?)"
    return did_you_mean(name, _fields(schema))


def _option(schema_name: str) -> str:
    """The group option a schema backs: ``hf_schema`` -> ``hf``."""
    return schema_name.removesuffix("_schema")


def _fields(schema: object) -> list[str]:
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    return []


@functools.cache
def _schema_keys() -> dict[str, list[str]]:
    """Every key path of the root schema (each group's option schemas too), by its last name,
    shallowest first."""
    from skyrl.config.root import GROUP_SCHEMAS, SkyRLConfig

    found: dict[str, list[str]] = {}

    def walk(schema: type, path: str) -> None:
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            key_path = _join(path, f.name)
            found.setdefault(f.name, []).append(key_path)
            kinds = GROUP_SCHEMAS.get(key_path, {}).values() or [_dataclass_in(hints[f.name])]
            for kind in dict.fromkeys(k for k in kinds if k is not None):
                walk(kind, key_path)

    walk(SkyRLConfig, "")
    return {
        name: sorted(dict.fromkeys(paths), key=lambda p: p.count("."))
        for name, paths in found.items()
    }


def _dataclass_in(hint: object) -> type | None:
    """The dataclass a field's type names (``OptimizerConfig``, ``SamplingConfig | None``)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(filter(None, map(_dataclass_in, typing.get_args(hint))), None)
    return None


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
