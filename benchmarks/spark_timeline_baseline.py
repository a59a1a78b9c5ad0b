"""The anchor for the Spark timeline engine: the timeline as a plain PySpark script would build it.

    from spark_timeline_baseline import build_plain_timeline   # benchmarks/ on sys.path
    rows_out = build_plain_timeline(spark, "rows.parquet", "out/", actions=["0", "1"], n_step=3)

What a data engineer writes by hand for Horizon's timeline of logged discrete decisions: read
the pre-timeline Parquet rows, turn the action names into indices and masks, one window per
episode (``mdp_id`` ordered by ``sequence_number``) with ``lead()`` for the next row's state,
action and possible actions, ``row_number()`` and ``first()`` for the ordinal and the time since
the first row, a frame of the next ``n_step`` rows collected into the n-step arrays, and one
Parquet write of the timeline's columns. Nothing more: no check of unknown actions or missing
rewards, no filters or counts of dropped rows, no train/eval split, no sort across files, no
nullable schema. That is the floor the engine's guarantees are measured against (issue 11:
the engine at >= 0.8x this script's rows/s, on the same session and rows).

    .venv/bin/python benchmarks/spark_timeline_baseline.py --rows 100000,1000000 --repeats 3
    .venv/bin/python benchmarks/spark_timeline_baseline.py --rows 1000000,10000000 --repeats 1

runs this script and the engine (``[timeline] engine = "spark"``, default options) in one
local[2] session on the same generated rows (CartPole-like, as ``benchmarks/timeline.py``
makes them: 4 state features, 2 actions, episodes of 50 steps, rows shuffled), interleaved
(A B, B A, ...) after one uncounted warm-up round on ``WARM_UP_ROWS`` rows, and prints the
medians of each, their ratio and, per size, a RESULT line as ``benchmarks/timeline.py`` prints
them. The session start is timed apart and not counted.

The rows are written to disk a chunk at a time, and each build's output is deleted once
counted, so that 10^7 rows fit a small machine: what the benchmark holds in memory is one chunk,
what it holds on disk is the rows and one output.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession


def build_plain_timeline(
    spark: SparkSession,
    rows_path: str | Path,
    output_path: str | Path,
    actions: Sequence[str],
    n_step: int = 3,
) -> None:
    """Build the timeline of the pre-timeline Parquet rows at ``rows_path`` into ``output_path``.

    The columns are the engine's discrete timeline (``timeline_schema(DISCRETE, n_step)``),
    computed with the same window functions; ``output_path`` must not exist.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    names = F.array(*(F.lit(name) for name in actions))
    rows = spark.read.parquet(str(rows_path)).select(
        "ds",
        "mdp_id",
        "sequence_number",
        "state_features",
        (F.array_position(names, F.col("action")) - 1).alias("action"),
        "action_probability",
        "reward",
        "metrics",
        F.transform(
            names, lambda name: F.array_contains("possible_actions", name).cast("tinyint")
        ).alias("possible_actions"),
    )
    episode = Window.partitionBy("mdp_id").orderBy("sequence_number")
    next_sequence_number = F.lead("sequence_number").over(episode)
    not_terminal = next_sequence_number.isNotNull()
    timeline = rows.select(
        "*",
        F.row_number().over(episode).alias("sequence_number_ordinal"),
        (F.col("sequence_number") - F.first("sequence_number").over(episode)).alias(
            "time_since_first"
        ),
        F.when(not_terminal, F.lead("state_features").over(episode))
        .otherwise(F.create_map().cast("map<string,double>"))
        .alias("next_state_features"),
        F.lead("action").over(episode).alias("next_action"),
        F.coalesce(next_sequence_number - F.col("sequence_number"), F.lit(0).cast("bigint")).alias(
            "time_diff"
        ),
        not_terminal.alias("not_terminal"),
        F.coalesce(
            F.lead("possible_actions").over(episode),
            F.array_repeat(F.lit(0).cast("tinyint"), len(actions)),
        ).alias("possible_next_actions"),
    )
    if n_step > 1:
        following = episode.rowsBetween(0, n_step - 1)
        steps = {
            "next_n_rewards": "reward",
            "next_n_time_diffs": "time_diff",
            "next_n_state_features": "next_state_features",
            "next_n_not_terminal": "not_terminal",
            "next_n_possible_next_actions": "possible_next_actions",
        }
        timeline = timeline.select(
            "*",
            *(F.collect_list(column).over(following).alias(name) for name, column in steps.items()),
        )
    timeline.write.parquet(str(output_path))


# --- the side-by-side measurement -----------------------------------------------------------

ACTIONS = ["0", "1"]
WARM_UP_ROWS = 100_000
"""Rows of the uncounted round that warms the JVM's code for both sides."""
CHUNK_ROWS = 1_000_000
"""Rows generated and written at a time (at most): whole episodes, shuffled within the chunk."""
CHUNK_VALUES = 20_000_000
"""State feature values generated at a time (at most): with 100 features a chunk is 200,000
rows, as many values as a million rows of 20 features."""


def generate_rows(
    path: Path, rows: int, episode_length: int = 50, seed: int = 0, features: int = 4
) -> None:
    """Write ``rows`` pre-timeline rows with ``features`` state features to ``path`` in the
    source stage's schema, a chunk of ``CHUNK_ROWS`` rows or ``CHUNK_VALUES`` values at a time,
    each chunk's rows shuffled (an episode never spans two chunks); ``benchmarks/scaling.py``
    generates its rows with it."""
    import numpy as np
    import pyarrow.parquet as pq

    from horizon_engine import ActionType, RowFormat, RowLayout

    rng = np.random.default_rng(seed)
    schema = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE).schema
    chunk_rows = min(CHUNK_ROWS, CHUNK_VALUES // features)
    chunk_rows = max(chunk_rows - chunk_rows % episode_length, episode_length)
    with pq.ParquetWriter(path, schema) as writer:
        for first in range(0, rows, chunk_rows):
            count = min(chunk_rows, rows - first)
            chunk = _chunk(first, count, episode_length, features, rng)
            writer.write_table(chunk.cast(schema))


def _chunk(
    first: int, rows: int, episode_length: int, features: int, rng: np.random.Generator
) -> pa.Table:
    """Rows ``first`` .. ``first + rows`` of the generated log, shuffled."""
    import numpy as np
    import pyarrow as pa

    from horizon_engine import ActionType, RowFormat, RowLayout

    index = np.arange(first, first + rows)
    state = pa.MapArray.from_arrays(
        pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32)),
        # Taken from the names rather than converted from numpy strings, which pyarrow splits
        # into chunks past 2^24 values (a map's keys must be one array).
        pa.array([str(i) for i in range(features)]).take(
            pa.array(np.tile(np.arange(features, dtype=np.int32), rows))
        ),
        pa.array(rng.normal(size=rows * features)),
    )
    columns = {
        "ds": pa.array(np.full(rows, "2019-01-01", dtype=object)),
        "mdp_id": pa.array((index // episode_length).astype(str)),
        "sequence_number": pa.array(index % episode_length),
        "state_features": state,
        "action": pa.array(np.array(ACTIONS)[rng.integers(0, len(ACTIONS), rows)]),
        "action_probability": pa.array(np.full(rows, 0.5)),
        "reward": pa.array(np.ones(rows)),
        "metrics": pa.MapArray.from_arrays(
            pa.array(np.arange(rows + 1, dtype=np.int32)),
            pa.array(np.full(rows, "reward", dtype=object)),
            pa.array(np.ones(rows)),
        ),
        "possible_actions": pa.ListArray.from_arrays(
            pa.array(np.arange(0, len(ACTIONS) * rows + 1, len(ACTIONS), dtype=np.int32)),
            pa.array(np.tile(ACTIONS, rows)),
        ),
    }
    schema = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE).schema
    arrays = [columns.get(field.name, pa.nulls(rows, field.type)) for field in schema]
    return pa.Table.from_arrays(arrays, schema=schema).take(pa.array(rng.permutation(rows)))


def spark_engine() -> Callable[[Path, Path], None]:
    """The engine's build of rows into a fresh folder, as the pipeline's timeline stage calls it,
    its plugin found and configured beforehand (as the stage does, before it is timed)."""
    from horizon_engine import ActionType
    from horizon_engine.plugins import PluginHost

    class Run:
        seed = 0

    component = PluginHost().component("timeline_engines", "spark")
    transform = component.cls(component.cls.Config(actions=ACTIONS))

    def build(rows: Path, output: Path) -> None:
        output.mkdir()
        transform.build(Run(), rows, output, ActionType.DISCRETE, quarantine=False)

    return build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated sizes")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per size")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g", help="the local session's JVM heap")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from horizon_plugins_spark import SparkOptions, spark_session

    started = time.perf_counter()
    conf = {"spark.ui.enabled": False, "spark.driver.memory": args.driver_memory}
    spark = spark_session(SparkOptions(master=args.master, conf=conf))
    print(
        f"session start {time.perf_counter() - started:.1f} s (not counted), {args.master}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    sides = {
        "plain": lambda rows, out: build_plain_timeline(spark, rows, out, ACTIONS),
        "engine": spark_engine(),
    }

    def timed(name: str, rows: Path, size: int) -> float:
        """Seconds of one build by ``name``, whose output is counted, then deleted."""
        output = rows.with_name(f"out-{name}")
        started = time.perf_counter()
        sides[name](rows, output)
        elapsed = time.perf_counter() - started
        written = spark.read.option("recursiveFileLookup", True).parquet(str(output)).count()
        assert written == size, f"{name} wrote {written:,} rows of {size:,}"
        shutil.rmtree(output)
        return elapsed

    with tempfile.TemporaryDirectory() as folder:
        warm_up = Path(folder) / "rows-warm-up.parquet"
        generate_rows(warm_up, WARM_UP_ROWS)
        for name in sides:
            timed(name, warm_up, WARM_UP_ROWS)
        before: dict[str, tuple[int, float]] = {}
        for size in (int(text) for text in args.rows.split(",")):
            rows = Path(folder) / f"rows-{size}.parquet"
            generate_rows(rows, size)
            seconds: dict[str, list[float]] = {name: [] for name in sides}
            for repeat in range(args.repeats):
                for name in list(sides) if repeat % 2 else list(reversed(sides)):
                    seconds[name].append(timed(name, rows, size))
            rows.unlink()
            medians = {name: statistics.median(times) for name, times in seconds.items()}
            for name, times in seconds.items():
                print(
                    f"{size:>10,} rows  {name:>6}: {size / medians[name]:>9,.0f} rows/s  "
                    f"{medians[name]:6.2f} s (median of {len(times)}, "
                    f"{min(times):.2f}-{max(times):.2f})"
                )
            print(f"{size:>10,} rows  engine / plain: {medians['plain'] / medians['engine']:.2f}x")
            growth = {name: growth_per_10x(size, medians[name], before.get(name)) for name in sides}
            fields = {
                "name": "timeline_spark",
                "rows": size,
                "ours_rows_per_s": f"{size / medians['engine']:.0f}",
                "baseline": "plain_pyspark",
                "baseline_rows_per_s": f"{size / medians['plain']:.0f}",
                "ratio": f"{medians['plain'] / medians['engine']:.2f}",
                "growth_per_10x": f"{growth['engine']:.2f}",
                "baseline_growth_per_10x": f"{growth['plain']:.2f}",
            }
            print("RESULT " + " ".join(f"{key}={value}" for key, value in fields.items()))
            before = {name: (size, medians[name]) for name in sides}
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    spark.stop()


def growth_per_10x(rows: int, seconds: float, before: tuple[int, float] | None) -> float:
    """Time over the time at the size before, scaled to 10 times the rows (10: linear; nan at
    the first size)."""
    if before is None:
        return math.nan
    return (seconds / before[1]) ** (1 / math.log10(rows / before[0]))


if __name__ == "__main__":
    main()
