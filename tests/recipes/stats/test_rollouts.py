"""Rollout-batch loading and validation in every supported format."""

from __future__ import annotations

import pandas as pd
import pytest

from orchlib.errors import OrchError
from recipes.stats.rollouts import iter_steps, load_rollout_batch, write_rollout_batch

FRAME = pd.DataFrame(
    {
        "step": [1, 1, 1, 1, 2, 2, 2, 2],
        "prompt_id": ["a", "a", "b", "b", "a", "a", "b", "b"],
        "reward": [1.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.0, 1.0],
        "success": [True, False, False, False, True, True, False, True],
    }
)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json", ".csv"])
def test_roundtrip_every_format(tmp_path, suffix):
    path = write_rollout_batch(FRAME, tmp_path / f"batch{suffix}")
    loaded = load_rollout_batch(path)
    assert loaded["reward"].tolist() == FRAME["reward"].tolist()
    assert loaded["prompt_id"].tolist() == FRAME["prompt_id"].tolist()
    assert [s for s, _ in iter_steps(loaded, str(path))] == [1, 2]


def test_json_array_of_records_is_read(tmp_path):
    path = tmp_path / "batch.json"
    FRAME.to_json(path, orient="records")
    assert len(load_rollout_batch(path)) == len(FRAME)


def test_unknown_step_lists_available_steps(tmp_path):
    frame = load_rollout_batch(write_rollout_batch(FRAME, tmp_path / "b.csv"))
    with pytest.raises(OrchError, match="step 7 not in the file; available steps: 1, 2"):
        list(iter_steps(frame, "b.csv", 7))
    with pytest.raises(OrchError, match="no 'step' column"):
        list(iter_steps(FRAME.drop(columns="step"), "b.csv", 1))


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("prompt_id,score\na,1\n", ".csv", "missing required column.*reward.*found: prompt_id, score"),
        ("prompt_id,reward\na,1\na,oops\n", ".csv", "column 'reward' must hold finite numbers; row 1 has 'oops'"),
        ("prompt_id,reward\na,1\na,\n", ".csv", "row 1"),
        ("prompt_id,reward\n", ".csv", "no rows"),
        ("prompt_id,reward,step\na,1,1.5\na,2,1\n", ".csv", "'step' must hold integers"),
        ('{"prompt_id": "a", "reward": 1}\n{not json\n', ".jsonl", "cannot read as jsonl"),
        ("a,b\n", ".tsv", "unknown rollout-batch format '.tsv'; valid extensions: .parquet, .jsonl, .json, .csv"),
        ("not parquet", ".parquet", "cannot read as parquet"),
    ],
)
def test_bad_files_give_one_clear_error(tmp_path, content, suffix, message):
    path = tmp_path / f"batch{suffix}"
    path.write_text(content)
    with pytest.raises(OrchError, match=message) as info:
        load_rollout_batch(path)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(OrchError, match="no such rollout-batch file"):
        load_rollout_batch(tmp_path / "nope.parquet")
