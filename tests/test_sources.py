"""The built-in ``jsonl`` and ``parquet`` sources, and how the source stage treats bad rows.

Rows go through ``Engine.run`` as a user's would, and the stage's ``source/rows.parquet`` is
read back. Bad rows either stop the run with every one listed as ``file:line: reason`` and no
output written, or go to ``source/quarantine.jsonl`` and are counted by kind in the manifest.
"""

from __future__ import annotations

import bz2
import gzip
import json
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.builtin.sources import JsonlSource, JsonlSourceConfig
from horizon_engine.errors import BadRowsError, HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.schema import FEATURES, ActionType, RowFormat, RowLayout


def decision(mdp_id: str, step: int, **changes: Any) -> dict[str, Any]:
    """A valid pre-timeline row: episode ``mdp_id``, step ``step``."""
    row = {
        "ds": "2019-01-01",
        "mdp_id": mdp_id,
        "sequence_number": step,
        "state_features": {"0": 0.1 * step, "1": -0.5},
        "action": str(step % 2),
        "reward": 1.0,
        "action_probability": 0.5,
        "possible_actions": ["0", "1"],
        "metrics": {"reward": 1.0},
    }
    row.update(changes)
    return row


def transition(mdp_id: str, step: int, **changes: Any) -> dict[str, Any]:
    """A valid timeline row with parametric actions, as Horizon wrote them."""
    row = {
        "mdp_id": mdp_id,
        "sequence_number": step,
        "propensity": 0.95,
        "state_features": {"0": 0.1 * step},
        "action": {"4": 1.0},
        "reward": 1.0,
        "next_state_features": {"0": 0.1 * step + 0.1},
        "next_action": {"5": 1.0},
        "time_diff": 1,
        "possible_actions": [{"4": 1.0}, {"5": 1.0}],
        "possible_next_actions": [{"4": 1.0}, {"5": 1.0}],
        "metrics": {"reward": 1.0},
    }
    row.update(changes)
    return row


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """Write rows (dicts, dumped as JSON) and raw strings (written as they are), one a line."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    if opener:
        with opener(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def run_source(
    output: Path, kind: str, path: Any, on_bad_rows: str = "fail", **source: Any
) -> dict[str, Any]:
    config = {
        "pipeline": {"output_dir": str(output), "on_bad_rows": on_bad_rows},
        "source": {"kind": kind, "path": path if isinstance(path, list) else str(path), **source},
    }
    return Engine(show_progress=False).run(config)


def read_rows(output: Path) -> list[dict[str, Any]]:
    return pq.read_table(output / "source" / "rows.parquet").to_pylist(maps_as_pydicts="strict")


def keys(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(row["mdp_id"], row["sequence_number"]) for row in rows]


# JSONL -------------------------------------------------------------------------------------

ROWS = [decision("0", 0), decision("0", 1), decision("1", 0)]


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json.gz", "rows.jsonl.bz2"])
def test_jsonl_plain_gzip_and_bzip2(tmp_path, name):
    path = write_jsonl(tmp_path / name, ROWS)
    manifest = run_source(tmp_path / "run", "jsonl", path)
    rows = read_rows(tmp_path / "run")
    assert keys(rows) == [("0", 0), ("0", 1), ("1", 0)]
    assert rows[1]["state_features"] == {"0": 0.1, "1": -0.5}
    assert manifest["stages"]["source"]["rows_in"] == manifest["stages"]["source"]["rows_out"] == 3
    assert manifest["stages"]["source"]["details"] == {
        "row_format": "pre_timeline",
        "action_type": "discrete",
    }


def test_jsonl_folders_globs_and_lists(tmp_path):
    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", ROWS[:1])
    write_jsonl(data / "day2" / "b.json.gz", ROWS[1:2])
    write_jsonl(data / "day2" / "c.jsonl.bz2", ROWS[2:])
    (data / "notes.txt").write_text("not rows\n")  # a folder contributes JSON files only

    run_source(tmp_path / "folder", "jsonl", data)
    assert keys(read_rows(tmp_path / "folder")) == keys(ROWS)

    run_source(tmp_path / "glob", "jsonl", str(data / "**" / "*.json*"))
    assert keys(read_rows(tmp_path / "glob")) == keys(ROWS)

    # A list, with one file named twice (by a pattern and by name): read once.
    paths = [str(data / "day2" / "c.jsonl.bz2"), str(data / "*.jsonl"), str(data / "a.jsonl")]
    run_source(tmp_path / "list", "jsonl", paths)
    assert keys(read_rows(tmp_path / "list")) == [("1", 0), ("0", 0)]


def test_a_folder_leaves_out_names_starting_with_a_dot_or_underscore(tmp_path):
    """As Spark, Hive and Arrow datasets do: a join's report, a temporary file, a job's
    _temporary folder are not rows."""
    data = tmp_path / "joined"
    write_jsonl(data / "round-0.jsonl", ROWS)
    (data / "_round-0.jsonl.report.json").write_text('{"decisions": 3}\n')
    write_jsonl(data / ".round-1.jsonl.tmp-1", ROWS[:1])
    write_jsonl(data / "_temporary" / "0" / "part-0.jsonl", ROWS[:1])
    run_source(tmp_path / "run", "jsonl", data)
    assert keys(read_rows(tmp_path / "run")) == keys(ROWS)


def test_jsonl_path_that_matches_nothing(tmp_path):
    with pytest.raises(HorizonError, match=r"\[source\] path '.*nowhere/\*\.jsonl': no file or"):
        run_source(tmp_path / "run", "jsonl", tmp_path / "nowhere" / "*.jsonl")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    with pytest.raises(HorizonError, match=r"path '.*empty': no \*\.jsonl, .* file under it"):
        run_source(tmp_path / "run", "jsonl", tmp_path / "empty")


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path):
    path = write_jsonl(
        tmp_path / "rows.jsonl",
        ["", ROWS[0], "   ", ROWS[1], "", decision("1", 0, action_probability=0)],
    )
    with pytest.raises(BadRowsError) as caught:
        run_source(tmp_path / "run", "jsonl", path)
    assert [str(row) for row in caught.value.bad_rows] == [
        f"{path}:6: 'action_probability' must be in (0, 1], found 0.0"
    ]


def test_invalid_json_line_is_a_bad_row_with_its_line(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [ROWS[0], "{not json}", ROWS[1]])
    manifest = run_source(tmp_path / "run", "jsonl", path, on_bad_rows="quarantine")
    assert keys(read_rows(tmp_path / "run")) == keys(ROWS[:2])
    assert manifest["stages"]["source"]["dropped"] == {"invalid_json": 1}
    quarantined = json.loads((tmp_path / "run" / "source" / "quarantine.jsonl").read_text())
    assert quarantined == {
        "location": f"{path}:2",
        "kind": "invalid_json",
        # Column 2 is the `n` after the opening brace.
        "reason": "invalid JSON at column 2: Expecting property name enclosed in double quotes",
        "row": "{not json}\n",
    }


def test_file_without_any_json_object_is_a_clear_error(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ["[1, 2]", '"text"'])
    with pytest.raises(HorizonError) as caught:
        run_source(tmp_path / "run", "jsonl", path)
    assert str(caught.value) == (
        f"{path}: no line holds a JSON object; expected one JSON object per line (JSON Lines)"
    )
    pretty = tmp_path / "pretty.json"
    pretty.write_text('[{"mdp_id":\n "0"}]\n')
    # A pretty-printed JSON document: the message shows the first line's problem.
    with pytest.raises(HorizonError) as caught:
        run_source(tmp_path / "run", "jsonl", pretty)
    assert str(caught.value).startswith(
        f"{pretty}: no line holds a JSON object; expected one JSON object per line (JSON Lines) "
        f"({pretty}:1: invalid JSON at column "
    )


def test_unreadable_file_is_an_error_naming_it(tmp_path):
    broken = tmp_path / "rows.jsonl.gz"
    broken.write_bytes(b"this is not gzip data")
    with pytest.raises(
        HorizonError, match=r"rows\.jsonl\.gz: cannot read the file \(after 0 lines"
    ):
        run_source(tmp_path / "run", "jsonl", broken)


def test_source_reads_lazily_in_batches(tmp_path, monkeypatch):
    monkeypatch.setattr("horizon_engine.builtin.sources.BATCH_ROWS", 2)
    path = write_jsonl(tmp_path / "rows.jsonl", [decision("0", step) for step in range(5)])
    batches = list(JsonlSource(JsonlSourceConfig(path=str(path))).read(None))
    assert [batch.table.num_rows for batch in batches] == [2, 2, 1]
    assert batches[2].locations == [f"{path}:5"]


# Parquet -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows",
    [ROWS, [transition("7", 0), transition("7", 1, possible_next_actions=[])]],
    ids=["pre_timeline_discrete", "timeline_parametric"],
)
def test_parquet_round_trip(tmp_path, rows):
    write_jsonl(tmp_path / "rows.jsonl", rows)
    run_source(tmp_path / "first", "jsonl", tmp_path / "rows.jsonl")
    written = tmp_path / "first" / "source" / "rows.parquet"
    manifest = run_source(tmp_path / "second", "parquet", written)
    again = tmp_path / "second" / "source" / "rows.parquet"
    assert pq.read_table(again).equals(pq.read_table(written))
    assert pq.read_schema(again).metadata == pq.read_schema(written).metadata
    assert manifest["stages"]["source"]["warnings"] == []


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_decision_logs_own_fields_are_read_past_without_a_warning(tmp_path, kind):
    """horizon serve, score and join write decision_id, model_id and timestamp into every
    row; a run on such rows warns only about fields nobody told it of."""
    logged = [
        decision(
            str(i),
            0,
            decision_id=f"d{i}",
            model_id="5e1d1d5d89b55743",
            timestamp="2026-12-01T14:29:05+00:00",
            user_segment="a",
        )
        for i in range(3)
    ]
    path = write_jsonl(tmp_path / "rows.jsonl", logged)
    if kind == "parquet":
        path = tmp_path / "rows.parquet"
        pq.write_table(pa.Table.from_pylist(logged), path)
    manifest = run_source(tmp_path / "run", kind, path)
    assert manifest["stages"]["source"]["warnings"] == [
        "ignored field 'user_segment' (not part of pre_timeline rows with discrete actions) "
        "in 3 rows"
    ]
    assert len(read_rows(tmp_path / "run")) == 3


def test_users_own_parquet_without_horizon_metadata(tmp_path):
    """Plain types, Horizon's `propensity` name, an extra column: layout detected, rows kept."""
    path = tmp_path / "logged.parquet"
    table = pa.table(
        {
            "mdp_id": pa.array([1, 1], pa.int32()),
            "sequence_number": pa.array([0, 1], pa.int32()),
            "state_features": pa.array(
                [[("0", 1.0)], [("0", 2.0)]], pa.map_(pa.string(), pa.float32())
            ),
            "action": pa.array([{"3": 0.5}, {"3": -0.5}], pa.map_(pa.string(), pa.float64())),
            "propensity": [1.0, 1.0],
            "reward": [0.5, -1.0],
            "next_state_features": pa.array([[("0", 2.0)], []], FEATURES),
            "next_action": pa.array([[("3", -0.5)], []], FEATURES),
            "time_diff": [1, 1],
            "user_segment": ["a", "b"],
        }
    )
    pq.write_table(table, path)
    manifest = run_source(tmp_path / "run", "parquet", path)
    source = manifest["stages"]["source"]
    assert source["details"] == {"row_format": "timeline", "action_type": "continuous"}
    assert source["warnings"] == [
        "ignored field 'user_segment' (not part of timeline rows with continuous actions) in 2 rows"
    ]
    rows = read_rows(tmp_path / "run")
    assert keys(rows) == [("1", 0), ("1", 1)]
    assert [row["action_probability"] for row in rows] == [1.0, 1.0]
    assert rows[1]["action"] == {"3": -0.5}
    # The second row's next state is empty: the end of the episode.
    assert [row["not_terminal"] for row in rows] == [True, False]


def test_parquet_written_from_python_dicts_stores_features_as_structs(tmp_path):
    """pa.Table.from_pylist (and pandas) store dict columns as structs; they read as maps."""
    rows = [
        transition("7", 0, next_state_features={"0": 0.1, "1": 2.0}),
        transition("7", 1, possible_next_actions=[]),
    ]
    table = pa.Table.from_pylist(rows)
    assert pa.types.is_struct(table.schema.field("state_features").type)
    assert pa.types.is_struct(table.schema.field("possible_actions").type.value_type)
    pq.write_table(table, tmp_path / "dicts.parquet")
    manifest = run_source(tmp_path / "run", "parquet", tmp_path / "dicts.parquet")
    assert manifest["stages"]["source"]["details"]["action_type"] == "parametric"
    first, second = read_rows(tmp_path / "run")
    assert first["next_state_features"] == {"0": 0.1, "1": 2.0}
    # The struct of the second row has a null "1": a feature missing from that row's map.
    assert second["next_state_features"] == {"0": 0.2}
    assert first["possible_actions"] == [{"4": 1.0}, {"5": 1.0}]
    assert second["possible_next_actions"] == []
    assert [row["not_terminal"] for row in (first, second)] == [True, False]


def test_parquet_missing_a_required_column(tmp_path):
    path = tmp_path / "logged.parquet"
    pq.write_table(
        pa.Table.from_pylist([decision("0", 0)]).drop_columns(["action_probability"]), path
    )
    with pytest.raises(HorizonError) as caught:
        run_source(tmp_path / "run", "parquet", path)
    message = str(caught.value)
    assert message.startswith(
        f"{path}: missing column 'action_probability' or 'propensity' (expected double) "
        "for pre_timeline rows with discrete actions; the file has ds, mdp_id,"
    )


@pytest.mark.parametrize(
    ("column", "values", "expected"),
    [
        ("sequence_number", ["ten"], "column 'sequence_number' has type string, expected int64"),
        ("state_features", [0.5], "column 'state_features' has type double, expected map<string"),
    ],
)
def test_parquet_column_of_the_wrong_type(tmp_path, column, values, expected):
    path = tmp_path / "logged.parquet"
    pq.write_table(pa.Table.from_pylist([decision("0", 0, **{column: values[0]})]), path)
    with pytest.raises(HorizonError) as caught:
        run_source(tmp_path / "run", "parquet", path)
    assert str(caught.value).startswith(f"{path}: {expected}")


def test_parquet_bad_rows_are_located_by_row(tmp_path):
    path = tmp_path / "logged.parquet"
    rows = [decision("0", 0), decision("0", 1, action_probability=1.5), decision("0", 0)]
    schema = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE).schema.remove_metadata()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    with pytest.raises(BadRowsError) as caught:
        run_source(tmp_path / "run", "parquet", path)
    assert [str(row) for row in caught.value.bad_rows] == [
        f"{path}:row 1: 'action_probability' must be in (0, 1], found 1.5",
        f"{path}:row 2: duplicate (mdp_id, sequence_number) = ('0', 0)",
    ]


def test_parquet_files_of_different_layouts(tmp_path):
    write_jsonl(tmp_path / "pre.jsonl", ROWS)
    write_jsonl(tmp_path / "timeline.jsonl", [transition("7", 0)])
    run_source(tmp_path / "a", "jsonl", tmp_path / "pre.jsonl")
    run_source(tmp_path / "b", "jsonl", tmp_path / "timeline.jsonl")
    both = [str(tmp_path / name / "source" / "rows.parquet") for name in ("a", "b")]
    with pytest.raises(HorizonError, match="but earlier rows were pre_timeline rows"):
        run_source(tmp_path / "run", "parquet", both)


def test_not_a_parquet_file(tmp_path):
    path = write_jsonl(tmp_path / "rows.parquet", ROWS)
    with pytest.raises(HorizonError, match=r"rows\.parquet: not a readable Parquet file"):
        run_source(tmp_path / "run", "parquet", path)


# Bad rows in the pipeline ------------------------------------------------------------------

BAD_LINES = [
    decision("0", 0),
    decision("0", 1, sequence_number="one"),  # line 2: wrong type
    decision("0", 2, state_features={"0": float("nan")}),  # line 3: NaN feature
    decision("0", 3),
    decision("0", 0),  # line 5: duplicate of line 1
    "{oops",  # line 6: invalid JSON
]


def test_bad_rows_fail_the_run_listing_each_and_writing_nothing(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", BAD_LINES)
    output = tmp_path / "run"
    with pytest.raises(BadRowsError) as caught:
        run_source(output, "jsonl", path)
    message = str(caught.value)
    assert message.splitlines() == [
        "4 bad rows (duplicate: 1, invalid_json: 1, non_finite: 1, wrong_type: 1):",
        f"  {path}:2: field 'sequence_number': expected an integer, found 'one' (str)",
        f"  {path}:3: 'state_features' feature '0' is nan",
        f"  {path}:5: duplicate (mdp_id, sequence_number) = ('0', 0)",
        f"  {path}:6: invalid JSON at column 2: Expecting property name enclosed in double quotes",
        'Fix them, or set [pipeline] on_bad_rows = "quarantine" to set them aside.',
    ]
    # No source/ folder, no half-written rows.parquet, no temporary leftovers.
    assert sorted(p.name for p in output.iterdir()) == ["manifest.json"]
    assert not list(tmp_path.rglob("rows.parquet"))
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["error"] == message


def test_bad_rows_quarantined_with_their_reasons(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", BAD_LINES)
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["status"] == "succeeded"
    source = manifest["stages"]["source"]
    assert source["rows_in"] == 6
    assert source["rows_out"] == 2
    assert source["dropped"] == {
        "invalid_json": 1,
        "wrong_type": 1,
        "non_finite": 1,
        "duplicate": 1,
    }
    assert source["outputs"] == ["source/rows.parquet", "source/quarantine.jsonl"]
    assert keys(read_rows(output)) == [("0", 0), ("0", 3)]
    quarantined = [
        json.loads(line)
        for line in (output / "source" / "quarantine.jsonl").read_text().splitlines()
    ]
    assert [(q["location"], q["kind"]) for q in quarantined] == [
        (f"{path}:2", "wrong_type"),
        (f"{path}:3", "non_finite"),
        (f"{path}:5", "duplicate"),
        (f"{path}:6", "invalid_json"),
    ]
    assert (
        quarantined[0]["reason"]
        == "field 'sequence_number': expected an integer, found 'one' (str)"
    )
    assert quarantined[0]["row"] == decision("0", 1, sequence_number="one")
    assert quarantined[2]["row"]["state_features"] == {"0": 0.0, "1": -0.5}
    on_disk = json.loads((output / "manifest.json").read_text())
    assert on_disk["stages"]["source"]["dropped"] == source["dropped"]


# Values too large for training's float32 tensors -------------------------------------------

HUGE = 1e308
"""Finite in float64, the JSON reader's type; infinite once training makes it float32."""


def rows_with_a_huge_feature() -> list[dict[str, Any]]:
    """Ten episodes of eight steps; line 20 (episode 2, step 3) holds a huge state feature."""
    rows = [decision(str(episode), step) for episode in range(10) for step in range(8)]
    rows[19]["state_features"] = {"0": 0.3, "1": HUGE}
    return rows


def test_a_value_too_large_for_float32_fails_naming_its_row_and_feature(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", rows_with_a_huge_feature())
    with pytest.raises(BadRowsError) as caught:
        run_source(tmp_path / "run", "jsonl", path)
    assert str(caught.value).splitlines()[:2] == [
        "1 bad rows (out_of_range: 1):",
        f"  {path}:20: 'state_features' feature '1' is 1e+308, beyond the 3.4e+38 in magnitude "
        "that training's float32 tensors hold",
    ]


def test_a_value_too_large_for_float32_is_quarantined_and_training_warns_nothing(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", rows_with_a_huge_feature())
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "on_bad_rows": "quarantine"},
        "source": {"kind": "jsonl", "path": str(path)},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {},
        "trainer": {"kind": "dqn", "epochs": 1, "minibatch_size": 16},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        manifest = Engine(show_progress=False).run(config)
    assert manifest["status"] == "succeeded"
    assert manifest["stages"]["source"]["dropped"] == {"out_of_range": 1}
    [quarantined] = (tmp_path / "run" / "source" / "quarantine.jsonl").read_text().splitlines()
    assert json.loads(quarantined)["location"] == f"{path}:20"


def test_expand_paths_is_the_one_rule_for_what_a_source_path_stands_for(tmp_path):
    """The public rule a third party's file source reads by, as the built-in ones do: a
    folder's files with the suffixes, none under a name starting with ``.`` or ``_`` (Spark's
    markers, a writer's temporary parts), each file once however often it matches."""
    from horizon_engine import expand_paths, path_problems

    logs = tmp_path / "logs"
    for name in ("a.jsonl", "sub/b.jsonl.gz", "_SUCCESS", ".tmp/c.jsonl", "_temporary/d.jsonl"):
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_text("")
    (logs / "notes.txt").write_text("")

    found = expand_paths([str(logs), str(logs / "a.jsonl")], (".jsonl", ".jsonl.gz"))

    assert found == [logs / "a.jsonl", logs / "sub" / "b.jsonl.gz"]
    missing = str(tmp_path / "nowhere" / "*.jsonl")
    assert path_problems([str(logs), missing], (".jsonl",)) == [
        f"[source] path {missing!r}: no file or folder matches"
    ]
    with pytest.raises(HorizonError, match=r"no \*\.parquet file under it"):
        expand_paths(str(logs), (".parquet",))
