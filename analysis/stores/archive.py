"""A sweep's results as a small folder of Parquet files: committed, shared and reported from without the MLflow
store that produced them (``orch archive SWEEP --out DIR``, then ``orch report SWEEP --archive DIR``).

A long sweep on a machine that does not keep its files (a working session, a cluster's scratch space) loses its
tracking store; what it measured need not go with it. An archive keeps what every analysis of ``orch report``
reads -- the runs with their params and tags, every metric history, and the Std(RV)/Mean(RV) predictor on the
baseline runs' first dumped rollout batch -- and nothing it does not (no checkpoints, no rollout batches). Several
archives of one sweep (cells run in different sessions) are read as one. A run in more than one of them (the sweep's
parent run, or a cell's run continued in a later session of the same tracking store) is read from the archive written
last: an archive is a snapshot, the later one holds all the earlier one did and what came after.

Files of an archive folder:

    runs.parquet         RunData.runs (analysis.stores.mlflow_store), one row per run
    metrics.parquet      RunData.metrics, one row per logged value
    predictions.parquet  the predictor's rows (analysis.stores.rollout_artifacts.PREDICTION_COLUMNS)
    archive.json         {"format": 1, "sweep": ..., "tracking_uri": ..., "written": ..., "runs": N, "profile": ...}

``profile`` is the profile the sweep ran under (``orch sweep --profile``, the sweep's parent run's ``profile``
param), ``null`` for none. An archive of the ``rehearsal`` profile (tiny model, 2 steps, planted collapses: the paper
report's dress rehearsal) is generated data, not evidence: :func:`evidence_sessions` leaves it out of what the
calibration records (the collapse alert's rates, the predictor's record) are computed from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd

    from analysis.stores.mlflow_store import RunData

FORMAT = 1
FILES = ("runs.parquet", "metrics.parquet", "predictions.parquet", "archive.json")
READER = "archive"
REHEARSAL = "rehearsal"  # the profile whose runs are a rehearsal (sweeps/profiles.yaml), never evidence


def write_archive(data: RunData, predictions: pd.DataFrame, sweep: str, folder: Path) -> Path:
    """Write ``data`` and ``predictions`` as the archive folder ``folder`` (which must not exist yet); all or
    nothing: the files are written into a temporary folder beside it, then renamed into place."""
    folder = Path(folder)
    if folder.exists():
        raise OrchError(f"{folder}: already exists; an archive is written into a new folder")
    parent = folder.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    try:
        staging.chmod(0o777 & ~umask)  # a folder as any other (mkdtemp's is private)
        data.runs.to_parquet(staging / "runs.parquet", index=False)
        data.metrics.to_parquet(staging / "metrics.parquet", index=False)
        predictions.to_parquet(staging / "predictions.parquet", index=False)
        meta = {"format": FORMAT, "sweep": sweep, "tracking_uri": data.tracking_uri,
                "written": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "runs": len(data.runs),
                "profile": runs_profile(data.runs)}
        (staging / "archive.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, folder)
    except OSError as err:  # a full disk, a folder made unwritable meanwhile: one line, nothing left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise OrchError(f"{folder}: the archive could not be written ({err.strerror or err})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def runs_profile(runs: pd.DataFrame) -> str | None:
    """The profile the runs' sweep ran under (the sweep's parent run's ``profile`` param; None for none or unknown)."""
    if "params.profile" not in runs.columns:
        return None
    named = {str(value) for value in runs["params.profile"].dropna() if str(value)}
    return named.pop() if len(named) == 1 else None


def archive_profile(folder: Path) -> str | None:
    """The profile of the archive in ``folder``: its ``archive.json``'s, or, for an archive written before that key,
    its runs'."""
    import pandas as pd

    meta = check_archive(folder)
    if "profile" in meta:
        return meta["profile"] or None
    return runs_profile(pd.read_parquet(Path(folder) / "runs.parquet", columns=None))


def evidence_sessions(sweep_dir: Path) -> list[Path]:
    """The archive folders of one sweep's folder (docs/results/<sweep>/<session>/) whose runs are evidence: every one
    but those of the rehearsal profile (generated data, kept so the paper report renders from committed files)."""
    sessions = sorted(path for path in Path(sweep_dir).iterdir() if path.is_dir())
    return [folder for folder in sessions if archive_profile(folder) != REHEARSAL]


def check_archive(folder: Path) -> dict:
    """The archive's ``archive.json``, after checking the folder holds every file of an archive this version
    reads; OrchError naming the folder and what is wrong otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise OrchError(f"{folder}: no such archive folder (write one with `orch archive SWEEP --out DIR`)")
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise OrchError(f"{folder}: not an orch archive: missing {', '.join(missing)}")
    try:
        meta = json.loads((folder / "archive.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise OrchError(f"{folder / 'archive.json'}: unreadable ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise OrchError(f"{folder / 'archive.json'}: archive format {found!r}; this orch reads format {FORMAT}")
    return meta


def read_archives(folders: list[Path], sweep: str | None = None) -> tuple[RunData, pd.DataFrame]:
    """The runs, metric histories and predictor rows of one or more archive folders, as one :class:`RunData`
    (reader ``archive``) and one predictions frame. ``sweep``: every archive must be of this sweep."""
    import pandas as pd

    from analysis.stores.mlflow_store import RunData
    from analysis.stores.rollout_artifacts import PREDICTION_COLUMNS

    if not folders:
        raise OrchError("no archive folder given")
    snapshots = []
    for position, folder in enumerate(folders):
        meta = check_archive(folder)
        if sweep is not None and meta.get("sweep") != sweep:
            raise OrchError(f"{folder}: an archive of sweep {meta.get('sweep')!r}, not {sweep!r}")
        try:
            frames = tuple(pd.read_parquet(Path(folder) / name)
                           for name in ("runs.parquet", "metrics.parquet", "predictions.parquet"))
        except (OSError, ValueError) as err:
            raise OrchError(f"{folder}: unreadable archive file ({err})") from None
        snapshots.append((str(meta.get("written") or ""), position, frames))
    # newest snapshot first (the ISO time it was written; the later on the command line at equal times): a run is
    # read from the first archive that holds it, its metric history and predictor rows with it
    snapshots.sort(key=lambda snapshot: snapshot[:2], reverse=True)
    runs, metrics, predictions, seen = [], [], [], set()
    for _, _, (run_rows, metric_rows, prediction_rows) in snapshots:
        fresh = ~run_rows["run_id"].isin(seen)
        ids = set(run_rows.loc[fresh, "run_id"])
        runs.append(run_rows[fresh])
        metrics.append(metric_rows[metric_rows["run_id"].isin(ids)])
        predictions.append(prediction_rows[prediction_rows["run_id"].isin(ids)])
        seen |= ids
    table = pd.concat(runs, ignore_index=True)
    table = table.sort_values(["start_time", "run_id"], na_position="last", kind="stable").reset_index(drop=True)
    history = pd.concat(metrics, ignore_index=True).sort_values(["run_id", "key", "step", "timestamp"], kind="stable")
    found = [p for p in predictions if not p.empty]
    predicted = pd.concat(found, ignore_index=True) if found else pd.DataFrame(columns=list(PREDICTION_COLUMNS))
    predicted = predicted.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    uri = "archive:" + ",".join(str(folder) for folder in folders)
    return RunData(runs=table, metrics=history.reset_index(drop=True), tracking_uri=uri, reader=READER), predicted


def finished_cells(folders: list[Path], sweep: str) -> set[str]:
    """The digests of the cells of ``sweep`` that have a finished run in the archive folders (the ``cell`` tag the
    sweep engine gives a cell's run): what `orch sweep --done-in` leaves out."""
    data, _ = read_archives(list(folders), sweep)
    runs = data.runs
    if "tags.cell" not in runs.columns:
        return set()
    return set(runs.loc[(runs["status"] == "FINISHED") & runs["tags.cell"].notna(), "tags.cell"])
