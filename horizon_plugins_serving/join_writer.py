"""``horizon join``'s writing of JOINED: each decision row as it was logged, plus ``metrics``.

As JSONL a row is its logged line with the metrics added; as Parquet, the pre-timeline row
schema that the first row gives (``joined_schema``, which the Spark engine uses too), a JSONL
log's lines shaped a chunk at a time by Arrow (``join_shape``) or, where that could differ,
one by one by ``RowShaper``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine import BadLine, HorizonError, parse_json_line, refuse_output_over_inputs
from horizon_plugins_serving.join_readers import is_parquet
from horizon_plugins_serving.join_report import is_join_report, report_path

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from horizon_plugins_serving.join_readers import DecisionChunk


JOINED_PART = re.compile(r"part-[^/]*\.parquet")
"""The files of JOINED as a Parquet folder, as either engine writes them."""


def check_outputs(output: Path, inputs: Mapping[str, Path]) -> None:
    """Refuses, before anything is read or written, a join whose output or report would
    replace or land inside one of its ``inputs`` (by what each is, e.g. ``"rewards file"``),
    or replace what the join did not write.

    An input is recognised however the output spells it (``horizon_engine.output_paths``).
    Past these, ``-o`` may not be an existing folder for JSONL, nor a Parquet folder holding
    anything but the part files a join writes; and the report's name beside it may hold only a
    report a join wrote (``is_join_report``), which is replaced.
    """
    if output.name in ("", ".", ".."):
        raise HorizonError(
            f"-o {output}: name a file for JSONL, or a folder whose name ends .parquet"
        )
    report = report_path(output)
    places = {f"-o {output}": output, f"the report {report}, beside -o {output},": report}
    for label, place in places.items():
        refuse_output_over_inputs(label, place, inputs, "join", "joined rows")
    _check_parent(output)
    if output.is_dir():
        _check_replaceable_folder(output)
    if (report.exists() or report.is_symlink()) and not is_join_report(report):
        raise HorizonError(
            f"{report}: the join writes its report there (beside -o {output}), and this is "
            "not a report a join wrote. Nothing was written; move it, or write the joined "
            "rows elsewhere"
        )


def _check_parent(output: Path) -> None:
    """Refuses an output whose nearest existing parent is not a folder, which the write would
    meet as ``NotADirectoryError`` once the join was done."""
    for parent in output.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise HorizonError(f"-o {output}: {parent} is not a folder")
            return


def _check_replaceable_folder(output: Path) -> None:
    """An existing folder at ``-o`` is replaced whole by a Parquet JOINED: only where it
    holds nothing but the part files an earlier join wrote. JSONL is written to a file."""
    if not is_parquet(output):
        raise HorizonError(
            f"-o {output} is a folder: JSONL is written to a file (name one, or end the name "
            ".parquet to write a Parquet folder)"
        )
    if output.is_symlink():
        return  # the link is replaced, not the folder it leads to
    for entry in sorted(output.iterdir()):
        if entry.is_symlink() or not entry.is_file() or not JOINED_PART.fullmatch(entry.name):
            raise HorizonError(
                f"-o {output} is a folder holding {entry.name}, which a join does not write: "
                "the join replaces the folder whole. Nothing was written; move what is yours, "
                "or write the joined rows elsewhere"
            )


THREADED_CORES = 3
"""The cores a process must be let run on for the join to read its rewards and write JOINED's
row groups on threads of their own (``threads_help``)."""


def threads_help() -> bool:
    """Whether the join's threads of its own (the rewards' reading, the Parquet row groups'
    writing) let it finish sooner: where the process may run on ``THREADED_CORES`` or more.
    On two, Arrow's readers already run on both (its pool has a thread a core), and the
    threads only added work: a Parquet log of 200,000 decisions joined into Parquet took 0.84
    s of CPU with them against 0.73 without, and 1.20 s against 1.06 (medians of 8
    interleaved fresh processes on a shared 2-core machine), with 6,000 more page faults
    (each thread's allocations come from a fresh C allocator arena)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) >= THREADED_CORES
    return (os.cpu_count() or 1) >= THREADED_CORES


ROW_GROUP_ROWS = 131_072
"""Rows of a Parquet row group of JOINED (about 30 MB of a decision log with a few features):
at most two are held, one being written on the writing thread while the next gathers."""


class JoinedWriter:
    """Writes joined rows: JSONL lines, or Parquet part files in a directory."""

    def __init__(self, path: Path, parquet: bool) -> None:
        self.path, self.parquet = path, parquet
        self._writer: Any = None
        self._handle: Any = None
        self._shaper: Any = None
        self._schema: Any = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writing: Future[None] | None = None
        self._thread: ThreadPoolExecutor | None = None
        self.written = 0
        if self.parquet:
            path.mkdir()
            if threads_help():
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="joined-parquet")
        else:
            self._handle = open(path, "wb")  # noqa: SIM115 (closed by close())

    def write(self, chunk: DecisionChunk, metrics: pa.MapArray, keep: np.ndarray) -> None:
        import pyarrow as pa

        chunk = chunk.kept(keep)
        metrics = metrics if keep.all() else metrics.filter(pa.array(keep))
        self.written += len(metrics)
        if chunk.batch is not None:
            batch = chunk.batch
            if self.parquet:
                self._write_table(_with_metrics(pa.Table.from_batches([batch]), metrics))
            else:
                rows = batch.to_pylist(maps_as_pydicts="lossy")
                self._write_lines(
                    _json_line(row, m) for row, m in zip(rows, metrics.to_pylist(), strict=True)
                )
            return
        lines = chunk.lines
        if self.parquet:
            self._write_table(self._shape_lines(lines, metrics, chunk.rows, chunk.row_types))
        else:
            # The logged line, its closing brace replaced by the metrics: the row's own text
            # is written as it was, and no row is parsed again.
            self._write_lines(
                line.rstrip()[:-1] + b',"metrics":' + text + b"}"
                for line, text in zip(lines, metrics_json(metrics), strict=True)
            )

    def _write_lines(self, lines: Iterator[bytes]) -> None:
        self._handle.write(b"".join(line + b"\n" for line in lines))

    def row_types(self, lines: list[bytes]) -> pa.Schema | None:
        """The types a JSONL log's ``lines`` are best read with for this writer
        (``join_shape``): JOINED's once the first row written has given its schema, before
        that as the first of ``lines`` would give it (``first_row_types``); None for JSONL."""
        from horizon_plugins_serving.join_shape import read_types

        if not self.parquet:
            return None
        return first_row_types(lines) if self._schema is None else read_types(self._schema)

    def _shape_lines(
        self,
        lines: list[bytes],
        metrics: pa.MapArray,
        read: pa.Table | None,
        read_with: pa.Schema | None,
    ) -> pa.Table | None:
        """JSONL decision lines and their metrics as ``joined_schema`` says: read whole by
        Arrow (``join_shape``) where that gives what ``RowShaper`` gives, else row by row.
        ``read``: the lines as Arrow read them with ``read_with``, taken where those are
        JOINED's types (the row JOINED's schema came from need not be the one they were
        guessed from)."""
        from horizon_engine import RowShaper
        from horizon_plugins_serving.join_shape import read_types, shape_lines

        if not lines:
            return None
        if self._shaper is None:
            layout, self._schema = joined_schema(json.loads(lines[0]) | {"metrics": {}})
            self._shaper = RowShaper(layout)
        if read_with is None or not read_with.equals(read_types(self._schema)):
            read = None
        table = shape_lines(lines, metrics, self._shaper.layout, self._schema, read)
        if table is not None:
            return table
        return self._shape(
            [
                json.loads(line) | {"metrics": dict(m)}
                for line, m in zip(lines, metrics.to_pylist(), strict=True)
            ]
        )

    def _shape(self, rows: list[dict[str, Any]]) -> pa.Table:
        """JSONL decision rows (with their metrics) shaped one by one by ``RowShaper``."""
        import pyarrow as pa

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
        """Gathers the chunks' rows into row groups of ``ROW_GROUP_ROWS``: a decision log's
        parts are often small (``horizon serve`` writes one per 10,000 rows), and a row group
        per chunk costs the write and every reader of JOINED."""
        import pyarrow.parquet as pq

        if table is None or table.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path / "part-00000.parquet", table.schema)
        self._pending.append(table.cast(self._writer.schema))
        self._pending_rows += table.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Hands the gathered rows to the writing thread as a row group, once the one before
        is written: Arrow encodes and compresses it without holding the GIL, while the next
        chunks are read and shaped (measured: a fifth of a JSONL log's join into Parquet).
        Where threads do not help (``threads_help``), writes them here."""
        import pyarrow as pa

        if self._pending:
            table = pa.concat_tables(self._pending)
            if self._thread is None:
                self._writer.write_table(table, ROW_GROUP_ROWS)
            else:
                self._written()
                self._writing = self._thread.submit(self._writer.write_table, table, ROW_GROUP_ROWS)
        self._pending, self._pending_rows = [], 0

    def _written(self) -> None:
        """Waits for the row group being written; its failure is raised here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def close(self) -> None:
        try:
            if self._writer is not None:
                self._flush()
                self._written()
        finally:
            if self._thread is not None:
                self._thread.shutdown()
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


def first_row_types(lines: list[bytes]) -> pa.Schema | None:
    """The types ``JoinedWriter.row_types`` gives once JOINED's first row is the first of
    these lines: what a JSONL log's chunk is read with before JOINED has its schema, so that
    the pass that reads its keys reads every field too, and no line is parsed twice. None
    where that line gives no schema (it is torn, or bad, or has a field JOINED cannot keep)."""
    from horizon_plugins_serving.join_shape import read_types

    try:
        row = parse_json_line(lines[0])
    except BadLine:
        return None
    if not isinstance(row, dict):
        return None
    try:
        _, schema = joined_schema(row | {"metrics": {}})
    except HorizonError:
        return None
    return read_types(schema)


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
