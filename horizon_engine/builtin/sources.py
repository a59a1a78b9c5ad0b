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
    BadLine,
    DataSource,
    HorizonError,
    PathPatterns,
    SourceBatch,
    SourceConfig,
    expand_paths,
    hookimpl,
    invalid_text_rows,
    parse_json_line,
    path_problems,
    strip_bom,
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


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Each line of a file, as bytes, with its number; the first without a byte order mark.

    Lines are decoded one by one by their reader (``parse_json_line``), so a byte that is not
    UTF-8 costs its line only. A file that cannot be read on (a truncated or corrupt ``.gz``
    or ``.bz2``) is a user's error naming the last line read.
    """
    number = 0
    try:
        with open_binary(path) as handle:
            for number, line in enumerate(handle, start=1):
                yield number, strip_bom(line) if number == 1 else line
    except (OSError, EOFError, zlib.error) as exc:
        raise HorizonError(
            f"{path}: cannot read the file (after {number} lines): {exc or type(exc).__name__}"
        ) from None


class JsonlSourceConfig(SourceConfig):
    path: PathPatterns = Field(min_length=1)
    """A file, folder or glob pattern (or a list of them); ``.bz2`` and ``.gz`` are read too."""


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
        for path in expand_paths(self.config.path, JSONL_SUFFIXES):
            pending: list[tuple[str, Any]] = []
            invalid: list[BadRow] = []
            for number, line in read_lines(path):
                if not line.strip():
                    continue
                location = f"{path}:{number}"
                try:
                    row = parse_json_line(line)
                except BadLine as exc:
                    text = line.decode("utf-8", "backslashreplace")
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

        for path in expand_paths(self.config.path, (".parquet",)):
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
                bad_rows = [
                    BadRow(locations[index], reason, "wrong_type", _row_of(batch, index))
                    for index, reason in sorted(conformed.bad.items())
                ]
                if bad_rows:
                    locations = [locations[index] for index in conformed.kept]
                yield SourceBatch(conformed.table, layout, locations, bad_rows, conformed.ignored)
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


def _row_of(batch: pa.RecordBatch, index: int) -> Any:
    """A bad row's content for the quarantine; None where its text is not even UTF-8."""
    import pyarrow as pa

    try:
        return batch.slice(index, 1).to_pylist(maps_as_pydicts="lossy")[0]
    except (UnicodeDecodeError, pa.ArrowException):
        return None


@dataclass
class Conformed:
    """A Parquet batch conformed to the layout's schema: the good rows, the index in the
    batch of each (``kept``), why each other row was left out (by index), ignored fields."""

    table: pa.Table
    kept: list[int]
    bad: dict[int, str]
    ignored: dict[str, int]


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

    def conform(batch: pa.RecordBatch) -> Conformed:
        arrays = []
        bad: dict[int, str] = {}
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
                bad.setdefault(index, f"{found}: {reason}")
            for index in invalid_text_rows(cast):
                bad.setdefault(index, f"{found}: not valid UTF-8")
        table = pa.Table.from_arrays(arrays, schema=target)
        kept = [index for index in range(batch.num_rows) if index not in bad]
        if bad:
            table = table.take(pa.array(kept, pa.int64()))
        ignored = {name: batch.num_rows for name in ignored_names}
        return Conformed(table, kept, bad, ignored)

    return conform


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
