"""Parity: the local and the Spark engine build identical timeline tables from the same rows.

100,000 generated rows in shuffled order, with every feature of the transform switched on at
once (reward weights, gaps in sequence numbers, one-row episodes, rows without possible
actions, n-step arrays, the outlier and time-window filters, an eval split), are built by
both engines; the tables, sorted, must be equal value for value and have one schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.pipeline import Engine
from horizon_engine.schema import ActionType, RowFormat, RowLayout

pytestmark = pytest.mark.spark

ROWS = 100_000
ACTIONS = ["left", "right", "stay"]


def generated_rows(path: Path, rows: int = ROWS) -> None:
    """Episodes of 1 to 60 rows, sequence numbers with gaps, shuffled, as JSON-free Parquet;
    every fourth episode was cut by a time limit (``truncated`` on its last row)."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 61, size=rows)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), rows) + 1]
    lengths[-1] -= lengths.sum() - rows
    episode = np.repeat(np.arange(len(lengths)), lengths)
    step_in_episode = np.arange(rows) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    sequence = step_in_episode * 2 + (rng.random(rows) < 0.2)
    features = 3
    state = pa.MapArray.from_arrays(
        pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32)),
        pa.array(np.tile(["0", "1", "2"], rows)),
        pa.array(rng.normal(size=rows * features)),
    )
    metrics = pa.MapArray.from_arrays(
        pa.array(np.arange(0, 2 * rows + 1, 2, dtype=np.int32)),
        pa.array(np.tile(["clicks", "cost"], rows)),
        pa.array(rng.exponential(size=2 * rows)),
    )
    possible = [
        None if rng.random() < 0.1 else sorted(rng.choice(ACTIONS, 2, replace=False).tolist())
        for _ in range(rows)
    ]
    action = [
        rng.choice(ACTIONS) if choices is None else rng.choice(choices) for choices in possible
    ]
    last = step_in_episode == lengths[episode] - 1
    truncated = np.where(last & (episode % 4 == 0), True, None)
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    table = pa.Table.from_arrays(
        [
            pa.array(["2019-01-01"] * rows),
            pa.array([f"user{e}" for e in episode]),
            pa.array(sequence),
            state,
            pa.array(action),
            pa.array(rng.uniform(0.1, 1.0, rows)),
            pa.array(rng.normal(size=rows)),
            metrics,
            pa.array(possible, pa.list_(pa.string())),
            pa.array(truncated, pa.bool_()),
        ],
        schema=layout.schema,
    )
    pq.write_table(table.take(pa.array(rng.permutation(rows))), path)


def parity_config(output_dir: Path, source: Path, engine: str) -> dict[str, Any]:
    """The pipeline that builds ``source``'s timeline with every filter on, in ``output_dir``."""
    return {
        "pipeline": {"output_dir": str(output_dir), "seed": 5},
        "source": {"kind": "parquet", "path": str(source)},
        "timeline": {
            "engine": engine,
            "actions": ACTIONS,
            "reward": {"clicks": 1.0, "cost": -0.25},
            "n_step": 3,
            "outlier_episode_length_percentile": 95,
            "time_window_limit": 100,
            "eval_fraction": 0.2,
        },
    }


def read_timeline(output_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """A run's timeline splits, sorted, and its timeline stage's report, to compare."""
    folder = output_dir / "timeline"
    keys = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
    tables: dict[str, Any] = {
        split: pq.read_table(folder / split).sort_by(keys) for split in ("train", "eval")
    }
    tables["manifest"] = manifest["stages"]["timeline"]
    return tables


def build(tmp_path: Path, source: Path, engine: str) -> dict[str, Any]:
    manifest = Engine(show_progress=False).run(parity_config(tmp_path / engine, source, engine))
    return read_timeline(tmp_path / engine, manifest)


def assert_same_timeline(local: dict[str, Any], on_spark: dict[str, Any]) -> None:
    """The two builds' splits are equal value for value, in one schema, with the same counts."""
    for split in ("train", "eval"):
        assert local[split].num_rows > 0
        assert on_spark[split].schema.equals(local[split].schema, check_metadata=False)
        assert on_spark[split].equals(local[split]), split
    local_stage, spark_stage = local["manifest"], on_spark["manifest"]
    assert spark_stage["dropped"] == local_stage["dropped"]
    assert set(local_stage["dropped"]) == {"outlier_episode", "time_window", "truncated"}
    for key in ("train_rows", "eval_rows", "train_episodes", "eval_episodes"):
        assert spark_stage["details"][key] == local_stage["details"][key], key


def test_local_and_spark_build_the_same_table(tmp_path, spark):
    source = tmp_path / "rows.parquet"
    generated_rows(source)
    local = build(tmp_path, source, "local")
    on_spark = build(tmp_path, source, "spark")
    assert_same_timeline(local, on_spark)
