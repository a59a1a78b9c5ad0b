"""Parity: the local and the Spark engine build identical timeline tables from the same rows.

100,000 generated rows in shuffled order, with every feature of the transform switched on at
once (reward weights, gaps in sequence numbers, one-row episodes, rows without possible
actions, n-step arrays, the outlier and time-window filters, an eval split), are built by
both engines; the tables, sorted, must be equal value for value and have one schema.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.pipeline import Engine
from horizon_engine.schema import ActionType, RowFormat, RowLayout

pytestmark = pytest.mark.spark

ROWS = 100_000
ACTIONS = ["left", "right", "stay"]


def generated_rows(path: Path) -> None:
    """Episodes of 1 to 60 rows, sequence numbers with gaps, shuffled, as JSON-free Parquet;
    every fourth episode was cut by a time limit (``truncated`` on its last row)."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 61, size=ROWS)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), ROWS) + 1]
    lengths[-1] -= lengths.sum() - ROWS
    episode = np.repeat(np.arange(len(lengths)), lengths)
    step_in_episode = np.arange(ROWS) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    sequence = step_in_episode * 2 + (rng.random(ROWS) < 0.2)
    features = 3
    state = pa.MapArray.from_arrays(
        pa.array(np.arange(0, ROWS * features + 1, features, dtype=np.int32)),
        pa.array(np.tile(["0", "1", "2"], ROWS)),
        pa.array(rng.normal(size=ROWS * features)),
    )
    metrics = pa.MapArray.from_arrays(
        pa.array(np.arange(0, 2 * ROWS + 1, 2, dtype=np.int32)),
        pa.array(np.tile(["clicks", "cost"], ROWS)),
        pa.array(rng.exponential(size=2 * ROWS)),
    )
    possible = [
        None if rng.random() < 0.1 else sorted(rng.choice(ACTIONS, 2, replace=False).tolist())
        for _ in range(ROWS)
    ]
    action = [
        rng.choice(ACTIONS) if choices is None else rng.choice(choices) for choices in possible
    ]
    last = step_in_episode == lengths[episode] - 1
    truncated = np.where(last & (episode % 4 == 0), True, None)
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    table = pa.Table.from_arrays(
        [
            pa.array(["2019-01-01"] * ROWS),
            pa.array([f"user{e}" for e in episode]),
            pa.array(sequence),
            state,
            pa.array(action),
            pa.array(rng.uniform(0.1, 1.0, ROWS)),
            pa.array(rng.normal(size=ROWS)),
            metrics,
            pa.array(possible, pa.list_(pa.string())),
            pa.array(truncated, pa.bool_()),
        ],
        schema=layout.schema,
    )
    pq.write_table(table.take(pa.array(rng.permutation(ROWS))), path)


def build(tmp_path: Path, source: Path, engine: str) -> dict[str, pa.Table]:
    config = {
        "pipeline": {"output_dir": str(tmp_path / engine), "seed": 5},
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
    manifest = Engine(show_progress=False).run(config)
    folder = tmp_path / engine / "timeline"
    keys = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
    tables = {split: pq.read_table(folder / split).sort_by(keys) for split in ("train", "eval")}
    tables["manifest"] = manifest["stages"]["timeline"]
    return tables


def test_local_and_spark_build_the_same_table(tmp_path, spark):
    source = tmp_path / "rows.parquet"
    generated_rows(source)
    local = build(tmp_path, source, "local")
    on_spark = build(tmp_path, source, "spark")
    for split in ("train", "eval"):
        assert local[split].num_rows > 0
        assert on_spark[split].schema.equals(local[split].schema, check_metadata=False)
        assert on_spark[split].equals(local[split]), split
    local_stage, spark_stage = local["manifest"], on_spark["manifest"]
    assert spark_stage["dropped"] == local_stage["dropped"]
    assert set(local_stage["dropped"]) == {"outlier_episode", "time_window", "truncated"}
    for key in ("train_rows", "eval_rows", "train_episodes", "eval_episodes"):
        assert spark_stage["details"][key] == local_stage["details"][key], key
