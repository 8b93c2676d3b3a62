"""Convert GSM8K rows (``question``, ``answer`` ending in ``#### n``) into skyrl prompt rows.

The output has ``prompt`` (the question plus the answer-format instruction the
``math`` env grades), ``answer`` (just the final number) and ``data_source``
(``gsm8k``), as ``.jsonl`` or ``.parquet`` by the output suffix. Input: the
GSM8K ``train``/``test`` split as ``.jsonl`` or ``.parquet`` (e.g. the files of
``openai/gsm8k`` on the HF hub, copied here by hand; this project has no hub).
A bad file (missing, not JSON, a row without ``question``/``answer``, with a blank
question or without a final ``#### n``) ends with one line naming the file and row;
nothing is written.

    python recipes/gsm8k_grpo/prepare.py --input gsm8k/train.parquet --output data/gsm8k/train.jsonl
"""

from __future__ import annotations

import argparse
import codecs
import json
from pathlib import Path
from typing import Any

INSTRUCTION = "Solve the problem. Write the final answer on the last line as '#### <number>'."
"""Appended to every question: the format the ``math`` env grades."""
SUFFIXES = (".jsonl", ".parquet")
"""The file types read and written."""
COLUMNS = ("question", "answer")
"""The GSM8K columns a record must have."""
ELSEWHERE = "write the converted rows elsewhere"
"""What to do when ``--output`` names the ``--input`` file."""


def final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, without thousands separators."""
    number = solution.rsplit("####", 1)[1].strip() if "####" in solution else ""
    if not number:  # an empty answer would grade every reply 0
        raise ValueError(f"GSM8K answer has no '#### <number>': {solution[-80:]!r}")
    return number.replace(",", "")


def convert_record(record: dict[str, Any]) -> dict[str, str]:
    """One GSM8K record as a skyrl prompt row."""
    if not isinstance(record, dict):
        raise ValueError(f"not a JSON object: {record!r:.80}")
    missing = [c for c in COLUMNS if c not in record]
    if missing:
        raise ValueError(f"missing column {missing[0]!r} (has {sorted(record)})")
    not_text = [c for c in COLUMNS if not isinstance(record[c], str)]
    if not_text:
        raise ValueError(f"column {not_text[0]!r} is not text: {record[not_text[0]]!r:.80}")
    if not record["question"].strip():  # the prompt would be the instruction alone
        raise ValueError(f"column 'question' is blank: {record['question']!r:.80}")
    return {
        "prompt": f"{record['question'].strip()}\n{INSTRUCTION}",
        "answer": final_answer(record["answer"]),
        "data_source": "gsm8k",
    }


def read_records(path: Path) -> list[tuple[int, Any]]:
    """``(1-based row, record)`` of a ``.jsonl`` or ``.parquet`` file (jsonl rows are line
    numbers, blank lines skipped; of a parquet file only the ``COLUMNS``, which it must have).
    A jsonl line ends at ``\\n`` only, as skyrl's loader reads it (a JSON string may hold a
    U+2028 or U+0085, which ``str.splitlines`` would split at: ``json.dumps(...,
    ensure_ascii=False)`` writes them as they are); a UTF-8 BOM is skipped."""
    if path.suffix == ".jsonl":
        records = []
        for i, line in enumerate(path.read_bytes().split(b"\n"), start=1):
            if not line.strip().removeprefix(codecs.BOM_UTF8):
                continue
            try:
                records.append((i, json.loads(line)))  # bytes: json skips a BOM
            except json.JSONDecodeError as exc:
                raise ValueError(f"row {i}: invalid JSON ({exc.msg})") from None
            except UnicodeDecodeError:
                raise ValueError(f"row {i}: not UTF-8 text") from None
            except ValueError as exc:  # an integer past Python's 4300 digits
                number = str(exc).split(";")[0]
                raise ValueError(
                    f"row {i}: unreadable JSON ({number}): write such a number as a string"
                ) from None
        return records
    if path.suffix == ".parquet":  # only the GSM8K columns are read: the rows keep no other
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        missing = [c for c in COLUMNS if c not in names]  # in every row: no row to name
        if missing:
            raise ValueError(f"missing column {missing[0]!r} (has {sorted(names)})")
        return list(enumerate(pq.read_table(path, columns=list(COLUMNS)).to_pylist(), start=1))
    raise ValueError(f"use {' or '.join(SUFFIXES)}")


def convert_file(path: Path) -> list[dict[str, str]]:
    """Every record of ``path`` as a skyrl prompt row; a bad one names its row."""
    rows = []
    for i, record in read_records(path):
        try:
            rows.append(convert_record(record))
        except ValueError as exc:
            raise ValueError(f"row {i}: {exc}") from None
    if not rows:
        raise ValueError("no rows")
    return rows


def write_records(rows: list[dict[str, str]], path: Path) -> None:
    """Write rows as ``.jsonl`` or ``.parquet`` (by suffix), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise ValueError(f"{path}: use {' or '.join(SUFFIXES)}")


def main(argv: list[str] | None = None) -> None:
    """Convert ``--input`` into ``--output``; a bad file exits 2 with one ``error:`` line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="GSM8K split (.jsonl/.parquet)")
    parser.add_argument("--output", type=Path, required=True, help="skyrl rows (.jsonl/.parquet)")
    args = parser.parse_args(argv)
    for flag, path in (("--input", args.input), ("--output", args.output)):
        if path.suffix not in SUFFIXES:
            parser.exit(2, f"error: {flag} {path}: use {' or '.join(SUFFIXES)}\n")
    if not args.input.is_file():
        problem = "is a directory" if args.input.is_dir() else "file not found"
        parser.exit(2, f"error: --input {args.input}: {problem}\n")
    if args.output.exists() and args.output.samefile(args.input):  # the raw split would be lost
        parser.exit(2, f"error: --output {args.output}: is the --input file; {ELSEWHERE}\n")
    in_the_way = next((p for p in args.output.parents if p.exists() and not p.is_dir()), None)
    if in_the_way is not None:
        parser.exit(2, f"error: --output {args.output}: {in_the_way} is a file, not a folder\n")
    try:
        rows = convert_file(args.input)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        parser.exit(2, f"error: --input {args.input}: {getattr(exc, 'strerror', None) or exc}\n")
    try:
        write_records(rows, args.output)
    except OSError as exc:
        parser.exit(2, f"error: --output {args.output}: {exc.strerror or exc}\n")
    print(f"wrote {len(rows)} prompts to {args.output}")


if __name__ == "__main__":
    main()
