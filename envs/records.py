"""Reading data-set records from a local file: a JSON list, JSONL, or Parquet (Hugging Face's export formats)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIXES = (".json", ".jsonl", ".parquet")


def read_data_file(path: str, task: str, columns: list[str] | None = None) -> list[Any]:
    """The records of task `task`'s data file `path` (`read_records`). OrchError (one line naming the task and the
    path) for an unknown suffix, a missing file, or one that cannot be read."""
    from orchlib.errors import OrchError, choices_error

    file = Path(path)
    if file.suffix not in SUFFIXES:
        raise choices_error("data file suffix", file.suffix, list(SUFFIXES), where=f"{task} data_path {path}")
    if not file.is_file():
        raise OrchError(f"{task} data_path: no such file {path}")
    try:
        return read_records(file, columns)
    except (ValueError, OSError, KeyError) as err:
        raise OrchError(f"{task} data_path {path}: cannot read records ({err.__class__.__name__}: {err})") from None


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
