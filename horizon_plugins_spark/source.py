"""The ``spark_table`` source: logged rows from a Hive/Spark SQL table or any path Spark reads.

Spark does the reading, the ``ds`` partition filter (Horizon's ``startDs``/``endDs``, both
ends included) and the conversion to the row schema; the rows then come to the driver
partition by partition, because the source stage writes them to one local Parquet file. That
stage is the one place where a Spark pipeline's rows pass through the driver: the timeline,
where the work is, runs on the executors.

Where Spark would read a row differently from the JSONL and Parquet sources, the row is a bad
row here, with the JSONL source's reason (``_checks``): a JSON line Spark's reader cannot take
(bytes that are not UTF-8, text that is not JSON) arrives as its corrupt record, and a
fractional value in an integer column (a ``sequence_number`` of 1.5), which Spark's cast would
truncate, is caught before the cast. Not caught: a lone surrogate escape (``"\\ud800"``) in a
JSON file, which Spark's reader takes as ``?`` before any check can see it; that row is read
with ``?`` in its place.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from horizon_engine import (
    BadLine,
    BadRow,
    DataSource,
    HorizonError,
    PathPatterns,
    SourceBatch,
    SourceConfig,
    integer_problem,
    parse_json_line,
)
from horizon_plugins_spark.session import SparkOptions, spark_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from horizon_engine import RowLayout, RunContext

BATCH_ROWS = 10_000

CORRUPT = "_corrupt_record"
"""The column in which Spark's JSON reader keeps a line it could not read, as its bytes."""


class SparkTableConfig(SourceConfig):
    """The ``[source]`` section with ``kind = "spark_table"``."""

    table: str | None = None
    """A Hive/Spark SQL table, e.g. "logs.notifications"; give this or ``path``."""
    path: PathPatterns | None = None
    """A path (or list of paths) Spark can read: local, hdfs://, s3a://, globs."""
    format: Literal["parquet", "json", "orc"] = "parquet"
    """The format of the files under ``path``."""
    start_ds: str | None = None
    """Keep rows whose ``ds`` partition is at least this (e.g. "2019-01-01")."""
    end_ds: str | None = None
    """Keep rows whose ``ds`` partition is at most this."""
    spark: SparkOptions = Field(default_factory=SparkOptions)
    """``[source.spark]``: the session to start when none is active (master, conf, app_name)."""

    @model_validator(mode="after")
    def _one_origin(self) -> SparkTableConfig:
        if (self.table is None) == (self.path is None):
            raise ValueError("give exactly one of 'table' and 'path'")
        return self


class SparkTableSource(DataSource):
    """Reads pre-timeline or timeline rows from a Spark SQL table or path, by ds partition."""

    name = "spark_table"
    Config = SparkTableConfig
    config: SparkTableConfig

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        from pyspark.errors import PySparkException

        from horizon_engine import detect_layout

        origin = self._origin()
        try:
            frame = self._frame()
            first = frame.limit(1).collect()
        except PySparkException as exc:
            raise HorizonError(f"[source] spark_table {origin}: {_first_line(exc)}") from None
        if not first:
            raise HorizonError(f"[source] spark_table {origin}: no rows{self._ds_range()}")
        layout = detect_layout(
            first[0].asDict(recursive=True), self.config.row_format, self.config.action_type
        )
        frame, ignored, checks = _conform(frame, layout, origin)
        names = layout.schema.names
        key = names.index("mdp_id"), names.index("sequence_number")
        pending: list[Any] = []
        try:
            for row in frame.toLocalIterator(prefetchPartitions=True):
                pending.append(row)
                if len(pending) == BATCH_ROWS:
                    yield _batch(pending, layout, origin, key, ignored, checks)
                    pending = []
        except PySparkException as exc:
            raise HorizonError(f"[source] spark_table {origin}: {_first_line(exc)}") from None
        if pending:
            yield _batch(pending, layout, origin, key, ignored, checks)

    def _origin(self) -> str:
        if self.config.table is not None:
            return f"table {self.config.table}"
        return f"path {self.config.path!r}"

    def _ds_range(self) -> str:
        bounds = []
        if self.config.start_ds is not None:
            bounds.append(f"ds >= {self.config.start_ds!r}")
        if self.config.end_ds is not None:
            bounds.append(f"ds <= {self.config.end_ds!r}")
        return f" with {' and '.join(bounds)}" if bounds else ""

    def _frame(self) -> DataFrame:
        from pyspark.sql import functions as F

        spark = spark_session(self.config.spark)
        if self.config.table is not None:
            frame = spark.table(self.config.table)
        else:
            reader = spark.read.format(self.config.format)
            if self.config.format == "json":
                reader = reader.option("columnNameOfCorruptRecord", CORRUPT)
            frame = reader.load(self.config.path)
        if self.config.start_ds is None and self.config.end_ds is None:
            return frame
        if "ds" not in frame.columns:
            raise HorizonError(
                f"[source] spark_table {self._origin()}: start_ds/end_ds filter on a 'ds' "
                f"column, which it does not have ({', '.join(frame.columns)})"
            )
        if self.config.start_ds is not None:
            frame = frame.where(F.col("ds") >= F.lit(self.config.start_ds))
        if self.config.end_ds is not None:
            frame = frame.where(F.col("ds") <= F.lit(self.config.end_ds))
        return frame


def _conform(
    frame: DataFrame, layout: RowLayout, origin: str
) -> tuple[DataFrame, list[str], list[str]]:
    """Select the layout's columns in its order, cast by Spark to the row schema's types; the
    names of the columns left out, for the source stage's warnings; and after the layout's
    columns, one for each of ``_checks``, whose names it returns last.

    A feature map read from JSON arrives as a struct with one field per feature id; Spark
    cannot cast a struct to a map, so such a column goes through JSON text, which drops the
    struct's null fields: the features a row does not have.
    """
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    types = dict(frame.dtypes)
    columns = []
    used = {CORRUPT}
    checks = {}
    if CORRUPT in types:
        checks[CORRUPT] = F.col(CORRUPT).cast("binary")
    for column in layout.columns:
        found = next((n for n in (column.name, *column.aliases) if n in types), None)
        used.add(found)
        target = from_arrow_type(column.type).simpleString()
        if found is None:
            if column.required:
                also = "".join(f" or '{alias}'" for alias in column.aliases)
                raise HorizonError(
                    f"[source] spark_table {origin}: missing column '{column.name}'{also} "
                    f"(expected {target}) for {layout}; it has {', '.join(types)}"
                )
            columns.append(F.lit(None).cast(target).alias(column.name))
        elif types[found] == target:
            columns.append(F.col(found).alias(column.name))
        elif "struct<" in types[found] and "map<" in target:
            columns.append(F.from_json(F.to_json(F.col(found)), target).alias(column.name))
        else:
            fractional = types[found] in FRACTIONS or types[found].startswith("decimal")
            if target in INTEGERS and fractional:
                value = F.col(found).cast("double")
                checks[column.name] = F.when(value != F.floor(value), value)
            columns.append(F.col(found).cast(target).alias(column.name))
    try:
        conformed = frame.select(*columns, *[check.alias(name) for name, check in checks.items()])
    except PySparkException as exc:
        raise HorizonError(f"[source] spark_table {origin}: {_first_line(exc)}") from None
    return conformed, [name for name in types if name not in used], list(checks)


INTEGERS = {"tinyint", "smallint", "int", "bigint"}
FRACTIONS = {"float", "double"}


def _checks(values: Sequence[Any], names: list[str]) -> tuple[str, str] | None:
    """Why a row Spark read is a bad row, by the checks ``_conform`` added (their values and
    names), as the JSONL source words it: its kind and reason; None if it is not."""
    for name, value in zip(names, values, strict=True):
        if value is None:
            continue
        if name == CORRUPT:
            try:
                parse_json_line(bytes(value))
            except BadLine as exc:
                return exc.kind, exc.reason
            return "wrong_type", "not a row Spark's JSON reader takes"
        problem = integer_problem(value)
        return problem.kind, f"field '{name}': {problem}"
    return None


def _batch(
    rows: list[Any],
    layout: RowLayout,
    origin: str,
    key: tuple[int, int],
    ignored: list[str],
    checks: list[str],
) -> SourceBatch:
    """Rows Spark already gave the schema's types, as an Arrow table (maps arrive as dicts),
    less those ``_checks`` finds bad."""
    import pyarrow as pa

    schema = layout.schema
    width = len(schema)
    bad_rows = []
    if checks:
        good = []
        for row in rows:
            problem = _checks(row[width:], checks)
            if problem is None:
                good.append(row[:width])
                continue
            kind, reason = problem
            content = row.asDict(recursive=True)
            where = f"{origin}: mdp_id {content.get('mdp_id')!r} sequence_number "
            where += str(content.get("sequence_number"))
            record = content.get(CORRUPT)
            shown = bytes(record).decode("utf-8", "backslashreplace") if record else content
            bad_rows.append(BadRow(where, reason, kind, shown))
        rows = good
    columns = list(zip(*rows, strict=True)) or [() for _ in schema]
    table = pa.Table.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, schema, strict=True)],
        schema=schema,
    )
    locations = _KeyLocations(origin, columns[key[0]], columns[key[1]])
    return SourceBatch(table, layout, locations, bad_rows, dict.fromkeys(ignored, len(rows)))


class _KeyLocations(Sequence[str]):
    """Rows named by their episode and step: a table's rows have no line number.

    Built on demand, so that a batch does not hold a string per row.
    """

    def __init__(self, origin: str, mdp_ids: Sequence[Any], steps: Sequence[Any]) -> None:
        self.origin, self.mdp_ids, self.steps = origin, mdp_ids, steps

    def __len__(self) -> int:
        return len(self.mdp_ids)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return f"{self.origin}: mdp_id {self.mdp_ids[index]!r} sequence_number {self.steps[index]}"


def _first_line(exc: Exception) -> str:
    """Spark's error without the JVM stack trace it appends."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
