"""Property-based tests of both timeline engines on what a source can hand them.

Generated logged episodes (empty and one-row episodes, duplicate sequence numbers, huge gaps,
unicode ids, NaN and infinite rewards and metrics, missing metrics, unknown and unrecorded
possible actions, truncated last rows) go through the source stage's own checks
(``RowShaper``, ``RowChecker``: what they refuse never reaches an engine), then to the engine.
Every example must end in a valid table, every row accounted for (rows in = rows out +
dropped + rejected), and the Spark engine must build what the local one builds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizon_engine.builtin.timeline import LocalTimeline
from horizon_engine.schema import ActionType, RowChecker, RowFormat, RowLayout, RowShaper
from horizon_engine.timeline import TimelineConfig, TimelineResult, timeline_schema

pytestmark = pytest.mark.fuzz

ACTIONS = ["a", "b"]
LOGGED_ACTIONS = [*ACTIONS, "c"]
"""What loggers write: "c" is not in [timeline] actions, so the engine rejects its rows."""
LAYOUT = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
KEYS = [("mdp_id", "ascending"), ("sequence_number", "ascending")]

finite = st.floats(-1e6, 1e6)
numbers = st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1e300]))
sequence_numbers = st.one_of(
    st.integers(0, 20), st.integers(0, 2**62), st.sampled_from([0, 2**31, 2**53 + 1])
)
mdp_ids = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=6)


@st.composite
def logged_rows(draw: st.DrawFn, max_episodes: int = 6) -> list[dict[str, Any]]:
    """Rows of up to ``max_episodes`` episodes, some empty, in a drawn order."""
    rows = []
    for mdp_id in draw(st.lists(mdp_ids, max_size=max_episodes, unique=True)):
        for step in draw(st.lists(sequence_numbers, max_size=6)):
            # One row in four may hold non-finite values (which the source refuses): the others
            # pass, so that the engine has episodes to build.
            values = draw(st.sampled_from([finite, finite, finite, numbers]))
            row: dict[str, Any] = {
                "mdp_id": mdp_id,
                "sequence_number": step,
                "state_features": draw(st.dictionaries(st.sampled_from("012"), values)),
                "action": draw(st.sampled_from([*ACTIONS, *LOGGED_ACTIONS])),
                "action_probability": draw(st.floats(0.01, 1.0)),
                "reward": draw(st.one_of(values, values, values, st.none())),
                "metrics": draw(st.dictionaries(st.sampled_from(["clicks", "cost"]), values)),
                "possible_actions": draw(
                    st.one_of(
                        st.none(),
                        st.lists(st.sampled_from(ACTIONS), unique=True),
                        st.lists(st.sampled_from(ACTIONS), unique=True),
                        st.lists(st.sampled_from(LOGGED_ACTIONS), unique=True),
                    )
                ),
                "truncated": draw(st.one_of(st.none(), st.booleans())),
            }
            rows.append({key: value for key, value in row.items() if value is not None})
    return draw(st.permutations(rows))


timeline_configs = st.builds(
    TimelineConfig,
    actions=st.just(ACTIONS),
    reward=st.one_of(st.none(), st.just({"clicks": 1.0, "cost": -0.5})),
    add_terminal_state_row=st.booleans(),
    outlier_episode_length_percentile=st.one_of(st.none(), st.sampled_from([50.0, 90.0])),
    time_window_limit=st.one_of(st.none(), st.sampled_from([0, 5, 2**40])),
    n_step=st.one_of(st.none(), st.integers(1, 4)),
    eval_fraction=st.sampled_from([0.0, 0.5]),
)


def source_rows(rows: list[dict[str, Any]], path: Path) -> int:
    """What the source stage would write for ``rows`` (its refused rows left out); how many."""
    located = [
        (f"rows.jsonl:{number}", json.loads(json.dumps(row))) for number, row in enumerate(rows, 1)
    ]
    shaped = RowShaper(LAYOUT).shape(located)
    good, _ = RowChecker(LAYOUT).check(shaped.table, shaped.locations)
    pq.write_table(good, path)
    return good.num_rows


def built_tables(output: Path) -> dict[str, pa.Table]:
    return {split: pq.read_table(output / split).sort_by(KEYS) for split in ("train", "eval")}


def assert_valid_timeline(
    result: TimelineResult, tables: dict[str, pa.Table], rows_in: int, config: TimelineConfig
) -> None:
    """Row accounting, the schema, one row per (episode, step), splits disjoint, and values a
    trainer can use."""
    assert result.rows_in == rows_in
    accounted = result.train_rows + result.eval_rows
    assert rows_in == accounted + sum(result.dropped.values()) + sum(result.rejected.values())
    assert tables["train"].num_rows == result.train_rows
    assert tables["eval"].num_rows == result.eval_rows
    schema = timeline_schema(ActionType.DISCRETE, config.window)
    episodes = {}
    for split, table in tables.items():
        assert table.schema.equals(schema, check_metadata=False), split
        mdp_id, sequence = table["mdp_id"].to_pylist(), table["sequence_number"].to_pylist()
        keys = list(zip(mdp_id, sequence, strict=True))
        assert len(set(keys)) == len(keys)
        episodes[split] = {mdp_id for mdp_id, _ in keys}
        for reward in table["reward"].to_pylist():
            assert math.isfinite(reward), f"{split} has reward {reward}"
        for diff in table["time_diff"].to_pylist():
            assert diff >= 0
    assert not episodes["train"] & episodes["eval"]


def build_locally(
    rows: Path, output: Path, config: TimelineConfig, seed: int = 3
) -> TimelineResult:
    run = SimpleNamespace(seed=seed)
    output.mkdir()
    return LocalTimeline(config).build(run, rows, output, ActionType.DISCRETE, quarantine=True)


@given(rows=logged_rows(), config=timeline_configs)
def test_local_engine_builds_a_valid_table_from_any_source_rows(tmp_path_factory, rows, config):
    folder = tmp_path_factory.mktemp("timeline")
    rows_in = source_rows(rows, folder / "rows.parquet")
    result = build_locally(folder / "rows.parquet", folder / "out", config)
    assert_valid_timeline(result, built_tables(folder / "out"), rows_in, config)
    quarantine = folder / "out" / "quarantine" / "part-00000.jsonl"
    rejected = quarantine.read_text().splitlines() if quarantine.exists() else []
    assert len(rejected) == sum(result.rejected.values())


SPARK_EXAMPLES = 3
"""Spark runs a few jobs per build, seconds each: few examples, each of many episodes."""


@pytest.mark.spark
@settings(max_examples=SPARK_EXAMPLES)
@given(rows=logged_rows(max_episodes=60), config=timeline_configs)
def test_spark_engine_builds_what_the_local_engine_builds(tmp_path_factory, spark, rows, config):
    from horizon_plugins_spark.timeline import SparkTimeline, SparkTimelineConfig

    folder = tmp_path_factory.mktemp("timeline")
    rows_in = source_rows(rows, folder / "rows.parquet")
    local = build_locally(folder / "rows.parquet", folder / "local", config)
    (folder / "spark").mkdir()
    on_spark = SparkTimeline(SparkTimelineConfig(**config.model_dump())).build(
        SimpleNamespace(seed=3),
        folder / "rows.parquet",
        folder / "spark",
        ActionType.DISCRETE,
        quarantine=True,
    )
    local_tables, spark_tables = built_tables(folder / "local"), built_tables(folder / "spark")
    assert_valid_timeline(on_spark, spark_tables, rows_in, config)
    for split in ("train", "eval"):
        assert spark_tables[split].equals(local_tables[split]), split
    for count in ("train_rows", "eval_rows", "train_episodes", "eval_episodes", "dropped"):
        assert getattr(on_spark, count) == getattr(local, count), count
    assert on_spark.rejected == local.rejected
