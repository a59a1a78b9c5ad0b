"""Built-in data sources: JSONL files, Parquet files and Gymnasium environments.

Registered through the same hook a third-party source would use. pyarrow is imported inside
``read`` so that ``horizon plugins`` and ``horizon --help`` stay fast.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import Field

from horizon_engine.builtin.gym_source import GymSource
from horizon_engine.components import DataSource, SourceBatch, SourceConfig
from horizon_engine.errors import HorizonError
from horizon_engine.hookspecs import hookimpl

if TYPE_CHECKING:
    import pyarrow as pa

    from horizon_engine.pipeline import RunContext
    from horizon_engine.schema import RowLayout

BATCH_ROWS = 10_000


def expand_paths(patterns: str | list[str], what: str) -> list[Path]:
    """Files matching the configured paths or glob patterns, in a stable order."""
    patterns = [patterns] if isinstance(patterns, str) else patterns
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise HorizonError(f"[source] path {pattern!r}: no {what} file matches")
        for match in matches:
            path = Path(match)
            files.extend(sorted(path.rglob(f"*.{what}")) if path.is_dir() else [path])
    return files


def open_text(path: Path) -> IO[str]:
    """Open a plain, ``.bz2`` or ``.gz`` text file."""
    if path.suffix == ".bz2":
        return bz2.open(path, "rt", encoding="utf-8")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


class JsonlSourceConfig(SourceConfig):
    path: str | list[str] = Field(min_length=1)
    """A file, folder or glob pattern (or a list of them); ``.bz2`` and ``.gz`` are read too."""


class JsonlSource(DataSource):
    """Reads one JSON object per line: pre-timeline rows or Horizon's timeline rows."""

    name = "jsonl"
    Config = JsonlSourceConfig
    config: JsonlSourceConfig

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        from horizon_engine.schema import BadRow, RowShaper, detect_layout

        shaper: RowShaper | None = None
        for path in expand_paths(self.config.path, "json*"):
            with open_text(path) as handle:
                pending: list[tuple[str, Any]] = []
                invalid: list[BadRow] = []
                for number, line in enumerate(handle, start=1):
                    if not line.strip():
                        continue
                    location = f"{path}:{number}"
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        invalid.append(BadRow(location, f"invalid JSON: {exc}", "invalid_json", line))
                        continue
                    if shaper is None and isinstance(row, dict):
                        layout = detect_layout(row, self.config.row_format, self.config.action_type)
                        shaper = RowShaper(layout)
                    pending.append((location, row))
                    if len(pending) >= BATCH_ROWS and shaper is not None:
                        yield _shaped_batch(shaper, pending, invalid)
                        pending, invalid = [], []
                if shaper is None and (pending or invalid):
                    raise HorizonError(f"{path}: no line holds a JSON object")
                if shaper is not None and (pending or invalid):
                    yield _shaped_batch(shaper, pending, invalid)


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
    path: str | list[str] = Field(min_length=1)
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

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        import pyarrow.parquet as pq

        layout: RowLayout | None = None
        for path in expand_paths(self.config.path, "parquet"):
            parquet = pq.ParquetFile(path)
            if layout is None:
                layout = self._layout(parquet, path)
            conform = _conformer(parquet.schema_arrow, layout, str(path))
            first = 0
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS * 10):
                table, ignored = conform(batch)
                yield SourceBatch(
                    table, layout, RowLocations(str(path), first, table.num_rows), [], ignored
                )
                first += table.num_rows

    def _layout(self, parquet: Any, path: Path) -> RowLayout:
        from horizon_engine.schema import RowLayout, detect_layout

        schema = parquet.schema_arrow
        if schema.metadata and b"horizon.row_format" in schema.metadata:
            return RowLayout.from_schema(schema, str(path))
        first = parquet.read_row_group(0).slice(0, 1).to_pylist() if parquet.num_row_groups else []
        if not first:
            raise HorizonError(f"{path}: the file holds no rows")
        return detect_layout(first[0], self.config.row_format, self.config.action_type)


def _conformer(
    schema: pa.Schema, layout: RowLayout, where: str
) -> Callable[[pa.RecordBatch], tuple[pa.Table, dict[str, int]]]:
    """Check a file's columns against the layout once, and return a per-batch converter."""
    import pyarrow as pa

    target = layout.schema
    sources: dict[str, str | None] = {}
    for column in layout.columns:
        found = next((n for n in (column.name, *column.aliases) if n in schema.names), None)
        if found is None and column.required:
            raise HorizonError(
                f"{where}: missing column '{column.name}' (expected {column.type}); "
                f"the file has {', '.join(schema.names)}"
            )
        sources[column.name] = found
    used = {name for name in sources.values() if name}
    ignored_names = [name for name in schema.names if name not in used]

    def conform(batch: pa.RecordBatch) -> tuple[pa.Table, dict[str, int]]:
        arrays = []
        for field in target:
            name = sources[field.name]
            if name is None:
                arrays.append(pa.nulls(batch.num_rows, field.type))
                continue
            try:
                arrays.append(batch.column(name).cast(field.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise HorizonError(
                    f"{where}: column '{name}' has type {batch.schema.field(name).type}, "
                    f"expected {field.type} ({exc})"
                ) from None
        ignored = {name: batch.num_rows for name in ignored_names}
        return pa.Table.from_arrays(arrays, schema=target), ignored

    return conform


@hookimpl
def horizon_register_data_sources(register: Callable[[type], None]) -> None:
    register(JsonlSource)
    register(ParquetSource)
    register(GymSource)
