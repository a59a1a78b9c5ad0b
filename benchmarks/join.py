"""``horizon join``'s speed beside a plain pyarrow script doing the same join, on the same files.

    .venv/bin/python benchmarks/join.py --quick     # 200,000 decisions, 2 rounds: make bench
    .venv/bin/python benchmarks/join.py             # 1,000,000 decisions, 3 rounds
    .venv/bin/python benchmarks/join.py --rows 300000 --rounds 5

The files, made in a temporary folder before any timing: a decision log of ``--rows``
decisions written as ``horizon serve`` writes it (``decision_rows`` and ``open_decision_log``,
4 state features, 3 actions, batches of 1,000 decisions spread over a day), once as JSONL and
once as a Parquet folder, the same rows in both; and one rewards JSONL of rows
``{"decision_id", "timestamp", "metrics": {"click": 1}}`` for half the decisions, a fifth of
those with a second row, 1% of the rows past the 48h window, and 0.5% more rows for unknown
decision_ids, shuffled.

Three cases, JSONL log to JSONL output, Parquet log to Parquet output and JSONL log to Parquet
output, ``--window 48h`` and ``--default click=0`` (every decision is written, with 0 where no
reward came):

- ``ours``: ``horizon join``'s command, in-process (``join_command``, the local engine,
  ``join_local``, and its report file);
- ``plain_arrow``: a plain script without our checks or counts: ``pyarrow.json.read_json``
  both files (``pq.read_table`` for the Parquet log), the rewards joined to the decisions'
  timestamps (``Table.join``), kept within the window, ``group_by(decision_id)`` summing the
  clicks, the decisions' keys left-joined on the sums (Arrow's join takes no struct or list
  column beside the keys, so the sums are put back in log order by a row number), nulls
  filled with 0, and written with pandas' ``to_json(orient="records", lines=True)`` (or one
  Parquet file in the output folder, its metrics a struct).

Each run is a fresh Python process (as ``horizon join`` runs), which imports pyarrow, pandas
and our join modules alike before its clock starts; its time runs from reading the files to
the output written. Both sides run with the same Arrow memory pool: the one ``horizon join``
gets (``horizon_engine.arrow_memory``: the C allocator's, unless ``ARROW_DEFAULT_MEMORY_POOL``
names another), or ``--pool``'s. It is named in each process's environment, as the process
imports pyarrow before the engine, and each side reports the pool it ran with. The sides take
turns, A B, B A, ...; the median is reported with the range, the process's CPU seconds, and
its peak resident memory (Linux's ``VmHWM``, imports included, the same in both). The first
round's outputs are checked outside the timing: the same decisions with the same click sums
on both sides, and the sums the generator meant.

Last, one line per case for ``run_all.py``:

    RESULT name=join_jsonl rows=1000000 ours_rows_per_s=... baseline=plain_arrow
    baseline_rows_per_s=... ratio=... ours_peak_mb=... baseline_peak_mb=... pool=system

``ratio``: ours over the baseline's rows (decisions) per second (above 1, ours is faster). The
JSONL-to-Parquet line also gives ``over_jsonl_output``: our seconds for it over our seconds for
JSONL to JSONL (what writing Parquet rather than JSONL costs us).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

ACTIONS = ["0", "1", "2"]
FEATURES = 4
BATCH = 1_000
"""Decisions per ``decision_rows`` call: one timestamp each, as one request's batch."""
DAY = 86_400
WINDOW = "48h"
WINDOW_SECONDS = 48 * 3600
START = datetime(2026, 11, 30, tzinfo=UTC)
SIDES = ("ours", "plain_arrow")
LOGS = {"jsonl": "decisions.jsonl", "parquet": "decisions.parquet"}
CASES = {
    "jsonl": ("jsonl", "joined.jsonl"),
    "parquet": ("parquet", "joined.parquet"),
    "jsonl_parquet": ("jsonl", "joined.parquet"),
}
"""Each case's log (a key of ``LOGS``) and output name (``.parquet``: a folder of parts)."""
QUICK = {"rows": 200_000, "rounds": 2}
POOLS = ("system", "mimalloc", "jemalloc")
"""Arrow's memory pools (``ARROW_DEFAULT_MEMORY_POOL``); jemalloc where pyarrow was built
with it."""


@dataclass
class Files:
    logs: dict[str, Path]
    rewards: Path
    reward_rows: int
    clicks: int
    """Clicks within the window on known decisions: what both sides' sums must add up to."""


def generate(folder: Path, rows: int, seed: int = 0) -> Files:
    """The decision logs (JSONL and Parquet, the same rows) and the rewards; see the docstring."""
    from horizon_plugins_serving.decision_log import decision_rows, open_decision_log

    rng = np.random.default_rng(seed)
    logs = {form: folder / name for form, name in LOGS.items()}
    batches = -(-rows // BATCH)
    ids: list[str] = []
    seconds = np.empty(rows, dtype=np.int64)
    with open_decision_log(logs["jsonl"]) as jsonl, open_decision_log(logs["parquet"]) as parquet:
        for batch in range(batches):
            count = min(BATCH, rows - batch * BATCH)
            at = batch * DAY // batches
            values = rng.normal(size=(count, FEATURES)).round(6).tolist()
            states = [dict(zip(map(str, range(FEATURES)), row, strict=True)) for row in values]
            actions = [ACTIONS[a] for a in rng.integers(0, len(ACTIONS), count)]
            logged = decision_rows(
                states,
                actions,
                [1 / len(ACTIONS)] * count,
                "0" * 16,
                all_actions=ACTIONS,
                now=START + timedelta(seconds=at),
            )
            jsonl.append(logged)
            parquet.append(logged)
            ids += [row["decision_id"] for row in logged]
            seconds[batch * BATCH : batch * BATCH + count] = at

    rewarded = np.flatnonzero(rng.random(rows) < 0.5)
    twice = rewarded[rng.random(len(rewarded)) < 0.2]
    owners = np.concatenate([rewarded, twice])
    delays = rng.uniform(0, DAY, len(owners))  # within a day: inside the window
    late = rng.random(len(owners)) < 0.01
    delays[late] = rng.uniform(WINDOW_SECONDS + 3600, 3 * DAY, int(late.sum()))
    unknown = max(1, rows // 200)
    reward_ids = [ids[i] for i in owners] + [uuid.uuid4().hex for _ in range(unknown)]
    times = np.concatenate([seconds[owners] + delays, rng.uniform(0, 2 * DAY, unknown)])
    stamps = np.datetime64(START.replace(tzinfo=None)) + (times * 1e6).astype("timedelta64[us]")
    texts = np.datetime_as_string(stamps, unit="us")
    order = rng.permutation(len(reward_ids))
    rewards = folder / "rewards.jsonl"
    with open(rewards, "w", encoding="utf-8") as handle:
        handle.writelines(
            f'{{"decision_id":"{reward_ids[i]}","timestamp":"{texts[i]}+00:00",'
            '"metrics":{"click":1}}\n'
            for i in order
        )
    return Files(logs, rewards, len(reward_ids), int((~late).sum()))


# --- the two sides ----------------------------------------------------------------------------


def join_ours(log: Path, rewards: Path, output: Path) -> None:
    """``horizon join LOG REWARDS -o OUTPUT --window 48h --default click=0``, in-process."""
    from horizon_plugins_serving.join import join_command

    arguments = [str(log), str(rewards), "-o", str(output), "--window", WINDOW]
    with contextlib.redirect_stdout(io.StringIO()):  # its summary
        join_command.main([*arguments, "--default", "click=0"], standalone_mode=False)


def join_plain_arrow(log: Path, rewards: Path, output: Path) -> None:
    """The same join as a plain pyarrow script: no checks, no counts, no report."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    decisions = pq.read_table(log) if log.is_dir() else pj.read_json(log)
    stamp = pa.timestamp("us", tz="UTC")
    keys = pa.table(
        {
            "decision_id": decisions["decision_id"],
            "decided": decisions["timestamp"].cast(stamp),
            "row": np.arange(decisions.num_rows),
        }
    )
    table = pj.read_json(rewards)
    got = pa.table(
        {
            "decision_id": table["decision_id"],
            "timestamp": table["timestamp"].cast(stamp),
            "click": pc.struct_field(table["metrics"], "click"),
        }
    ).join(keys, "decision_id", join_type="inner")
    delay = pc.subtract(got["timestamp"].cast(pa.int64()), got["decided"].cast(pa.int64()))
    within = pc.and_(pc.greater_equal(delay, 0), pc.less_equal(delay, WINDOW_SECONDS * 10**6))
    sums = got.filter(within).group_by("decision_id").aggregate([("click", "sum")])
    joined = keys.join(sums, "decision_id", join_type="left outer").sort_by("row")
    clicks = joined["click_sum"].fill_null(0).combine_chunks()
    metrics = pa.StructArray.from_arrays([clicks], ["click"])
    result = decisions.append_column("metrics", metrics)
    if output.name.endswith(".parquet"):
        output.mkdir()
        pq.write_table(result, output / "part-0.parquet")
    else:
        result.to_pandas().to_json(output, orient="records", lines=True)


def run_side(side: str, log: Path, rewards: Path, output: Path) -> dict[str, float | str]:
    """One join by ``side``, timed in this process: seconds, CPU seconds, peak memory, and
    the Arrow memory pool it ran with."""
    import pandas  # noqa: F401 (both sides import the same before the clock)
    import pyarrow as pa
    import pyarrow.compute
    import pyarrow.json
    import pyarrow.parquet

    import horizon_plugins_serving.join  # noqa: F401

    join = join_ours if side == "ours" else join_plain_arrow
    started, cpu_started = time.perf_counter(), time.process_time()
    join(log, rewards, output)
    return {
        "seconds": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "peak_mb": peak_memory_mb(),
        "pool": pa.default_memory_pool().backend_name,
    }


def peak_memory_mb() -> float:
    """Peak resident memory of this process in MB: Linux's VmHWM, which starts afresh at
    exec, where ``ru_maxrss`` keeps the peak of the parent the process was forked from."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def engine_pool() -> str:
    """The Arrow memory pool ``horizon join`` runs with: importing the engine before pyarrow
    names it in the environment, where the user has not named one."""
    if "pyarrow" in sys.modules:
        sys.exit("engine_pool must run before pyarrow is imported")
    from horizon_engine.arrow_memory import ARROW_POOL_VARIABLE

    return os.environ[ARROW_POOL_VARIABLE]


def measure_fresh(
    side: str, log: Path, rewards: Path, output: Path, pool: str
) -> dict[str, float | str]:
    """One join by ``side`` in a fresh Python process whose Arrow memory pool is ``pool``."""
    from horizon_engine.arrow_memory import ARROW_POOL_VARIABLE

    command = [sys.executable, __file__, "--measure", side]
    command += ["--log", str(log), "--rewards", str(rewards), "--output", str(output)]
    environment = os.environ | {ARROW_POOL_VARIABLE: pool}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    if done.returncode:
        sys.exit(f"{side} failed:\n{done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    if run["pool"] != pool:
        sys.exit(f"{side} ran with Arrow's {run['pool']} memory pool, not {pool}")
    return run


# --- the check --------------------------------------------------------------------------------


def click_sums(output: Path) -> tuple[np.ndarray, np.ndarray]:
    """decision_ids and click sums of a joined output (JSONL, or a Parquet folder whose
    metrics are a map or a struct), sorted by decision_id."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pq.read_table(output) if output.is_dir() else pj.read_json(output)
    metrics = table["metrics"].combine_chunks()
    if pa.types.is_map(metrics.type):
        clicks = pc.map_lookup(metrics, "click", "first")
    else:
        clicks = pc.struct_field(metrics, "click")
    order = pc.sort_indices(table["decision_id"])
    ids = table["decision_id"].take(order).to_numpy(zero_copy_only=False)
    return ids, clicks.take(order).to_numpy(zero_copy_only=False).astype(np.float64)


def check(outputs: dict[str, Path], rows: int, clicks: int) -> str:
    """'' when both sides wrote every decision with the same click sums, adding up to
    ``clicks``; else what differs."""
    (ours_ids, ours), (their_ids, theirs) = (click_sums(outputs[side]) for side in SIDES)
    if len(ours_ids) != rows or len(their_ids) != rows:
        return f"{len(ours_ids):,} and {len(their_ids):,} rows written, not {rows:,}"
    if not np.array_equal(ours_ids, their_ids):
        return "the decision_ids differ"
    if not np.array_equal(ours, theirs):
        return f"{int((ours != theirs).sum()):,} click sums differ"
    if ours.sum() != clicks:
        return f"{ours.sum():,.0f} clicks joined, where the generator meant {clicks:,}"
    return ""


# --- the report -------------------------------------------------------------------------------


@dataclass
class Figures:
    """One side's joins of one case."""

    seconds: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    peak_mb: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def report(figures: dict[tuple[str, str], Figures], rows: int, rounds: int, pool: str) -> None:
    print(
        f"\n{'case':<13} {'side':<12} {'seconds (median, range)':>26} {'rows/s':>11} "
        f"{'CPU s':>6} {'peak MB':>8}"
    )
    for (case, side), runs in figures.items():
        spread = f"{runs.median:.2f} ({min(runs.seconds):.2f}-{max(runs.seconds):.2f})"
        print(
            f"{case:<13} {side:<12} {spread:>26} {rows / runs.median:>11,.0f} "
            f"{statistics.median(runs.cpu_s):>6.2f} {max(runs.peak_mb):>8,.0f}"
        )
    print(f"(each the median of {rounds} joins of {rows:,} decisions; CPU s: of the process)\n")
    for case in dict.fromkeys(case for case, _ in figures):
        ours, theirs = figures[(case, "ours")], figures[(case, "plain_arrow")]
        fields = {
            "name": f"join_{case}",
            "rows": rows,
            "ours_rows_per_s": f"{rows / ours.median:.0f}",
            "baseline": "plain_arrow",
            "baseline_rows_per_s": f"{rows / theirs.median:.0f}",
            "ratio": f"{theirs.median / ours.median:.2f}",
            "ours_peak_mb": f"{max(ours.peak_mb):.0f}",
            "baseline_peak_mb": f"{max(theirs.peak_mb):.0f}",
            "pool": pool,
        }
        if case == "jsonl_parquet" and ("jsonl", "ours") in figures:
            fields["over_jsonl_output"] = f"{ours.median / figures[('jsonl', 'ours')].median:.2f}"
        print("RESULT " + " ".join(f"{key}={value}" for key, value in fields.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="decisions in the log")
    parser.add_argument("--rounds", type=int, default=3, help="joins of each side, per case")
    parser.add_argument("--quick", action="store_true", help="200,000 decisions, 2 rounds")
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), help="cases to run"
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        help="Arrow memory pool of both sides (default: the one horizon join gets)",
    )
    parser.add_argument("--measure", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--log", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rewards", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(run_side(args.measure, args.log, args.rewards, args.output)))
        return
    if args.quick:
        args.rows, args.rounds = QUICK["rows"], QUICK["rounds"]
    pool = args.pool or engine_pool()
    print(
        f"horizon join of {args.rows:,} decisions ({FEATURES} features, {len(ACTIONS)} "
        f"actions), --window {WINDOW}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}, Arrow's {pool} memory pool on both sides"
    )
    figures: dict[tuple[str, str], Figures] = {}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        started = time.perf_counter()
        files = generate(folder, args.rows)
        print(
            f"generated in {time.perf_counter() - started:.1f} s (not counted): "
            f"{files.reward_rows:,} reward rows, {files.clicks:,} clicks within the window"
        )
        for case in args.cases:
            log, output_name = CASES[case]
            for turn in range(args.rounds):
                outputs = {}
                for side in SIDES if turn % 2 == 0 else SIDES[::-1]:
                    outputs[side] = folder / f"{side}-{output_name}"
                    run = measure_fresh(side, files.logs[log], files.rewards, outputs[side], pool)
                    runs = figures.setdefault((case, side), Figures())
                    runs.seconds.append(run["seconds"])
                    runs.cpu_s.append(run["cpu_s"])
                    runs.peak_mb.append(run["peak_mb"])
                if turn == 0:
                    problem = check(outputs, args.rows, files.clicks)
                    print(f"{case}: both sides join the same click sums: {problem or 'yes'}")
                    if problem:
                        sys.exit(1)
                for output in outputs.values():
                    if output.is_dir():
                        shutil.rmtree(output)
                    else:
                        output.unlink()
                    output.with_name(f"_{output.name}.report.json").unlink(missing_ok=True)
    report(figures, args.rows, args.rounds, pool)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
