"""Timeline throughput: the local engine beside Spark local, on the same generated rows.

    .venv/bin/python benchmarks/timeline.py                 # 1,000,000 rows, both engines
    .venv/bin/python benchmarks/timeline.py --rows 200000 --engines local --repeats 5

Generates pre-timeline rows (CartPole-like: 4 state features, 2 discrete actions, a metrics
map, episodes of ``--episode-length`` steps) as the source stage writes them, in the order
``--order`` says: ``shuffled`` (the worst case, every row in a random place) or ``episode``
(each episode's rows together, as a logger that writes per session does). Each engine then
builds the timeline (train and eval Parquet) in a fresh subprocess, so that its peak memory is
its own. Spark's time excludes starting the session (timed separately) and includes reading
and writing Parquet, as the local engine's does. Prints rows/s, seconds, peak memory and the
ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from horizon_engine.plugins import PluginHost
from horizon_engine.schema import ActionType, RowFormat, RowLayout

ACTIONS = ["0", "1"]


def generate(path: Path, rows: int, episode_length: int, order: str, seed: int = 0) -> None:
    """Write ``rows`` pre-timeline rows to ``path`` with the source stage's schema."""
    rng = np.random.default_rng(seed)
    features = 4
    episode = np.arange(rows) // episode_length
    step = np.arange(rows) % episode_length
    state = pa.MapArray.from_arrays(
        pa.array(np.arange(0, rows * features + 1, features, dtype=np.int32)),
        pa.array(np.tile([str(i) for i in range(features)], rows)),
        pa.array(rng.normal(size=rows * features)),
    )
    metrics = pa.MapArray.from_arrays(
        pa.array(np.arange(rows + 1, dtype=np.int32)),
        pa.array(np.full(rows, "reward", dtype=object)),
        pa.array(np.ones(rows)),
    )
    possible = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 2 * rows + 1, 2, dtype=np.int32)),
        pa.array(np.tile(ACTIONS, rows)),
    )
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    table = pa.Table.from_arrays(
        [
            pa.array(np.full(rows, "2019-01-01", dtype=object)),
            pa.array(episode.astype(str)),
            pa.array(step),
            state,
            pa.array(np.array(ACTIONS)[rng.integers(0, 2, rows)]),
            pa.array(np.full(rows, 0.5)),
            pa.array(np.ones(rows)),
            metrics,
            possible,
        ],
        schema=layout.schema,
    )
    if order == "shuffled":
        table = table.take(pa.array(rng.permutation(rows)))
    pq.write_table(table, path)


def peak_memory_mb(pid: int | None = None) -> float:
    """Peak resident memory of this process, or of process ``pid`` (from /proc), in MB."""
    if pid is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Run:
    seed = 0


def measure(engine: str, rows: Path) -> dict[str, float]:
    """Build the timeline of ``rows`` with one engine, in this process; time and memory."""
    host = PluginHost()
    component = host.component("transforms", "timeline", engine)
    transform = component.cls(component.cls.Config(actions=ACTIONS, eval_fraction=0.1))
    result: dict[str, float] = {}
    if engine == "spark":
        from horizon_plugins_spark import SparkOptions, spark_session

        started = time.perf_counter()
        session = spark_session(SparkOptions())
        result["session_start_s"] = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "timeline"
        output.mkdir()
        started = time.perf_counter()
        built = transform.build(_Run(), rows, output, ActionType.DISCRETE, quarantine=False)
        result["seconds"] = time.perf_counter() - started
    result["rows_out"] = built.train_rows + built.eval_rows
    result["peak_mb"] = peak_memory_mb()
    if engine == "spark":
        gateway = session.sparkContext._gateway
        result["jvm_peak_mb"] = peak_memory_mb(gateway.proc.pid)
        session.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--episode-length", type=int, default=50)
    parser.add_argument("--order", choices=["shuffled", "episode"], default="shuffled")
    parser.add_argument("--engines", default="local,spark")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="fresh processes per engine; the median is reported, with the range",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, Path(args.input))))
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory() as folder:
        rows = Path(folder) / "rows.parquet"
        generate(rows, args.rows, args.episode_length, args.order)
        print(
            f"timeline of {args.rows:,} {args.order} rows "
            f"(episodes of {args.episode_length}, 4 features, 2 actions), "
            f"{os.cpu_count()} cores"
        )
        results = {}
        for engine in args.engines.split(","):
            command = [sys.executable, __file__, "--measure", engine, "--input", str(rows)]
            runs = []
            for _ in range(args.repeats):
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            runs.sort(key=lambda run: run["seconds"])
            results[engine] = {**runs[len(runs) // 2], "fastest": runs[0]["seconds"]}
            results[engine]["slowest"] = runs[-1]["seconds"]
    for engine, result in results.items():
        line = (
            f"{engine:>6}: {args.rows / result['seconds']:>12,.0f} rows/s  "
            f"{result['seconds']:6.2f} s (median of {args.repeats}, "
            f"{result['fastest']:.2f}-{result['slowest']:.2f})  "
            f"peak {result['peak_mb']:,.0f} MB (Python process)"
        )
        if "jvm_peak_mb" in result:
            line += (
                f", {result['jvm_peak_mb']:,.0f} MB (JVM); "
                f"session start {result['session_start_s']:.1f} s not counted"
            )
        print(line)
    if {"local", "spark"} <= results.keys():
        ratio = results["spark"]["seconds"] / results["local"]["seconds"]
        print(f"local engine is {ratio:.1f}x the speed of Spark local on this machine")


if __name__ == "__main__":
    main()
