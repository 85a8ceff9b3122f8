"""Reading data-set records from a local file: a JSON list, JSONL, or Parquet (Hugging Face's export formats)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIXES = (".json", ".jsonl", ".parquet")


def read_records(path: Path, columns: list[str] | None = None) -> list[Any]:
    """The records of `path` (by its suffix, one of `SUFFIXES`), in file order; Parquet reads only `columns` if
    given. ValueError if a .json file is not a list; json/OS/Arrow errors pass through."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=columns).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    records = json.loads(text)
    if not isinstance(records, list):
        raise ValueError("expected a JSON list of records")
    return records
