"""``horizon join DECISIONS REWARDS -o JOINED --window 48h``: attach late rewards to decisions.

A decision log (``horizon score``'s or ``horizon serve``'s: JSONL, or Parquet, a file or a
directory of part files) holds one row per decision under a ``decision_id``; a rewards file
(JSONL or Parquet) holds rows ``{"decision_id", "timestamp", "metrics": {name: number}}`` that
arrive later, any number per decision. A reward counts when ``0 <= reward.timestamp -
decision.timestamp <= window``; the values of one metric are summed per decision. JOINED holds
every decision row as it was logged plus ``metrics``: a pre-timeline row that ``horizon run``
reads as its ``[source]``, with ``[timeline] reward`` weighting the metrics. A decision that no
reward reached within the window gets the ``--default`` metrics, or with ``--drop-unrewarded``
is left out; both are counted.

Nothing is held as a Python object per row: the local engine keeps the join's keys, the rewards
and the sums as Arrow arrays. A decision log that fits ``--max-memory-gb`` (``read_once``) is
read once, its chunks kept from the pass that plans the join to the write; a larger one is
streamed twice, chunk by chunk (once for the keys, once to write), holding only the keys. The
rewards are read meanwhile on a thread of their own, where the process may run on three cores
or more (``threads_help``; on two, after the log). A chunk of JSON lines is read by Arrow's
JSON reader, and line by line only where it holds a torn or bad line, to name it; a written
line is the logged text with its metrics added; for a Parquet JOINED a pass reads every field
with the keys, so that no line is parsed twice in a pass, and row groups are written on a
thread of their own where the rewards are read on one. Streamed, memory grows with the
decisions: about 50 bytes each for the keys, and one hash table of their ids and the
rewards' (a join of 1M decisions and 500k rewards peaks at about 560 MB).
``--engine spark`` runs the same join on a SparkSession (``join_spark``) and writes the same
rows, for logs larger than that.

Every count lands in ``_JOINED.report.json`` and in the printed summary: a torn last line of
the log (a crash mid-write; only the last line, without its newline, can be one) and rewards
outside the window or for an unknown decision are counted, not fatal; a repeated decision_id
keeps its first row only. A line that is not a whole JSON object elsewhere in the log, a reward
row without a decision_id, with a timestamp that is not ISO 8601 with a zone, or with a metric
that is not a finite number fails the command naming its file and line, or with
``--skip-bad-rows`` is counted and skipped.

Before anything is read, the command refuses what would destroy or confuse its own inputs or a
user's files (``join_writer.check_outputs``, ``join_readers.check_input``): JOINED or its report
on an input however spelt (``..``, a link, a hard link) or inside an input's folder, a folder
where a file belongs, a report file a join did not write, and a ``--default`` that breaks the
rule of every row's values.

This module holds the command and the local engine's join: the plan of the first pass and each
chunk's metrics. The report is ``join_report``'s, the row checks ``join_rows``', the reading
``join_readers``' and the writing ``join_writer``'s.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING, Any

import click

from horizon_engine import (
    FLOAT32_MAX,
    atomic_output,
    command,
    memory_budget,
    number_problem,
    text_problem,
)
from horizon_plugins_serving.join_readers import (
    DecisionChunk,
    DecisionLogReader,
    Rewards,
    check_input,
    ignored_files,
    is_parquet,
    log_memory,
    read_rewards,
)
from horizon_plugins_serving.join_report import SHOWN, BadRows, JoinReport, report_path
from horizon_plugins_serving.join_writer import (
    JoinedWriter,
    check_outputs,
    first_row_types,
    threads_help,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_WINDOW = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str) -> float:
    """Seconds in a window written as a number and a unit: ``3600s``, ``90m``, ``48h``, ``2d``."""
    match = _WINDOW.match(text)
    if match is None:
        raise ValueError(
            f"window {text!r} is not a number followed by s, m, h or d (e.g. 48h, 90m, 2d, 3600s)"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


class WindowType(click.ParamType):
    """``--window``: a duration as ``parse_window`` reads it, in seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        try:
            return parse_window(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class MemoryType(click.ParamType):
    """``--max-memory-gb``: a size in GiB above 0, or ``auto``."""

    name = "gib"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "auto" or isinstance(value, float):
            return value
        try:
            size = float(value)
        except ValueError:
            size = math.nan
        if not size > 0 or not math.isfinite(size):
            self.fail(f'{value!r}: give a size in GiB above 0, or "auto"', param, ctx)
        return size


def parse_defaults(pairs: Sequence[str]) -> dict[str, float]:
    """``--default METRIC=VALUE`` pairs as a map; none given means ``reward=0``.

    A default is a metric the joined rows hold as a reward row's would, so it follows the
    rule of every row's values (``horizon_engine.number_problem``: finite, within float32)
    and its name that of every text (``text_problem``): a default the next run's source
    would quarantine on every defaulted row is refused here, before anything is joined.
    A metric given twice is refused too: which value was meant is not for the join to guess.
    """
    defaults: dict[str, float] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not sep or not name or math.isnan(value):
            raise ValueError(f"--default {pair!r}: expected METRIC=NUMBER, e.g. reward=0")
        problem = number_problem(value) or text_problem(name)
        if problem is not None:
            raise ValueError(f"--default {pair!r}: {problem}")
        if name in defaults:
            raise ValueError(f"--default {pair!r}: metric {name!r} is given a default twice")
        defaults[name] = value
    return defaults or {"reward": 0.0}


# --- the join ---------------------------------------------------------------------------------


@dataclass
class JoinPlan:
    """What the first pass decided, by position of a good decision row in the log."""

    first: np.ndarray
    """True for the first row of each decision_id."""
    rewarded: np.ndarray
    """True for a first row that a reward reached within the window."""
    positions: np.ndarray
    """Sorted positions of the summed metrics below, (position, metric) ascending."""
    metrics: pa.Table
    """metric (string), value (float64): one row per rewarded decision and metric name."""


def plan_join(
    keys: pa.Table,
    rewards: Rewards,
    window_seconds: float,
    report: JoinReport,
    bad: BadRows | None = None,
) -> JoinPlan:
    """Keep each decision_id's first row, classify every reward row against it, and sum the
    rewards within the window per decision and metric. ``keys``: decision_id and timestamp,
    in log order (a row's position is its index).

    One hash table answers both questions, "which row came first" and "which row is this
    reward's": the dictionary encoding of the decision_ids followed by the rewards' numbers
    them in the order they first come, so a decision row is first where its number is above
    every number before it, and a reward's number is its decision's (or, past the decisions',
    an unknown id's). The sums are a sort by (position, metric): no group-by table.
    """
    import numpy as np
    import pyarrow as pa

    count = keys.num_rows
    reward_ids = rewards.rows.column("decision_id")
    every_id = pa.chunked_array(
        keys.column("decision_id").chunks + reward_ids.chunks, pa.string()
    ).combine_chunks()
    encoded = every_id.dictionary_encode()
    every_number = encoded.indices.to_numpy(zero_copy_only=False)
    numbers, reward_numbers = every_number[:count], every_number[count:]
    highest_before = np.maximum.accumulate(np.concatenate([[-1], numbers[:-1]]))[:count]
    first = numbers > highest_before
    first_rows = np.flatnonzero(first)  # each decision's first row, by its number
    distinct = encoded.dictionary.slice(0, len(first_rows))
    report.decision_rows = count
    report.decisions = len(distinct)
    report.duplicate_decisions = count - len(distinct)
    repeated = np.unique(numbers[~first])  # by number: in the order of their first rows
    report.duplicate_ids = distinct.take(pa.array(repeated[:SHOWN], pa.int64())).to_pylist()

    known_rows = reward_numbers < len(first_rows)
    positions = np.full(len(known_rows), -1, dtype=np.int64)
    positions[known_rows] = first_rows[reward_numbers[known_rows]]
    decided = _micros(keys.column("timestamp"))[np.maximum(positions, 0)] if count else 0
    delay = np.where(known_rows, _micros(rewards.rows.column("timestamp")) - decided, 0)
    window = round(window_seconds * 1_000_000)
    early = known_rows & (delay < 0)
    late = known_rows & (delay > window)
    inside = known_rows & ~early & ~late
    report.reward_rows = len(known_rows)
    report.unknown_rewards = int((~known_rows).sum())
    report.early_rewards, report.late_rewards = int(early.sum()), int(late.sum())
    report.rewards_attached = int(inside.sum())
    report.unknown_ids = encoded.dictionary.slice(len(first_rows), SHOWN).to_pylist()

    rewarded = np.zeros(count, dtype=bool)
    rewarded[positions[inside]] = True
    report.rewarded = int(rewarded.sum())
    unrewarded = report.decisions - report.rewarded
    if report.default_metrics is None:
        report.dropped = unrewarded
    else:
        report.defaulted = unrewarded
    sums_at, names, sums = _sums(rewards.metrics, positions, inside)
    ids = keys.column("decision_id")
    _drop_unholdable_sums(ids, sums_at, names, sums, first, rewarded, report, bad)
    return JoinPlan(first, rewarded, sums_at, pa.table({"metric": names, "value": sums}))


def _micros(timestamps: pa.ChunkedArray) -> np.ndarray:
    """Timestamps (microseconds, no nulls) as int64 microseconds since the epoch."""
    import pyarrow as pa

    return timestamps.combine_chunks().cast(pa.int64()).to_numpy(zero_copy_only=False)


def _drop_unholdable_sums(
    ids: pa.ChunkedArray,
    sums_at: np.ndarray,
    names: pa.Array,
    sums: pa.Array,
    first: np.ndarray,
    rewarded: np.ndarray,
    report: JoinReport,
    bad: BadRows | None,
) -> None:
    """A decision whose summed metric training's float32 cannot hold (each reward fits, their
    sum does not) is a bad decision row: it fails the join naming the decision, or with
    ``--skip-bad-rows`` is counted and left out, rather than written for the next run's
    source stage to refuse (or, past float64, written as ``inf``, which is not JSON)."""
    import numpy as np

    values = sums.to_numpy(zero_copy_only=False)
    over = np.flatnonzero(~(np.abs(values) <= FLOAT32_MAX))
    if not len(over) or bad is None:
        return
    for entry in over:
        position = int(sums_at[entry])
        bad.found(
            f"decision {ids[position].as_py()!r}",
            f"metric {names[entry].as_py()!r} summed over its rewards: "
            f"{number_problem(float(values[entry]))}",
            "decision",
            position,
        )
    bad.flush()
    for position in np.unique(sums_at[over]):
        first[position] = rewarded[position] = False
        report.rewarded -= 1
        report.decisions -= 1
        report.decision_rows -= 1


def _sums(
    metrics: pa.Table, positions: np.ndarray, inside: np.ndarray
) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """The sum of each metric per decision over the reward rows ``inside`` the window, sorted
    by (decision position, metric name): positions, names and sums."""
    import numpy as np
    import pyarrow as pa

    parents = metrics.column("reward_row").to_numpy()
    kept = inside[parents] if len(parents) else np.zeros(0, dtype=bool)
    encoded = metrics.column("metric").combine_chunks().filter(pa.array(kept)).dictionary_encode()
    names = encoded.dictionary.to_numpy(zero_copy_only=False)
    rank = np.argsort(np.argsort(names)) if len(names) else np.zeros(0, np.int64)
    codes = rank[encoded.indices.to_numpy(zero_copy_only=False)].astype(np.int64)
    key = positions[parents[kept]] * max(len(names), 1) + codes
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.diff(key, prepend=-1)) if len(key) else np.zeros(0, np.int64)
    values = metrics.column("value").to_numpy()[kept][order]
    sums = np.add.reduceat(values, starts) if len(starts) else np.zeros(0)
    by_rank = np.sort(names) if len(names) else names
    return (
        key[starts] // max(len(names), 1),
        pa.array(by_rank[key[starts] % max(len(names), 1)], pa.string()),
        pa.array(sums, pa.float64()),
    )


def chunk_metrics(
    plan: JoinPlan, start: int, stop: int, defaults: dict[str, float] | None
) -> pa.MapArray:
    """The metrics map of each decision row at positions ``start`` to ``stop``: its summed
    rewards, or the defaults (empty where unrewarded rows are to be dropped)."""
    import numpy as np
    import pyarrow as pa

    low, high = np.searchsorted(plan.positions, [start, stop])
    rows = plan.positions[low:high] - start
    keys = plan.metrics.column("metric").slice(low, high - low)
    values = plan.metrics.column("value").slice(low, high - low)
    unrewarded = np.flatnonzero(~plan.rewarded[start:stop])
    if defaults:
        names = np.array(list(defaults), dtype=object)
        rows = np.concatenate([rows, np.repeat(unrewarded, len(names))])
        keys = pa.concat_arrays(
            [keys.combine_chunks(), pa.array(np.tile(names, len(unrewarded)), pa.string())]
        )
        values = pa.concat_arrays(
            [
                values.combine_chunks(),
                pa.array(np.tile(list(defaults.values()), len(unrewarded)), pa.float64()),
            ]
        )
        order = pa.array(np.argsort(rows, kind="stable"))
        keys, values = keys.take(order), values.take(order)
    else:
        keys, values = keys.combine_chunks(), values.combine_chunks()
    counts = np.bincount(rows, minlength=stop - start)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values)


KEPT_SHARE = 2
"""A decision log is read once when its chunks take at most the memory budget over this: the
rest holds the keys, the rewards, their hash table and the row group being written."""


def read_once(decisions: Path, budget: int, with_rows: bool = False) -> bool:
    """Whether the pass that plans the join keeps the log's chunks for the write: when they fit
    ``budget`` / ``KEPT_SHARE`` (``with_rows``: a JSONL log's chunks with its rows read by
    Arrow, for a Parquet JOINED)."""
    return log_memory(decisions, with_rows) * KEPT_SHARE <= budget


def _drained(kept: deque[DecisionChunk]) -> Iterator[DecisionChunk]:
    """The kept chunks in order, each let go as it is taken."""
    while kept:
        yield kept.popleft()


def _first_pass(
    log: DecisionLogReader,
    once: bool,
    row_types: Callable[[list[bytes]], pa.Schema | None] | None,
    rewards: Callable[[], Rewards],
) -> tuple[list[pa.Table], deque[DecisionChunk], Rewards]:
    """The log's keys, a table a chunk, and (``once``) its chunks; then ``rewards``' rewards,
    so that the log's bad rows fail the join before theirs."""
    import pyarrow as pa

    keys = []
    kept: deque[DecisionChunk] = deque()
    for chunk in log.chunks(keys_only=not once, row_types=row_types):
        keys.append(pa.table({"decision_id": chunk.decision_ids, "timestamp": chunk.timestamps}))
        if once:
            kept.append(chunk)
    return keys, kept, rewards()


def join_local(
    decisions: Path,
    rewards_path: Path,
    output: Path,
    window_seconds: float,
    defaults: dict[str, float] | None,
    skip_bad_rows: bool,
    max_memory_gb: float | str = "auto",
) -> JoinReport:
    """The local engine: Arrow tables for the keys and rewards; the log read once, or, when it
    does not fit ``max_memory_gb`` (``read_once``), twice."""
    import pyarrow as pa

    report = JoinReport("local", window_seconds, defaults, ignored_files=ignored_files(decisions))
    bad = BadRows(skip_bad_rows, report)
    log = DecisionLogReader(decisions, bad)
    to_parquet = is_parquet(output)
    once = read_once(decisions, memory_budget(max_memory_gb), with_rows=to_parquet)
    # Read once into Parquet, a JSONL chunk's rows are read with its keys, as JOINED's first
    # row will likely type them (the writer reads them again where it does not).
    row_types = first_row_types if once and to_parquet else None
    # The rewards' bad rows are counted apart and after the log's; where threads help, the
    # rewards are read on a thread of their own while the log is read (most of either is
    # Arrow's, without the GIL), else once the log is read.
    rewards_counted = JoinReport("local", window_seconds, defaults)
    rewards_bad = BadRows(skip_bad_rows, rewards_counted)
    if threads_help():
        failed = Event()
        with ThreadPoolExecutor(1, thread_name_prefix="join-rewards") as reading:
            rewards_read = reading.submit(read_rewards, rewards_path, rewards_bad, failed)
            try:
                keys, kept, rewards = _first_pass(log, once, row_types, rewards_read.result)
            except BaseException:  # a bad row, or Ctrl-C: the rewards stop at their next block
                failed.set()
                raise
    else:
        rewards_now = partial(read_rewards, rewards_path, rewards_bad)
        keys, kept, rewards = _first_pass(log, once, row_types, rewards_now)
    report.torn_lines, report.torn_line_numbers = log.torn, list(log.torn_lines)
    bad.add_rewards(rewards_counted)
    key_schema = pa.schema(
        [("decision_id", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC"))]
    )
    keys_table = pa.concat_tables(keys) if keys else key_schema.empty_table()
    plan = plan_join(keys_table, rewards, window_seconds, report, bad)
    del keys, keys_table, rewards
    quiet = BadRows(True, JoinReport("local", window_seconds, defaults))
    with atomic_output(output) as temporary:
        writer = JoinedWriter(temporary, to_parquet)
        chunks = (
            _drained(kept)
            if once
            else DecisionLogReader(decisions, quiet).chunks(row_types=writer.row_types)
        )
        try:
            start, planned = 0, len(plan.first)
            for read in chunks:
                # A live log grows between the passes (a torn last line completed, a new
                # part): the rows past those the first pass planned are the next join's.
                if start == planned:
                    break
                chunk = read.head(planned - start)
                stop = start + len(chunk.decision_ids)
                keep = plan.first[start:stop]
                if defaults is None:
                    keep = keep & plan.rewarded[start:stop]
                writer.write(chunk, chunk_metrics(plan, start, stop, defaults), keep)
                start = stop
        finally:
            writer.close()
    report.written = writer.written
    return report


@command("join")
@click.argument("decisions", type=click.Path(exists=True, path_type=Path))
@click.argument("rewards", type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="Joined rows to write: JSONL, or a Parquet directory when the name ends .parquet.",
)
@click.option(
    "--window",
    required=True,
    type=WindowType(),
    help="How long after its decision a reward still counts: 48h, 90m, 2d, 3600s.",
)
@click.option(
    "--default",
    "default_pairs",
    multiple=True,
    metavar="METRIC=VALUE",
    help="Metrics of a decision no reward reached in the window (repeatable; reward=0 if none).",
)
@click.option(
    "--drop-unrewarded", is_flag=True, help="Leave out decisions no reward reached (counted)."
)
@click.option(
    "--engine",
    type=click.Choice(["local", "spark"]),
    default="local",
    show_default=True,
    help="spark: the same join on the running SparkSession (spark-submit's), or a local one.",
)
@click.option(
    "--skip-bad-rows", is_flag=True, help="Count and skip bad input rows instead of failing."
)
@click.option(
    "--max-memory-gb",
    type=MemoryType(),
    default="auto",
    show_default=True,
    help="Memory the local engine may hold the decision log in, to read it once rather than "
    "twice (auto: a quarter of the machine's).",
)
def join_command(
    decisions: Path,
    rewards: Path,
    output: Path,
    window: float,
    default_pairs: tuple[str, ...],
    drop_unrewarded: bool,
    engine: str,
    skip_bad_rows: bool,
    max_memory_gb: float | str,
) -> None:
    """Attach the REWARDS that arrived within --window of each decision in DECISIONS (a decision
    log) by decision_id, and write every decision row with its summed metrics: the [source] of
    the next horizon run."""
    if drop_unrewarded and default_pairs:
        raise click.UsageError("--default gives nothing to a run with --drop-unrewarded")
    try:
        defaults = None if drop_unrewarded else parse_defaults(default_pairs)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--default") from None
    inputs = {"decision log": decisions, "rewards file": rewards}
    for what, path in inputs.items():
        check_input(path, what)
    check_outputs(output, inputs)
    if engine == "spark":
        from horizon_plugins_serving.join_spark import join_spark

        report = join_spark(decisions, rewards, output, window, defaults, skip_bad_rows)
    else:
        report = join_local(
            decisions, rewards, output, window, defaults, skip_bad_rows, max_memory_gb
        )
    with atomic_output(report_path(output)) as temporary:
        temporary.write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
    click.echo(report.summary(output))
