"""Convert GSM8K rows (``question``, ``answer`` ending in ``#### n``) into skyrl prompt rows.

The output has ``prompt`` (the question plus the answer-format instruction the
``math`` env grades), ``answer`` (just the final number) and ``data_source``
(``gsm8k``), as ``.jsonl`` or ``.parquet`` by the output suffix. Input: the
GSM8K ``train``/``test`` split as ``.jsonl`` or ``.parquet`` (e.g. the files of
``openai/gsm8k`` on the HF hub, copied here by hand; this project has no hub).

    python recipes/gsm8k_grpo/prepare.py --input gsm8k/train.parquet --output data/gsm8k/train.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

INSTRUCTION = "Solve the problem. Write the final answer on the last line as '#### <number>'."
"""Appended to every question: the format the ``math`` env grades."""


def final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, without thousands separators."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer has no '#### <number>': {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def convert_record(record: dict[str, Any]) -> dict[str, str]:
    """One GSM8K record as a skyrl prompt row."""
    return {
        "prompt": f"{record['question'].strip()}\n{INSTRUCTION}",
        "answer": final_answer(record["answer"]),
        "data_source": "gsm8k",
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` or ``.parquet`` file."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: use .jsonl or .parquet")


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
        raise ValueError(f"{path}: use .jsonl or .parquet")


def main(argv: list[str] | None = None) -> None:
    """Convert ``--input`` into ``--output``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, required=True, help="GSM8K split (.jsonl/.parquet)")
    parser.add_argument("--output", type=Path, required=True, help="skyrl rows (.jsonl/.parquet)")
    args = parser.parse_args(argv)
    rows = [convert_record(r) for r in read_records(args.input)]
    write_records(rows, args.output)
    print(f"wrote {len(rows)} prompts to {args.output}")


if __name__ == "__main__":
    main()
