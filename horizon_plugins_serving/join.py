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
and the sums as Arrow arrays and streams the decision log twice, chunk by chunk (once for the
keys, once to write). A chunk of JSON lines is read by Arrow's JSON reader, and line by line
only where it holds a torn or bad line, to name it; a written line is the logged text with its
metrics added. Memory grows with the decisions: about 50 bytes each for the keys, and one hash
table of their ids (a join of 1M decisions and 500k rewards peaks at about 560 MB).
``--engine spark`` runs the same join on a SparkSession (``join_spark``) and writes the same
rows, for logs larger than that.

Every count lands in ``JOINED.report.json`` and in the printed summary: torn last lines of the
log (a crash mid-write) and rewards outside the window or for an unknown decision are counted,
not fatal; a repeated decision_id keeps its first row only. A reward row without a decision_id,
with a timestamp that is not ISO 8601 with a zone, or with a metric that is not a finite number
fails the command naming its file and line, or with ``--skip-bad-rows`` is counted and skipped.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from horizon_engine import HorizonError, atomic_output

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

CHUNK_ROWS = 50_000
"""Decision-log rows parsed, joined and written at a time."""

SHOWN = 5
"""How many example ids, lines or rows the report names for each kind of count."""

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


def parse_defaults(pairs: Sequence[str]) -> dict[str, float]:
    """``--default METRIC=VALUE`` pairs as a map; none given means ``reward=0``."""
    defaults: dict[str, float] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not sep or not name.strip() or not math.isfinite(value):
            raise ValueError(f"--default {pair!r}: expected METRIC=NUMBER, e.g. reward=0")
        defaults[name.strip()] = value
    return defaults or {"reward": 0.0}


# --- the report -------------------------------------------------------------------------------


@dataclass
class JoinReport:
    """What the join did, counted: printed as a summary and written as JOINED.report.json."""

    engine: str
    window_seconds: float
    default_metrics: dict[str, float] | None
    decision_rows: int = 0
    """Good whole rows in the decision log, repeated decision_ids included."""
    torn_lines: int = 0
    torn_line_numbers: list[int] = field(default_factory=list)
    ignored_files: list[str] = field(default_factory=list)
    """Files in a Parquet log's folder that are not parts (a temporary part a crash left)."""
    duplicate_decisions: int = 0
    """Rows whose decision_id an earlier row had: left out, the first row kept."""
    duplicate_ids: list[str] = field(default_factory=list)
    decisions: int = 0
    """Distinct decisions: rewarded + defaulted + dropped."""
    rewarded: int = 0
    defaulted: int = 0
    dropped: int = 0
    written: int = 0
    reward_rows: int = 0
    """Good reward rows: attached + late + early + unknown."""
    rewards_attached: int = 0
    late_rewards: int = 0
    early_rewards: int = 0
    unknown_rewards: int = 0
    unknown_ids: list[str] = field(default_factory=list)
    bad_decision_rows: int = 0
    bad_reward_rows: int = 0
    bad_rows: list[str] = field(default_factory=list)
    """The first bad rows skipped (``--skip-bad-rows``), each as ``file:line: reason``."""

    def summary(self, output: Path) -> str:
        unrewarded = (
            f"dropped {self.dropped} without a reward"
            if self.default_metrics is None
            else f"defaulted {self.defaulted} to {self.default_metrics}"
        )
        lines = [
            f"joined {self.decisions} decisions: {self.rewarded} rewarded, {unrewarded}; "
            f"wrote {self.written} rows to {output}",
            f"reward rows: {self.reward_rows} ({self.rewards_attached} attached, "
            f"{self.late_rewards} late, {self.early_rewards} before their decision, "
            f"{self.unknown_rewards} for unknown decision_ids{_examples(self.unknown_ids)})",
        ]
        if self.duplicate_decisions:
            lines.append(
                f"{self.duplicate_decisions} repeated decision_id rows left out, the first "
                f"row of each kept{_examples(self.duplicate_ids)}"
            )
        if self.torn_lines:
            lines.append(
                f"{self.torn_lines} torn decision-log lines skipped"
                f"{_examples(list(map(str, self.torn_line_numbers)))}"
            )
        if self.ignored_files:
            lines.append(
                f"{len(self.ignored_files)} files in the decision log's folder are not parts "
                f"and were not read{_examples(self.ignored_files[:SHOWN])}"
            )
        if self.bad_decision_rows or self.bad_reward_rows:
            lines.append(
                f"skipped {self.bad_decision_rows} bad decision rows and "
                f"{self.bad_reward_rows} bad reward rows:"
            )
            lines += [f"  {bad}" for bad in self.bad_rows]
        return "\n".join(lines)


def _examples(items: Sequence[str]) -> str:
    return f", e.g. {', '.join(items)}" if items else ""


def report_path(output: Path) -> Path:
    """Where the report of a join writing ``output`` goes: ``JOINED.report.json``."""
    return output.with_name(output.name + ".report.json")


class BadRows:
    """Bad input rows: the first fails the join, or with ``skip`` each is counted and skipped.

    A chunk's rows are checked in two steps (each line, then the chunk's timestamps at once),
    so what is found waits for ``flush`` at the chunk's end and is then taken in file order:
    the first bad row named is the first in the file.
    """

    def __init__(self, skip: bool, report: JoinReport) -> None:
        self.skip, self.report = skip, report
        self._pending: list[tuple[int, str, str, str]] = []

    def found(self, location: str, reason: str, kind: str, order: int) -> None:
        """A bad row at ``location``; ``order`` places it in its file (line or row number)."""
        self._pending.append((order, location, reason, kind))

    def flush(self) -> None:
        pending, self._pending = sorted(self._pending), []
        for _, location, reason, kind in pending:
            self._record(location, reason, kind)

    def _record(self, location: str, reason: str, kind: str) -> None:
        if not self.skip:
            raise HorizonError(f"{location}: {reason} (--skip-bad-rows counts and skips such rows)")
        if kind == "decision":
            self.report.bad_decision_rows += 1
        else:
            self.report.bad_reward_rows += 1
        if len(self.report.bad_rows) < 2 * SHOWN:
            self.report.bad_rows.append(f"{location}: {reason}")


# --- checking keys and rewards ----------------------------------------------------------------


@dataclass(frozen=True)
class Locations:
    """Names the rows of a chunk: ``file:line`` for JSONL, ``file:row N`` for Parquet."""

    prefix: str
    numbers: Sequence[int]

    def __call__(self, index: int) -> str:
        return f"{self.prefix}{self.numbers[index]}"


def bad_key(row: Any) -> str | None:
    """What is wrong with a row's ``decision_id`` or ``timestamp`` (its text), or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, found {type(row).__name__}"
    decision_id = row.get("decision_id")
    if not isinstance(decision_id, str) or not decision_id:
        return f"decision_id is {decision_id!r}, expected a non-empty string"
    if not isinstance(row.get("timestamp"), str):
        return f"timestamp is {row.get('timestamp')!r}, expected an ISO 8601 string"
    return None


MISSING_ID = "decision_id is missing or empty, expected a non-empty string"
"""Why a Parquet row without a decision_id is a bad row."""

JOINED_ALREADY = "has metrics already (a joined row?); the join writes a decision's metrics"
"""Why a decision row with metrics is a bad row."""


def decision_problem(row: Any) -> str | None:
    """What is wrong with a decision row's key, or a metrics field it must not have yet."""
    problem = bad_key(row)
    if problem is None and row.get("metrics") is not None:
        return JOINED_ALREADY
    return problem


def reward_problem(row: Any) -> str | None:
    """What is wrong with a reward row's decision_id or metrics (not its timestamp's text)."""
    return bad_key(row) or bad_metrics(row.get("metrics"))


def timestamp_problem(text: Any) -> str | None:
    """Why a timestamp is not ISO 8601 text with a zone, or None."""
    import pyarrow as pa

    if not isinstance(text, str):
        return f"timestamp is {text!r}, expected an ISO 8601 string"
    try:
        pa.scalar(text, pa.string()).cast(pa.timestamp("us", tz="UTC"))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return f"timestamp {text!r} is not ISO 8601 with a zone (e.g. 2026-12-01T10:00:00Z)"
    return None


def line_problem(text: str, check: Callable[[Any], str | None]) -> str | None:
    """What is wrong with a JSON line, as ``check`` and ``timestamp_problem`` word it."""
    try:
        row = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    return check(row) or timestamp_problem(row["timestamp"])


def bad_metrics(metrics: Any) -> str | None:
    """What is wrong with a reward row's ``metrics``, or None."""
    if not isinstance(metrics, dict):
        return f"metrics is {metrics!r}, expected a map of metric names to numbers"
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"metric {name!r} is {value!r}, expected a number"
        if not math.isfinite(value):
            return f"metric {name!r} is {value!r}, expected a finite number"
    return None


def parse_timestamps(texts: pa.Array, where: str) -> tuple[pa.Array, dict[int, str]]:
    """ISO 8601 strings (or timestamps) as UTC microseconds, and why each bad one (null in the
    result) is bad, by index.

    A timestamp must say its zone (``Z`` or ``+00:00``, as the decision log writes): without
    one the instant it names depends on where it was written. A whole chunk is parsed at once;
    a chunk that fails is parsed again row by row, to name the bad rows.
    """
    import pyarrow as pa

    target = pa.timestamp("us", tz="UTC")
    if pa.types.is_timestamp(texts.type):
        if texts.type.tz is None:
            raise HorizonError(f"{where}: the timestamp column has no time zone")
        parsed = texts.cast(target)
        missing = parsed.is_null().to_numpy(zero_copy_only=False).nonzero()[0]
        return parsed, dict.fromkeys(missing.tolist(), timestamp_problem(None))
    try:
        parsed = texts.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        parsed = None
    if parsed is not None and parsed.null_count == texts.null_count == 0:
        return parsed, {}
    values, problems = [], {}
    for index, text in enumerate(texts.to_pylist()):
        problem = timestamp_problem(text)
        if problem is not None:
            problems[index] = problem
        values.append(None if problem else pa.scalar(text, pa.string()).cast(target).as_py())
    return pa.array(values, target), problems


# --- reading the decision log -----------------------------------------------------------------


def line_blocks(path: Path, count: int) -> Iterator[tuple[list[bytes], list[int]]]:
    """A text file's non-blank lines, ``count`` at a time, with their numbers (from 1)."""
    lines: list[bytes] = []
    numbers: list[int] = []
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                lines.append(line)
                numbers.append(number)
                if len(lines) == count:
                    yield lines, numbers
                    lines, numbers = [], []
    if lines:
        yield lines, numbers


KEY_FIELDS = [("decision_id", "string"), ("timestamp", "string")]


def read_json_block(lines: list[bytes], look_at: bytes, infer: bool = False) -> pa.Table | None:
    """Whole JSON lines read at once by Arrow's JSON reader (no Python object per row), or None
    where that cannot hold every row as it is: a torn line, a line that is not an object, a
    decision_id or timestamp missing, empty or not a string, or ``look_at`` in the text (what
    Arrow's reader would not tell apart). The caller then reads the block line by line, to
    count and name what is wrong. ``infer``: read the other fields too, their types inferred;
    else only the two keys."""
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    block = b"".join(lines)
    if not lines[-1].endswith(b"\n") or look_at in block:
        return None
    options = pj.ParseOptions(
        explicit_schema=pa.schema(KEY_FIELDS),
        unexpected_field_behavior="infer" if infer else "ignore",
    )
    try:
        table = pj.read_json(
            io.BytesIO(block),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=options,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    ids = table.column("decision_id")
    if table.num_rows != len(lines) or ids.null_count or table.column("timestamp").null_count:
        return None
    if pc.any(pc.equal(ids, "")).as_py():
        return None
    return table.combine_chunks()


@dataclass
class DecisionChunk:
    """A chunk of good decision rows, as read: their keys, and what writing them needs."""

    decision_ids: pa.Array
    timestamps: pa.Array
    lines: list[bytes] | None = None
    """JSONL: each row's line as it was logged."""
    batch: pa.RecordBatch | None = None
    """Parquet: the rows as read."""


def parquet_files(path: Path) -> list[Path]:
    """A Parquet file, or a directory's part files in the order they were written.

    A part's name carries its sequence number (``part-<sequence>-<uuid>.parquet``); names that
    start with a dot are files still being written (or left by a crash) and are passed over.
    """
    if not path.is_dir():
        return [path]

    def order(part: Path) -> tuple[int, str]:
        pieces = part.name.split("-")
        sequence = pieces[1] if len(pieces) > 1 else ""
        return (int(sequence) if sequence.isdigit() else -1, part.name)

    return sorted(
        (part for part in path.rglob("*.parquet") if not part.name.startswith((".", "_"))),
        key=order,
    )


def ignored_files(path: Path) -> list[str]:
    """The files of a Parquet folder that ``parquet_files`` does not read, but Spark's markers
    and checksums: a temporary part that a crash left, or a stranger's file."""
    if not path.is_dir():
        return []
    parts = set(parquet_files(path))
    return sorted(
        str(entry.relative_to(path))
        for entry in path.rglob("*")
        if entry.is_file()
        and entry not in parts
        and entry.name != "_SUCCESS"
        and not entry.name.endswith(".crc")
    )


def is_parquet(path: Path) -> bool:
    return path.name.endswith(".parquet")


class DecisionLogReader:
    """Streams a decision log's good rows in chunks, the same rows in the same order each pass.

    A JSONL line that is not a whole JSON object ending with a newline is torn (what a crash
    mid-write leaves, as ``read_decisions`` counts it): counted, never fatal. A whole row
    without a decision_id or a readable timestamp is a bad row.
    """

    def __init__(self, path: Path, bad: BadRows, chunk_rows: int = CHUNK_ROWS) -> None:
        self.path, self.bad, self.chunk_rows = path, bad, chunk_rows
        self.torn_lines: list[int] = []
        self.torn = 0

    def chunks(self) -> Iterator[DecisionChunk]:
        self.torn_lines, self.torn = [], 0
        if is_parquet(self.path):
            yield from self._parquet_chunks()
        else:
            yield from self._jsonl_chunks()

    def _jsonl_chunks(self) -> Iterator[DecisionChunk]:
        import pyarrow.compute as pc

        for lines, numbers in line_blocks(self.path, self.chunk_rows):
            read = read_json_block(lines, look_at=b'"metrics"')
            if read is not None:
                ids, texts = read.column("decision_id"), read.column("timestamp")
            else:
                lines, numbers, ids, texts = self._checked_lines(lines, numbers)
            timestamps, problems = parse_timestamps(texts, str(self.path))
            for index, problem in problems.items():
                where = f"{self.path}:{numbers[index]}"
                self.bad.found(where, problem, "decision", numbers[index])
            self.bad.flush()
            if problems:  # bad rows the caller chose to skip
                good = pc.is_valid(timestamps)
                lines = [line for line, ok in zip(lines, good, strict=True) if ok]
                ids, timestamps = ids.filter(good), timestamps.filter(good)
            if lines:
                yield DecisionChunk(ids, timestamps, lines=lines)

    def _checked_lines(
        self, lines: list[bytes], numbers: list[int]
    ) -> tuple[list[bytes], list[int], pa.Array, pa.Array]:
        """A block that Arrow's reader could not take whole, line by line: torn lines counted,
        bad rows reported; the good lines, their numbers, decision_ids and timestamp texts."""
        import pyarrow as pa

        kept: list[bytes] = []
        kept_numbers: list[int] = []
        ids: list[str] = []
        texts: list[str] = []
        for number, line in zip(numbers, lines, strict=True):
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict) or not line.endswith(b"\n"):
                self.torn += 1
                if len(self.torn_lines) < SHOWN:
                    self.torn_lines.append(number)
                continue
            problem = decision_problem(row)
            if problem is not None:
                self.bad.found(f"{self.path}:{number}", problem, "decision", number)
                continue
            kept.append(line)
            kept_numbers.append(number)
            ids.append(row["decision_id"])
            texts.append(row["timestamp"])
        return kept, kept_numbers, pa.array(ids, pa.string()), pa.array(texts, pa.string())

    def _parquet_chunks(self) -> Iterator[DecisionChunk]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for part in parquet_files(self.path):
            try:
                parquet = pq.ParquetFile(part)
            except (OSError, pa.ArrowException) as exc:
                raise HorizonError(f"{part}: not a readable Parquet file ({exc})") from None
            for name in ("decision_id", "timestamp"):
                if name not in parquet.schema_arrow.names:
                    raise HorizonError(f"{part}: no {name} column in the decision log")
            first = 0
            for batch in parquet.iter_batches(batch_size=self.chunk_rows):
                ids = batch.column("decision_id").cast(pa.string())
                no_id = pc.fill_null(pc.equal(ids, ""), True).to_numpy(zero_copy_only=False)
                problems = dict.fromkeys(np.flatnonzero(no_id).tolist(), MISSING_ID)
                if "metrics" in batch.schema.names:
                    joined = batch.column("metrics").is_valid().to_numpy(zero_copy_only=False)
                    for index in np.flatnonzero(joined).tolist():
                        problems.setdefault(index, JOINED_ALREADY)
                timestamps, late = parse_timestamps(batch.column("timestamp"), str(part))
                for index, problem in {**late, **problems}.items():
                    self.bad.found(f"{part}:row {first + index}", problem, "decision", index)
                self.bad.flush()
                first += batch.num_rows
                if problems or late:
                    good = np.ones(batch.num_rows, dtype=bool)
                    good[list({**late, **problems})] = False
                    mask = pa.array(good)
                    batch, ids, timestamps = (
                        batch.filter(mask),
                        ids.filter(mask),
                        timestamps.filter(mask),
                    )
                yield DecisionChunk(ids, timestamps, batch=batch)


# --- reading rewards ---------------------------------------------------------------------------


@dataclass
class Rewards:
    """Good reward rows as Arrow tables: one row each, and one row per (reward row, metric)."""

    rows: pa.Table
    """reward_row (int64, in file order), decision_id, timestamp."""
    metrics: pa.Table
    """reward_row, metric, value (float64)."""


def read_rewards(path: Path, bad: BadRows) -> Rewards:
    """Every good row of a rewards file (JSONL or Parquet), checked and numbered in order."""
    import pyarrow as pa

    rows: list[pa.Table] = []
    metrics: list[pa.Table] = []
    reader = _parquet_rewards if is_parquet(path) else _jsonl_rewards
    first = 0
    for chunk_rows, chunk_metrics in reader(path, bad):
        count = chunk_rows.num_rows
        numbers = pa.array(range(first, first + count), pa.int64())
        rows.append(chunk_rows.append_column("reward_row", numbers))
        local = chunk_metrics.column("reward_row").to_numpy() + first
        metrics.append(chunk_metrics.set_column(0, "reward_row", pa.array(local, pa.int64())))
        first += count
    row_schema = pa.schema(
        [("decision_id", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC"))]
    ).append(pa.field("reward_row", pa.int64()))
    metric_schema = pa.schema(
        [("reward_row", pa.int64()), ("metric", pa.string()), ("value", pa.float64())]
    )
    return Rewards(
        pa.concat_tables(rows) if rows else row_schema.empty_table(),
        pa.concat_tables(metrics) if metrics else metric_schema.empty_table(),
    )


def _rewards_chunk(
    ids: pa.Array,
    texts: pa.Array,
    metrics: pa.Table,
    located: Locations,
    bad: BadRows,
) -> tuple[pa.Table, pa.Table]:
    """Reward rows and their metric rows (``reward_row`` numbered within the chunk), less the
    rows whose timestamp is bad."""
    import pyarrow as pa
    import pyarrow.compute as pc

    timestamps, problems = parse_timestamps(texts, located.prefix.rsplit(":", 1)[0])
    for index, problem in problems.items():
        bad.found(located(index), problem, "reward", located.numbers[index])
    bad.flush()
    rows = pa.table({"decision_id": ids, "timestamp": timestamps})
    if problems:
        good = pc.is_valid(timestamps).to_numpy(zero_copy_only=False)
        rows, metrics = rows.filter(pa.array(good)), _renumbered(metrics, good)
    return rows, metrics


def _renumbered(metrics: pa.Table, good: np.ndarray) -> pa.Table:
    """The metric rows of the reward rows ``good`` keeps, numbered as those rows are then."""
    import numpy as np
    import pyarrow as pa

    parents = metrics.column("reward_row").to_numpy()
    metrics = metrics.filter(pa.array(good[parents]))
    renumber = np.cumsum(good) - 1
    parents = renumber[metrics.column("reward_row").to_numpy()]
    return metrics.set_column(0, "reward_row", pa.array(parents, pa.int64()))


def _metric_table(rows: Any, names: Any, values: Any) -> pa.Table:
    import pyarrow as pa

    return pa.table(
        {
            "reward_row": pa.array(rows, pa.int64()),
            "metric": pa.array(names, pa.string()),
            "value": pa.array(values, pa.float64()),
        }
    )


def _jsonl_rewards(path: Path, bad: BadRows) -> Iterator[tuple[pa.Table, pa.Table]]:
    for lines, numbers in line_blocks(path, CHUNK_ROWS):
        block = _read_reward_block(lines, numbers) or _checked_reward_lines(
            path, lines, numbers, bad
        )
        located = Locations(f"{path}:", block.numbers)
        yield _rewards_chunk(block.ids, block.texts, block.metrics, located, bad)
    bad.flush()


@dataclass
class RewardBlock:
    """A block of good reward rows: keys, timestamp texts, and their metric rows."""

    ids: pa.Array
    texts: pa.Array
    metrics: pa.Table
    numbers: list[int]


def _read_reward_block(lines: list[bytes], numbers: list[int]) -> RewardBlock | None:
    """Reward lines read whole by Arrow, when every row's metrics are finite numbers (a JSON
    null, which Arrow's struct would take for a missing metric, sends the block line by line)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = read_json_block(lines, look_at=b"null", infer=True)
    if table is None or "metrics" not in table.column_names:
        return None
    column = table.column("metrics").combine_chunks()
    if not pa.types.is_struct(column.type) or column.null_count:
        return None
    if not all(_numeric(field.type) for field in column.type):
        return None
    parents, names, values = _metric_entries(column, "")
    if len(values) and not pc.all(pc.is_finite(values)).as_py():
        return None
    return RewardBlock(
        table.column("decision_id"),
        table.column("timestamp"),
        _metric_table(parents, names, values),
        numbers,
    )


def _checked_reward_lines(
    path: Path, lines: list[bytes], numbers: list[int], bad: BadRows
) -> RewardBlock:
    """Reward lines one by one: each bad one reported, the good ones kept."""
    import pyarrow as pa

    ids: list[str] = []
    texts: list[str] = []
    kept: list[int] = []
    metric_rows: list[int] = []
    names: list[str] = []
    values: list[float] = []
    for number, line in zip(numbers, lines, strict=True):
        try:
            row = json.loads(line)
        except ValueError as exc:
            bad.found(f"{path}:{number}", f"not JSON ({exc})", "reward", number)
            continue
        problem = reward_problem(row)
        if problem is not None:
            bad.found(f"{path}:{number}", problem, "reward", number)
            continue
        for name, value in row["metrics"].items():
            metric_rows.append(len(ids))
            names.append(name)
            values.append(float(value))
        ids.append(row["decision_id"])
        texts.append(row["timestamp"])
        kept.append(number)
    return RewardBlock(
        pa.array(ids, pa.string()),
        pa.array(texts, pa.string()),
        _metric_table(metric_rows, names, values),
        kept,
    )


def _parquet_rewards(path: Path, bad: BadRows) -> Iterator[tuple[pa.Table, pa.Table]]:
    """A Parquet rewards file's rows, checked on whole batches: a bad row is looked at alone
    only once a batch is known to hold one."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for part in parquet_files(path):
        try:
            parquet = pq.ParquetFile(part)
        except (OSError, pa.ArrowException) as exc:
            raise HorizonError(f"{part}: not a readable Parquet file ({exc})") from None
        missing = {"decision_id", "timestamp", "metrics"} - set(parquet.schema_arrow.names)
        if missing:
            raise HorizonError(f"{part}: no {', '.join(sorted(missing))} column in the rewards")
        first = 0
        for batch in parquet.iter_batches(batch_size=CHUNK_ROWS):
            numbers = np.arange(first, first + batch.num_rows)
            first += batch.num_rows
            located = Locations(f"{part}:row ", numbers)
            ids = batch.column("decision_id").cast(pa.string())
            parents, names, values = _metric_entries(batch.column("metrics"), str(part))
            problems: dict[int, str] = {}
            no_id = pc.fill_null(pc.equal(ids, ""), True).to_numpy(zero_copy_only=False)
            for index in np.flatnonzero(no_id):
                problems.setdefault(index, MISSING_ID)
            for index in np.flatnonzero(batch.column("metrics").is_null().to_numpy(False)):
                problems.setdefault(index, "metrics is missing")
            finite = pc.fill_null(pc.is_finite(values), False).to_numpy(zero_copy_only=False)
            for entry in np.flatnonzero(~finite):
                name, value = names[entry].as_py(), values[entry].as_py()
                problem = f"metric {name!r} is {value!r}, expected a finite number"
                problems.setdefault(int(parents[entry]), problem)
            good = np.ones(batch.num_rows, dtype=bool)
            for index, problem in problems.items():
                bad.found(located(index), problem, "reward", int(numbers[index]))
                good[index] = False
            metrics = _metric_table(parents, names, values)
            if problems:
                metrics = _renumbered(metrics, good)
                ids, batch = ids.filter(pa.array(good)), batch.filter(pa.array(good))
                located = Locations(f"{part}:row ", numbers[good])
            yield _rewards_chunk(ids, batch.column("timestamp"), metrics, located, bad)


def _metric_entries(column: pa.Array, where: str) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """For a metrics column (a map, or a struct with one field per metric): each entry's row,
    name and value (as float64; a null value stays null, to be reported)."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_map(column.type) and _numeric(column.type.item_type):
        offsets = column.offsets.to_numpy(zero_copy_only=False)
        start, end = offsets[0], offsets[-1]
        parents = np.repeat(np.arange(len(column)), np.diff(offsets))
        names = column.keys.slice(start, end - start).cast(pa.string())
        values = column.items.slice(start, end - start).cast(pa.float64())
        return parents, names, values
    if pa.types.is_struct(column.type) and all(
        _numeric(column.type.field(i).type) for i in range(column.type.num_fields)
    ):
        parents, names, values = [], [], []
        for index, child in enumerate(column.flatten()):
            present = np.flatnonzero(child.is_valid().to_numpy(zero_copy_only=False))
            parents.append(present)
            names.append(np.full(len(present), column.type.field(index).name, object))
            values.append(child.cast(pa.float64()).take(pa.array(present)))
        order = np.argsort(np.concatenate(parents) if parents else np.zeros(0), kind="stable")
        return (
            np.concatenate(parents)[order] if parents else np.zeros(0, np.int64),
            pa.array(np.concatenate(names)[order] if names else [], pa.string()),
            pa.concat_arrays(values).take(pa.array(order)) if values else pa.array([], "f8"),
        )
    raise HorizonError(
        f"{where}: metrics column has type {column.type}, expected a map of metric names to numbers"
    )


def _numeric(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(data_type) or pa.types.is_floating(data_type)


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
    keys: pa.Table, rewards: Rewards, window_seconds: float, report: JoinReport
) -> JoinPlan:
    """Keep each decision_id's first row, classify every reward row against it, and sum the
    rewards within the window per decision and metric. ``keys``: decision_id and timestamp,
    in log order (a row's position is its index).

    One hash table of the decision_ids answers both questions, "which row came first" and
    "which row is this reward's" (``index_in`` finds the first match), and the sums are a
    sort by (position, metric): no hash join or group-by tables of every decision.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    count = keys.num_rows
    ids = keys.column("decision_id").combine_chunks()
    lookup = pc.SetLookupOptions(value_set=ids)
    distinct = pc.unique(ids)
    first = np.zeros(count, dtype=bool)
    first[pc.index_in(distinct, options=lookup).to_numpy(zero_copy_only=False)] = True
    report.decision_rows = count
    report.decisions = len(distinct)
    report.duplicate_decisions = count - len(distinct)
    repeats = pc.unique(ids.filter(pa.array(~first)))  # in the order their repeats come
    by_first = np.sort(pc.index_in(repeats, options=lookup).to_numpy(zero_copy_only=False))
    report.duplicate_ids = ids.take(pa.array(by_first[:SHOWN])).to_pylist()

    reward_ids = rewards.rows.column("decision_id")
    position = pc.index_in(reward_ids, options=lookup)
    known = pc.is_valid(position)
    decided = keys.column("timestamp").combine_chunks().take(position)
    delay = pc.subtract(rewards.rows.column("timestamp").cast(pa.int64()), decided.cast(pa.int64()))
    delay = delay.fill_null(0).to_numpy(zero_copy_only=False)  # 0 for an unknown decision
    known_rows = known.to_numpy(zero_copy_only=False)
    window = round(window_seconds * 1_000_000)
    early = known_rows & (delay < 0)
    late = known_rows & (delay > window)
    inside = known_rows & ~early & ~late
    report.reward_rows = len(known_rows)
    report.unknown_rewards = int((~known_rows).sum())
    report.early_rewards, report.late_rewards = int(early.sum()), int(late.sum())
    report.rewards_attached = int(inside.sum())
    unknown = reward_ids.filter(pc.invert(known))
    report.unknown_ids = pc.unique(unknown).slice(0, SHOWN).to_pylist()

    positions = position.fill_null(-1).to_numpy(zero_copy_only=False)
    rewarded = np.zeros(count, dtype=bool)
    rewarded[positions[inside]] = True
    report.rewarded = int(rewarded.sum())
    unrewarded = report.decisions - report.rewarded
    if report.default_metrics is None:
        report.dropped = unrewarded
    else:
        report.defaulted = unrewarded
    sums_at, names, sums = _sums(rewards.metrics, positions, inside)
    return JoinPlan(first, rewarded, sums_at, pa.table({"metric": names, "value": sums}))


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


class JoinedWriter:
    """Writes joined rows: JSONL lines, or Parquet part files in a directory."""

    def __init__(self, path: Path, parquet: bool) -> None:
        self.path, self.parquet = path, parquet
        self._writer: Any = None
        self._handle: Any = None
        self._shaper: Any = None
        self._schema: Any = None
        self.written = 0
        if self.parquet:
            path.mkdir()
        else:
            self._handle = open(path, "wb")  # noqa: SIM115 (closed by close())

    def write(self, chunk: DecisionChunk, metrics: pa.MapArray, keep: np.ndarray) -> None:
        import pyarrow as pa

        metrics = metrics.filter(pa.array(keep))
        self.written += len(metrics)
        if chunk.batch is not None:
            batch = chunk.batch.filter(pa.array(keep))
            if self.parquet:
                self._write_table(_with_metrics(pa.Table.from_batches([batch]), metrics))
            else:
                rows = batch.to_pylist(maps_as_pydicts="lossy")
                self._write_lines(
                    _json_line(row, m) for row, m in zip(rows, metrics.to_pylist(), strict=True)
                )
            return
        lines = [chunk.lines[index] for index in keep.nonzero()[0]]
        if self.parquet:
            rows = [
                json.loads(line) | {"metrics": dict(m)}
                for line, m in zip(lines, metrics.to_pylist(), strict=True)
            ]
            self._write_table(self._shape(rows))
        else:
            # The logged line, its closing brace replaced by the metrics: the row's own text
            # is written as it was, and no row is parsed again.
            self._write_lines(
                line.rstrip()[:-1] + b',"metrics":' + text + b"}"
                for line, text in zip(lines, metrics_json(metrics), strict=True)
            )

    def _write_lines(self, lines: Iterator[bytes]) -> None:
        self._handle.write(b"".join(line + b"\n" for line in lines))

    def _shape(self, rows: list[dict[str, Any]]) -> pa.Table | None:
        """JSONL decision rows as ``joined_schema`` says (that of the first row written)."""
        import pyarrow as pa

        from horizon_engine import RowShaper

        if not rows:
            return None
        if self._shaper is None:
            layout, self._schema = joined_schema(rows[0])
            self._shaper = RowShaper(layout)
        shaped = self._shaper.shape((str(index), row) for index, row in enumerate(rows))
        if shaped.bad_rows:
            raise HorizonError(
                f"a decision row cannot be written as Parquet: {shaped.bad_rows[0].reason}"
            )
        extra = self._schema.names[len(shaped.table.schema) :]
        unexpected = set(shaped.ignored_fields) - set(extra)
        if unexpected:
            raise HorizonError(
                f"decision rows hold field(s) {sorted(unexpected)} that the first row did not; "
                "JOINED as Parquet takes its columns from the first row (write JSONL instead)"
            )
        arrays = [pa.array([row.get(name) for row in rows]) for name in extra]
        table = shaped.table
        for name, array in zip(extra, arrays, strict=True):
            table = table.append_column(name, array.cast(self._schema.field(name).type))
        return table

    def _write_table(self, table: pa.Table | None) -> None:
        import pyarrow.parquet as pq

        if table is None or table.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path / "part-00000.parquet", table.schema)
        self._writer.write_table(table.cast(self._writer.schema))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._handle is not None:
            self._handle.close()


SCALAR_TYPES = {str: "string", bool: "bool", int: "int64", float: "float64"}
"""The Arrow type of a decision row's own fields (decision_id, model_id, timestamp, ...)."""


def joined_schema(first: dict[str, Any]) -> tuple[Any, pa.Schema]:
    """The layout and Arrow schema of JOINED as Parquet from JSONL decision rows: the
    pre-timeline row schema (with its Horizon metadata), then the row's other fields."""
    import pyarrow as pa

    from horizon_engine import detect_layout

    layout = detect_layout(first, "pre_timeline", "auto")
    known = {name for column in layout.columns for name in (column.name, *column.aliases)}
    fields = list(layout.schema)
    for name, value in first.items():
        if name in known:
            continue
        if type(value) not in SCALAR_TYPES:
            raise HorizonError(
                f"decision field {name!r} is {value!r}: JOINED as Parquet keeps strings, numbers "
                "and booleans besides the row schema's fields (write JSONL instead)"
            )
        fields.append(pa.field(name, SCALAR_TYPES[type(value)]))
    return layout, pa.schema(fields, metadata=layout.metadata)


def _with_metrics(table: pa.Table, metrics: pa.MapArray) -> pa.Table:
    if "metrics" in table.column_names:
        return table.set_column(table.column_names.index("metrics"), "metrics", metrics)
    return table.append_column("metrics", metrics)


def _json_line(row: dict[str, Any], metrics: list[tuple[str, float]]) -> bytes:
    """A Parquet row as a JSON line with ``metrics``; null fields, which a column holds for
    rows without that field, are left out as a logged JSONL row leaves them out."""
    fields = {name: value for name, value in row.items() if value is not None}
    return json.dumps(fields | {"metrics": dict(metrics)}, separators=(",", ":")).encode()


def metrics_json(metrics: pa.MapArray) -> list[bytes]:
    """Each metrics map as a JSON object, built by Arrow (one string per row, no dict)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = metrics.offsets.to_numpy(zero_copy_only=False)
    start, count = offsets[0], offsets[-1] - offsets[0]
    encoded = metrics.keys.slice(start, count).dictionary_encode()
    quoted = pa.array([json.dumps(name) for name in encoded.dictionary.to_pylist()], pa.string())
    values = metrics.items.slice(start, count).cast(pa.string())
    pairs = pc.binary_join_element_wise(quoted.take(encoded.indices), values, ":")
    lists = pa.ListArray.from_arrays(pa.array(offsets - offsets[0], pa.int32()), pairs)
    objects = pc.binary_join_element_wise("{", pc.binary_join(lists, ","), "}", "")
    return objects.cast(pa.binary()).to_pylist()


def join_local(
    decisions: Path,
    rewards_path: Path,
    output: Path,
    window_seconds: float,
    defaults: dict[str, float] | None,
    skip_bad_rows: bool,
) -> JoinReport:
    """The local engine: Arrow tables for the keys and rewards, two passes over the log."""
    import pyarrow as pa

    report = JoinReport("local", window_seconds, defaults, ignored_files=ignored_files(decisions))
    bad = BadRows(skip_bad_rows, report)
    log = DecisionLogReader(decisions, bad)
    keys = [
        pa.table({"decision_id": chunk.decision_ids, "timestamp": chunk.timestamps})
        for chunk in log.chunks()
    ]
    report.torn_lines, report.torn_line_numbers = log.torn, list(log.torn_lines)
    key_schema = pa.schema(
        [("decision_id", pa.string()), ("timestamp", pa.timestamp("us", tz="UTC"))]
    )
    keys_table = pa.concat_tables(keys) if keys else key_schema.empty_table()
    plan = plan_join(keys_table, read_rewards(rewards_path, bad), window_seconds, report)
    del keys, keys_table
    quiet = BadRows(True, JoinReport("local", window_seconds, defaults))
    with atomic_output(output) as temporary:
        writer = JoinedWriter(temporary, is_parquet(output))
        try:
            start = 0
            for chunk in DecisionLogReader(decisions, quiet).chunks():
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


@click.command("join")
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
def join_command(
    decisions: Path,
    rewards: Path,
    output: Path,
    window: float,
    default_pairs: tuple[str, ...],
    drop_unrewarded: bool,
    engine: str,
    skip_bad_rows: bool,
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
    try:
        if engine == "spark":
            from horizon_plugins_serving.join_spark import join_spark

            report = join_spark(decisions, rewards, output, window, defaults, skip_bad_rows)
        else:
            report = join_local(decisions, rewards, output, window, defaults, skip_bad_rows)
        with atomic_output(report_path(output)) as temporary:
            temporary.write_text(json.dumps(asdict(report), indent=2) + "\n", encoding="utf-8")
    except HorizonError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(report.summary(output))
