"""Rollout batches dumped by the trainers as MLflow artifacts (``rollouts/step_NNNN.parquet``), read back for the
predictor (Table 8: :func:`analysis.stats.predictor.predictions` runs it on them) and for reward-variance histograms.

Files are read with :func:`recipes.stats.rollouts.load_rollout_batch` and per-prompt reward variance is
:func:`recipes.stats.filtering.group_stats`: nothing here recomputes a statistic.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from analysis import names
from analysis.stores.mlflow_store import Progress
from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd
    from mlflow import MlflowClient

STEP_FILE = re.compile(r"step_(\d+)\.parquet$")
# ratio: RV as the variance (the verdict's, at the default thresholds); ratio_std: RV as the std
PREDICTION_COLUMNS = ("run_id", "step", "ratio", "verdict", "num_prompts", "zero_variance_share", "ratio_std")
RV_COLUMNS = ("run_id", "step", "prompt_id", "rv")
QUIET_DOWNLOADS = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def dumped_steps(client: MlflowClient, run_id: str) -> dict[int, str]:
    """step -> artifact path of every rollout batch a run dumped."""
    return _steps_of(client.list_artifacts(run_id, names.ROLLOUT_DIR))


def _steps_of(listed: Iterable[Any]) -> dict[int, str]:
    """step -> artifact path of the rollout batches among the listed artifacts (``FileInfo`` s)."""
    found = {}
    for item in listed:
        match = STEP_FILE.search(item.path)
        if match and not item.is_dir:
            found[int(match.group(1))] = item.path
    return dict(sorted(found.items()))


def _pick(steps: dict[int, str], which: str) -> dict[int, str]:
    if not steps or which == "all":
        return steps
    if which == "first":
        first = min(steps)
        return {first: steps[first]}
    if which.startswith("first:") and which[6:].isdigit():  # the first k dumped steps
        return dict(sorted(steps.items())[: int(which[6:])])
    if which == "last":
        last = max(steps)
        return {last: steps[last]}
    raise OrchError(f"unknown rollout step choice {which!r}; valid choices: all, first, first:K, last")


@contextmanager
def _quiet_downloads() -> Iterator[None]:
    """Silence MLflow's per-file download progress bars (our own progress callback reports instead)."""
    previous = os.environ.get(QUIET_DOWNLOADS)
    os.environ[QUIET_DOWNLOADS] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(QUIET_DOWNLOADS, None)
        else:
            os.environ[QUIET_DOWNLOADS] = previous


def local_folder(artifact_uri: str | None) -> Path | None:
    """A run's artifact folder when its artifact URI is a local one (a path or ``file://``), else None (then
    MLflow's client finds the run's artifacts: one query of the tracking store per run, seconds at a Table-4
    sweep, issue 60)."""
    from urllib.parse import unquote, urlparse

    if not isinstance(artifact_uri, str) or not artifact_uri:
        return None
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    return Path(artifact_uri) if parsed.scheme == "" else None


def _local_steps(folder: Path) -> dict[int, str]:
    """:func:`dumped_steps` of a local artifact folder, as MLflow lists it (paths relative to the folder)."""
    batches = folder / names.ROLLOUT_DIR
    if not batches.is_dir():
        return {}
    return _steps_of(SimpleNamespace(path=f"{names.ROLLOUT_DIR}/{entry.name}", is_dir=entry.is_dir())
                     for entry in batches.iterdir())


def load_batches(
    tracking_uri: str, run_ids: list[str], *, which: str = "first", progress: Progress | None = None,
    artifact_uris: Mapping[str, str] | None = None,
) -> dict[str, pd.DataFrame]:
    """run_id -> validated rollout-batch frame (the ``which`` dumped step(s) concatenated, with a ``step``
    column); runs without dumped batches are left out. ``artifact_uris``: run_id -> its artifact URI (the runs
    frame's ``artifact_uri``), read directly where local (:func:`local_folder`)."""
    import pandas as pd

    from recipes.run.tracking import mlflow_client
    from recipes.stats.rollouts import load_rollout_batch

    client = None
    batches = {}
    with _quiet_downloads(), tempfile.TemporaryDirectory(prefix="orch-rollouts-") as tmp:
        for done, run_id in enumerate(run_ids, start=1):
            folder = local_folder((artifact_uris or {}).get(run_id))
            if folder is None:
                client = mlflow_client(tracking_uri) if client is None else client
                listed = dumped_steps(client, run_id)
            else:
                listed = _local_steps(folder)
            frames = []
            for step, path in _pick(listed, which).items():  # a local batch is read where it is
                local = Path(client.download_artifacts(run_id, path, tmp)) if folder is None else folder / path
                frame = load_rollout_batch(local)
                frames.append(frame.assign(step=step) if "step" not in frame.columns else frame)
            if frames:
                batches[run_id] = pd.concat(frames, ignore_index=True)
            if progress:
                progress("reading rollout batches", done, len(run_ids))
    return batches


def _run_steps(tracking_uri: str, run_id: str) -> tuple[MlflowClient, dict[int, str]]:
    """A client and the rollout batches run `run_id` dumped (step -> artifact path); OrchError when the store is
    missing, the run unknown or it dumped none."""
    from analysis.stores.mlflow_sql import _engine
    from recipes.run.tracking import mlflow_client

    _engine(tracking_uri).dispose()  # a missing SQLite file is an error here, never a new empty store
    client = mlflow_client(tracking_uri)
    try:
        client.get_run(run_id)
    except Exception as err:  # unknown run id, unreachable store
        raise OrchError(f"--run {run_id}: no such run in {tracking_uri} ({str(err).splitlines()[0]})") from None
    steps = dumped_steps(client, run_id)
    if not steps:
        raise OrchError(f"--run {run_id}: the run logged no rollout batch ({names.ROLLOUT_DIR}/step_NNNN.parquet; "
                        "trainer.dump_every > 0 writes them)")
    return client, steps


def run_batches(tracking_uri: str, run_id: str, steps: list[int] | None = None) -> pd.DataFrame:
    """The rollout batches run `run_id` dumped at `steps` (default: all), validated, concatenated in step order with
    a `step` column. OrchError when the run is unknown, dumped no batch, or none at a step asked for (naming the
    steps it did dump)."""
    import pandas as pd

    from recipes.stats.rollouts import load_rollout_batch

    client, dumped = _run_steps(tracking_uri, run_id)
    for step in steps or ():
        if step not in dumped:
            raise OrchError(f"--step {step}: run {run_id} logged rollout batches at steps {sorted(dumped)}")
    frames = []
    with _quiet_downloads(), tempfile.TemporaryDirectory(prefix="orch-rollouts-") as tmp:
        for step in steps or sorted(dumped):
            frame = load_rollout_batch(Path(client.download_artifacts(run_id, dumped[step], tmp)))
            frames.append(frame.assign(step=step) if "step" not in frame.columns else frame)
    return pd.concat(frames, ignore_index=True)


def run_batch(tracking_uri: str, run_id: str, step: int | None = None) -> tuple[pd.DataFrame, str]:
    """The rollout batch run `run_id` dumped at `step` (default: its first dumped step, the predictor's "one
    rollout batch"), validated, with a source label for messages (errors as `run_batches`)."""
    chosen = step if step is not None else min(_run_steps(tracking_uri, run_id)[1])
    return run_batches(tracking_uri, run_id, [chosen]), f"run {run_id} step {chosen}"


def trajectory_records(frame: pd.DataFrame) -> Iterator[dict]:
    """One plain-JSON record per trajectory (numpy scalars and arrays as Python values), in the frame's order."""
    import numpy as np

    def plain(value):  # noqa: ANN001, ANN202
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, list | tuple | np.ndarray):
            return [plain(item) for item in value]
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, float) and value != value:  # NaN: JSON has none
            return None
        return value

    for record in frame.to_dict(orient="records"):
        yield {key: plain(value) for key, value in record.items()}


def prompt_rv(batches: dict[str, pd.DataFrame], metric: str = "var") -> pd.DataFrame:
    """Per-prompt reward variance (``metric``: var | std) of every step of every batch: columns
    :data:`RV_COLUMNS`. Steps whose groups cannot have a variance (one trajectory per prompt) are left out."""
    import pandas as pd

    from recipes.stats.filtering import group_stats
    from recipes.stats.rollouts import iter_steps

    parts = []
    for run_id, frame in batches.items():
        for step, rows in iter_steps(frame, f"run {run_id}"):
            try:
                stats = group_stats(rows["reward"].to_numpy(), rows["prompt_id"].to_numpy())
            except ValueError:
                continue
            parts.append(
                pd.DataFrame({"run_id": run_id, "step": step, "prompt_id": stats.keys, "rv": stats.score(metric)})
            )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(RV_COLUMNS))
