"""``horizon join --engine spark``: the local engine's join, as Spark SQL on DataFrames.

Imported only when Spark is asked for: a serving process never imports Spark, and the
import-linter contract that keeps pyspark out of the serving package names this module as its
one exception. The join runs on the executors as SQL expressions, without Python UDFs, so an
executor needs nothing but Spark; what reaches the driver is counts, the few ids and lines the
report names, and the bad rows it shows, whose reasons the local engine's own checks word.

The rows and counts are the local engine's (``tests/test_join.py`` and
``tests/test_join_spark_hostile.py`` hold the two to that). Where Spark's reader would take a
line the local one refuses, a pattern on the line's text finds it first: a decision_id given
as a number (Spark would take it as its text: ``STRING_ID``), bytes that are not UTF-8 (Spark
would read each as U+FFFD) and a lone surrogate escape (Spark would read it as ``?``:
``lone_surrogate``). A bad row's reason is worded by the local engine's checks, from the
line's bytes as they are in the file.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine import FLOAT32_MAX, HorizonError, atomic_output, number_problem
from horizon_plugins_serving.join_readers import ignored_files, is_parquet, parquet_files
from horizon_plugins_serving.join_report import SHOWN, BadRows, JoinReport
from horizon_plugins_serving.join_rows import (
    JOINED_ALREADY,
    MISSING_ID,
    decision_line_problem,
    line_problem,
    reward_problem,
    timestamp_problem,
)
from horizon_plugins_serving.join_writer import joined_schema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

ZONE = r"(Z|z|[+-][0-9]{2}(:?[0-9]{2})?)$"
"""A timestamp's text must end with its zone, as the local engine's Arrow parser requires."""

STRING_ID = r'"decision_id"\s*:\s*"'
"""A line whose decision_id is a JSON string: Spark's reader would take a number as its text."""

ESCAPES = (
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair
    r"|\\u[0-9a-fA-F]{4}|\\."  # any other escape, an escaped backslash included
)
"""A JSON line's escapes, one match each, read left to right (so that ``\\\\ud800`` is an escaped
backslash and text): a surrogate escape matched alone is a lone surrogate."""

LONE_SURROGATE = r"^\\u[dD][89a-fA-F][0-9a-fA-F]{2}$"

FILE_SHIFT = 40
"""A Parquet row's position: its file's order times 2**40 plus its row in the file."""


def spark_session() -> SparkSession:
    """The active SparkSession, or a local one started as the Spark plugin starts its own.

    A session already running (spark-submit, a notebook, a test's) is used as it is, so that a
    cluster's own settings win; without one, a local session on the loopback, quiet.
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName("horizon-join")
    if not SparkConf().contains("spark.master"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Spark's 200 shuffle partitions are meant for a cluster: on one machine each costs a
        # task per stage (a 200k-decision join wrote in 35 s with them, 9 s with 8).
        partitions = str(2 * (os.cpu_count() or 4))
        builder = builder.master("local[*]").config("spark.sql.shuffle.partitions", partitions)
    session = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def hadoop_path(path: Path) -> str:
    """A local path as Spark reads it: ``file:``, its glob characters escaped."""
    return "file:" + re.sub(r"([\\*?\[\]{}])", r"\\\1", str(path.resolve()))


def micros(text: Column) -> Column:
    """UTC microseconds of an ISO 8601 text with a zone; null where it is not one."""
    from pyspark.sql import functions as F

    parsed = F.unix_micros(F.try_to_timestamp(text))
    return F.when(text.rlike(ZONE), parsed)


def lone_surrogate(text: Column) -> Column:
    """Whether a JSON line escapes a lone surrogate (``json_lines``' ``bad_text``), which
    Spark's reader would take as ``?``. Only a line with a surrogate escape is looked at."""
    from pyspark.sql import functions as F

    escapes = F.regexp_extract_all(text, F.lit(ESCAPES), 0)
    lone = F.exists(escapes, lambda escape: escape.rlike(LONE_SURROGATE))
    return F.when(text.rlike(r"\\u[dD][89a-fA-F]"), lone).otherwise(F.lit(False))


# --- reading ----------------------------------------------------------------------------------


def numbered_lines(spark: SparkSession, path: Path) -> tuple[DataFrame, int | None]:
    """A JSONL file's non-blank lines with their numbers (from 1), and the number of its last
    line when that line has no newline (what a crash mid-write leaves), else None.

    A line's number is its partition's first line plus its place in the partition: one small
    job counts each partition's lines.
    """
    from pyspark.sql import functions as F

    text = spark.read.text(hadoop_path(path)).select(
        F.spark_partition_id().alias("part"),
        F.monotonically_increasing_id().alias("id"),
        F.col("value").alias("text"),
    )
    counts = dict(text.groupBy("part").count().collect())
    starts, total = [], 0
    for part in sorted(counts):
        starts += [F.lit(part), F.lit(total)]
        total += counts[part]
    start = F.create_map(*starts)[F.col("part")] if starts else F.lit(0)
    line = start + (F.col("id") - F.shiftleft(F.col("part").cast("long"), 33)) + 1
    numbered = text.select(line.alias("line"), "text").filter(F.trim("text") != "")
    return numbered, None if _ends_whole(path) else total


def _ends_whole(path: Path) -> bool:
    """Whether a file is empty or ends with a newline: its last line is whole."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return True
        handle.seek(size - 1)
        return handle.read(1) == b"\n"


def parquet_rows(spark: SparkSession, path: Path) -> tuple[DataFrame, list[Path]]:
    """A Parquet file's or part directory's rows with their ``position`` in log order."""
    from pyspark.sql import functions as F

    files = parquet_files(path)
    if not files:
        raise HorizonError(f"{path}: no Parquet part files")
    order = F.create_map(*[F.lit(item) for i, f in enumerate(files) for item in (f.name, i)])
    frame = spark.read.parquet(*map(hadoop_path, files))
    position = F.shiftleft(order[F.col("_metadata.file_name")].cast("long"), FILE_SHIFT) + F.col(
        "_metadata.row_index"
    )
    return frame.select("*", position.alias("position")), files


def parquet_location(files: list[Path], position: int) -> str:
    return f"{files[position >> FILE_SHIFT]}:row {position & ((1 << FILE_SHIFT) - 1)}"


def column_or_null(frame: DataFrame, name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(name) if name in frame.columns else F.lit(None)


class Checked:
    """Rows classified by SQL as good, torn or bad; the bad ones shown through ``bad``.

    The classified rows are cached once computed: every count and the join read them, not the
    files again, until ``unpersist``."""

    def __init__(
        self,
        frame: DataFrame,
        kind: str,
        where: Callable[[Row], str],
        reason: Callable[[Row], str],
    ) -> None:
        self.frame, self.kind, self.where, self.reason = frame.persist(), kind, where, reason

    def good(self, bad: BadRows) -> DataFrame:
        """The good rows, once the bad ones are reported (the first one fails the join unless
        bad rows are skipped)."""
        from pyspark.sql import functions as F

        rejected = self.frame.filter(F.col("status") == "bad")
        shown = 2 * SHOWN if bad.skip else 1
        examples = rejected.orderBy("position").limit(shown)
        if "text" in self.frame.columns:  # the line's bytes, as the local engine reads them
            examples = examples.withColumn("raw", F.col("text").cast("binary"))
        examples = examples.collect()
        for row in examples:
            bad.found(self.where(row), self.reason(row), self.kind, row.position)
        bad.flush()
        if examples and bad.skip:
            total = rejected.count()
            if self.kind == "decision":
                bad.report.bad_decision_rows = total
            else:
                bad.report.bad_reward_rows = total
        return self.frame.filter(F.col("status") == "good").drop("status")

    def unpersist(self) -> None:
        self.frame.unpersist()


def check_jsonl_decisions(spark: SparkSession, path: Path, report: JoinReport) -> Checked:
    """Decision lines: torn ones counted in the report, the others checked by their keys."""
    from pyspark.sql import functions as F

    lines, torn_last = numbered_lines(spark, path)
    parsed = F.from_json(
        "text",
        "decision_id string, timestamp string, metrics string, torn string",
        {"columnNameOfCorruptRecord": "torn"},
    )
    json = F.col("row.torn").isNull()
    whole = json & F.ltrim("text").startswith("{")
    # Only the last line, without its newline, is torn (``join_rows.torn_line``).
    at_end = F.lit(False) if torn_last is None else F.col("line") == torn_last
    frame = lines.select(
        F.col("line").alias("position"),
        "text",
        parsed.alias("row"),
        whole.alias("whole"),
        at_end.alias("at_end"),
        # Not a row the next run can take, whole or not (as ``json_lines`` finds it).
        (~F.is_valid_utf8("text") | (json & lone_surrogate(F.col("text")))).alias("bad_text"),
    ).select(
        "position",
        "text",
        "whole",
        "at_end",
        "bad_text",
        F.col("row.decision_id").alias("decision_id"),
        micros(F.col("row.timestamp")).alias("micros"),
        F.col("row.metrics").isNotNull().alias("has_metrics"),
    )
    bad = (
        ~F.col("whole")
        | (F.coalesce(F.col("decision_id"), F.lit("")) == "")
        | ~F.col("text").rlike(STRING_ID)
        | F.col("micros").isNull()
        | F.col("has_metrics")
    )
    status = (
        F.when(F.col("bad_text"), "bad")
        .when(F.col("at_end"), "torn")
        .when(bad, "bad")
        .otherwise("good")
    )
    checked = Checked(
        frame.withColumn("status", status).drop("whole", "at_end", "bad_text", "has_metrics"),
        "decision",
        lambda row: f"{path}:{row.position}",
        lambda row: decision_line_problem(bytes(row.raw)) or "rejected by Spark's reader",
    )
    torn = checked.frame.filter(F.col("status") == "torn").select("position")
    report.torn_lines = torn.count()
    report.torn_line_numbers = [row.position for row in torn.orderBy("position").take(SHOWN)]
    return checked


def check_parquet_decisions(spark: SparkSession, path: Path) -> Checked:
    from pyspark.sql import functions as F

    frame, files = parquet_rows(spark, path)
    for name in ("decision_id", "timestamp"):
        if name not in frame.columns:
            raise HorizonError(f"{path}: no {name} column in the decision log")
    frame = frame.withColumn("micros", timestamp_micros(frame))
    identifier = F.col("decision_id").cast("string")
    status = (
        F.when(F.coalesce(identifier, F.lit("")) == "", "bad")
        .when(column_or_null(frame, "metrics").isNotNull(), "bad")
        .when(F.col("micros").isNull(), "bad")
        .otherwise("good")
    )

    def reason(row: Row) -> str:
        fields = row.asDict()
        if not fields["decision_id"]:
            return MISSING_ID
        if fields.get("metrics") is not None:
            return JOINED_ALREADY
        return timestamp_problem(fields["timestamp"]) or "rejected by Spark's reader"

    return Checked(
        frame.withColumn("status", status),
        "decision",
        lambda row: parquet_location(files, row.position),
        reason,
    )


METRICS = "map<string,double>"


def check_rewards(spark: SparkSession, path: Path, report: JoinReport) -> Checked:
    """Reward rows as (position, decision_id, micros, metrics map), classified good, bad or
    torn (a JSONL file's last line, cut by a crash mid-write: counted in the report)."""
    from pyspark.sql import functions as F

    frame, where, reason = (check_parquet_rewards if is_parquet(path) else check_jsonl_rewards)(
        spark, path
    )
    good = (
        F.col("whole")
        & (F.coalesce(F.col("decision_id"), F.lit("")) != "")
        & F.col("micros").isNotNull()
        & F.col("metrics").isNotNull()
        & F.forall(F.map_values("metrics"), holdable)
    )
    status = (
        F.when(F.col("torn"), "torn").when(F.coalesce(good, F.lit(False)), "good").otherwise("bad")
    )
    checked = Checked(frame.withColumn("status", status).drop("torn"), "reward", where, reason)
    if not is_parquet(path):
        report.torn_reward_lines = checked.frame.filter(F.col("status") == "torn").count()
    return checked


def holdable(value: Column) -> Column:
    """The rule of every row's values (``horizon_engine.number_problem``) for a number Spark
    read as a double: finite, and within float32 (null, NaN and infinities are not)."""
    from pyspark.sql import functions as F

    return F.coalesce(F.abs(value) <= FLOAT32_MAX, F.lit(False))


Located = tuple["DataFrame", Callable[["Row"], str], Callable[["Row"], str]]
"""Parsed rows, and how to name a row and word what is wrong with it."""


def check_jsonl_rewards(spark: SparkSession, path: Path) -> Located:
    from pyspark.sql import functions as F

    lines, torn_last = numbered_lines(spark, path)
    schema = f"decision_id string, timestamp string, metrics {METRICS}, bad string"
    parsed = F.from_json("text", schema, {"columnNameOfCorruptRecord": "bad"})
    json = F.col("row.bad").isNull()
    utf8 = F.is_valid_utf8("text")
    torn = F.lit(False) if torn_last is None else (F.col("position") == torn_last) & utf8 & ~json
    frame = lines.select(F.col("line").alias("position"), "text", parsed.alias("row")).select(
        "position",
        "text",
        F.col("row.decision_id").alias("decision_id"),
        micros(F.col("row.timestamp")).alias("micros"),
        F.col("row.metrics").alias("metrics"),
        (json & F.col("text").rlike(STRING_ID) & utf8 & ~lone_surrogate(F.col("text"))).alias(
            "whole"
        ),
        torn.alias("torn"),
    )
    return (
        frame,
        lambda row: f"{path}:{row.position}",
        lambda row: line_problem(bytes(row.raw), reward_problem) or "rejected by Spark's reader",
    )


def check_parquet_rewards(spark: SparkSession, path: Path) -> Located:
    from pyspark.sql import functions as F

    frame, files = parquet_rows(spark, path)
    missing = {"decision_id", "timestamp", "metrics"} - set(frame.columns)
    if missing:
        raise HorizonError(f"{path}: no {', '.join(sorted(missing))} column in the rewards")
    metrics = F.col("metrics")
    if dict(frame.dtypes)["metrics"].startswith("struct"):  # one field per metric
        names = frame.schema["metrics"].dataType.fieldNames()
        pairs = [item for name in names for item in (F.lit(name), metrics[name])]
        metrics = F.map_filter(F.create_map(*pairs), lambda _, value: value.isNotNull())
    frame = frame.select(
        "position",
        F.col("decision_id").cast("string").alias("decision_id"),
        F.col("timestamp").cast("string").alias("timestamp_text"),
        timestamp_micros(frame).alias("micros"),
        metrics.cast(METRICS).alias("metrics"),
        F.lit(True).alias("whole"),
        F.lit(False).alias("torn"),
    )

    def reason(row: Row) -> str:
        if not row.decision_id:
            return MISSING_ID
        if row.metrics is None:
            return "metrics is missing"
        for name, value in row.metrics.items():
            if value is None or number_problem(value) is not None:
                return (
                    f"metric {name!r}: {number_problem(value) if value is not None else 'missing'}"
                )
        return timestamp_problem(row.timestamp_text) or "rejected by Spark's reader"

    return frame, lambda row: parquet_location(files, row.position), reason


def timestamp_micros(frame: DataFrame) -> Column:
    """A Parquet frame's ``timestamp`` as UTC microseconds: ISO 8601 text, or a timestamp."""
    from pyspark.sql import functions as F

    if dict(frame.dtypes)["timestamp"] == "string":
        return micros(F.col("timestamp"))
    return F.unix_micros(F.col("timestamp").cast("timestamp"))


# --- the join ---------------------------------------------------------------------------------


def join_spark(
    decisions: Path,
    rewards_path: Path,
    output: Path,
    window_seconds: float,
    defaults: dict[str, float] | None,
    skip_bad_rows: bool,
) -> JoinReport:
    """The Spark engine: the local engine's join and counts, written as the local one writes."""

    spark = spark_session()
    report = JoinReport("spark", window_seconds, defaults, ignored_files=ignored_files(decisions))
    bad = BadRows(skip_bad_rows, report)
    if is_parquet(decisions):
        log = check_parquet_decisions(spark, decisions)
    else:
        log = check_jsonl_decisions(spark, decisions, report)
    rewards = check_rewards(spark, rewards_path, report)
    try:
        _join(spark, log.good(bad), rewards.good(bad), bad, output, decisions)
    finally:
        log.unpersist()
        rewards.unpersist()
    return report


def _join(
    spark: SparkSession,
    rows: DataFrame,
    rewards: DataFrame,
    bad: BadRows,
    output: Path,
    decisions: Path,
) -> None:
    """Count, sum and write, as ``plan_join`` and ``join_local`` do; fills ``report``."""
    from pyspark.sql import functions as F

    report = bad.report
    defaults = report.default_metrics

    groups = (
        rows.groupBy("decision_id")
        .agg(F.min(F.struct("position", "micros")).alias("first"), F.count("*").alias("rows"))
        .persist()
    )
    totals = groups.agg(F.sum("rows").alias("rows"), F.count("*").alias("decisions")).first()
    report.decision_rows = totals.rows or 0
    report.decisions = totals.decisions
    report.duplicate_decisions = report.decision_rows - report.decisions
    repeated = groups.filter(F.col("rows") > 1).orderBy("first.position").limit(SHOWN)
    report.duplicate_ids = [row.decision_id for row in repeated.select("decision_id").collect()]
    firsts = groups.select(
        "decision_id",
        F.col("first.position").alias("first_position"),
        F.col("first.micros").alias("decision_micros"),
    )

    matched = rewards.join(firsts, "decision_id", "left").withColumn(
        "delay", F.col("micros") - F.col("decision_micros")
    )
    window = round(report.window_seconds * 1_000_000)
    known = F.col("first_position").isNotNull()
    early, late = F.col("delay") < 0, F.col("delay") > window
    inside = known & ~early & ~late
    matched = matched.withColumn("inside", inside).cache()
    counts = matched.agg(
        F.count("*").alias("rows"),
        F.count(F.when(~known, 1)).alias("unknown"),
        F.count(F.when(known & early, 1)).alias("early"),
        F.count(F.when(known & late, 1)).alias("late"),
        F.count(F.when(F.col("inside"), 1)).alias("inside"),
    ).first()
    report.reward_rows, report.unknown_rewards = counts.rows, counts.unknown
    report.early_rewards, report.late_rewards = counts.early, counts.late
    report.rewards_attached = counts.inside
    unknown = (
        matched.filter(~known)
        .groupBy("decision_id")
        .agg(F.min("position").alias("first"))
        .orderBy("first")
        .limit(SHOWN)
    )
    report.unknown_ids = [row.decision_id for row in unknown.collect()]

    attached = matched.filter("inside")
    summed = (
        attached.select("decision_id", F.explode("metrics").alias("metric", "value"))
        .groupBy("decision_id", "metric")
        .agg(F.sum("value").alias("value"))
        .persist()
    )
    unholdable = _unholdable_sums(summed, firsts, bad)
    if unholdable is not None:
        firsts = firsts.join(unholdable, "decision_id", "left_anti")
        attached = attached.join(unholdable, "decision_id", "left_anti")
    sums = summed.groupBy("decision_id").agg(
        F.array_sort(F.collect_list(F.struct("metric", "value"))).alias("entries")
    )
    rewarded = (
        attached.select(F.col("first_position").alias("position"), "decision_id")
        .distinct()
        .join(sums, "decision_id", "left")
        .select("position", F.map_from_entries("entries").alias("summed"))
    )
    report.rewarded = rewarded.count()
    unrewarded = report.decisions - report.rewarded
    if defaults is None:
        report.dropped = unrewarded
    else:
        report.defaulted = unrewarded
    report.written = report.decisions - report.dropped

    empty = F.create_map().cast("map<string,double>")
    default = (
        F.create_map(*[F.lit(item) for pair in sorted(defaults.items()) for item in pair]).cast(
            "map<string,double>"
        )
        if defaults
        else empty
    )
    joined = (
        rows.join(firsts.select(F.col("first_position").alias("position")), "position")
        .join(rewarded.withColumn("is_rewarded", F.lit(True)), "position", "left")
        .withColumn(
            "joined_metrics",
            F.when(F.col("is_rewarded"), F.coalesce("summed", empty)).otherwise(default),
        )
    )
    if defaults is None:
        joined = joined.filter(F.col("is_rewarded"))
    write_joined(spark, joined, decisions, output)
    groups.unpersist()
    matched.unpersist()
    summed.unpersist()


def _unholdable_sums(summed: DataFrame, firsts: DataFrame, bad: BadRows) -> DataFrame | None:
    """The decisions whose summed metric training's float32 cannot hold (each reward fits,
    their sum does not), as ``join``'s ``_drop_unholdable_sums`` finds them: each such sum is a
    bad decision row, named as the local engine names it; the decisions' ids, or None if none.
    The report's counts of decisions leave them out."""
    from pyspark.sql import functions as F

    over = summed.filter(~holdable(F.col("value"))).join(firsts, "decision_id")
    shown = 2 * SHOWN if bad.skip else 1
    examples = over.orderBy("first_position", "metric").limit(shown).collect()
    if not examples:
        return None
    for row in examples:
        bad.found(
            f"decision {row.decision_id!r}",
            f"metric {row.metric!r} summed over its rewards: {number_problem(row.value)}",
            "decision",
            row.first_position,
        )
    bad.flush()
    report = bad.report
    report.bad_decision_rows += over.count() - len(examples)
    decisions = over.select("decision_id").distinct()
    count = decisions.count()
    report.decisions -= count
    report.decision_rows -= count
    return decisions


def write_joined(spark: SparkSession, joined: DataFrame, decisions: Path, output: Path) -> None:
    """Write JOINED in log order, as the local engine does: a JSONL file or a Parquet
    directory; Spark's part files are made into that form before it is renamed into place."""
    from pyspark.sql import functions as F

    joined = joined.orderBy("position")
    metrics = F.col("joined_metrics")
    with atomic_output(output) as temporary:
        parts = temporary.with_name(temporary.name + "-parts")
        try:
            if is_parquet(decisions):
                columns = [c for c in joined.columns if c in _parquet_columns(joined)]
                frame = joined.select(
                    *[metrics.alias("metrics") if c == "metrics" else c for c in columns],
                    *([] if "metrics" in columns else [metrics.alias("metrics")]),
                )
                if is_parquet(output):
                    frame.write.parquet(hadoop_path(parts))
                else:
                    frame.select(F.to_json(F.struct(*frame.columns)).alias("t")).write.text(
                        hadoop_path(parts)
                    )
            elif is_parquet(output):
                first = joined.select("text").first()
                schema = _spark_schema(first.text if first else "{}")
                row = F.from_json("text", schema)
                frame = joined.select(row.alias("row"), metrics.alias("joined")).select(
                    *[
                        F.col("joined").alias("metrics")
                        if name == "metrics"
                        else F.col(f"row.{name}")
                        for name in _field_names(schema)
                    ]
                )
                frame.write.parquet(hadoop_path(parts))
            else:
                body = F.regexp_replace("text", r"\}\s*$", "")
                line = F.concat(body, F.lit(',"metrics":'), F.to_json(metrics), F.lit("}"))
                joined.select(line.alias("line")).write.text(hadoop_path(parts))
            _collect_parts(parts, temporary, is_parquet(output))
        finally:
            shutil.rmtree(parts, ignore_errors=True)


def _parquet_columns(frame: DataFrame) -> set[str]:
    helpers = {"position", "micros", "status", "is_rewarded", "summed", "joined_metrics"}
    return {name for name in frame.columns if name not in helpers}


def _spark_schema(first_line: str) -> str:
    """The Spark DDL of ``joined_schema`` for the first decision row."""
    import json

    _, schema = joined_schema(json.loads(first_line))
    return ", ".join(f"`{field.name}` {_spark_type(field.type)}" for field in schema)


def _field_names(ddl: str) -> list[str]:
    return re.findall(r"`([^`]+)`", ddl)


def _spark_type(data_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_map(data_type):
        return f"map<{_spark_type(data_type.key_type)},{_spark_type(data_type.item_type)}>"
    if pa.types.is_list(data_type):
        return f"array<{_spark_type(data_type.value_type)}>"
    names = {
        pa.string(): "string",
        pa.int64(): "bigint",
        pa.float64(): "double",
        pa.bool_(): "boolean",
    }
    return names[data_type]


def _collect_parts(parts: Path, temporary: Path, parquet: bool) -> None:
    """Spark's part files, in order, as JOINED: moved into a directory (Parquet) or
    concatenated into one file (JSONL); markers and checksums are left behind."""
    names = sorted(path for path in parts.iterdir() if path.name.startswith("part-"))
    if parquet:
        temporary.mkdir()
        for path in names:
            if path.name.endswith(".parquet"):
                os.replace(path, temporary / path.name)
        return
    with open(temporary, "wb") as out:
        for path in names:
            with open(path, "rb") as part:
                shutil.copyfileobj(part, out)
