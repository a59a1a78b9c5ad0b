"""Timeline throughput: each engine beside a plain script building the same table, by size.

    .venv/bin/python benchmarks/timeline.py --quick   # a few minutes: what `make bench` runs
    .venv/bin/python benchmarks/timeline.py           # 10^5, 10^6, 10^7 rows, every builder
    .venv/bin/python benchmarks/timeline.py --sizes 1e5 1e6 --engines local plain_arrow

Five builders, in three pairs, each pair on the same rows in the same run:

- ``local``, the local engine (``[timeline] engine = "local"``), through the transform's
  ``build``, beside ``plain_arrow``: a plain pyarrow/numpy script (sort by episode and step,
  next rows by shifted takes, n-step arrays by a flat index, one file per split);
- ``local_buckets``, the local engine out of core (``max_memory_gb`` set so that it cuts the
  rows into ``BUCKETS`` buckets of episodes), beside ``plain_arrow`` too: what building out of
  core costs in time, and what it saves in peak memory (``peak_mb`` on its RESULT line);
- ``spark``, the Spark engine (``engine = "spark"``), through the transform's ``build``,
  beside ``plain_spark``: a plain PySpark script (one window per episode: ``lead``,
  ``row_number``, ``collect_list`` over a 3-row frame; a global sort before the write).

The rows are pre-timeline rows as the source stage writes them (row groups of 256k rows):
CartPole-like, 4 state features, 2 discrete actions, a metrics map, episodes of 50 steps, in
``--order``: ``shuffled`` (every row in a random place, the worst case) or ``episode``. Every
builder makes the default timeline (3-step windows, a 10% eval split) and its time runs from
reading the rows to both splits written. The baselines build the same table as the engines:
checked on 10^4 rows before the timing (``--no-check`` skips it).

``local`` and ``plain_arrow`` build in a fresh process each time, as ``horizon run`` does
(the memory it touches is its own, and on a VM touching fresh memory can cost as much as the
arithmetic), in turns A B, B A, ...; the median is reported with the range, and the CPU
seconds of the process beside it (on a loaded machine, what the build did rather than what it
waited for). Spark's two run in one process on one session, whose start is reported apart and
not counted, after a warm-up build of each, in the same alternating turns.

Prints a table, then one line per pair and size for machines to read, e.g.

    RESULT name=timeline_local rows=1000000 ours_rows_per_s=... baseline_rows_per_s=...
    ratio=... growth_per_10x=... baseline_growth_per_10x=...

``ratio``: ours over the baseline's rows per second (above 1, ours is faster);
``growth_per_10x``: the time at this size over the time at the size before, scaled to 10 times
the rows (10 is linear growth; none at the first size).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from horizon_engine.pipeline import ROW_GROUP_ROWS
from horizon_engine.plugins import PluginHost
from horizon_engine.schema import ActionType, RowFormat, RowLayout
from horizon_engine.timeline import DEFAULT_N_STEP, timeline_schema

ACTIONS = ["0", "1"]
FEATURES = 4
SEED = 0
EVAL_FRACTION = 0.1
CHECK_ROWS = 10_000
"""Rows the baselines are checked on, against the engines; Spark's warm-up builds, too."""
PAIRS = {"local": "plain_arrow", "local_buckets": "plain_arrow", "spark": "plain_spark"}
"""Each engine and the baseline it is measured against."""
BUILDERS = list(dict.fromkeys([*PAIRS, *PAIRS.values()]))
BUCKETS = 8
"""``local_buckets``: the local engine out of core, its ``max_memory_gb`` set so as to cut the
rows into this many buckets."""
SPARK_BUILDERS = ("spark", "plain_spark")
QUICK = {"sizes": [100_000, 1_000_000], "spark_sizes": [100_000], "repeats": 3}
"""``--quick``: every builder, Spark's at the smallest size only, 3 builds of each."""


def generate(
    path: Path,
    rows: int,
    episode_length: int,
    order: str,
    seed: int = 0,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> None:
    """Write ``rows`` pre-timeline rows to ``path`` as the source stage writes them (in row
    groups of ``row_group_rows``)."""
    rng = np.random.default_rng(seed)
    episode = np.arange(rows) // episode_length
    step = np.arange(rows) % episode_length
    names = pa.array([str(feature) for feature in range(FEATURES)])
    state = pa.MapArray.from_arrays(
        pa.array(np.arange(0, rows * FEATURES + 1, FEATURES, dtype=np.int32)),
        names.take(np.tile(np.arange(FEATURES), rows)),
        pa.array(rng.normal(size=rows * FEATURES)),
    )
    metrics = pa.MapArray.from_arrays(
        pa.array(np.arange(rows + 1, dtype=np.int32)),
        pa.array(["reward"]).take(np.zeros(rows, dtype=np.int64)),
        pa.array(np.ones(rows)),
    )
    actions = pa.array(ACTIONS)
    possible = pa.ListArray.from_arrays(
        pa.array(np.arange(0, len(ACTIONS) * rows + 1, len(ACTIONS), dtype=np.int32)),
        actions.take(np.tile(np.arange(len(ACTIONS)), rows)),
    )
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    columns = [
        pa.array(["2019-01-01"]).take(np.zeros(rows, dtype=np.int64)),
        pc.cast(pa.array(episode), pa.string()),
        pa.array(step),
        state,
        actions.take(rng.integers(0, len(ACTIONS), rows)),
        pa.array(np.full(rows, 0.5)),
        pa.array(np.ones(rows)),
        metrics,
        possible,
        pa.array(np.zeros(rows, dtype=bool)),
    ]
    table = pa.Table.from_arrays(
        [column.cast(field.type) for column, field in zip(columns, layout.schema, strict=True)],
        schema=layout.schema,
    )
    if order == "shuffled":
        table = table.take(rng.permutation(rows))
    pq.write_table(table, path, row_group_size=row_group_rows)


class _Run:
    """What a timeline engine reads of the run: its seed."""

    seed = SEED


def build_plain_arrow(rows: Path, output: Path) -> None:
    """The timeline of these rows as a plain pyarrow/numpy script builds it (no rejected rows,
    no filters to handle): the local engine's baseline."""
    table = pq.read_table(rows)
    table = table.sort_by([("mdp_id", "ascending"), ("sequence_number", "ascending")])
    table = table.combine_chunks()
    count = table.num_rows
    mdp_id = table["mdp_id"].chunk(0)
    sequence = table["sequence_number"].to_numpy()
    first = np.ones(count, dtype=bool)
    first[1:] = pc.not_equal(mdp_id[1:], mdp_id[:-1]).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(first)
    episode = np.cumsum(first) - 1
    has_next = np.append(~first[1:], False)
    following = pa.array(np.arange(1, count + 1), mask=~has_next)
    names = pa.array(ACTIONS)
    action = pc.index_in(table["action"], value_set=names).to_numpy().astype(np.int64)
    possible = table["possible_actions"].chunk(0)
    masks = np.zeros((count, len(ACTIONS)), dtype=np.int8)
    chosen = pc.index_in(pc.list_flatten(possible), value_set=names).to_numpy()
    masks[pc.list_parent_indices(possible).to_numpy(), chosen] = 1
    lengths = pc.list_value_length(possible).fill_null(0).to_numpy()
    masks[lengths == 0] = 1
    next_masks = masks[np.minimum(np.arange(1, count + 1), count - 1)] * has_next[:, None]
    time_diff = np.where(has_next, np.append(np.diff(sequence), 0), 0)
    reward = table["reward"].to_numpy()
    state = table["state_features"].chunk(0)

    def next_states(at: pa.Array) -> pa.Array:
        taken = state.take(at)  # null where the episode ends: an empty map there
        return pa.MapArray.from_arrays(taken.offsets, taken.keys, taken.items)

    def mask_lists(matrix: np.ndarray) -> pa.Array:
        offsets = np.arange(0, matrix.size + 1, len(ACTIONS), dtype=np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(matrix.ravel()))

    remaining = (starts[episode] + np.bincount(episode)[episode]) - np.arange(count)
    counts = np.minimum(remaining, DEFAULT_N_STEP)
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    flat = np.repeat(np.arange(count), counts) + np.arange(offsets[-1])
    flat -= np.repeat(offsets[:-1], counts)
    windows = {
        "next_n_rewards": pa.array(reward[flat]),
        "next_n_time_diffs": pa.array(time_diff[flat]),
        "next_n_state_features": next_states(pa.array(flat + 1, mask=~has_next[flat])),
        "next_n_not_terminal": pa.array(has_next[flat]),
        "next_n_possible_next_actions": mask_lists(next_masks[flat]),
    }
    columns = {
        **{name: table[name].chunk(0) for name in ("ds", "mdp_id", "metrics")},
        "sequence_number": pa.array(sequence),
        "state_features": state,
        "action": pa.array(action),
        "action_probability": table["action_probability"].chunk(0),
        "reward": pa.array(reward),
        "possible_actions": mask_lists(masks),
        "sequence_number_ordinal": pa.array(np.arange(count) - starts[episode] + 1),
        "time_since_first": pa.array(sequence - sequence[starts[episode]]),
        "next_state_features": next_states(following),
        "next_action": pa.array(action).take(following),
        "time_diff": pa.array(time_diff),
        "not_terminal": pa.array(has_next),
        "possible_next_actions": mask_lists(next_masks),
        **{
            name: pa.ListArray.from_arrays(pa.array(offsets), values)
            for name, values in windows.items()
        },
    }
    schema = timeline_schema(ActionType.DISCRETE, DEFAULT_N_STEP)
    timeline = pa.Table.from_arrays(
        [columns[field.name].cast(field.type) for field in schema], schema=schema
    )
    episodes = pc.unique(mdp_id).to_pylist()
    held_out = [name for name in episodes if _split_value(name) < EVAL_FRACTION]
    is_eval = pc.is_in(timeline["mdp_id"], value_set=pa.array(held_out, pa.string()))
    for split, rows_of_split in (("train", pc.invert(is_eval)), ("eval", is_eval)):
        (output / split).mkdir()
        pq.write_table(timeline.filter(rows_of_split), output / split / "part-0.parquet")


def _split_value(mdp_id: str) -> float:
    digest = hashlib.md5(f"{SEED}:{mdp_id}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16) / 2**32


def build_plain_spark(rows: Path, output: Path) -> None:
    """The timeline of these rows as a plain PySpark script builds it, on the active session:
    the Spark engine's baseline."""
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    spark = SparkSession.getActiveSession()
    names = F.array(*(F.lit(name) for name in ACTIONS))
    logged = F.col("possible_actions")
    mask = F.when(
        logged.isNull() | (F.size(logged) == 0),
        F.array_repeat(F.lit(1).cast("tinyint"), len(ACTIONS)),
    ).otherwise(F.transform(names, lambda name: F.array_contains(logged, name).cast("tinyint")))
    frame = spark.read.parquet(f"file:{rows}").select(
        "ds",
        "mdp_id",
        "sequence_number",
        "state_features",
        (F.array_position(names, F.col("action")) - 1).alias("action"),
        "action_probability",
        "reward",
        "metrics",
        mask.alias("possible_actions"),
    )
    episode = Window.partitionBy("mdp_id").orderBy("sequence_number")
    next_sequence = F.lead("sequence_number").over(episode)
    frame = frame.select(
        "*",
        F.row_number().over(episode).alias("sequence_number_ordinal"),
        (F.col("sequence_number") - F.first("sequence_number").over(episode)).alias(
            "time_since_first"
        ),
        F.coalesce(
            F.lead("state_features").over(episode), F.create_map().cast("map<string,double>")
        ).alias("next_state_features"),
        F.lead("action").over(episode).alias("next_action"),
        F.coalesce(next_sequence - F.col("sequence_number"), F.lit(0).cast("bigint")).alias(
            "time_diff"
        ),
        next_sequence.isNotNull().alias("not_terminal"),
        F.coalesce(
            F.lead("possible_actions").over(episode),
            F.array_repeat(F.lit(0).cast("tinyint"), len(ACTIONS)),
        ).alias("possible_next_actions"),
    )
    window = episode.rowsBetween(0, DEFAULT_N_STEP - 1)
    steps = {
        "next_n_rewards": "reward",
        "next_n_time_diffs": "time_diff",
        "next_n_state_features": "next_state_features",
        "next_n_not_terminal": "not_terminal",
        "next_n_possible_next_actions": "possible_next_actions",
    }
    frame = frame.select(
        "*", *(F.collect_list(column).over(window).alias(name) for name, column in steps.items())
    )
    digest = F.md5(F.concat(F.lit(f"{SEED}:"), F.col("mdp_id")))
    split_value = F.conv(F.substring(digest, 1, 8), 16, 10).cast("double") / float(2**32)
    frame = frame.withColumn("is_eval", split_value < F.lit(EVAL_FRACTION))
    written = output / "splits"
    frame.orderBy("is_eval", "mdp_id", "sequence_number").write.partitionBy("is_eval").parquet(
        f"file:{written}"
    )
    for split, folder in (("train", "is_eval=false"), ("eval", "is_eval=true")):
        (written / folder).rename(output / split)


def builder(name: str, rows: Path) -> Callable[[Path, Path], None]:
    """What builds the timeline of ``rows`` for ``name``: found before the clock starts."""
    if name == "plain_arrow":
        return build_plain_arrow
    if name == "plain_spark":
        return build_plain_spark
    component = PluginHost().component("timeline_engines", name.removesuffix("_buckets"))
    config = component.cls.Config(actions=ACTIONS, eval_fraction=EVAL_FRACTION)
    if name == "local_buckets":
        config = config.model_copy(update={"max_memory_gb": memory_for_buckets(rows)})
    transform = component.cls(config)
    return lambda rows, output: transform.build(
        _Run(), rows, output, ActionType.DISCRETE, quarantine=False
    )


def timed_build(name: str, rows: Path) -> tuple[float, float]:
    """Seconds ``name`` takes to build the timeline of ``rows`` (in a folder then removed),
    and the CPU seconds this process spent on it (all its threads)."""
    build = builder(name, rows)
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "timeline"
        output.mkdir()
        started, cpu_started = time.perf_counter(), time.process_time()
        build(rows, output)
        return time.perf_counter() - started, time.process_time() - cpu_started


def same_table(first: Path, second: Path) -> str:
    """'' when two timeline folders hold the same rows (values, in the timeline's types), else
    what differs."""
    schema = timeline_schema(ActionType.DISCRETE, DEFAULT_N_STEP)
    keys = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
    for split in ("train", "eval"):
        tables = [
            pq.read_table(folder / split).select(schema.names).sort_by(keys).cast(schema)
            for folder in (first, second)
        ]
        if tables[0].num_rows != tables[1].num_rows:
            return f"{split}: {tables[0].num_rows} rows against {tables[1].num_rows}"
        for name in schema.names:
            if not tables[0][name].equals(tables[1][name]):
                return f"{split}: column {name} differs"
    return ""


def check_baseline(engine: str, rows: Path) -> str:
    """The engine's and its baseline's timelines of ``rows`` compared (see ``same_table``)."""
    with tempfile.TemporaryDirectory() as folder:
        outputs = [Path(folder) / engine, Path(folder) / PAIRS[engine]]
        for name, output in zip((engine, PAIRS[engine]), outputs, strict=True):
            output.mkdir()
            builder(name, rows)(rows, output)
        return same_table(*outputs)


def measure_fresh(name: str, rows: Path) -> dict[str, float]:
    """One build by ``name`` in a fresh Python process: its seconds and peak memory."""
    command = [sys.executable, __file__, "--measure", name, "--input", str(rows)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def spark_runs(
    names: list[str], inputs: list[str], repeats: int, warm_up: str, check: bool
) -> dict:
    """Spark's builders on one session, in this process: a warm-up build of each on the
    ``warm_up`` rows (compared, with ``check``), then alternating turns at every size."""
    from horizon_plugins_spark import SparkOptions, spark_session

    started = time.perf_counter()
    session = spark_session(SparkOptions(conf={"spark.driver.memory": "4g"}))
    report: dict = {"session_start_s": time.perf_counter() - started, "runs": {}}
    if check and set(SPARK_BUILDERS) <= set(names):
        report["check"] = check_baseline("spark", Path(warm_up))
    else:
        for name in names:
            timed_build(name, Path(warm_up))
    for rows in inputs:
        runs: dict[str, list[float]] = {name: [] for name in names}
        for turn in range(repeats):
            for name in names if turn % 2 == 0 else names[::-1]:
                runs[name].append(timed_build(name, Path(rows))[0])
        report["runs"][rows] = runs
    session.stop()
    return report


@dataclass
class Figures:
    """One builder's builds at one size."""

    seconds: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    """CPU seconds of the building process (not Spark's JVM)."""
    peak_mb: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def memory_for_buckets(rows: Path) -> float:
    """The local engine's ``max_memory_gb`` that cuts ``rows`` into ``BUCKETS`` buckets."""
    from horizon_engine.builtin.timeline import (
        BUILD_MEMORY_FIXED_BYTES,
        BUILD_MEMORY_PER_SOURCE_BYTE,
    )

    metadata = pq.read_metadata(rows)
    source_bytes = sum(
        metadata.row_group(group).total_byte_size for group in range(metadata.num_row_groups)
    )
    share = source_bytes * BUILD_MEMORY_PER_SOURCE_BYTE / (BUCKETS - 0.5)
    return (BUILD_MEMORY_FIXED_BYTES + share) / 2**30


def peak_text(built: Figures) -> str:
    return f"{max(built.peak_mb):.0f}" if built.peak_mb else "nan"


def peak_memory_mb() -> float:
    """Peak resident memory of this process in MB: Linux's VmHWM, which starts afresh at
    exec, where ``ru_maxrss`` keeps the peak of the parent the process was forked from."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def growth_per_10x(rows: int, seconds: float, before: tuple[int, float] | None) -> float:
    """Time over the time at the size before, scaled to 10 times the rows (10: linear)."""
    if before is None:
        return math.nan
    return (seconds / before[1]) ** (1 / math.log10(rows / before[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7])
    parser.add_argument(
        "--spark-sizes", nargs="+", type=float, help="sizes for Spark's builders (--sizes)"
    )
    parser.add_argument("--engines", nargs="+", choices=BUILDERS, default=BUILDERS)
    parser.add_argument("--repeats", type=int, default=5, help="builds of each, per size")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10^5 and 10^6 rows, Spark's builders at 10^5 only, 3 builds of each",
    )
    parser.add_argument("--episode-length", type=int, default=50)
    parser.add_argument("--order", choices=["shuffled", "episode"], default="shuffled")
    parser.add_argument("--no-check", action="store_true", help="skip the baselines' check")
    parser.add_argument("--measure", choices=BUILDERS, help=argparse.SUPPRESS)
    parser.add_argument("--spark-runs", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        seconds, cpu_seconds = timed_build(args.measure, Path(args.input))
        print(json.dumps({"seconds": seconds, "cpu_s": cpu_seconds, "peak_mb": peak_memory_mb()}))
        return
    if args.spark_runs:
        print(json.dumps(spark_runs(**json.loads(args.spark_runs))))
        return
    if args.quick:
        args.sizes, args.spark_sizes, args.repeats = (
            QUICK["sizes"],
            QUICK["spark_sizes"],
            QUICK["repeats"],
        )
    sizes = sorted({int(size) for size in args.sizes})
    spark_sizes = sorted({int(size) for size in args.spark_sizes or sizes})
    local_names = [name for name in args.engines if name not in SPARK_BUILDERS]
    spark_names = [name for name in args.engines if name in SPARK_BUILDERS]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    print(
        f"timeline of {args.order} rows (episodes of {args.episode_length}, {FEATURES} "
        f"features, {len(ACTIONS)} actions, {DEFAULT_N_STEP}-step windows), "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    figures: dict[tuple[str, int], Figures] = {}
    with tempfile.TemporaryDirectory() as folder:
        inputs = {}
        for rows in sorted({*sizes, *spark_sizes, CHECK_ROWS}):
            inputs[rows] = Path(folder) / f"rows-{rows}.parquet"
            generate(inputs[rows], rows, args.episode_length, args.order)
        if not args.no_check and {"local", "plain_arrow"} <= set(local_names):
            problem = check_baseline("local", inputs[CHECK_ROWS])
            print(f"plain_arrow builds the local engine's table: {problem or 'yes'}")
        for rows in sizes:
            for turn in range(args.repeats if local_names else 0):
                for name in local_names if turn % 2 == 0 else local_names[::-1]:
                    run = measure_fresh(name, inputs[rows])
                    built = figures.setdefault((name, rows), Figures())
                    built.seconds.append(run["seconds"])
                    built.cpu_s.append(run["cpu_s"])
                    built.peak_mb.append(run["peak_mb"])
        if spark_names and spark_sizes:
            options = {
                "names": spark_names,
                "inputs": [str(inputs[rows]) for rows in spark_sizes],
                "repeats": args.repeats,
                "warm_up": str(inputs[CHECK_ROWS]),
                "check": not args.no_check,
            }
            command = [sys.executable, __file__, "--spark-runs", json.dumps(options)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                # The other figures still stand; say why Spark's are missing.
                print(f"Spark's builders failed:\n{done.stderr[-3000:]}")
            else:
                record_spark(json.loads(done.stdout.strip().splitlines()[-1]), figures, inputs)
    report_figures(figures, args.repeats)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def record_spark(
    report: dict, figures: dict[tuple[str, int], Figures], inputs: dict[int, Path]
) -> None:
    """Print what ``spark_runs`` reported beside the times, and add the times to ``figures``."""
    if "check" in report:
        print(f"plain_spark builds the Spark engine's table: {report['check'] or 'yes'}")
    print(f"Spark session start (not counted): {report['session_start_s']:.1f} s")
    for rows, path in inputs.items():
        for name, seconds in report["runs"].get(str(path), {}).items():
            figures[(name, rows)] = Figures(seconds)


def report_figures(figures: dict[tuple[str, int], Figures], repeats: int) -> None:
    """The table of every builder and size, then a RESULT line per pair and size."""
    print(
        f"\n{'builder':<12} {'rows':>11} {'seconds (median, range)':>26} {'rows/s':>11} "
        f"{'growth/10x':>10} {'CPU s':>6} {'peak MB':>8}"
    )
    before: dict[str, tuple[int, float]] = {}
    growth: dict[tuple[str, int], float] = {}
    for (name, rows), built in sorted(figures.items(), key=lambda item: item[0]):
        seconds = built.median
        growth[(name, rows)] = growth_per_10x(rows, seconds, before.get(name))
        before[name] = (rows, seconds)
        spread = f"{seconds:.2f} ({min(built.seconds):.2f}-{max(built.seconds):.2f})"
        cpu = f"{statistics.median(built.cpu_s):.2f}" if built.cpu_s else "-"
        peak = f"{max(built.peak_mb):,.0f}" if built.peak_mb else "-"
        change = growth[(name, rows)]
        change_text = "-" if math.isnan(change) else f"{change:.1f}"
        print(
            f"{name:<12} {rows:>11,} {spread:>26} {rows / seconds:>11,.0f} "
            f"{change_text:>10} {cpu:>6} {peak:>8}"
        )
    print(
        f"(each the median of {repeats} builds; growth/10x: 10 is linear; CPU s: of the "
        "building Python process, all threads)\n"
    )
    for engine, baseline in PAIRS.items():
        for rows in sorted({rows for name, rows in figures if name == engine}):
            ours = figures[(engine, rows)].median
            theirs = figures[(baseline, rows)].median if (baseline, rows) in figures else None
            fields = {
                "name": f"timeline_{engine}",
                "rows": rows,
                "ours_rows_per_s": f"{rows / ours:.0f}",
                "baseline": baseline,
                "baseline_rows_per_s": f"{rows / theirs:.0f}" if theirs else "nan",
                "ratio": f"{theirs / ours:.2f}" if theirs else "nan",
                "growth_per_10x": f"{growth[(engine, rows)]:.2f}",
                "baseline_growth_per_10x": (f"{growth[(baseline, rows)]:.2f}" if theirs else "nan"),
                "peak_mb": peak_text(figures[(engine, rows)]),
                "baseline_peak_mb": peak_text(figures.get((baseline, rows), Figures())),
            }
            print("RESULT " + " ".join(f"{key}={value}" for key, value in fields.items()))


if __name__ == "__main__":
    main()
