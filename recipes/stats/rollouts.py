"""The rollout-batch format: one table of trajectories, read and validated in one place.

Schema (docs/rollout_batch.md): one row per trajectory.

    prompt_id        required  group key: trajectories of the same prompt (same seed / question) share it
    reward           required  episode return (float; finite)
    step             optional  training step the batch was collected at (integer)
    sample           optional  index of the trajectory within its prompt group (integer)
    response_length  optional  generated tokens (or characters) of the trajectory
    prompt           optional  first user prompt text
    response         optional  generated text (all turns concatenated)
    turns            optional  number of turns taken
    success          optional  whether the episode succeeded (bool)
    images           optional  image observations by reference: the SHA-256 (hex) of each frame's shape and pixels,
                               in the order of the prompts' image placeholders (`recipes.policy.vision.frame_digest`)

Files are Parquet (``.parquet``), JSON Lines (``.jsonl``, or ``.json`` holding a list of records or JSON Lines) or
CSV (``.csv``), chosen by extension.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd

REQUIRED_COLUMNS = ("prompt_id", "reward")
OPTIONAL_COLUMNS = ("step", "sample", "response_length", "prompt", "response", "turns", "success", "images")
FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "json", ".csv": "csv"}


def _read_table(path: Path) -> pd.DataFrame:
    import pandas as pd

    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise OrchError(
            f"{path}: unknown rollout-batch format {path.suffix or '(no extension)'!r}; "
            f"valid extensions: {', '.join(FORMATS)}"
        )
    try:
        if kind == "parquet":
            return pd.read_parquet(path)
        if kind == "csv":
            return pd.read_csv(path)
        if kind == "jsonl":
            return pd.read_json(path, lines=True)
        text = path.read_text(encoding="utf-8").lstrip()
        return pd.read_json(path, lines=not text.startswith("["))
    except (ValueError, TypeError, OSError, UnicodeDecodeError) as err:  # pyarrow and pandas parse errors
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        line = _bad_json_line(path) if kind in ("jsonl", "json") else None
        if line:
            raise OrchError(f"{path}:{line}: cannot read as {kind}: line {line} is not one JSON object") from None
        raise OrchError(f"{path}: cannot read as {kind}: {first_line}") from None


def _bad_json_line(path: Path) -> int | None:
    """The number of the first line of a JSON Lines file that is not one JSON object (None: none found)."""
    import json

    try:
        with path.open(encoding="utf-8") as handle:
            if handle.read(1) == "[":
                return None  # one JSON document: its parser's message says where
            handle.seek(0)
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        if not isinstance(json.loads(line), dict):
                            return number
                    except ValueError:
                        return number
    except (OSError, UnicodeDecodeError):
        return None
    return None


def validate_rollout_frame(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check the schema and return a cleaned copy (``reward`` as float64, ``step`` as int64 when present).

    Raises:
        OrchError: missing required column, non-numeric / NaN / infinite reward, or a non-integer step.
    """
    import numpy as np
    import pandas as pd

    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise OrchError(
            f"{source}: missing required column(s) {', '.join(missing)}; "
            f"required: {', '.join(REQUIRED_COLUMNS)}; optional: {', '.join(OPTIONAL_COLUMNS)}; "
            f"found: {', '.join(map(str, frame.columns)) or '(none)'}"
        )
    if frame.empty:
        raise OrchError(f"{source}: the rollout batch has no rows")
    frame = frame.copy()
    reward = pd.to_numeric(frame["reward"], errors="coerce")
    bad = reward.isna() | ~np.isfinite(reward.to_numpy(dtype=np.float64, na_value=np.nan))
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise OrchError(
            f"{source}: column 'reward' must hold finite numbers; row {row} has {frame['reward'].iloc[row]!r} "
            f"({int(bad.sum())} bad row(s) in all)"
        )
    frame["reward"] = reward.astype(np.float64)
    if frame["prompt_id"].isna().any():
        raise OrchError(f"{source}: column 'prompt_id' has empty values; every trajectory needs its prompt's id")
    if "step" in frame.columns:
        step = pd.to_numeric(frame["step"], errors="coerce")
        if step.isna().any() or not np.all(step == np.round(step)):
            raise OrchError(f"{source}: column 'step' must hold integers")
        frame["step"] = step.astype(np.int64)
    return frame


def load_rollout_batch(path: str | Path) -> pd.DataFrame:
    """Read and validate a rollout-batch file (see the module docstring for the schema)."""
    path = Path(path)
    if path.is_dir():
        raise OrchError(f"{path}: is a directory; a rollout batch is one file (.parquet, .jsonl, .json or .csv)")
    if not path.is_file():
        raise OrchError(f"{path}: no such rollout-batch file")
    return validate_rollout_frame(_read_table(path), str(path))


def iter_steps(frame: pd.DataFrame, source: str, step: int | None = None) -> Iterator[tuple[int | None, pd.DataFrame]]:
    """Yield ``(step, rows)`` per training step (ascending), or only ``step`` when given.

    A frame without a ``step`` column is one batch (yielded with step ``None``).
    """
    if "step" not in frame.columns:
        if step is not None:
            raise OrchError(f"{source}: --step {step} given but the file has no 'step' column")
        yield None, frame
        return
    steps = sorted(int(s) for s in frame["step"].unique())
    if step is not None:
        if step not in steps:
            shown = ", ".join(map(str, steps[:20])) + (" ..." if len(steps) > 20 else "")
            raise OrchError(f"{source}: step {step} not in the file; available steps: {shown}")
        steps = [step]
    for value in steps:
        yield value, frame[frame["step"] == value]


def write_rollout_batch(frame: pd.DataFrame, path: str | Path) -> Path:
    """Validate and write a rollout batch; the format follows the extension."""
    path = Path(path)
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise OrchError(f"{path}: unknown rollout-batch format; valid extensions: {', '.join(FORMATS)}")
    frame = validate_rollout_frame(frame, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "parquet":
        frame.to_parquet(path, index=False)
    elif kind == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    return path
