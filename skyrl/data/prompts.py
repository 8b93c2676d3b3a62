"""Prompt rows and their loading from parquet / jsonl files or local ``datasets``.

A row is a prompt (a string, or a list of chat messages with string ``content`` and a
``role`` of ``ROLES``; not blank: a whitespace string, or messages whose every content is
whitespace, is refused, as is text with a lone surrogate, which no tokenizer takes), the
``data_source`` it belongs to (metrics such as pass@n are reported per source), and
``extras``: every other column (e.g. ``answer``; the keys of a dict ``extra_info`` column, a
parquet struct or map, are merged in, over a column of the same name unless null or NaN), handed
to the env's ``init``. A parquet map with string keys is read as a dict, as a jsonl object is.
A malformed row raises ``PromptDataError`` (a ``ValueError``) naming the file and
the 1-based row. ``iter_prompt_file`` streams a file row by row (a jsonl line or a
parquet record batch at a time), so checking a large file never holds all of it.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = dict[str, str]

PARQUET_BATCH_ROWS = 1024
"""Parquet rows read at a time when streaming a file."""
UTF8_BOM = b"\xef\xbb\xbf"
"""The byte order mark an editor may start a UTF-8 file with (``json.loads`` skips it)."""
ROLES = ("system", "user", "assistant", "tool")
"""The roles a prompt's messages may have. Another one may render under a template that
takes any role (Qwen's), but the endpoint an external agent sends it to refuses it
(``skyrl.serve.chat_format.ROLES``); OpenAI's ``developer``, which the endpoint renders as
``system``, would reach the template as it is in the agent loop, so it is refused too."""


class PromptDataError(ValueError):
    """A prompt file or row that cannot be used; the message starts with the file (and row)."""


@dataclass
class PromptRow:
    """One prompt of a dataset."""

    prompt: str | list[Message]
    """The question as text, or the opening chat messages."""
    data_source: str
    """Which dataset the row comes from (metrics are grouped by it)."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Everything else (``answer``, reasoning-gym ``entry``, ...), passed to ``env.init``."""
    uid: str = ""
    """Stable id of the prompt (all samples and turns of it share it)."""

    def for_sample(self) -> PromptRow:
        """A deep copy for one sample's trajectory: what its env or agent writes to
        ``extras`` (or the prompt) stays out of the prompt's other samples and later passes."""
        return copy.deepcopy(self)


def _check_prompt(prompt: Any) -> str | None:
    """An error message for an unusable prompt, or None."""
    if isinstance(prompt, str):
        return _not_unicode(prompt, "prompt") or (None if prompt.strip() else "empty prompt")
    if isinstance(prompt, list | tuple) and prompt:
        for j, m in enumerate(prompt):
            if not isinstance(m, Mapping):
                return f"message {j} is a {type(m).__name__}, not a {{'role', 'content'}} dict"
            for key in ("role", "content"):
                if not isinstance(m.get(key), str):
                    has = "" if key in m else f" (has {sorted(m)})"
                    return f"message {j} has no string {key!r}{has}"
            if m["role"] not in ROLES:
                return f"message {j} has role {m['role']!r}, not one of {', '.join(ROLES)}"
            if problem := _not_unicode(m["content"], f"message {j}'s content"):
                return problem
        if not any(m["content"].strip() for m in prompt):  # as a blank string prompt is
            return "empty prompt (every message's content is blank)"
        return None
    return f"prompt must be a string or a non-empty list of messages, got {type(prompt).__name__}"


def _not_unicode(text: str, what: str) -> str | None:
    """Why ``text`` is no Unicode text a tokenizer takes: a lone surrogate, which JSON can
    spell (``"\\ud83d"``: half of an emoji's UTF-16 pair, e.g. cut by a truncation)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{what} is not valid Unicode: a lone surrogate {text[exc.start]!r} at character "
            f"{exc.start} (half of a UTF-16 pair)"
        )
    return None


def row_from_record(
    record: Mapping[str, Any], where: str, prompt_key: str = "prompt", default_source: str = ""
) -> PromptRow:
    """Validate one record; ``where`` (e.g. ``"data.jsonl: row 3"``) prefixes any error."""
    if not isinstance(record, Mapping):
        raise PromptDataError(f"{where}: expected an object, got {type(record).__name__}")
    if prompt_key not in record:
        raise PromptDataError(f"{where}: missing column {prompt_key!r} (has {sorted(record)})")
    prompt = record[prompt_key]
    if isinstance(prompt, list | tuple):
        prompt = [dict(m) if isinstance(m, Mapping) else m for m in prompt]
    problem = _check_prompt(prompt)
    if problem:
        raise PromptDataError(f"{where}: {problem}")
    source = record.get("data_source")
    source = default_source if source is None else source
    if not isinstance(source, str) or not source:
        raise PromptDataError(f"{where}: 'data_source' must be a non-empty string, got {source!r}")
    extra_info = record.get("extra_info")
    nested = isinstance(extra_info, Mapping)  # verl's dict column, merged into the extras
    skip = (prompt_key, "data_source", "extra_info") if nested else (prompt_key, "data_source")
    extras = {k: v for k, v in record.items() if k not in skip}
    if isinstance(extra_info, Mapping):  # a null (or NaN) field hides no column (parquet:
        # every row has every field of a struct column, null where the row has none)
        extras.update((k, v) for k, v in extra_info.items() if not _absent(v) or k not in extras)
    uid = record.get("uid")  # a parquet column's null is None, not a uid
    return PromptRow(prompt, source, extras, uid="" if uid is None else str(uid))


def _absent(value: Any) -> bool:
    """A null, or a float NaN (pandas' and ``json.dumps``' missing value)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(1-based row, record)`` of a file, read lazily (jsonl rows are line numbers)."""
    if path.suffix == ".jsonl":
        with path.open("rb") as f:
            for i, line in enumerate(f, start=1):
                if not line.strip().removeprefix(UTF8_BOM):  # a BOM alone is a blank line
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise PromptDataError(f"{path}: row {i}: invalid JSON ({exc.msg})") from None
                except UnicodeDecodeError:
                    raise PromptDataError(f"{path}: row {i}: not UTF-8 text") from None
                except ValueError as exc:  # an integer past Python's 4300 digits
                    raise PromptDataError(
                        f"{path}: row {i}: unreadable JSON ({str(exc).split(';')[0]}): "
                        "write such a number as a string"
                    ) from None
                except RecursionError:
                    raise PromptDataError(
                        f"{path}: row {i}: invalid JSON (nested too deeply)"
                    ) from None
                yield i, record
    elif path.suffix == ".parquet":
        yield from enumerate(_parquet_records(path), start=1)
    else:
        raise PromptDataError(f"{path}: unsupported file type (use .jsonl or .parquet)")


def _parquet_records(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = 1  # the 1-based row of the batch's first record
    try:
        file = pq.ParquetFile(path)
        maps = "strict" if _string_keyed(file.schema_arrow) else None
        for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            try:
                records = batch.to_pylist(maps_as_pydicts=maps)
            except (OverflowError, ValueError, KeyError) as exc:  # year 10000, a key twice
                raise PromptDataError(_unconvertible(path, batch, first, exc, maps)) from None
            yield from records
            first += batch.num_rows
    except pa.ArrowException as exc:
        raise PromptDataError(f"{path}: not a readable parquet file ({exc})") from None


def _string_keyed(schema) -> bool:
    """Whether every map in a parquet schema has string keys, as a JSON object has: its maps
    are then read as dicts, as jsonl objects are (pyarrow's default: lists of ``(key, value)``
    pairs, which hid a map ``extra_info``'s keys), a map with a key twice refused. A map keyed
    by bytes or dates stays a list of pairs: such a dict is no JSON object."""
    import pyarrow as pa

    def string_keyed(t) -> bool:
        key = t.key_type if pa.types.is_map(t) else None
        if key is not None and not (pa.types.is_string(key) or pa.types.is_large_string(key)):
            return False
        return all(string_keyed(t.field(i).type) for i in range(t.num_fields))

    return all(string_keyed(field.type) for field in schema)


def _unconvertible(path: Path, batch, first: int, exc: Exception, maps: str | None) -> str:
    """Where a parquet batch (rows from ``first``) has a value no Python object holds (or a
    map with a key twice): its first such cell, by row."""
    for j in range(batch.num_rows):
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            try:
                column[j].as_py(maps_as_pydicts=maps)
            except (OverflowError, ValueError, KeyError) as cell:
                return f"{path}: row {first + j}: column {name!r} cannot be read ({_reason(cell)})"
    return f"{path}: rows {first} to {first + batch.num_rows - 1} cannot be read ({_reason(exc)})"


def _reason(exc: Exception) -> str:
    """``exc``'s message (a ``KeyError``'s without the quotes ``str`` adds)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def uid_prefixes(files: Sequence[str | Path]) -> list[str]:
    """The default uid prefix of each of a split's files: the file stem, or ``<stem>.<i>``
    (``i`` its place in ``files``) where two files share a stem, so no two rows share a uid."""
    stems = [Path(f).stem for f in files]
    return [s if stems.count(s) == 1 else f"{s}.{i}" for i, s in enumerate(stems)]


def iter_prompt_file(
    path: str | Path, prompt_key: str = "prompt", uid_prefix: str | None = None
) -> Iterator[tuple[int, PromptRow]]:
    """``(1-based row, row)`` of a ``.jsonl`` or ``.parquet`` file, validated one at a time;
    ``data_source`` defaults to the file stem, the uid to ``<uid_prefix>-<index>`` (the prefix
    defaults to the stem; ``uid_prefixes`` gives a list's). A file without
    rows (empty, blank lines only) raises once read through: a file listed for a split that
    gives it nothing is a mistake (an empty eval file would turn evaluation off)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found")
    if path.is_dir():
        raise PromptDataError(f"{path}: is a directory, not a .jsonl or .parquet file")
    index, uid_prefix = 0, uid_prefix or path.stem
    for i, rec in _records(path):
        row = row_from_record(rec, f"{path}: row {i}", prompt_key, default_source=path.stem)
        row.uid = row.uid or f"{uid_prefix}-{index}"
        index += 1
        yield i, row
    if index == 0:
        raise PromptDataError(f"{path}: no rows")


def load_prompt_file(
    path: str | Path, prompt_key: str = "prompt", uid_prefix: str | None = None
) -> list[PromptRow]:
    """Rows of a ``.jsonl`` or ``.parquet`` file; ``data_source`` defaults to the file stem,
    the uid to ``<uid_prefix>-<index>`` (like ``iter_prompt_file``)."""
    return [row for _, row in iter_prompt_file(path, prompt_key, uid_prefix)]


def load_hf_dataset(
    dataset_or_dir: Any, prompt_key: str = "prompt", name: str = "dataset"
) -> list[PromptRow]:
    """Rows of a local ``datasets.Dataset`` (or a ``save_to_disk`` directory); errors start
    with the directory, else ``name``, which is also the default ``data_source``."""
    where = name
    if isinstance(dataset_or_dir, str | Path):
        import datasets

        where, name = str(dataset_or_dir), Path(dataset_or_dir).name
        dataset_or_dir = datasets.load_from_disk(where)
    if isinstance(dataset_or_dir, Mapping):  # a DatasetDict: iterating it gives split names
        raise PromptDataError(
            f"{where}: a DatasetDict of the splits {sorted(dataset_or_dir)}, not a Dataset: "
            "pass one split"
        )
    rows = [
        row_from_record(rec, f"{where}: row {i}", prompt_key, default_source=name)
        for i, rec in enumerate(dataset_or_dir, start=1)
    ]
    return assign_uids(rows, prefix=name)


def assign_uids(rows: list[PromptRow], prefix: str) -> list[PromptRow]:
    """Give rows without a uid the id ``<prefix>-<index>``."""
    for i, row in enumerate(rows):
        if not row.uid:
            row.uid = f"{prefix}-{i}"
    return rows
