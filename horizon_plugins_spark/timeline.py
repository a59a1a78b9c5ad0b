"""The timeline on Spark: the contract of ``horizon_engine.timeline``, with Spark's windows.

Every step is a Spark expression, so the rows stay on the executors from the read of
``source/rows.parquet`` to the write of ``timeline/train`` and ``timeline/eval``; the driver
sees a sample of episode ids, the outlier percentile, the counts and at most
``BAD_ROWS_SHOWN`` example rows.

The plan, in the contract's order, as one Spark job after two small ones:

1. rows the transform cannot use (an action or possible action not in ``actions``, no reward)
   are set aside, with their reasons, before any window sees them;
2. the usable rows are shuffled once, each episode to the partition of its range of
   ``mdp_id``; one window per episode (ordered by ``sequence_number``) then gives the next
   row's values, the ordinal, the time since the first row and the n-step arrays, and the
   partitions come out of the window's own sort in the order the files must have;
3. the filters (outlier episodes, time window, an episode's last row cut by a time limit,
   terminal rows) label rows rather than remove them early, so that a kept row keeps its real
   next state, and every dropped row is counted by reason;
4. one write, partitioned by split, writes both splits, while Spark observes the counts on
   the way (``Observation``): nothing is cached, and no row is read or shuffled twice.

The two small jobs before it read only ``mdp_id``: a sample that sets the episode ranges, and,
when ``outlier_episode_length_percentile`` is set, the episode lengths for the percentile.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine import (
    BAD_ROWS_SHOWN,
    ActionType,
    BadRow,
    HorizonError,
    TimelineConfig,
    TimelineEngine,
    TimelineResult,
)
from horizon_plugins_spark.session import SparkOptions, hadoop_path, spark_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession, WindowSpec
    from pyspark.sql.types import StructType

    from horizon_engine import RunContext

ROW_INDEX = "_row_index"
REJECT_KIND = "_reject_kind"
REJECT_REASON = "_reject_reason"
REJECT_KINDS = ("missing_reward", "unknown_action")
DROP_REASON = "_drop_reason"
IS_EVAL = "_is_eval"
PARTITION = "_partition"
"""The partition that builds and writes a row (``_Partitioning``)."""
PART_FILE = re.compile(r"\.?part-(\d+)-.*")
"""A file Spark writes (or its checksum), named after the number of the partition it holds."""
EPISODE_LENGTH = "_episode_length"
CUT = "_cut"
"""True on the last row of an episode that a time limit cut short (``truncated``)."""
# The pre-timeline columns after the transform's own conversions, beside the originals so a
# rejected row is quarantined as it came.
ACTION, POSSIBLE, REWARD = "_action", "_possible", "_reward"
PARTITION_BYTES = 64 * 2**20
"""Parquet bytes of rows per partition, at most: Spark's advisory partition size. The rows
shuffled are about 1.6 times their Parquet size (4 features, 2 actions)."""
SAMPLE_PER_PARTITION = 100
"""Episode ids sampled per partition to set the ranges (Spark's own range sampling: 100)."""
MISSING_FILE = re.compile(r"FILE_NOT_EXIST|FileNotFoundException")
"""How Spark says an executor found no file at a path: on a cluster, one the driver alone sees."""


class SparkTimelineConfig(TimelineConfig):
    """The ``[timeline]`` section with ``engine = "spark"``."""

    spark: SparkOptions = Field(default_factory=SparkOptions)
    """``[timeline.spark]``: the session to start when none is active (master, conf, app_name)."""


class SparkTimeline(TimelineEngine):
    """Builds the timeline on a SparkSession with window functions; writes from the executors."""

    name = "spark"
    Config = SparkTimelineConfig
    config: SparkTimelineConfig

    def build(
        self,
        run: RunContext,
        rows: Path,
        output: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> TimelineResult:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        spark = spark_session(self.config.spark)
        plan = _TimelinePlan(self.config, action_type, run.seed)
        master = spark.sparkContext.master
        try:
            # The executors' first jobs (the schema, the sample) read the file the driver has
            # just listed: on a cluster, not finding it means the run folder is not shared.
            source = spark.read.parquet(hadoop_path(rows, reading=True))
            partitioning = _Partitioning.sample(source, _partitions(spark, rows), plan)
        except (PySparkException, Py4JJavaError) as exc:
            if master.startswith("local") or not MISSING_FILE.search(str(exc)):
                raise
            raise HorizonError(
                f"Spark's executors cannot read {rows}, which this machine wrote: with master "
                f"{master}, [pipeline] output_dir must be a folder every executor sees at the "
                "same absolute path, on a shared mount (NFS, a mounted bucket); see 'Scaling "
                "out' in README.md"
            ) from None
        originals = source.columns
        checked = plan.check(source)
        # Observed where the rows come out of the shuffle, which copies them anyway: an
        # observation among the first stage's expressions would have the rows copied for it.
        intake = Observation("timeline intake")
        arrived = plan.shuffle(checked, partitioning).observe(
            intake,
            F.count(F.lit(1)).alias("rows"),
            *(_count_where(F.col(REJECT_KIND) == kind).alias(kind) for kind in REJECT_KINDS),
        )
        usable = checked.where(F.col(REJECT_KIND).isNull())
        outlier_limit = plan.outlier_limit(usable)
        labelled = plan.timeline(arrived.where(F.col(REJECT_KIND).isNull()), outlier_limit)
        # Observed before the second window, which copies the rows into its buffer anyway.
        tally = Observation("timeline tally")
        kept = F.col(DROP_REASON).isNull()
        first = F.col("sequence_number_ordinal") == 1
        counted = labelled.observe(
            tally,
            *(_count_where(F.col(DROP_REASON) == reason).alias(reason) for reason in plan.reasons),
            *(
                _count_where(kept & (F.col(IS_EVAL) == is_eval) & where).alias(f"{name}_{what}")
                for name, is_eval in (("train", False), ("eval", True))
                # An episode keeps a row if and only if it keeps its first row: no filter
                # drops a first row but with the whole episode, or as an episode's only row.
                for what, where in (("rows", F.lit(True)), ("episodes", first))
            ),
        )
        plan.write(plan.n_step(counted).where(kept), output, partitioning)
        counts = tally.get
        _check_split_files(output, {"train": counts["train_rows"], "eval": counts["eval_rows"]})
        intake_counts = intake.get
        rejected = {kind: intake_counts[kind] for kind in REJECT_KINDS if intake_counts[kind]}
        examples: list[BadRow] = []
        if rejected:
            indexed = source.select("*", F.col("_metadata.row_index").alias(ROW_INDEX))
            bad = plan.check(indexed).where(F.col(REJECT_KIND).isNotNull())
            examples = _examples(bad, originals, str(rows))
            if quarantine:
                _write_quarantine(bad, originals, str(rows), output / "quarantine")
        return TimelineResult(
            rows_in=intake_counts["rows"],
            train_rows=counts["train_rows"],
            eval_rows=counts["eval_rows"],
            train_episodes=counts["train_episodes"],
            eval_episodes=counts["eval_episodes"],
            dropped={reason: counts[reason] for reason in plan.reasons if counts[reason]},
            rejected=rejected,
            examples=examples,
            n_step=self.config.window,
        )


def _check_split_files(output: Path, counted: dict[str, int]) -> None:
    """Each split's files hold the rows counted for it, or the build stops.

    Files go to a split by the number of the partition that wrote them (``_Partitioning``),
    which holds while Spark writes the partitions the plan made. A plan that Spark wrote in
    fewer (one file of both splits, as a Python filter after the window made it do) would
    otherwise pass for a timeline whose eval rows are training rows. The Parquet footers say
    how many rows each file holds: no row is read.
    """
    import pyarrow.parquet as pq

    for split, rows in counted.items():
        files = sorted((output / split).glob("part-*"))
        written = sum(pq.ParquetFile(path).metadata.num_rows for path in files)
        if written != rows:
            raise HorizonError(
                f"the Spark timeline wrote {written} rows to {output / split} but counted {rows} "
                f"{split} rows: Spark did not write the partitions the plan made; the local "
                'engine ([timeline] engine = "local") does not depend on them'
            )


def _count_where(condition: Column) -> Column:
    """How many rows meet ``condition``, for an observation: ``count_if`` would have Spark
    compute the condition in a projection of its own, which copies every row."""
    from pyspark.sql import functions as F

    return F.count(F.when(condition, 1))


def _partitions(spark: SparkSession, rows: Path) -> int:
    """How many partitions the timeline is built in: about what adaptive execution would
    coalesce the shuffle of these rows to.

    The session's default parallelism, or more where the rows, as Parquet on disk, are larger
    than that many ``PARTITION_BYTES``. Chosen here because the shuffle is one that adaptive
    execution leaves as it is (``repartitionById``), and ``spark.sql.shuffle.partitions``
    (200 by default) is far too many for a local session and too few for a large table.
    """
    files = [rows] if rows.is_file() else [path for path in rows.rglob("*") if path.is_file()]
    size = sum(path.stat().st_size for path in files)
    return max(spark.sparkContext.defaultParallelism, math.ceil(size / PARTITION_BYTES))


@dataclass(frozen=True)
class _Partitioning:
    """Which partition builds and writes each episode: one per range of ``mdp_id`` within a
    split, the train split's first, so that each file holds one split's episodes in order.

    The ranges cut the rows (in split, then ``mdp_id`` order) into parts of about as many rows,
    and a part that holds the end of the train split and the start of the eval one is cut in
    two there: each split gets a partition at least.
    """

    train_bounds: list[str]
    """The train split's ranges: rows with ``mdp_id`` up to the first bound, ... after the last."""
    eval_bounds: list[str]
    """The eval split's ranges, likewise."""

    @classmethod
    def sample(cls, rows: DataFrame, partitions: int, plan: _TimelinePlan) -> _Partitioning:
        """Ranges for about ``partitions`` parts, from a sample of the rows' ``mdp_id`` alone.

        Spark reads that column without the others, where ``repartitionByRange`` would
        sample whole rows; the sample is seeded, so a run's files hold the same rows each time.
        """
        from pyspark.sql import functions as F

        from horizon_engine import eval_split_value

        sample = (
            rows.select("mdp_id")
            .orderBy(F.rand(plan.seed))
            .limit(SAMPLE_PER_PARTITION * partitions)
            .collect()
        )
        fraction = plan.config.eval_fraction
        ordered = sorted(
            (eval_split_value(plan.seed, row["mdp_id"]) < fraction, row["mdp_id"]) for row in sample
        )
        parts = range(1, partitions) if ordered else range(0)
        cuts = {ordered[len(ordered) * part // partitions] for part in parts}
        return cls(
            sorted(mdp_id for is_eval, mdp_id in cuts if not is_eval),
            sorted(mdp_id for is_eval, mdp_id in cuts if is_eval),
        )

    @property
    def train_partitions(self) -> int:
        return len(self.train_bounds) + 1

    @property
    def partitions(self) -> int:
        return self.train_partitions + len(self.eval_bounds) + 1

    def partition(self, mdp_id: Column, is_eval: Column) -> Column:
        """The partition of a row of episode ``mdp_id``, in split ``is_eval``."""
        from pyspark.sql import functions as F

        return F.when(
            is_eval, _range_of(mdp_id, self.eval_bounds, self.train_partitions)
        ).otherwise(_range_of(mdp_id, self.train_bounds))

    def split(self, partition: int) -> str:
        """The split whose rows partition number ``partition`` holds."""
        return "train" if partition < self.train_partitions else "eval"


def _range_of(column: Column, bounds: list[str], first: int = 0) -> Column:
    """``first`` plus the index of the range ``column`` falls in: how many of the sorted
    ``bounds`` are below it. A binary search, so a row compares ``log2(len(bounds))`` strings."""
    from pyspark.sql import functions as F

    if not bounds:
        return F.lit(first)
    middle = len(bounds) // 2
    return F.when(
        column <= F.lit(bounds[middle]), _range_of(column, bounds[:middle], first)
    ).otherwise(_range_of(column, bounds[middle + 1 :], first + middle + 1))


class _TimelinePlan:
    """The Spark expressions of one timeline build: its config, action type and seed."""

    def __init__(self, config: TimelineConfig, action_type: ActionType, seed: int) -> None:
        self.config = config
        self.action_type = action_type
        self.seed = seed

    @property
    def discrete(self) -> bool:
        return self.action_type is ActionType.DISCRETE

    @property
    def has_possible(self) -> bool:
        return self.action_type is not ActionType.CONTINUOUS

    def check(self, rows: DataFrame) -> DataFrame:
        """Add the converted action, mask and reward, and each unusable row's kind and reason.

        A row's first problem names it, in the local engine's order (its reward, its action,
        its possible actions) and in its words, names quoted as Python would.
        """
        from pyspark.sql import functions as F

        problems: list[tuple[Column, str, Column]] = []
        reward = F.col("reward")
        if self.config.reward is not None:
            # The terms in the weights' order from 0.0, as weighted_reward adds them: same float.
            reward = F.lit(0.0)
            for metric, weight in self.config.reward.items():
                value = F.try_element_at(F.col("metrics"), F.lit(metric))
                reward = reward + F.coalesce(value, F.lit(0.0)) * F.lit(float(weight))
        else:
            reason = "no 'reward', and [timeline] has no reward weights to compute it from"
            problems.append((reward.isNull(), "missing_reward", F.lit(reason)))
        action = F.col("action")
        possible = F.col("possible_actions") if self.has_possible else None
        if self.discrete:
            actions = self.config.actions
            names = F.array(*(F.lit(name) for name in actions))
            position = F.array_position(names, F.col("action"))
            logged = F.col("possible_actions")
            quoted = F.transform(logged, lambda name: F.concat(F.lit("'"), name, F.lit("'")))
            problems += [
                (
                    position == 0,
                    "unknown_action",
                    F.concat(
                        F.lit("action '"),
                        F.col("action"),
                        F.lit(f"' is not in [timeline] actions {actions}"),
                    ),
                ),
                (
                    F.coalesce(F.size(F.array_except(logged, names)) > 0, F.lit(False)),
                    "unknown_action",
                    F.concat(
                        F.lit("possible_actions ["),
                        F.array_join(quoted, ", ", "None"),
                        F.lit(f"] name an action not in [timeline] actions {actions}"),
                    ),
                ),
            ]
            action = position - 1
            unrecorded = logged.isNull() | (F.size(logged) == 0)
            possible = F.when(
                unrecorded, F.array_repeat(F.lit(1).cast("tinyint"), len(actions))
            ).otherwise(
                F.transform(names, lambda name: F.array_contains(logged, name).cast("tinyint"))
            )
        kind, reason = F.lit(None).cast("string"), F.lit(None).cast("string")
        for found, name, text in reversed(problems):
            kind = F.when(found, F.lit(name)).otherwise(kind)
            reason = F.when(found, text).otherwise(reason)
        extra = [action.alias(ACTION), reward.alias(REWARD)]
        if possible is not None:
            extra.append(possible.alias(POSSIBLE))
        return rows.select("*", *extra, kind.alias(REJECT_KIND), reason.alias(REJECT_REASON))

    @property
    def episode(self) -> WindowSpec:
        """An episode's rows in order.

        Partitioned by (episode, partition), the second a function of the first, so that the
        groups are the episodes, and the shuffle ``shuffle`` made serves the window. The sort
        the window makes, by ``mdp_id`` first, is the files' order, and tells most rows apart
        by the 8-byte prefix of ``mdp_id``, where a sort by the split first would compare most
        rows in full.
        """
        from pyspark.sql import Window

        return Window.partitionBy("mdp_id", PARTITION).orderBy("sequence_number")

    def shuffle(self, rows: DataFrame, partitioning: _Partitioning) -> DataFrame:
        """The rows with their split, each moved to the partition ``partitioning`` gives its
        episode: the window needs an episode's rows together, and the files need the episodes
        in order."""
        from pyspark.sql import functions as F

        rows = rows.withColumn(IS_EVAL, self._is_eval())
        partition = partitioning.partition(F.col("mdp_id"), F.col(IS_EVAL))
        return rows.withColumn(PARTITION, partition).repartitionById(
            partitioning.partitions, PARTITION
        )

    def timeline(self, rows: DataFrame, outlier_limit: float | None) -> DataFrame:
        """The timeline columns of the usable rows but the n-step arrays, and why a row is
        dropped (``DROP_REASON``; null: kept)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        episode = self.episode
        following = {
            "_next_sequence_number": "sequence_number",
            "_next_state": "state_features",
            "_next_action": ACTION,
            **({"_next_possible": POSSIBLE} if self.has_possible else {}),
        }
        extra = []
        if self.config.outlier_episode_length_percentile is not None:
            whole = episode.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
            extra.append(F.count(F.lit(1)).over(whole).alias(EPISODE_LENGTH))
        rows = rows.select(
            "*",
            *(F.lead(column).over(episode).alias(name) for name, column in following.items()),
            F.row_number().over(episode).alias("sequence_number_ordinal"),
            (F.col("sequence_number") - F.first("sequence_number").over(episode)).alias(
                "time_since_first"
            ),
            *extra,
        )
        not_terminal = F.col("_next_sequence_number").isNotNull()
        columns = {
            "next_state_features": F.when(not_terminal, F.col("_next_state")).otherwise(
                F.create_map().cast("map<string,double>")
            ),
            "next_action": F.col("_next_action"),
            "time_diff": F.when(
                not_terminal, F.col("_next_sequence_number") - F.col("sequence_number")
            ).otherwise(F.lit(0).cast("bigint")),
            "not_terminal": not_terminal,
        }
        if self.discrete:
            no_action = F.array_repeat(F.lit(0).cast("tinyint"), len(self.config.actions))
            columns["possible_next_actions"] = F.when(
                not_terminal, F.col("_next_possible")
            ).otherwise(no_action)
        elif self.has_possible:
            # Empty, too, where the next row did not record its possible actions.
            no_action = F.array().cast("array<map<string,double>>")
            columns["possible_next_actions"] = F.coalesce(F.col("_next_possible"), no_action)
        truncated = F.col("truncated") if "truncated" in rows.columns else F.lit(None)
        columns[CUT] = ~not_terminal & F.coalesce(truncated.cast("boolean"), F.lit(False))
        rows = rows.select("*", *(value.alias(name) for name, value in columns.items()))
        return rows.withColumn(DROP_REASON, self.drop_reason(outlier_limit))

    def n_step(self, rows: DataFrame) -> DataFrame:
        """The values of rows t .. t+n-1 of the episode, as arrays (none for n = 1).

        Row t+k's value is ``lead(value, k)``, read where the window holds the row already
        (``collect_list`` over a frame of n rows would copy each value n times, as objects).
        Each array is then cut to the steps there are: the episode's rows, less a cut episode's
        last row, which is no step (its next state was never observed), so the windows end
        before it, as in the local engine. Such a row only ever ends an episode, so the steps
        kept are always the first ones. A null value (a parametric row's unknown possible next
        actions) keeps its place.
        """
        from pyspark.sql import functions as F

        window = self.config.window
        if window == 1:
            return rows
        episode = self.episode
        steps = {
            "next_n_rewards": REWARD,
            "next_n_time_diffs": "time_diff",
            "next_n_state_features": "next_state_features",
            "next_n_not_terminal": "not_terminal",
        }
        if self.has_possible:
            steps["next_n_possible_next_actions"] = "possible_next_actions"
        is_step = ~F.col(CUT)
        following = [
            F.coalesce(F.lead(is_step, k).over(episode), F.lit(False)) for k in range(1, window)
        ]
        length = sum((step.cast("int") for step in following), is_step.cast("int"))
        return rows.select(
            "*",
            *(
                F.slice(
                    F.array(
                        F.col(column), *(F.lead(column, k).over(episode) for k in range(1, window))
                    ),
                    1,
                    length,
                ).alias(name)
                for name, column in steps.items()
            ),
        )

    def _is_eval(self) -> Column:
        """``eval_split_value(seed, mdp_id) < eval_fraction``, computed by Spark.

        That value is the first 8 hex digits of an md5 over 2**32, so it is below the fraction
        exactly when those digits, as a string, sort below the first whole number that is not.
        """
        from pyspark.sql import functions as F

        first_not_below = math.ceil(self.config.eval_fraction * 2**32)
        if first_not_below >= 2**32:
            return F.lit(True)
        digest = F.md5(F.concat(F.lit(f"{self.seed}:"), F.col("mdp_id")))
        return F.substring(digest, 1, 8) < F.lit(f"{first_not_below:08x}")

    @property
    def reasons(self) -> list[str]:
        """The filters' reasons to drop a row, in the order they decide."""
        config = self.config
        return [
            *(["outlier_episode"] if config.outlier_episode_length_percentile is not None else []),
            *(["time_window"] if config.time_window_limit is not None else []),
            "truncated",
            *([] if config.add_terminal_state_row else ["terminal_row"]),
        ]

    def outlier_limit(self, rows: DataFrame) -> float | None:
        """The episode length above which an episode is an outlier (None: no such filter, or
        no rows), from the episode lengths alone: a job that reads only ``mdp_id``."""
        from pyspark.sql import functions as F

        percentile = self.config.outlier_episode_length_percentile
        if percentile is None:
            return None
        lengths = rows.groupBy("mdp_id").count()
        return lengths.agg(F.percentile("count", F.lit(percentile / 100))).first()[0]

    def drop_reason(self, outlier_limit: float | None) -> Column:
        """Why a row is left out of the timeline (null: kept), the first filter deciding."""
        from pyspark.sql import functions as F

        found = {
            "outlier_episode": (
                F.col(EPISODE_LENGTH) > F.lit(outlier_limit)
                if outlier_limit is not None
                else F.lit(False)
            ),
            "time_window": F.col("time_since_first") > F.lit(self.config.time_window_limit),
            "truncated": F.col(CUT),
            "terminal_row": ~F.col("not_terminal"),
        }
        reason = F.lit(None).cast("string")
        for name in reversed(self.reasons):
            reason = F.when(found[name], F.lit(name)).otherwise(reason)
        return reason

    @property
    def schema(self) -> StructType:
        """The timeline schema, as Spark types."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from horizon_engine import timeline_schema

        return from_arrow_schema(timeline_schema(self.action_type, self.config.window))

    def write(self, rows: DataFrame, output: Path, partitioning: _Partitioning) -> None:
        """Write ``output/train`` and ``output/eval`` in the timeline schema, each sorted by
        (mdp_id, sequence_number) across its files, in one write.

        Each partition holds one split's episodes, sorted, and the partitions come in order, so
        Spark writes the rows as they come, with no sort, a file per partition, which is then
        moved to its split's folder. A split without rows gets a file with the schema alone,
        as the local engine writes.

        Spark writes a column as NOT NULL when its expression cannot be null (``not_terminal``,
        the n-step arrays...), so every column is written as ``CASE WHEN
        sequence_number_ordinal > 0 THEN column END``: true on every row (``row_number``
        starts at 1), but no optimizer rule folds it, so the column is nullable, and an array
        of it has nullable items, as in ``timeline_schema``. A cast to the nullable type would
        not do (Spark removes a cast that only widens nullability), and a union with an empty
        frame of the nullable schema, which would, hides the rows' order from the write, which
        then sorts them again.
        """
        from pyspark.sql import functions as F

        schema = self.schema
        renamed = {"action": ACTION, "reward": REWARD, "possible_actions": POSSIBLE}
        built = {field.name: field.dataType.simpleString() for field in rows.schema.fields}
        every_row = F.col("sequence_number_ordinal") > 0
        columns = []
        for field in schema.fields:
            column = F.col(renamed.get(field.name, field.name))
            if built[renamed.get(field.name, field.name)] != field.dataType.simpleString():
                column = column.cast(field.dataType)
            columns.append(F.when(every_row, column).alias(field.name))
        written = output / "_parts"
        rows.select(*columns).write.parquet(hadoop_path(written))
        for split in ("train", "eval"):
            (output / split).mkdir()
        for path in written.iterdir():
            part = PART_FILE.fullmatch(path.name)
            if part:
                path.rename(output / partitioning.split(int(part[1])) / path.name)
        shutil.rmtree(written)
        session = rows.sparkSession
        for split in ("train", "eval"):
            if not any((output / split).glob("part-*")):
                (output / split).rmdir()
                session.createDataFrame([], schema).write.parquet(hadoop_path(output / split))


def _records(bad: DataFrame, originals: list[str], rows: str) -> DataFrame:
    """Rejected rows in file order as the quarantine holds them: location, kind, reason, row."""
    from pyspark.sql import functions as F

    location = F.concat(F.lit(f"{rows}:row "), F.col(ROW_INDEX).cast("string"))
    return bad.orderBy(ROW_INDEX).select(
        location.alias("location"),
        F.col(REJECT_KIND).alias("kind"),
        F.col(REJECT_REASON).alias("reason"),
        F.struct(*originals).alias("row"),
    )


def _examples(bad: DataFrame, originals: list[str], rows: str) -> list[BadRow]:
    """The first rejected rows, for the error that stops the run."""
    first = _records(bad, originals, rows).limit(BAD_ROWS_SHOWN).collect()
    return [
        BadRow(row["location"], row["reason"], row["kind"], row["row"].asDict(recursive=True))
        for row in first
    ]


def _write_quarantine(bad: DataFrame, originals: list[str], rows: str, folder: Path) -> None:
    """Rejected rows as JSON lines, written by the executors; a null field is written too."""
    records = _records(bad, originals, rows)
    records.write.option("ignoreNullFields", "false").json(hadoop_path(folder))
