"""A recorded YAML file (a bench's measured rates: the judge's, the collapse alert's), parsed once per version.

A report reads such a record for every value it judges (hundreds at lab scale: 20 s of YAML, issue 60). The parse is
kept per file version -- its path, modification time and size -- so a re-recorded file is read again.
"""

from __future__ import annotations

import functools
from pathlib import Path


def recorded_yaml(path: Path) -> dict:
    """The YAML mapping at ``path`` ({} when there is no such file or it is empty), parsed once per version of the
    file; the dict is shared between callers: read it, do not change it."""
    if not path.is_file():
        return {}
    stat = path.stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    """:func:`recorded_yaml`'s parse of ``path`` at one version (its modification time and size key the cache)."""
    import yaml

    return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
