"""The Spark plugin: its timeline builds the local engine's table, its source reads Spark tables.

Every test shares the session-scoped ``spark`` fixture (conftest.py): the pipeline's Spark
components find that session active and use it, so the file starts Spark once (plus once for
the spark-submit test, which is the point of that test). Hand-made cases assert exact rows;
the parity cases hold the Spark engine to the local one on generated rows with every edge case
at once, down to the Parquet schema and the quarantined rows.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.errors import BadRowsError, ConfigError, HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.schema import ActionType
from horizon_engine.timeline import eval_split_value, timeline_schema

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("spark")]

FEATURES = pa.map_(pa.string(), pa.float64())


def decision(mdp_id: str, step: int, action: Any = "0", **changes: Any) -> dict[str, Any]:
    """A pre-timeline row of episode ``mdp_id`` at sequence number ``step``."""
    row = {
        "mdp_id": mdp_id,
        "sequence_number": step,
        "state_features": {"0": float(step)},
        "action": action,
        "reward": 1.0,
        "action_probability": 0.5,
        "possible_actions": ["0", "1"],
    }
    row.update(changes)
    return {key: value for key, value in row.items() if value is not None}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(
    folder: Path,
    source: dict[str, Any],
    timeline: dict[str, Any] | None = None,
    on_bad_rows: str = "fail",
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "pipeline": {"output_dir": str(folder), "seed": 7, "on_bad_rows": on_bad_rows},
        "source": source,
    }
    engine = Engine(show_progress=False)
    if timeline is None:
        return engine.run(config, overwrite=True)
    config["timeline"] = {"engine": "spark", "eval_fraction": 0.0, **timeline}
    # The source stage first, without [timeline] actions, then the timeline stage: the
    # source stage would report an unknown action at its own line when it knows the actions,
    # and these tests are about the timeline engine's own check (what --stages timeline with
    # a changed action list meets). Both continue the folder's run, which tests re-run.
    without_actions = {name: value for name, value in timeline.items() if name != "actions"}
    engine.run({**config, "timeline": without_actions}, stages=["source"])
    return engine.run(config, stages=["timeline"])


def run_rows(tmp_path: Path, rows: list[dict[str, Any]], **timeline: Any) -> dict[str, Any]:
    source = {"kind": "jsonl", "path": str(write_jsonl(tmp_path / "rows.jsonl", rows))}
    on_bad_rows = timeline.pop("on_bad_rows", "fail")
    return run(tmp_path / "run", source, timeline, on_bad_rows)


def read_split(folder: Path, split: str = "train") -> list[dict[str, Any]]:
    return pq.read_table(folder / "timeline" / split).to_pylist(maps_as_pydicts="strict")


def quarantined(folder: Path) -> list[dict[str, Any]]:
    """Quarantined rows, locations relative to the run, in file order."""
    records = [
        json.loads(line)
        for path in sorted((folder / "timeline" / "quarantine").glob("part-*"))
        for line in path.read_text().splitlines()
    ]
    for record in records:
        record["location"] = record["location"].replace(str(folder), "<run>")
    return records


# --- hand-made episodes ---------------------------------------------------------------------


def test_parametric_n_step_arrays_keep_a_place_for_unrecorded_possible_actions(tmp_path):
    """A struct per step in one collect_list: a null would otherwise shift the arrays."""
    left, right = {"4": 1.0}, {"5": 1.0}
    rows = [
        decision("p", 0, left, possible_actions=[left, right], reward=0.0),
        decision("p", 2, right, possible_actions=None, reward=1.0),
        decision("p", 3, left, possible_actions=[left], reward=2.0),
    ]
    run_rows(tmp_path, rows, n_step=2)
    out = read_split(tmp_path / "run")
    assert [(row["sequence_number"], row["time_diff"]) for row in out] == [(0, 2), (2, 1), (3, 0)]
    assert [row["possible_next_actions"] for row in out] == [[], [left], []]
    assert [row["next_n_possible_next_actions"] for row in out] == [
        [[], [left]],
        [[left], []],
        [[]],
    ]
    assert [row["next_n_rewards"] for row in out] == [[0.0, 1.0], [1.0, 2.0], [2.0]]
    assert [row["next_n_state_features"] for row in out] == [
        [{"0": 2.0}, {"0": 3.0}],
        [{"0": 3.0}, {}],
        [{}],
    ]
    assert out[1]["possible_actions"] is None


def test_rejected_rows_are_quarantined_with_their_reasons_as_json_lines(tmp_path):
    rows = [
        decision("a", 0),
        decision("a", 1, "left", possible_actions=None),
        decision("a", 2, possible_actions=["0", "up"]),
        decision("a", 3, reward=None, metrics={"clicks": 1.0}),
        decision("a", 4),
    ]
    # Spark reads a path as a glob pattern: "[1]" must still name this folder.
    folder = tmp_path / "exp [1]"
    folder.mkdir()
    manifest = run_rows(folder, rows, actions=["0", "1"], on_bad_rows="quarantine")
    stage = manifest["stages"]["timeline"]
    assert stage["dropped"] == {"unknown_action": 2, "missing_reward": 1}
    assert [row["sequence_number"] for row in read_split(folder / "run")] == [0, 4]
    records = quarantined(folder / "run")
    assert [(r["location"], r["kind"], r["reason"]) for r in records] == [
        (
            "<run>/source/rows.parquet:row 1",
            "unknown_action",
            "action 'left' is not in [timeline] actions ['0', '1']",
        ),
        (
            "<run>/source/rows.parquet:row 2",
            "unknown_action",
            "possible_actions ['0', 'up'] name an action not in [timeline] actions ['0', '1']",
        ),
        (
            "<run>/source/rows.parquet:row 3",
            "missing_reward",
            "no 'reward', and [timeline] has no reward weights to compute it from",
        ),
    ]
    # The row as it came, with its action's name, not the index the timeline gives it.
    assert records[0]["row"] == {
        "ds": None,
        "mdp_id": "a",
        "sequence_number": 1,
        "state_features": {"0": 1.0},
        "action": "left",
        "action_probability": 0.5,
        "reward": 1.0,
        "metrics": None,
        "possible_actions": None,
        "truncated": None,
    }


def test_rejected_rows_stop_the_run_naming_the_first_of_them(tmp_path):
    rows = [
        decision("a", step, "left" if step % 2 else "0", possible_actions=None)
        for step in range(50)
    ]
    with pytest.raises(BadRowsError) as caught:
        run_rows(tmp_path, rows, actions=["0", "1"])
    message = str(caught.value)
    assert message.startswith("25 bad rows (unknown_action: 25):")
    assert "rows.parquet:row 1: action 'left' is not in" in message
    assert "and 5 more" in message
    assert len(caught.value.bad_rows) == 20
    assert not (tmp_path / "run" / "timeline").exists()


def test_filters_count_what_they_drop_in_order(tmp_path):
    """Outlier episodes first, then the time window, then terminal rows: each row counted once."""
    lengths = {"a": 2, "b": 3, "c": 3, "d": 8}
    rows = [decision(m, 2 * step) for m, length in lengths.items() for step in range(length)]
    # numpy.percentile([2, 3, 3, 8], 60) = 3 + 0.8 * (3 - 3) = 3.0: d (8 rows) goes.
    manifest = run_rows(
        tmp_path,
        rows,
        actions=["0", "1"],
        outlier_episode_length_percentile=60,
        time_window_limit=2,
        add_terminal_state_row=False,
    )
    out = read_split(tmp_path / "run")
    assert [(r["mdp_id"], r["sequence_number"], r["time_diff"]) for r in out] == [
        ("a", 0, 2),
        ("b", 0, 2),
        ("b", 2, 2),
        ("c", 0, 2),
        ("c", 2, 2),
    ]
    stage = manifest["stages"]["timeline"]
    assert stage["dropped"] == {"outlier_episode": 8, "time_window": 2, "terminal_row": 1}
    assert (stage["rows_in"], stage["rows_out"]) == (16, 5)


def test_split_is_the_documented_hash_of_seed_and_episode(tmp_path):
    rows = [decision(f"ep-{e}", step) for e in range(30) for step in range(2)]
    manifest = run_rows(tmp_path, rows, actions=["0", "1"], eval_fraction=0.4)
    train = read_split(tmp_path / "run", "train")
    evaluation = read_split(tmp_path / "run", "eval")
    expected = {f"ep-{e}" for e in range(30) if eval_split_value(7, f"ep-{e}") < 0.4}
    assert {row["mdp_id"] for row in evaluation} == expected
    assert {row["mdp_id"] for row in train} == {f"ep-{e}" for e in range(30)} - expected
    for split in (train, evaluation):
        keys = [(row["mdp_id"], row["sequence_number"]) for row in split]
        assert keys == sorted(keys)
    details = manifest["stages"]["timeline"]["details"]
    assert details["engine"] == "spark"
    assert (details["train_episodes"], details["eval_episodes"]) == (
        30 - len(expected),
        len(expected),
    )


# --- parity with the local engine -----------------------------------------------------------

WEIGHTS = {"clicks": 0.7, "cost": -1.3, "views": 0.1}


def generated_rows(action_type: ActionType, seed: int) -> list[dict[str, Any]]:
    """Episodes with every edge case: shuffled rows, gaps, one-row episodes, unrecorded and
    empty possible actions, unknown actions, missing rewards and metrics, float metrics,
    episodes cut by a time limit (``truncated`` on the last row) and stray ``truncated``
    flags elsewhere."""
    rng = random.Random(seed)
    names = ["a", "b", "c"]
    choices = [{"7": 1.0}, {"7": 2.0, "8": -1.0}, {"9": 0.25}]
    rows = []
    for episode in range(120):
        length = rng.choice([1, 1, 2, 5, 9, 14, 30])
        step = rng.randint(-3, 3)
        for _ in range(length):
            step += rng.choice([1, 1, 1, 2, 5])
            row: dict[str, Any] = {
                "ds": "2019-01-01",
                "mdp_id": f"mdp-{episode}",
                "sequence_number": step,
                "state_features": {str(f): rng.uniform(-2, 2) for f in rng.sample(range(6), 3)},
                "action_probability": rng.choice([0.25, 0.5, 1.0]),
                "reward": rng.choice([rng.uniform(-1, 1), None]),
                "metrics": {m: rng.uniform(0, 3) for m in rng.sample(sorted(WEIGHTS), 2)},
            }
            if action_type is ActionType.DISCRETE:
                possible = rng.choice([None, [], rng.sample(names, 2), names, [*names, "z"]])
                row["action"] = rng.choice(possible or names)
                row["possible_actions"] = possible
                if rng.random() < 0.02:
                    row["action"], row["possible_actions"] = "x", None
            elif action_type is ActionType.PARAMETRIC:
                possible = rng.choice([None, [], choices[:2], choices])
                row["action"] = rng.choice(possible or choices)
                row["possible_actions"] = possible
            else:
                row["action"] = {"0": rng.uniform(-1, 1), "1": rng.uniform(-1, 1)}
            row["truncated"] = rng.choice([None, None, None, False, True])
            rows.append(row)
        if rng.random() < 0.4:
            rows[-1]["truncated"] = True
    rng.shuffle(rows)
    return rows


PARITY = {
    ActionType.DISCRETE: {
        "actions": ["a", "b", "c"],
        "reward": WEIGHTS,
        "n_step": 3,
        "outlier_episode_length_percentile": 85.5,
        "time_window_limit": 25,
        "add_terminal_state_row": False,
    },
    ActionType.PARAMETRIC: {"n_step": 2, "outlier_episode_length_percentile": 97},
    ActionType.CONTINUOUS: {"n_step": 4, "time_window_limit": 12, "reward": {"cost": 2.0}},
}


@pytest.mark.parametrize("action_type", list(PARITY), ids=lambda kind: kind.value)
def test_same_table_as_the_local_engine(tmp_path, action_type):
    source = {
        "kind": "jsonl",
        "path": str(write_jsonl(tmp_path / "rows.jsonl", generated_rows(action_type, 5))),
    }
    timeline = {"eval_fraction": 0.3, **PARITY[action_type]}
    stages = {}
    for engine in ("local", "spark"):
        manifest = run(tmp_path / engine, source, {**timeline, "engine": engine}, "quarantine")
        stages[engine] = manifest["stages"]["timeline"]
        del stages[engine]["seconds"], stages[engine]["import_seconds"]
        del stages[engine]["details"]["engine"], stages[engine]["run_id"]
    assert stages["spark"] == stages["local"]
    assert stages["local"]["rows_out"] > 300
    assert stages["local"]["dropped"]["truncated"] > 10
    schema = timeline_schema(action_type, timeline["n_step"])
    for split in ("train", "eval"):
        local = pq.read_table(tmp_path / "local" / "timeline" / split)
        spark = pq.read_table(tmp_path / "spark" / "timeline" / split)
        assert spark.schema.equals(schema, check_metadata=False)
        assert spark.num_rows > 0
        assert spark.equals(local.cast(spark.schema))
    assert quarantined(tmp_path / "spark") == quarantined(tmp_path / "local")


# --- the session ----------------------------------------------------------------------------


def test_components_use_the_active_session(spark):
    from horizon_plugins_spark import SparkOptions, spark_session

    assert spark_session(SparkOptions(master="local[1]", conf={"spark.x": 1})) is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"


def test_spark_options_are_validated_with_the_timeline_section(tmp_path):
    base = {"pipeline": {"output_dir": str(tmp_path)}, "source": {"kind": "gym"}}
    spec = Engine().validate(
        {
            **base,
            "timeline": {
                "engine": "spark",
                "spark": {"master": "local[3]", "conf": {"spark.sql.shuffle.partitions": 8}},
            },
        }
    )
    options = spec.sections["timeline"].config.spark
    assert (options.master, options.conf, options.app_name) == (
        "local[3]",
        {"spark.sql.shuffle.partitions": 8},
        "horizon-engine",
    )
    with pytest.raises(ConfigError, match="mastr"):
        Engine().validate({**base, "timeline": {"engine": "spark", "spark": {"mastr": "yarn"}}})


# --- the spark_table source -----------------------------------------------------------------


def logged_table() -> pa.Table:
    """Three days of decisions, as a Spark table would hold them (maps, not structs)."""
    rows = [
        decision(f"{day}-{episode}", step, ds=f"2019-01-0{day}", metrics={"clicks": float(step)})
        for day in (1, 2, 3)
        for episode in range(2)
        for step in range(3)
    ]
    schema = pa.schema(
        [
            ("ds", pa.string()),
            ("mdp_id", pa.string()),
            ("sequence_number", pa.int64()),
            ("state_features", FEATURES),
            ("action", pa.string()),
            ("action_probability", pa.float64()),
            ("reward", pa.float64()),
            ("metrics", FEATURES),
            ("possible_actions", pa.list_(pa.string())),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def test_spark_table_source_reads_a_table_between_ds_and_feeds_the_timeline(spark, tmp_path):
    spark.createDataFrame(logged_table()).createOrReplaceTempView("logged_decisions")
    source = {
        "kind": "spark_table",
        "table": "logged_decisions",
        "start_ds": "2019-01-02",
        "end_ds": "2019-01-03",
    }
    manifest = run(tmp_path / "run", source, {"actions": ["0", "1"]})
    assert manifest["stages"]["source"]["rows_out"] == 12
    out = read_split(tmp_path / "run")
    assert sorted({row["mdp_id"] for row in out}) == ["2-0", "2-1", "3-0", "3-1"]
    assert {row["ds"] for row in out} == {"2019-01-02", "2019-01-03"}
    assert [row["metrics"] for row in out[:3]] == [
        {"clicks": 0.0},
        {"clicks": 1.0},
        {"clicks": 2.0},
    ]


def test_spark_table_source_reads_json_folders_like_the_jsonl_source(spark, tmp_path):
    """Spark reads JSON objects as structs; the source turns them back into feature maps."""
    rows = logged_table().to_pylist(maps_as_pydicts="strict")
    rows[4]["state_features"] = {"0": 1.0, "extra": 3.5}
    for day in ("2019-01-01", "2019-01-02", "2019-01-03"):
        folder = tmp_path / "logs" / f"ds={day}"
        folder.mkdir(parents=True)
        # The ds column comes from the folder names, as in a partitioned Hive table.
        day_rows = [{k: v for k, v in row.items() if k != "ds"} for row in rows if row["ds"] == day]
        write_jsonl(folder / "part-0.json", day_rows)
    write_jsonl(tmp_path / "all.jsonl", rows)
    source = {"kind": "spark_table", "path": str(tmp_path / "logs"), "format": "json"}
    run(tmp_path / "spark", {**source, "start_ds": "2019-01-01"})
    run(tmp_path / "jsonl", {"kind": "jsonl", "path": str(tmp_path / "all.jsonl")})
    tables = {}
    for name in ("spark", "jsonl"):
        table = pq.read_table(tmp_path / name / "source" / "rows.parquet")
        tables[name] = table.sort_by([("mdp_id", "ascending"), ("sequence_number", "ascending")])
    assert tables["spark"].schema == tables["jsonl"].schema
    spark_rows = tables["spark"].to_pylist(maps_as_pydicts="strict")
    assert spark_rows == tables["jsonl"].to_pylist(maps_as_pydicts="strict")
    assert spark_rows[4]["state_features"] == {"0": 1.0, "extra": 3.5}


def test_spark_table_source_reads_horizons_own_timeline_json(tmp_path):
    """ReAgent's parametric timeline rows: lists of action maps, which Spark reads as structs."""
    root = Path(
        os.environ.get("HORIZON_REFERENCE_DATA")
        or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
    )
    path = root / "reagent" / "parametric_action" / "cartpole_training_data.json"
    if not path.is_file():
        pytest.skip(f"reference data not found at {path}")
    spark_manifest = run(
        tmp_path / "spark", {"kind": "spark_table", "path": str(path), "format": "json"}
    )
    jsonl_manifest = run(tmp_path / "jsonl", {"kind": "jsonl", "path": str(path)})
    rows = {}
    for name in ("spark", "jsonl"):
        table = pq.read_table(tmp_path / name / "source" / "rows.parquet")
        rows[name] = table.sort_by([("mdp_id", "ascending"), ("sequence_number", "ascending")])
    assert rows["spark"].schema == rows["jsonl"].schema
    assert rows["spark"].num_rows == 162
    assert rows["spark"].to_pylist(maps_as_pydicts="strict") == rows["jsonl"].to_pylist(
        maps_as_pydicts="strict"
    )
    spark_stage, jsonl_stage = (m["stages"]["source"] for m in (spark_manifest, jsonl_manifest))
    assert spark_stage["warnings"] == jsonl_stage["warnings"]
    assert spark_stage["details"] == {"row_format": "timeline", "action_type": "parametric"}


def test_spark_table_source_names_bad_rows_by_episode_and_step(spark, tmp_path):
    table = logged_table()
    probability = table.schema.get_field_index("action_probability")
    values = [2.0 if i == 4 else 0.5 for i in range(table.num_rows)]
    table = table.set_column(probability, "action_probability", pa.array(values))
    spark.createDataFrame(table).createOrReplaceTempView("bad_decisions")
    with pytest.raises(BadRowsError, match="1 bad rows") as caught:
        run(tmp_path / "run", {"kind": "spark_table", "table": "bad_decisions"})
    assert (
        "table bad_decisions: mdp_id '1-1' sequence_number 1: 'action_probability' must be in"
        in str(caught.value)
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"table": "no_such_table"}, r"table no_such_table: \[TABLE_OR_VIEW_NOT_FOUND\]"),
        ({"table": "logged_decisions", "end_ds": "2019-01-00"}, "no rows with ds <= '2019-01-00'"),
        ({"path": "/nonexistent/logs"}, r"path '/nonexistent/logs': \[PATH_NOT_FOUND\]"),
    ],
)
def test_spark_table_source_errors_name_the_table(spark, tmp_path, source, message):
    spark.createDataFrame(logged_table()).createOrReplaceTempView("logged_decisions")
    with pytest.raises(HorizonError, match=message):
        run(tmp_path / "run", {"kind": "spark_table", **source})


def test_spark_table_source_needs_a_ds_column_to_filter_on(spark, tmp_path):
    spark.createDataFrame(logged_table().drop_columns(["ds"])).createOrReplaceTempView("no_ds")
    with pytest.raises(HorizonError, match="start_ds/end_ds filter on a 'ds' column"):
        run(tmp_path / "run", {"kind": "spark_table", "table": "no_ds", "start_ds": "2019"})


def test_spark_table_source_takes_a_table_or_a_path(tmp_path):
    base = {"pipeline": {"output_dir": str(tmp_path)}}
    for source in ({}, {"table": "t", "path": "p"}):
        with pytest.raises(ConfigError, match="give exactly one of 'table' and 'path'"):
            Engine().validate({**base, "source": {"kind": "spark_table", **source}})


# --- spark-submit ---------------------------------------------------------------------------


def test_spark_submit_runs_the_same_pipeline_toml_quietly(tmp_path):
    """The documented command, as a user types it: a second JVM, so one small run."""
    write_jsonl(tmp_path / "rows.jsonl", [decision(f"e{e}", s) for e in range(3) for s in range(2)])
    (tmp_path / "pipeline.toml").write_text(
        '[pipeline]\noutput_dir = "run"\n\n[source]\nkind = "jsonl"\npath = "rows.jsonl"\n\n'
        '[timeline]\nengine = "spark"\nactions = ["0", "1"]\neval_fraction = 0.0\n'
        # Never used: spark-submit's session is active, so its --master wins.
        '[timeline.spark]\nmaster = "no-such-master"\n'
    )

    def submit_module(flag: str) -> str:
        args = [sys.executable, "-m", "horizon_plugins_spark.submit", flag]
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()

    spark_submit = Path(sys.executable).with_name("spark-submit")
    command = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--driver-java-options",
        f"-Dlog4j2.configurationFile={submit_module('--log4j2')}",
        submit_module("--path"),
        "run",
        "pipeline.toml",
    ]
    environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    result = subprocess.run(
        command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert "timeline: 6 rows in, 6 out, 0 dropped" in result.stdout
    assert " WARN " not in result.stderr and " INFO " not in result.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["timeline"]["details"]["engine"] == "spark"
    assert len(read_split(tmp_path / "run")) == 6
