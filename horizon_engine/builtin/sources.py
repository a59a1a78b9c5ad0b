"""Built-in data sources: JSONL files, Parquet files and Gymnasium environments.

Registered through the same hook a third-party source would use. pyarrow is imported inside
``read`` so that ``horizon plugins`` and ``horizon --help`` stay fast.
"""

from __future__ import annotations

import bz2
import gzip
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import Field

from horizon_engine import (
    INTEGER_ACTION_NOTE,
    MAX_LINE_BYTES,
    BadLine,
    DataSource,
    HorizonError,
    PathPatterns,
    SourceBatch,
    SourceConfig,
    duplicate_key_rows,
    expand_paths,
    hookimpl,
    invalid_text_rows,
    line_prefix,
    parse_json_line,
    path_problems,
    read_lines,
)
from horizon_engine.builtin.gym_source import GymSource

if TYPE_CHECKING:
    import pyarrow as pa

    from horizon_engine import RowLayout, RunContext

BATCH_ROWS = 10_000


JSONL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.bz2", ".json.bz2")
"""The files a folder given as a JSONL path contributes."""


def open_binary(path: Path) -> IO[bytes]:
    """Open a plain, ``.bz2`` or ``.gz`` file for reading its bytes."""
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return path.open("rb")


@dataclass(frozen=True)
class Damage:
    """Where a file stopped being readable: after line ``lines`` (``offset`` bytes of its
    text, decompressed), and what the reader said."""

    lines: int
    offset: int
    error: str

    def __str__(self) -> str:
        return (
            f"the file cannot be read past line {self.lines} (byte {self.offset:,} of its "
            f"text): {self.error}; the {self.lines} lines before it were read"
        )


def file_lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, bytes | Damage]]:
    """Each line of a file, as bytes, with its number (``json_lines.read_lines``: the first
    without a byte order mark, a line over ``max_line_bytes`` as a ``LongLine``).

    Lines are decoded one by one by their reader (``parse_json_line``), so a byte that is not
    UTF-8 costs its line only. A file that stops being readable part way (a ``.gz`` cut off
    mid-stream or with bytes after its last member, a corrupt ``.bz2``) gives the lines read
    before, then its ``Damage`` as the next line: the rows before it are kept. One that cannot
    be read at all is a user's error naming it.
    """
    number = offset = 0
    try:
        with open_binary(path) as handle:
            for number, line in read_lines(handle, max_line_bytes):
                offset += getattr(line, "length", len(line))
                yield number, line
    except (OSError, EOFError, zlib.error) as exc:
        error = str(exc) or type(exc).__name__
        if number == 0:
            raise HorizonError(f"{path}: cannot read the file (after 0 lines): {error}") from None
        yield number + 1, Damage(number, offset, error)


class JsonlSourceConfig(SourceConfig):
    path: PathPatterns = Field(min_length=1)
    """A file, folder or glob pattern (or a list of them); ``.bz2`` and ``.gz`` are read too."""
    max_line_bytes: int = Field(MAX_LINE_BYTES, ge=1024, le=2**31)
    """The longest line (in bytes, its newline not counted) read as a row, 16 MiB by default
    (a row of 10,000 features is about 300 KB); a longer line is a bad row (``too_long``),
    read past without being held in memory, and its quarantine keeps its first 4 KiB. Raise
    it for rows larger than that."""


class JsonlSource(DataSource):
    """Reads one JSON object per line: pre-timeline rows or Horizon's timeline rows."""

    name = "jsonl"
    Config = JsonlSourceConfig
    config: JsonlSourceConfig

    def problems(self) -> list[str]:
        return path_problems(self.config.path, JSONL_SUFFIXES)

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        from horizon_engine import BadRow, RowShaper

        shaper: RowShaper | None = None
        run_folder = run.output_dir if run is not None else None
        for path in expand_paths(self.config.path, JSONL_SUFFIXES, run_folder):
            pending: list[tuple[str, Any]] = []
            invalid: list[BadRow] = []
            for number, line in file_lines(path, self.config.max_line_bytes):
                location = f"{path}:{number}"
                if isinstance(line, Damage):
                    invalid.append(BadRow(location, str(line), "damaged_file"))
                    continue
                if not line.strip():
                    continue
                try:
                    row = parse_json_line(line)
                except BadLine as exc:
                    text = line_prefix(line).decode("utf-8", "backslashreplace")
                    invalid.append(BadRow(location, exc.reason, exc.kind, text))
                    continue
                pending.append((location, row))
                if len(pending) >= BATCH_ROWS and (shaper or isinstance(row, dict)):
                    # The layout is the one most of the first batch's rows show, so that one
                    # odd first row is a bad row rather than the format of the whole file.
                    shaper = shaper or _shaper(pending, self.config)
                    yield _shaped_batch(shaper, pending, invalid)
                    pending, invalid = [], []
            shaper = shaper or _shaper(pending, self.config)
            if shaper is None and (pending or invalid):
                example = f" ({invalid[0]})" if invalid else ""
                raise HorizonError(
                    f"{path}: no line holds a JSON object; expected one JSON object per line "
                    f"(JSON Lines){example}"
                )
            if shaper is not None and (pending or invalid):
                yield _shaped_batch(shaper, pending, invalid)


def _shaper(rows: list[tuple[str, Any]], config: SourceConfig) -> Any:
    """A ``RowShaper`` for the layout most of ``rows`` show, or None if none is an object."""
    from horizon_engine import RowShaper, majority_layout

    layout = majority_layout((row for _, row in rows), config.row_format, config.action_type)
    return None if layout is None else RowShaper(layout)


def _shaped_batch(shaper: Any, pending: list[tuple[str, Any]], invalid: list) -> SourceBatch:
    shaped = shaper.shape(pending)
    return SourceBatch(
        shaped.table,
        shaper.layout,
        shaped.locations,
        invalid + shaped.bad_rows,
        shaped.ignored_fields,
        shaped.notes,
    )


class ParquetSourceConfig(SourceConfig):
    path: PathPatterns = Field(min_length=1)
    """A Parquet file, a folder of them, or a glob pattern (or a list of them)."""


class RowLocations(Sequence[str]):
    """Row locations built on demand, so a million-row file does not need a million strings."""

    def __init__(self, origin: str, first: int, count: int) -> None:
        self.origin, self.first, self.count = origin, first, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(index)
        return f"{self.origin}:row {self.first + index % self.count}"


class ParquetSource(DataSource):
    """Reads Parquet files holding pre-timeline or timeline rows (ours, or a user's own)."""

    name = "parquet"
    Config = ParquetSourceConfig
    config: ParquetSourceConfig

    def problems(self) -> list[str]:
        return path_problems(self.config.path, (".parquet",))

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from horizon_engine import BadRow

        run_folder = run.output_dir if run is not None else None
        for path in expand_paths(self.config.path, (".parquet",), run_folder):
            try:
                parquet = pq.ParquetFile(path)
            except (OSError, pa.ArrowException) as exc:
                raise HorizonError(f"{path}: not a readable Parquet file ({exc})") from None
            if parquet.metadata.num_rows == 0:
                continue
            # Each file's own layout: the stage reports a file that differs from the first.
            layout = self._layout(parquet, path)
            conform = _conformer(parquet.schema_arrow, layout, str(path))
            first = 0
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS * 10):
                conformed = conform(batch)
                locations: Sequence[str] = RowLocations(str(path), first, batch.num_rows)
                bad = sorted(conformed.bad.items())
                contents = _rows_of(batch, [index for index, _ in bad])
                bad_rows = [
                    BadRow(locations[index], reason, kind, content)
                    for (index, (kind, reason)), content in zip(bad, contents, strict=True)
                ]
                if bad_rows:
                    locations = [locations[index] for index in conformed.kept]
                yield SourceBatch(
                    conformed.table, layout, locations, bad_rows, conformed.ignored, conformed.notes
                )
                first += batch.num_rows

    def _layout(self, parquet: Any, path: Path) -> RowLayout:
        """The layout Horizon Engine recorded in the file, or else the one most of its first
        ``LAYOUT_ROWS`` rows show (one odd row does not decide the file's format)."""
        from horizon_engine import RowLayout, majority_layout

        schema = parquet.schema_arrow
        if schema.metadata and b"horizon.row_format" in schema.metadata:
            return RowLayout.from_schema(schema, str(path))
        # Maps as dicts, as JSON gives them: detection tells a map action from a discrete one.
        rows = next(parquet.iter_batches(batch_size=LAYOUT_ROWS)).to_pylist(maps_as_pydicts="lossy")
        return majority_layout(rows, self.config.row_format, self.config.action_type)


LAYOUT_ROWS = 1000
"""How many of a Parquet file's first rows vote on its layout where the file does not record
it and the config says ``auto``."""


def _rows_of(batch: pa.RecordBatch, indices: list[int]) -> list[Any]:
    """Bad rows' contents for the quarantine, taken at once; where that fails (a text that
    is not UTF-8), row by row, with None for a row that is not even UTF-8. A map naming a key
    twice keeps its last value there (the row's reason names the key)."""
    import pyarrow as pa

    from horizon_engine import rows_as_dicts

    if not indices:
        return []
    try:
        return rows_as_dicts(pa.Table.from_batches([batch]).take(pa.array(indices, pa.int64())))
    except (UnicodeDecodeError, pa.ArrowException):
        if len(indices) == 1:
            return [None]
    return [row for index in indices for row in _rows_of(batch, [index])]


@dataclass
class Conformed:
    """A Parquet batch conformed to the layout's schema: the good rows, the index in the
    batch of each (``kept``), the kind and reason each other row was left out for (by index),
    ignored fields, and what was read as something else (``SourceBatch.notes``)."""

    table: pa.Table
    kept: list[int]
    bad: dict[int, tuple[str, str]]
    ignored: dict[str, int]
    notes: dict[str, int]


def _conformer(
    schema: pa.Schema, layout: RowLayout, where: str
) -> Callable[[pa.RecordBatch], Conformed]:
    """Check a file's columns against the layout once, and return a per-batch converter.

    A column whose type cannot become the layout's at all fails the file; a column whose
    values can, but for some rows (one string in a numeric column that is not a number, one
    fractional sequence number), leaves out those rows, each with its reason, as does a
    string that is not valid UTF-8 (Parquet's writers need not check).
    """
    import pyarrow as pa

    target = layout.schema
    sources: dict[str, str | None] = {}
    for column in layout.columns:
        found = next((n for n in (column.name, *column.aliases) if n in schema.names), None)
        if found is not None and schema.names.count(found) > 1:
            raise HorizonError(
                f"{where}: the file has {schema.names.count(found)} columns named '{found}'; "
                "which one holds the rows cannot be told, so rename or drop the others"
            )
        if found is None and column.required:
            also = "".join(f" or '{alias}'" for alias in column.aliases)
            raise HorizonError(
                f"{where}: missing column '{column.name}'{also} (expected {column.type}) "
                f"for {layout}; the file has {', '.join(schema.names)}"
            )
        sources[column.name] = found
    used = {name for name in sources.values() if name}
    known = layout.known_fields
    ignored_names = [name for name in schema.names if name not in used and name not in known]
    integer_actions = _integer_action_columns(schema, layout, sources)

    def conform(batch: pa.RecordBatch) -> Conformed:
        arrays = []
        bad: dict[int, tuple[str, str]] = {}
        for field in target:
            name = sources[field.name]
            if name is None:
                arrays.append(pa.nulls(batch.num_rows, field.type))
                continue
            column = batch.column(name)
            found = f"column '{name}' ({column.type})"
            try:
                cast, failed = _cast_rows(column, field.type)
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                failed, cast = {0: str(exc)}, None
            if cast is None or len(failed) == batch.num_rows:
                raise HorizonError(
                    f"{where}: column '{name}' has type {column.type}, "
                    f"expected {field.type} ({failed[min(failed)]})"
                )
            arrays.append(cast)
            for index, reason in failed.items():
                bad.setdefault(index, ("wrong_type", f"{found}: {reason}"))
            for index in invalid_text_rows(cast):
                bad.setdefault(index, ("wrong_type", f"{found}: not valid UTF-8"))
            for index, key in duplicate_key_rows(cast).items():
                reason = f"{found}: a map holds the key {key!r} twice"
                bad.setdefault(index, ("duplicate_key", reason))
        table = pa.Table.from_arrays(arrays, schema=target)
        kept = [index for index in range(batch.num_rows) if index not in bad]
        if bad:
            table = table.take(pa.array(kept, pa.int64()))
        ignored = {name: batch.num_rows for name in ignored_names}
        notes = {INTEGER_ACTION_NOTE: len(kept)} if integer_actions and kept else {}
        return Conformed(table, kept, bad, ignored, notes)

    return conform


def _integer_action_columns(
    schema: pa.Schema, layout: RowLayout, sources: dict[str, str | None]
) -> bool:
    """Whether a file's discrete action names (``action``, ``possible_actions``) are stored as
    integers, which the cast reads as their decimal names, as the JSONL source does."""
    import pyarrow as pa

    from horizon_engine import ActionType, RowFormat

    if (
        layout.action_type is not ActionType.DISCRETE
        or layout.row_format is not RowFormat.PRE_TIMELINE
    ):
        return False
    for column in ("action", "possible_actions"):
        name = sources.get(column)
        kind = schema.field(name).type if name else None
        if kind is not None and pa.types.is_list(kind):
            kind = kind.value_type
        if kind is not None and pa.types.is_integer(kind):
            return True
    return False


def _cast_rows(column: pa.Array, target: pa.DataType) -> tuple[pa.Array, dict[int, str]]:
    """``column`` as ``target``, null where a row's value cannot be cast, and why, by row.

    The whole column is cast at once; only where that fails is it halved, and halved again,
    down to the rows that fail: a few bad rows cost a few dozen casts, not one per row. A
    column of a type that cannot be cast at all raises Arrow's error.
    """
    import pyarrow as pa

    try:
        return _structs_as_maps(column, target).cast(target), {}
    except pa.ArrowInvalid as exc:
        if len(column) == 1:
            return pa.nulls(1, target), {0: str(exc)}
    half = len(column) // 2
    head, head_failed = _cast_rows(column.slice(0, half), target)
    tail, tail_failed = _cast_rows(column.slice(half), target)
    failed = head_failed | {half + index: reason for index, reason in tail_failed.items()}
    return pa.concat_arrays([head, tail]), failed


def _structs_as_maps(column: pa.Array, target: pa.DataType) -> pa.Array:
    """Feature columns stored as structs, as maps.

    Parquet written from Python dicts (``pa.Table.from_pylist``, pandas) stores a feature map as
    a struct with one field per feature id; Arrow cannot cast that to a map, so it is rebuilt
    here: one entry per non-null field, in field order. Other columns pass through unchanged.
    """
    import pyarrow as pa

    if pa.types.is_map(target) and pa.types.is_struct(column.type):
        return _struct_to_map(column)
    if (
        pa.types.is_list(target)
        and pa.types.is_map(target.value_type)
        and pa.types.is_list(column.type)
        and pa.types.is_struct(column.type.value_type)
    ):
        offsets = column.offsets.to_numpy(zero_copy_only=False)
        values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
        return pa.ListArray.from_arrays(
            pa.array(offsets - offsets[0], pa.int32()),
            _struct_to_map(values),
            mask=column.is_null(),
        )
    return column


def _struct_to_map(column: pa.StructArray) -> pa.MapArray:
    import numpy as np
    import pyarrow as pa

    names = np.array([column.type.field(i).name for i in range(column.type.num_fields)], object)
    children = column.flatten()
    present = np.ones((len(column), len(names)), dtype=bool)
    values = np.zeros((len(column), len(names)), dtype=np.float64)
    for index, child in enumerate(children):
        present[:, index] = child.is_valid().to_numpy(zero_copy_only=False)
        values[:, index] = child.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    keys = pa.array(np.tile(names, len(column))[present.ravel()], pa.string())
    items = pa.array(values.ravel()[present.ravel()], pa.float64())
    return pa.MapArray.from_arrays(offsets, keys, items, mask=column.is_null())


@hookimpl
def horizon_register_data_sources(register: Callable[[type], None]) -> None:
    register(JsonlSource)
    register(ParquetSource)
    register(GymSource)
