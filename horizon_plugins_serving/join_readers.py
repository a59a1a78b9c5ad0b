"""``horizon join``'s local engine's reading: the decision log streamed in chunks of good
rows, and a rewards file read whole into Arrow tables.

A block of JSON lines is read by Arrow's JSON reader, and line by line only where it holds a
torn or bad line, to name it (``join_rows`` words what is wrong). ``parquet_files``,
``ignored_files`` and ``is_parquet`` also tell the Spark engine (``join_spark``) what to read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from threading import Event
from typing import TYPE_CHECKING, Any, BinaryIO

from horizon_engine import (
    FLOAT32_MAX,
    MAX_LINE_BYTES,
    BadLine,
    HorizonError,
    LongLine,
    invalid_text_rows,
    line_prefix,
    number_problem,
    parse_json_line,
    read_lines,
    read_past_line,
    strip_bom,
)
from horizon_plugins_serving.join_report import SHOWN, BadRows
from horizon_plugins_serving.join_rows import (
    JOINED_ALREADY,
    MISSING_ID,
    bad_line_reason,
    decision_problem,
    parse_timestamps,
    reward_problem,
    torn_line,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

CHUNK_ROWS = 50_000
"""Decision-log rows parsed, joined and written at a time."""


# --- reading the decision log -----------------------------------------------------------------


def line_blocks(path: Path, count: int) -> Iterator[tuple[list[bytes], list[int]]]:
    """A text file's non-blank lines, ``count`` at a time, with their numbers (from 1); the
    first without a UTF-8 byte order mark."""
    lines: list[bytes] = []
    numbers: list[int] = []
    with open(path, "rb") as handle:
        for number, line in read_lines(handle):
            if line.strip():
                lines.append(line)
                numbers.append(number)
                if len(lines) == count:
                    yield lines, numbers
                    lines, numbers = [], []
    if lines:
        yield lines, numbers


KEY_FIELDS = [("decision_id", "string"), ("timestamp", "string")]


def read_json_block(
    lines: list[bytes], look_at: bytes, infer: bool = False, types: pa.Schema | None = None
) -> pa.Table | None:
    """Whole JSON lines read at once by Arrow's JSON reader (no Python object per row), or None
    where that cannot hold every row as it is: a torn line, a line that is not an object, a
    decision_id or timestamp missing, empty or not a string, or ``look_at`` in the text (what
    Arrow's reader would not tell apart). The caller then reads the block line by line, to
    count and name what is wrong. ``infer``: read the other fields too, their types inferred
    (or ``types``' where it names them); else only the two keys."""
    return read_json_text(b"".join(lines), len(lines), look_at, infer, types)


ARROW_BLOCK_BYTES = 2**20
"""Bytes of text each of Arrow's JSON reader's threads parses at a time. Its blocks' types are
inferred apart and unified (a field one block lacks is null there, an integer field a later
block holds as a float is a float), and a field whose types cannot unify fails the read, as
one block would (measured: 70 MB of rewards parse in about half the time of one block, and
less CPU time)."""


def read_json_text(
    block: bytes,
    rows: int,
    look_at: bytes,
    infer: bool = False,
    types: pa.Schema | None = None,
) -> pa.Table | None:
    """``read_json_block`` of the ``rows`` lines joined in ``block``: None also where Arrow
    reads another number of rows (a blank line, which the line reader passes over)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if not block.endswith(b"\n") or look_at in block:
        return None
    explicit = pa.schema(KEY_FIELDS)
    if types is not None:
        explicit = pa.schema([*explicit, *(f for f in types if f.name not in explicit.names)])
    options = pj.ParseOptions(
        explicit_schema=explicit,
        unexpected_field_behavior="infer" if infer or types is not None else "ignore",
    )
    try:
        # Arrow reads the text where it lies: a Python file would hand it over in new bytes
        # objects, each a fresh allocation the kernel maps in (measured: 3,400 page faults
        # and a tenth more CPU time for 14 MB of rewards).
        table = pj.read_json(
            pa.BufferReader(block),
            read_options=pj.ReadOptions(use_threads=True, block_size=ARROW_BLOCK_BYTES),
            parse_options=options,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    ids = table.column("decision_id")
    if table.num_rows != rows or ids.null_count or table.column("timestamp").null_count:
        return None
    if pc.any(pc.equal(ids, "")).as_py():
        return None
    return table.combine_chunks()


TEXT_BLOCK_BYTES = 16 * 2**20
"""Bytes of a rewards file read at a time: whole lines, about 130,000 reward rows."""


def text_blocks(path: Path, size: int = TEXT_BLOCK_BYTES) -> Iterator[tuple[bytes, int]]:
    """A text file in blocks of whole lines (the last may be torn) of about ``size`` bytes,
    each with the number of its first line (from 1); the first without a UTF-8 byte order
    mark. Nothing is split into lines: a block Arrow reads whole never is. A line longer than
    ``MAX_LINE_BYTES`` is a block of its own, a ``LongLine``, read past and never held whole
    (one that never ends would otherwise grow without bound). Only a line begun in an earlier
    read can be that long, as a read is no longer than the limit."""
    number = 1
    rest = b""
    with open(path, "rb") as handle:
        while read := handle.read(size):
            block = rest + read
            if rest:
                long_line, block = _long_first_line(handle, block)
                if long_line is not None:
                    yield long_line, number
                    number += 1
            end = block.rfind(b"\n") + 1
            if end == 0:
                rest = block
                continue
            block, rest = block[:end], block[end:]
            yield strip_bom(block) if number == 1 else block, number
            number += block.count(b"\n")
    if rest:
        yield strip_bom(rest) if number == 1 else rest, number


def _long_first_line(handle: BinaryIO, block: bytes) -> tuple[LongLine | None, bytes]:
    """The block's first line as a ``LongLine`` when it is longer than ``MAX_LINE_BYTES``
    (read past to its newline when the block holds none), and what follows it; else None and
    the block as it was."""
    first_end = block.find(b"\n") + 1
    if first_end == 0 and len(block) > MAX_LINE_BYTES:
        return read_past_line(handle, block, MAX_LINE_BYTES), b""
    if first_end - 1 > MAX_LINE_BYTES:
        return LongLine(line_prefix(block), first_end - 1, MAX_LINE_BYTES), block[first_end:]
    return None, block


def block_lines(block: bytes, first: int) -> tuple[list[bytes], list[int]]:
    """A block's non-blank lines, each with its newline (the last may have none), and their
    numbers: what ``line_blocks`` gives for the same lines."""
    lines: list[bytes] = []
    numbers: list[int] = []
    pieces = block.split(b"\n")
    for offset, piece in enumerate(pieces):
        line = piece if offset == len(pieces) - 1 else piece + b"\n"
        if line.strip():
            lines.append(line)
            numbers.append(first + offset)
    return lines, numbers


@dataclass
class DecisionChunk:
    """A chunk of good decision rows, as read: their keys, and what writing them needs."""

    decision_ids: pa.Array
    timestamps: pa.Array
    lines: list[bytes] | None = None
    """JSONL: each row's line as it was logged."""
    batch: pa.RecordBatch | None = None
    """Parquet: the rows as read."""
    rows: pa.Table | None = None
    """JSONL, where the caller gave ``row_types`` and Arrow read the chunk whole: every field."""
    row_types: pa.Schema | None = None
    """The types ``rows`` was read with."""

    def kept(self, keep: np.ndarray) -> DecisionChunk:
        """The chunk's rows where ``keep`` is true: the chunk itself where it keeps them all (as
        most do), nothing copied."""
        import pyarrow as pa

        if keep.all():
            return self
        mask = pa.array(keep)
        return DecisionChunk(
            self.decision_ids.filter(mask),
            self.timestamps.filter(mask),
            None if self.lines is None else [self.lines[index] for index in keep.nonzero()[0]],
            None if self.batch is None else self.batch.filter(mask),
            None if self.rows is None else self.rows.filter(mask),
            self.row_types,
        )

    def head(self, count: int) -> DecisionChunk:
        """The chunk's first ``count`` rows."""
        if count >= len(self.decision_ids):
            return self
        return DecisionChunk(
            self.decision_ids.slice(0, count),
            self.timestamps.slice(0, count),
            None if self.lines is None else self.lines[:count],
            None if self.batch is None else self.batch.slice(0, count),
            None if self.rows is None else self.rows.slice(0, count),
            self.row_types,
        )


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


def check_input(path: Path, what: str) -> None:
    """Refuses an input either engine would read otherwise than as the join's docs say: a
    folder is a Parquet log's part files only where its name ends ``.parquet`` (read as
    JSONL, a folder raised ``IsADirectoryError`` locally where Spark read every file in it),
    and a pipe or a device is no file to read twice."""
    if path.is_dir():
        if not is_parquet(path):
            raise HorizonError(
                f"{path}: the {what} is a folder; a folder is read as Parquet part files only "
                "where its name ends .parquet (JSONL is one file)"
            )
    elif not path.is_file():
        raise HorizonError(f"{path}: the {what} is neither a file nor a folder")


ARROW_OVER_PARQUET = 2
"""A Parquet log's rows in Arrow's memory over their uncompressed size in its metadata (measured:
200,000 rows ``horizon serve`` logged, 23.8 MB uncompressed, take 46.4 MB as an Arrow table; the
map and list columns' offsets and validity are most of the difference)."""

PYTHON_OVER_JSONL = 2
"""A JSONL log's lines held as Python bytes over their size on disk: each line's own object
header and the list's pointer to it (about 40 bytes a line) and its Arrow keys (the decision_id
and timestamp again), for lines of a few hundred bytes."""


ARROW_OVER_JSONL = 1
"""A JSONL log's rows read by Arrow's JSON reader (``DecisionChunk.rows``) over the lines' size
on disk (measured: 50,000 rows ``horizon serve`` logged, 18.1 MB of lines, take 10.4 MB)."""


def log_memory(path: Path, with_rows: bool = False) -> int:
    """About how many bytes a decision log's chunks take, held in memory as the reader yields
    them (``with_rows``: a JSONL log's with their rows read by Arrow too): estimated from the
    Parquet metadata or the JSONL file's size, nothing decoded. A part that cannot be read
    counts nothing here: the reader names it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_parquet(path):
        return path.stat().st_size * (PYTHON_OVER_JSONL + (ARROW_OVER_JSONL if with_rows else 0))
    uncompressed = 0
    for part in parquet_files(path):
        try:
            metadata = pq.ParquetFile(part).metadata
        except (OSError, pa.ArrowException):
            continue
        for group in range(metadata.num_row_groups):
            uncompressed += metadata.row_group(group).total_byte_size
    return uncompressed * ARROW_OVER_PARQUET


KEY_COLUMNS = ("decision_id", "timestamp", "metrics")
"""The columns of a Parquet log that the key pass reads: the keys and what the checks look at
(and every column that holds text, which ``bad_text_rows`` checks)."""


def holds_text(data_type: pa.DataType) -> bool:
    """Whether a column of this type holds strings, at any depth (a map's keys, a list's items)."""
    import pyarrow as pa

    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return True
    return any(holds_text(data_type.field(i).type) for i in range(data_type.num_fields))


def bad_text_rows(batch: pa.RecordBatch) -> dict[int, str]:
    """Why each row of a Parquet batch holding a string that is not valid UTF-8 is a bad row
    (Parquet's writers need not check), worded as the Parquet source words it."""
    problems: dict[int, str] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        for index in sorted(invalid_text_rows(column)):
            problems.setdefault(index, f"column '{name}' ({column.type}): not valid UTF-8")
    return problems


class DecisionLogReader:
    """Streams a decision log's good rows in chunks, the same rows in the same order each pass.

    A JSONL log's last line without its newline is torn (what a crash mid-write leaves):
    counted, never fatal (``torn_line``). Any other line that is not a whole JSON object, and
    a row without a decision_id or a readable timestamp, is a bad row.
    """

    def __init__(self, path: Path, bad: BadRows, chunk_rows: int = CHUNK_ROWS) -> None:
        self.path, self.bad, self.chunk_rows = path, bad, chunk_rows
        self.torn_lines: list[int] = []
        self.torn = 0

    def chunks(
        self,
        keys_only: bool = False,
        row_types: Callable[[list[bytes]], pa.Schema | None] | None = None,
    ) -> Iterator[DecisionChunk]:
        """The good rows, chunk by chunk; with ``keys_only`` a Parquet log's chunks hold only
        the columns the checks and the keys need (a JSONL line is read whole either way).
        ``row_types``: the types of a JSONL log's fields that its caller wants read too, with
        the keys, into ``DecisionChunk.rows`` (asked with each chunk's lines; None: keys
        only): one parse of each line gives both."""
        self.torn_lines, self.torn = [], 0
        if is_parquet(self.path):
            yield from self._parquet_chunks(keys_only)
        else:
            yield from self._jsonl_chunks(row_types)

    def _jsonl_chunks(
        self, row_types: Callable[[list[bytes]], pa.Schema | None] | None
    ) -> Iterator[DecisionChunk]:
        import pyarrow.compute as pc

        for lines, numbers in line_blocks(self.path, self.chunk_rows):
            types = row_types(lines) if row_types is not None else None
            rows = None if types is None else read_json_block(lines, b'"metrics"', types=types)
            # Without the row types, as the first pass read it: the same rows are good.
            read = rows if rows is not None else read_json_block(lines, look_at=b'"metrics"')
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
                rows = None if rows is None else rows.filter(good)
            if lines:
                yield DecisionChunk(ids, timestamps, lines, rows=rows, row_types=types)

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
            refused: BadLine | None = None
            try:
                row = parse_json_line(line)
            except BadLine as exc:
                refused, row = exc, None
            if torn_line(line, refused):
                self.torn += 1
                if len(self.torn_lines) < SHOWN:
                    self.torn_lines.append(number)
                continue
            if refused is not None:
                reason = bad_line_reason(refused)
                self.bad.found(f"{self.path}:{number}", reason, "decision", number)
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

    def _parquet_chunks(self, keys_only: bool) -> Iterator[DecisionChunk]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for part in parquet_files(self.path):
            try:
                parquet = pq.ParquetFile(part)
            except (OSError, pa.ArrowException) as exc:
                raise HorizonError(f"{part}: not a readable Parquet file ({exc})") from None
            names = parquet.schema_arrow.names
            for name in ("decision_id", "timestamp"):
                if name not in names:
                    raise HorizonError(f"{part}: no {name} column in the decision log")
            columns = None
            if keys_only:
                columns = [
                    field.name
                    for field in parquet.schema_arrow
                    if field.name in KEY_COLUMNS or holds_text(field.type)
                ]
            first = 0
            for batch in parquet.iter_batches(batch_size=self.chunk_rows, columns=columns):
                ids = batch.column("decision_id").cast(pa.string())
                no_id = pc.fill_null(pc.equal(ids, ""), True).to_numpy(zero_copy_only=False)
                problems = bad_text_rows(batch)
                for index in np.flatnonzero(no_id).tolist():
                    problems.setdefault(index, MISSING_ID)
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


@dataclass(frozen=True)
class Locations:
    """Names the rows of a chunk: ``file:line`` for JSONL, ``file:row N`` for Parquet."""

    prefix: str
    numbers: Sequence[int]

    def __call__(self, index: int) -> str:
        return f"{self.prefix}{self.numbers[index]}"


@dataclass
class Rewards:
    """Good reward rows as Arrow tables: one row each, and one row per (reward row, metric)."""

    rows: pa.Table
    """reward_row (int64, in file order), decision_id, timestamp."""
    metrics: pa.Table
    """reward_row, metric, value (float64)."""


def read_rewards(path: Path, bad: BadRows, stop: Event | None = None) -> Rewards:
    """Every good row of a rewards file (JSONL or Parquet), checked and numbered in order.
    ``stop``: set where the join they are read for has failed, which then takes none of them:
    the reading stops at the next block."""
    import pyarrow as pa

    rows: list[pa.Table] = []
    metrics: list[pa.Table] = []
    reader = _parquet_rewards if is_parquet(path) else _jsonl_rewards
    first = 0
    for chunk_rows, chunk_metrics in reader(path, bad):
        if stop is not None and stop.is_set():
            break
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
    for text, first in text_blocks(path):
        long_line = isinstance(text, LongLine)
        block = None if long_line else _read_reward_block(text, first)
        if block is None:
            lines, numbers = ([text], [first]) if long_line else block_lines(text, first)
            if not lines:
                continue
            block = _checked_reward_lines(path, lines, numbers, bad)
        located = Locations(f"{path}:", block.numbers)
        yield _rewards_chunk(block.ids, block.texts, block.metrics, located, bad)
    bad.flush()


@dataclass
class RewardBlock:
    """A block of good reward rows: keys, timestamp texts, and their metric rows."""

    ids: pa.Array
    texts: pa.Array
    metrics: pa.Table
    numbers: Sequence[int]


def _read_reward_block(text: bytes, first: int) -> RewardBlock | None:
    """A block of reward lines read whole by Arrow, from line ``first``, when it holds no blank
    line and every row's metrics are finite numbers (a JSON null, which Arrow's struct would
    take for a missing metric, sends the block line by line)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = text.count(b"\n")
    table = read_json_text(text, rows, look_at=b"null", infer=True)
    if table is None or "metrics" not in table.column_names:
        return None
    column = table.column("metrics").combine_chunks()
    if not pa.types.is_struct(column.type) or column.null_count:
        return None
    if not all(_numeric(field.type) for field in column.type):
        return None
    parents, names, values = _metric_entries(column, "")
    if len(values) and not pc.all(_holdable(values)).as_py():
        return None
    return RewardBlock(
        table.column("decision_id"),
        table.column("timestamp"),
        _metric_table(parents, names, values),
        range(first, first + rows),
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
            row = parse_json_line(line)
        except BadLine as exc:
            if torn_line(line, exc):
                # The last line, torn by a crash mid-write: counted, as a torn decision is.
                bad.report.torn_reward_lines += 1
                continue
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
            problems = bad_text_rows(batch.select(["decision_id", "timestamp", "metrics"]))
            no_id = pc.fill_null(pc.equal(ids, ""), True).to_numpy(zero_copy_only=False)
            for index in np.flatnonzero(no_id):
                problems.setdefault(index, MISSING_ID)
            for index in np.flatnonzero(batch.column("metrics").is_null().to_numpy(False)):
                problems.setdefault(index, "metrics is missing")
            holdable = pc.fill_null(_holdable(values), False).to_numpy(zero_copy_only=False)
            for entry in np.flatnonzero(~holdable):
                if int(parents[entry]) in problems:
                    continue
                name, value = names[entry].as_py(), values[entry].as_py()
                problem = f"metric {name!r}: {number_problem(value) or 'missing'}"
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
        parents, fields, values = [], [], []
        for index, child in enumerate(column.flatten()):
            present = np.flatnonzero(child.is_valid().to_numpy(zero_copy_only=False))
            parents.append(present)
            fields.append(np.full(len(present), index))
            values.append(child.cast(pa.float64()).take(pa.array(present)))
        if not parents:
            return np.zeros(0, np.int64), pa.array([], pa.string()), pa.array([], pa.float64())
        order = np.argsort(np.concatenate(parents), kind="stable")
        # Each entry's name taken from the struct's names: no Python string per entry.
        names = pa.array([field.name for field in column.type], pa.string())
        return (
            np.concatenate(parents)[order],
            names.take(pa.array(np.concatenate(fields)[order])),
            pa.concat_arrays(values).take(pa.array(order)),
        )
    raise HorizonError(
        f"{where}: metrics column has type {column.type}, expected a map of metric names to numbers"
    )


def _holdable(values: pa.Array) -> pa.Array:
    """True for each metric value the rule of every row's values takes: finite, and within
    float32 (``horizon_engine.number_problem``); a sum of them is checked again (``join``)."""
    import pyarrow.compute as pc

    return pc.and_(pc.is_finite(values), pc.less_equal(pc.abs(values), FLOAT32_MAX))


def _numeric(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(data_type) or pa.types.is_floating(data_type)
