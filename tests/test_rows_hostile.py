"""Hostile rows at the data sources' door (issue 21, defects 4 to 6): each is a quarantined row
with its line and reason, never a traceback and never the whole file refused.

Rows go through the source stage (``Engine.run`` with a ``[source]`` only), as in
tests/test_sources.py; ``horizon_engine.row_values`` and ``json_lines`` are tested directly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.builtin.sources import ParquetSource, ParquetSourceConfig
from horizon_engine.json_lines import MAX_DEPTH, BadLine, parse_json_line
from horizon_engine.row_values import (
    FLOAT32_MAX,
    feature_map_problem,
    integer_problem,
    number_problem,
    text_problem,
)
from horizon_engine.schema import ActionType, RowFormat, RowLayout
from horizon_plugins_serving.decision_log import open_decision_log
from horizon_plugins_serving.predictor import Predictor, check_row
from horizon_plugins_serving.server import BackgroundServer, build_app
from tests.test_serve import http_json
from tests.test_serving import cartpole_model, horizon
from tests.test_sources import decision, keys, read_rows, run_source, write_jsonl


def quarantined(output: Path) -> list[dict[str, Any]]:
    text = (output / "source" / "quarantine.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def row_bytes(row: dict[str, Any]) -> bytes:
    return json.dumps(row).encode()


# Defect 4: a lone surrogate ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mdp_id": "\ud800"}, "mdp_id"),
        ({"state_features": {"\ud800": 1.0}}, "state_features"),
        ({"action": "\udfff", "possible_actions": ["0", "\udfff"]}, "action"),
    ],
)
def test_a_lone_surrogate_is_quarantined_not_a_unicode_traceback(tmp_path, changes, field):
    rows = [decision("0", 0), {**decision("0", 1), **changes}, decision("0", 2)]
    # json.dumps writes the surrogate as the escape \ud800, as serve's log did.
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"bad_text": 1}
    assert len(read_rows(output)) == 2
    (bad,) = quarantined(output)
    assert bad["location"] == f"{path}:2"
    assert field in bad["reason"] and "lone surrogate" in bad["reason"]


def test_a_lone_surrogate_in_an_ignored_field_name_is_quarantined(tmp_path):
    rows = [decision("0", 0), {**decision("0", 1), "\ud800note": 1}]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    manifest = run_source(tmp_path / "run", "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"bad_text": 1}
    assert manifest["stages"]["source"]["warnings"] == []


def test_a_surrogate_pair_is_valid_unicode(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(decision("\U0001f600", 0))])
    run_source(tmp_path / "run", "jsonl", path)
    assert keys(read_rows(tmp_path / "run")) == [("\U0001f600", 0)]


def test_invalid_utf8_in_a_parquet_string_is_quarantined(tmp_path):
    rows = [decision(str(step), step) for step in range(3)]
    schema = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE).schema
    table = pa.Table.from_pylist(rows, schema=schema)
    offsets = pa.py_buffer(pa.array([0, 1, 2, 3], pa.int32()).buffers()[1])
    bad_ids = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(b"0\xff2")])
    table = table.set_column(table.schema.get_field_index("mdp_id"), "mdp_id", bad_ids)
    path = tmp_path / "rows.parquet"
    pq.write_table(table, path)
    output = tmp_path / "run"
    manifest = run_source(output, "parquet", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"wrong_type": 1}
    assert keys(read_rows(output)) == [("0", 0), ("2", 2)]
    (bad,) = quarantined(output)
    assert bad["location"] == f"{path}:row 1"
    assert bad["reason"] == "column 'mdp_id' (string): not valid UTF-8"


# Defect 5: bad rows that stopped the run ------------------------------------------------------


def test_a_deeply_nested_line_is_a_bad_row(tmp_path):
    deep = b'{"mdp_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    shallow_but_deep = row_bytes(decision("0", 1, action=json.loads("[" * 900 + "]" * 900)))
    lines = [row_bytes(decision("0", 0)), deep, shallow_but_deep, row_bytes(decision("0", 3))]
    path = write_lines(tmp_path / "rows.jsonl", lines)
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"too_deep": 2}
    assert keys(read_rows(output)) == [("0", 0), ("0", 3)]
    assert [bad["location"] for bad in quarantined(output)] == [f"{path}:2", f"{path}:3"]


def test_one_byte_that_is_not_utf8_costs_its_line_only(tmp_path):
    lines = [row_bytes(decision("0", step)) for step in range(5)]
    lines[3] = lines[3].replace(b'"ds": "2019', b'"ds": "\xff2019')
    path = write_lines(tmp_path / "rows.jsonl", lines)
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"not_utf8": 1}
    assert keys(read_rows(output)) == [("0", 0), ("0", 1), ("0", 2), ("0", 4)]
    (bad,) = quarantined(output)
    assert bad["location"] == f"{path}:4"
    assert bad["reason"] == "not UTF-8: byte 0xff at column 9"


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.gz", "rows.jsonl.bz2"])
def test_a_byte_order_mark_does_not_cost_the_first_row(tmp_path, name):
    rows = [decision("0", 0), decision("0", 1)]
    path = write_jsonl(tmp_path / name, ["\ufeff" + json.dumps(rows[0]), rows[1]])
    run_source(tmp_path / "run", "jsonl", path)
    assert keys(read_rows(tmp_path / "run")) == keys(rows)


def test_a_torn_json_line_is_reported_where_it_ends(tmp_path):
    whole = row_bytes(decision("0", 1))
    torn = whole[: whole.index(b', "sequence_number"')]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(decision("0", 0)), torn])
    output = tmp_path / "run"
    run_source(output, "jsonl", path, on_bad_rows="quarantine")
    (bad,) = quarantined(output)
    assert bad["reason"] == (
        f"invalid JSON at column {len(torn) + 1} (the end of the line: a torn line?): "
        "Expecting ',' delimiter"
    )


def test_a_number_of_thousands_of_digits_is_a_bad_row(tmp_path):
    lines = [row_bytes(decision("0", 0)), row_bytes(decision("0", 1)).replace(b"-0.5", b"9" * 5000)]
    path = write_lines(tmp_path / "rows.jsonl", lines)
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"bad_value": 1}


def test_parquet_one_unparsable_reward_and_one_fractional_sequence_number(tmp_path):
    rows = [decision("0", step, reward=str(step)) for step in range(6)]
    rows[2]["reward"] = "lots"
    rows[4]["sequence_number"] = 3.5
    for row in rows:
        row["sequence_number"] = float(row["sequence_number"])
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    output = tmp_path / "run"
    manifest = run_source(output, "parquet", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"wrong_type": 2}
    assert keys(read_rows(output)) == [("0", 0), ("0", 1), ("0", 3), ("0", 5)]
    assert [row["reward"] for row in read_rows(output)] == [0.0, 1.0, 3.0, 5.0]
    reward, sequence = quarantined(output)
    assert reward["location"] == f"{path}:row 2"
    assert reward["reason"].startswith("column 'reward' (string): Failed to parse string: 'lots'")
    assert reward["row"]["reward"] == "lots"
    assert sequence["location"] == f"{path}:row 4"
    assert (
        "column 'sequence_number' (double): Float value 3.500000 was truncated"
        in sequence["reason"]
    )


def test_a_map_action_on_the_first_row_does_not_decide_the_files_format(tmp_path):
    rows = [decision("0", 0, action={"0": 1.0})] + [decision("1", step) for step in range(420)]
    for kind, path in (
        ("jsonl", write_jsonl(tmp_path / "rows.jsonl", rows)),
        ("parquet", tmp_path / "rows.parquet"),
    ):
        if kind == "parquet":
            pq.write_table(pa.Table.from_pylist(rows[1:]), path)
            layout = ParquetSource(ParquetSourceConfig(path=str(path)))._layout(
                pq.ParquetFile(path), path
            )
            assert layout.action_type is ActionType.DISCRETE
            continue
        output = tmp_path / kind
        manifest = run_source(output, kind, path, on_bad_rows="quarantine")
        source = manifest["stages"]["source"]
        assert (source["rows_in"], source["rows_out"]) == (421, 420)
        assert source["details"]["action_type"] == "discrete"
        (bad,) = quarantined(output)
        assert bad["location"] == f"{path}:1"


# Defect 6: the one rule for a row's values ----------------------------------------------------


def test_the_rule_for_numbers():
    assert number_problem(1) is None and number_problem(-FLOAT32_MAX) is None
    assert number_problem(True).kind == "wrong_type"
    assert number_problem(float("nan")).kind == "non_finite"
    assert number_problem(1e39).kind == "out_of_range"
    huge = number_problem(10**400)
    assert huge.kind == "out_of_range" and "about 401 digits" in huge.reason
    assert integer_problem(2**63).kind == "bad_value"
    assert integer_problem(2**63 - 1) is None


def test_the_rule_for_strings_and_feature_maps():
    assert text_problem("caf\u00e9") is None
    assert text_problem("ab\ud800").reason == (
        "a lone surrogate '\\ud800' at character 2, not valid Unicode"
    )
    assert feature_map_problem({"a": 1.0}) is None
    assert str(feature_map_problem({"a": 1e39}, "state feature")).startswith(
        "state feature 'a': found 1e+39, beyond"
    )
    assert feature_map_problem({"\udc00": 1.0}).kind == "bad_text"
    assert feature_map_problem([1.0]).kind == "wrong_type"


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (b"\xff{}", "not_utf8"),
        (b'{"a": 1', "invalid_json"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "too_deep"),
        (b"1" * 5000, "bad_value"),
        (b'{"a": "\\udbff"}', "bad_text"),
    ],
)
def test_a_json_line_is_a_value_or_a_bad_line(line, kind):
    with pytest.raises(BadLine) as caught:
        parse_json_line(line)
    assert caught.value.kind == kind
    assert parse_json_line(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None


# serve and score: the same rule at the predictor ---------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small CartPole DQN of test_serving (state features "0" to "3"), exported."""
    return cartpole_model(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"state_features": {"0": 1e39}}, "state feature '0': found 1e+39, beyond the 3.4e+38"),
        ({"state_features": {"0": 10**400}}, "state feature '0': found an integer of about 401"),
        ({"state_features": {"\ud800": 1.0}}, "state feature '\\ud800': a lone surrogate"),
        ({"state_features": {}, "mdp_id": "a\udfff"}, "mdp_id: a lone surrogate '\\udfff'"),
        ({"state_features": {}, "sequence_number": 10**400}, "sequence_number: expected a 64"),
    ],
)
def test_a_request_row_follows_the_rule_the_sources_follow(row, problem):
    found = check_row(row, ["0", "1"], "discrete")
    assert found is not None and found.startswith(problem)


def test_serve_refuses_a_value_beyond_float32_with_422_naming_row_and_field(model, tmp_path):
    rows = [{"state_features": {"0": 0.1}}, {"state_features": {"1": 3.5e38}}]
    app = build_app(Predictor(model), open_decision_log(tmp_path / "log.jsonl"))
    with BackgroundServer(app) as server:
        status, answer = http_json(server.url, "POST", "/decisions", {"rows": rows})
    assert status == 422
    assert answer["error"].startswith("row 1: state feature '1': found 3.5e+38, beyond")
    assert (tmp_path / "log.jsonl").read_text() == ""


def test_rows_without_a_known_feature_are_counted_warned_and_refused_when_strict(model, caplog):
    predictor = Predictor(model)
    rows = [
        {"state_features": {}},
        {"state_features": {"speed": 1.0}},
        {"state_features": {"0": 1}},
    ]
    with caplog.at_level("WARNING", logger="horizon_plugins_serving.predictor"):
        predictor.decide(rows)
    assert predictor.featureless_rows == 2
    assert "2 rows so far had no state feature the model uses" in caplog.text
    assert all(predictor.row_problem(row) is None for row in rows)
    strict = Predictor(model, strict_features=True)
    assert strict.row_problem(rows[1]).startswith(
        "none of the state features ['speed'] is one the model uses (['0', '1', '2', '3'])"
    )
    assert strict.row_problem(rows[2]) is None


def test_score_skips_and_counts_hostile_lines_instead_of_a_traceback(model, tmp_path):
    good = json.dumps({"state_features": {"0": 0.1}}).encode()
    source = tmp_path / "rows.jsonl"
    source.write_bytes(
        b"\xef\xbb\xbf"  # a byte order mark costs no row
        + b"\n".join(
            [
                good,
                b'{"state_features": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
                b'{"state_features": {"0": 0.\xff}}',
                json.dumps({"state_features": {"speed": 1.0}}).encode(),
                good,
            ]
        )
        + b"\n"
    )
    output = tmp_path / "decisions.jsonl"
    printed = horizon("score", model, source, "-o", output, "--skip-bad-rows")
    assert "scored 3 rows" in printed and "skipped 2 bad rows" in printed
    assert "line 2: not JSON (nested more than 64 levels deep)" in printed
    assert "line 3: not JSON (not UTF-8: byte 0xff at column 28)" in printed
    strict = horizon("score", model, source, "-o", output, "--skip-bad-rows", "--strict-features")
    assert "scored 2 rows" in strict and "line 4: none of the state features" in strict


def test_serve_counts_rows_without_a_known_feature_and_refuses_them_when_strict(model, tmp_path):
    rows = [{"state_features": {"speed": 1.0}}, {"state_features": {"0": 0.1}}]
    app = build_app(Predictor(model), open_decision_log(tmp_path / "log.jsonl"))
    with BackgroundServer(app) as server:
        status, answer = http_json(server.url, "POST", "/decisions", {"rows": rows})
        _, health = http_json(server.url, "GET", "/health")
    assert (status, len(answer["decisions"]), health["featureless_rows"]) == (200, 2, 1)

    strict = build_app(
        Predictor(model, strict_features=True), open_decision_log(tmp_path / "strict.jsonl")
    )
    with BackgroundServer(strict) as server:
        status, answer = http_json(server.url, "POST", "/decisions", {"rows": rows})
    assert status == 422
    assert answer["error"].startswith("row 0: none of the state features ['speed'] is one")
    assert (tmp_path / "strict.jsonl").read_text() == ""


def test_score_skips_a_line_too_long_and_one_naming_a_key_twice(model, tmp_path):
    """Issue 33: score reads its lines as the sources do (``json_lines.read_lines``)."""
    good = json.dumps({"state_features": {"0": 0.1}}).encode()
    long_line = b'{"state_features": {"0": 0.1}, "note": "' + b"x" * 2**24 + b'"}'
    source = tmp_path / "rows.jsonl"
    source.write_bytes(
        b"\n".join([good, b'{"state_features": {"0": 1, "0": 2}}', long_line, good]) + b"\n"
    )
    output = tmp_path / "decisions.jsonl"
    printed = horizon("score", model, source, "-o", output, "--skip-bad-rows")
    assert "scored 2 rows" in printed and "skipped 2 bad rows" in printed
    assert "line 2: not JSON (the key '0' appears twice in one object)" in printed
    assert (
        f"line 3: not JSON (a line of {len(long_line):,} bytes, longer than the 16,777,216"
        in printed
    )
