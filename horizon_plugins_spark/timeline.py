"""The timeline on Spark: the contract of ``horizon_engine.timeline``, with Spark's windows.

Every step is a Spark expression, so the rows stay on the executors from the read of
``source/rows.parquet`` to the write of ``timeline/train`` and ``timeline/eval``; the driver
sees counts, the outlier percentile and at most ``BAD_ROWS_SHOWN`` example rows.

The plan, in the contract's order:

1. rows the transform cannot use (an action or possible action not in ``actions``, no reward)
   are set aside, with their reasons, before any window sees them;
2. one window per episode (``mdp_id`` ordered by ``sequence_number``) gives the next row's
   values, the ordinal, the time since the first row and the episode length; a second,
   over the same partitioning and order (so no second shuffle), gathers the n-step arrays;
3. the filters (outlier episodes, time window, an episode's last row cut by a time limit,
   terminal rows) then only label rows, so that a kept row keeps its real next state, and
   every dropped row is counted by reason;
4. the labelled frame is persisted once: the counts, the percentile and both splits' writes
   read it instead of recomputing the windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine import (
    BAD_ROWS_SHOWN,
    ActionType,
    BadRow,
    TimelineConfig,
    TimelineResult,
    TimelineTransform,
)
from horizon_plugins_spark.session import SparkOptions, hadoop_path, spark_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, WindowSpec
    from pyspark.sql.types import StructType

    from horizon_engine import RunContext

ROW_INDEX = "_row_index"
REJECT_KIND = "_reject_kind"
REJECT_REASON = "_reject_reason"
DROP_REASON = "_drop_reason"
IS_EVAL = "_is_eval"
EPISODE_LENGTH = "_episode_length"
CUT = "_cut"
"""True on the last row of an episode that a time limit cut short (``truncated``)."""
# The pre-timeline columns after the transform's own conversions, beside the originals so a
# rejected row is quarantined as it came.
ACTION, POSSIBLE, REWARD = "_action", "_possible", "_reward"


class SparkTimelineConfig(TimelineConfig):
    """The ``[timeline]`` section with ``engine = "spark"``."""

    spark: SparkOptions = Field(default_factory=SparkOptions)
    """``[timeline.spark]``: the session to start when none is active (master, conf, app_name)."""


class SparkTimeline(TimelineTransform):
    """Builds the timeline on a SparkSession with window functions; writes from the executors."""

    engine = "spark"
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
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        spark = spark_session(self.config.spark)
        plan = _TimelinePlan(self.config, action_type, run.seed)
        source = spark.read.parquet(hadoop_path(rows, reading=True))
        originals = source.columns
        checked = plan.check(source.select("*", F.col("_metadata.row_index").alias(ROW_INDEX)))
        kinds = checked.groupBy(REJECT_KIND).count().collect()
        rows_in = sum(row["count"] for row in kinds)
        rejected = {row[REJECT_KIND]: row["count"] for row in kinds if row[REJECT_KIND]}
        examples: list[BadRow] = []
        if rejected:
            bad = checked.where(F.col(REJECT_KIND).isNotNull())
            examples = _examples(bad, originals, str(rows))
            if quarantine:
                _write_quarantine(bad, originals, str(rows), output / "quarantine")
        usable = checked.where(F.col(REJECT_KIND).isNull())
        timeline = plan.timeline(usable).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            labelled = timeline.withColumn(DROP_REASON, plan.drop_reason(timeline))
            tallies = (
                labelled.groupBy(DROP_REASON, IS_EVAL)
                .agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("mdp_id").alias("episodes"))
                .collect()
            )
            for split, is_eval in (("train", False), ("eval", True)):
                split_rows = labelled.where(
                    F.col(DROP_REASON).isNull() & (F.col(IS_EVAL) == is_eval)
                )
                plan.write(split_rows, output / split)
        finally:
            timeline.unpersist()
        kept = {row[IS_EVAL]: row for row in tallies if row[DROP_REASON] is None}
        dropped: dict[str, int] = {}
        for row in tallies:
            if row[DROP_REASON] is not None:
                dropped[row[DROP_REASON]] = dropped.get(row[DROP_REASON], 0) + row["rows"]

        def kept_count(is_eval: bool, what: str) -> int:
            return kept[is_eval][what] if is_eval in kept else 0

        return TimelineResult(
            rows_in=rows_in,
            train_rows=kept_count(False, "rows"),
            eval_rows=kept_count(True, "rows"),
            train_episodes=kept_count(False, "episodes"),
            eval_episodes=kept_count(True, "episodes"),
            dropped=dropped,
            rejected=rejected,
            examples=examples,
            n_step=self.config.window,
        )


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

    def timeline(self, rows: DataFrame) -> DataFrame:
        """The timeline columns of the usable rows, the split, and the columns the filters use."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        episode = Window.partitionBy("mdp_id").orderBy("sequence_number")
        whole = episode.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
        following = {
            "_next_sequence_number": "sequence_number",
            "_next_state": "state_features",
            "_next_action": ACTION,
            **({"_next_possible": POSSIBLE} if self.has_possible else {}),
        }
        rows = rows.select(
            "*",
            *(F.lead(column).over(episode).alias(name) for name, column in following.items()),
            F.row_number().over(episode).alias("sequence_number_ordinal"),
            (F.col("sequence_number") - F.first("sequence_number").over(episode)).alias(
                "time_since_first"
            ),
            F.count(F.lit(1)).over(whole).alias(EPISODE_LENGTH),
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
        if self.config.window > 1:
            rows = self._n_step(rows, episode)
        # Only what is written and what the filters read: the frame is cached as it is.
        renamed = {"action": ACTION, "reward": REWARD, "possible_actions": POSSIBLE}
        columns = [
            F.col(renamed.get(field.name, field.name)).cast(field.dataType).alias(field.name)
            for field in self.schema.fields
        ]
        return rows.select(*columns, EPISODE_LENGTH, CUT, self._is_eval().alias(IS_EVAL))

    def _n_step(self, rows: DataFrame, episode: WindowSpec) -> DataFrame:
        """The values of rows t .. t+n-1 of the episode, as arrays.

        One ``collect_list`` of a struct per row: a struct is never null, so a null value
        (a parametric row's unknown possible next actions) keeps its place in the array, where
        ``collect_list`` of the bare column would skip it. A cut episode's last row contributes
        a null, which ``collect_list`` skips: the windows end before it, as in the local engine.
        """
        from pyspark.sql import functions as F

        frame = episode.rowsBetween(0, self.config.window - 1)
        steps = {
            "next_n_rewards": REWARD,
            "next_n_time_diffs": "time_diff",
            "next_n_state_features": "next_state_features",
            "next_n_not_terminal": "not_terminal",
        }
        if self.has_possible:
            steps["next_n_possible_next_actions"] = "possible_next_actions"
        step = F.struct(*(F.col(column).alias(name) for name, column in steps.items()))
        step = F.when(~F.col(CUT), step)
        rows = rows.withColumn("_steps", F.collect_list(step).over(frame))
        return rows.select(
            "*",
            *(F.col(f"_steps.{name}").alias(name) for name in steps),
        )

    def _is_eval(self) -> Column:
        """``eval_split_value(seed, mdp_id) < eval_fraction``, computed by Spark."""
        from pyspark.sql import functions as F

        digest = F.md5(F.concat(F.lit(f"{self.seed}:"), F.col("mdp_id")))
        value = F.conv(F.substring(digest, 1, 8), 16, 10).cast("double") / float(2**32)
        return value < F.lit(self.config.eval_fraction)

    def drop_reason(self, rows: DataFrame) -> Column:
        """Why a row is left out of the timeline (null: kept), the first filter deciding."""
        from pyspark.sql import functions as F

        reasons: list[tuple[Column, str]] = []
        percentile = self.config.outlier_episode_length_percentile
        if percentile is not None:
            limit = (
                rows.where(F.col("sequence_number_ordinal") == 1)
                .agg(F.percentile(EPISODE_LENGTH, F.lit(percentile / 100)))
                .first()[0]
            )
            if limit is not None:
                reasons.append((F.col(EPISODE_LENGTH) > F.lit(limit), "outlier_episode"))
        if self.config.time_window_limit is not None:
            limit = self.config.time_window_limit
            reasons.append((F.col("time_since_first") > F.lit(limit), "time_window"))
        reasons.append((F.col(CUT), "truncated"))
        if not self.config.add_terminal_state_row:
            reasons.append((~F.col("not_terminal"), "terminal_row"))
        reason = F.lit(None).cast("string")
        for dropped, name in reversed(reasons):
            reason = F.when(dropped, F.lit(name)).otherwise(reason)
        return reason

    @property
    def schema(self) -> StructType:
        """The timeline schema, as Spark types."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from horizon_engine import timeline_schema

        return from_arrow_schema(timeline_schema(self.action_type, self.config.window))

    def write(self, rows: DataFrame, folder: Path) -> None:
        """Write rows in the timeline schema, sorted by (mdp_id, sequence_number) across files.

        Spark writes a column as NOT NULL when its expression cannot be null (``not_terminal``,
        the n-step arrays...). A union with an empty frame of the nullable schema makes every
        column nullable, as in ``timeline_schema``, so both engines' files have one schema.
        """
        schema = self.schema
        session = rows.sparkSession
        nullable = session.createDataFrame(session.sparkContext.emptyRDD(), schema)
        table = rows.select(*schema.fieldNames()).unionByName(nullable)
        table.orderBy("mdp_id", "sequence_number").write.parquet(hadoop_path(folder))


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
