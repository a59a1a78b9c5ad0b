"""``horizon join`` on hostile rows (issue 21, defects 4, 6 and 9): a string that is not valid
Unicode, a metric training cannot hold, a sum that overflows, a torn rewards file and a
timestamp finer than microseconds. Each is counted, skipped or named; the joined file is always
one the next ``horizon run`` takes whole (local engine, small files).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_join import decision, failing, horizon, read_joined, reward, write_jsonl
from tests.test_join_threads import with_threads
from tests.test_sources import run_source


def report_of(output: Path) -> dict:
    return json.loads((output.parent / f"_{output.name}.report.json").read_text())


def join(decisions: Path, rewards: Path, output: Path, *options: str) -> str:
    return horizon("join", decisions, rewards, "-o", output, "--window", "48h", *options)


def test_a_lone_surrogate_in_a_decision_row_is_a_bad_row_not_passed_on(tmp_path):
    poisoned = decision("poisoned") | {"state_features": {"\ud800": 1.0}}
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a"), poisoned, decision("b")])
    rewards = write_jsonl(tmp_path / "r.jsonl", [reward("a", 1.0, clicks=1)])
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert f"{decisions}:2:" in message and "lone surrogate" in message
    join(decisions, rewards, output, "--skip-bad-rows")
    assert report_of(output)["bad_decision_rows"] == 1
    assert [row["decision_id"] for row in read_joined(output)] == ["a", "b"]
    # The joined file is the next run's source, read whole.
    manifest = run_source(tmp_path / "run", "jsonl", output)
    assert manifest["stages"]["source"]["rows_out"] == 2


def test_a_lone_surrogate_in_a_reward_row_is_a_bad_row(tmp_path):
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a")])
    rewards = write_jsonl(
        tmp_path / "r.jsonl",
        [reward("a", 1.0, clicks=1), reward("a", 2.0) | {"decision_id": "\udc80"}],
    )
    output = tmp_path / "joined.jsonl"
    assert "lone surrogate" in failing("join", decisions, rewards, "-o", output, "--window", "48h")
    join(decisions, rewards, output, "--skip-bad-rows")
    assert report_of(output)["bad_reward_rows"] == 1


def test_a_metric_beyond_float32_is_a_bad_reward_row(tmp_path):
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a")])
    rewards = write_jsonl(tmp_path / "r.jsonl", [reward("a", 1.0, clicks=1e39)])
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert "metric 'clicks': found 1e+39, beyond the 3.4e+38" in message


def test_a_sum_beyond_float32_is_a_bad_decision_and_never_written_as_inf(tmp_path):
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a"), decision("b")])
    big = 3e38
    rewards = write_jsonl(
        tmp_path / "r.jsonl",
        [reward("a", 1.0, clicks=big), reward("a", 2.0, clicks=big), reward("b", 1.0, clicks=1)],
    )
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert "decision 'a': metric 'clicks' summed over its rewards: found 6e+38" in message
    join(decisions, rewards, output, "--skip-bad-rows")
    report = report_of(output)
    assert report["bad_decision_rows"] == 1 and report["decisions"] == 1
    assert report["written"] == 1
    text = output.read_text()
    assert "Infinity" not in text and "inf" not in text.replace('"', " ").split()
    assert [row["decision_id"] for row in read_joined(output)] == ["b"]


def test_a_torn_last_rewards_line_is_counted_not_fatal(tmp_path):
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a")])
    rewards = write_jsonl(
        tmp_path / "r.jsonl", [reward("a", 1.0, clicks=1)], tail='{"decision_id": "a", "tim'
    )
    output = tmp_path / "joined.jsonl"
    printed = join(decisions, rewards, output)
    assert "1 torn last line of the rewards skipped" in printed
    report = report_of(output)
    assert report["torn_reward_lines"] == 1 and report["bad_reward_rows"] == 0
    assert read_joined(output)[0]["metrics"] == {"clicks": 1.0}


@pytest.mark.parametrize(
    "stamp", ["2026-12-01T15:00:00.123456789+02:00", "2026-12-01T13:00:00.9999999Z"]
)
def test_a_timestamp_with_nanoseconds_and_a_zone_is_read_to_the_microsecond(tmp_path, stamp):
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a")])
    rewards = write_jsonl(tmp_path / "r.jsonl", [reward("a", 1.0, clicks=2) | {"timestamp": stamp}])
    output = tmp_path / "joined.jsonl"
    join(decisions, rewards, output)
    assert report_of(output)["rewards_attached"] == 1
    assert read_joined(output)[0]["metrics"] == {"clicks": 2.0}


def test_a_byte_order_mark_costs_no_decision(tmp_path):
    decisions = tmp_path / "d.jsonl"
    decisions.write_bytes(b"\xef\xbb\xbf" + json.dumps(decision("a")).encode() + b"\n")
    rewards = write_jsonl(tmp_path / "r.jsonl", [reward("a", 1.0, clicks=1)])
    output = tmp_path / "joined.jsonl"
    join(decisions, rewards, output)
    assert report_of(output)["torn_lines"] == 0
    assert read_joined(output)[0]["metrics"] == {"clicks": 1.0}


def not_utf8(texts: list[str], bad: int) -> pa.Array:
    """A string array whose row ``bad`` holds a byte that is not UTF-8 (Parquet's writers do
    not check)."""
    raw = [text.encode() + (b"\xff" if row == bad else b"") for row, text in enumerate(texts)]
    return pa.array(raw, pa.binary()).view(pa.string())


def test_parquet_strings_that_are_not_utf8_are_bad_rows(tmp_path):
    decisions = tmp_path / "d.parquet"
    log = pa.Table.from_pylist([decision("a"), decision("b"), decision("c")])
    keys = pa.array([["0"], ["0"], ["0"]], pa.list_(pa.string()))
    features = pa.MapArray.from_arrays([0, 1, 2, 3], not_utf8(["0", "0", "0"], 2), [0.5] * 3)
    log = log.set_column(
        log.schema.get_field_index("mdp_id"), "mdp_id", not_utf8(["a", "b", "c"], 1)
    )
    log = log.set_column(log.schema.get_field_index("state_features"), "state_features", features)
    log = log.set_column(log.schema.get_field_index("possible_actions"), "possible_actions", keys)
    pq.write_table(log, decisions)
    rewards = tmp_path / "r.parquet"
    metrics = pa.MapArray.from_arrays([0, 1, 2, 3], not_utf8(["clicks"] * 3, 2), [1.0, 2.0, 3.0])
    pq.write_table(
        pa.table(
            {
                "decision_id": not_utf8(["a", "a", "a"], 1),
                "timestamp": [reward("a", 1.0)["timestamp"]] * 3,
                "metrics": metrics,
            }
        ),
        rewards,
    )
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert f"{decisions}:row 1: column 'mdp_id' (string): not valid UTF-8" in message
    join(decisions, rewards, output, "--skip-bad-rows")
    report = report_of(output)
    assert report["bad_decision_rows"] == 2 and report["bad_reward_rows"] == 2
    assert (
        report["bad_rows"][2] == f"{rewards}:row 1: column 'decision_id' (string): not valid UTF-8"
    )
    assert report["bad_rows"][3].startswith(f"{rewards}:row 2: column 'metrics' (map<string")
    assert [row["metrics"] for row in read_joined(output)] == [{"clicks": 1.0}]
    manifest = run_source(tmp_path / "run", "jsonl", output)
    assert manifest["stages"]["source"]["rows_out"] == 1


@pytest.mark.parametrize("threaded", [True, False])
def test_the_log_is_named_before_the_rewards_read_beside_it(tmp_path, monkeypatch, threaded):
    """The rewards read on their own thread while the log is read, or after it: a bad
    decision row is still the one a join without --skip-bad-rows names, a bad reward row only
    where the log has none; skipped, the log's bad rows are named first, ten in all, each side
    counted."""
    with_threads(monkeypatch, threaded)
    no_key = {"decision_id": "", "timestamp": decision("x")["timestamp"]}
    rows = [decision("a"), *([no_key] * 8), decision("b")]
    decisions = write_jsonl(tmp_path / "d.jsonl", rows)
    bad_reward = reward("a", 1.0, clicks=1) | {"timestamp": "noon"}
    rewards = write_jsonl(tmp_path / "r.jsonl", [reward("a", 1.0, clicks=1), *[bad_reward] * 4])
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert f"{decisions}:2:" in message and str(rewards) not in message
    good_log = write_jsonl(tmp_path / "good.jsonl", [decision("a")])
    message = failing("join", good_log, rewards, "-o", output, "--window", "48h")
    assert f"{rewards}:2:" in message
    join(decisions, rewards, output, "--skip-bad-rows")
    report = report_of(output)
    assert (report["bad_decision_rows"], report["bad_reward_rows"]) == (8, 4)
    named = [bad.split(":")[0] for bad in report["bad_rows"]]
    assert named == [str(decisions)] * 8 + [str(rewards)] * 2
    assert report["bad_rows"][8].startswith(f"{rewards}:2:")


def test_rewards_read_for_a_join_that_failed_stop_at_the_next_block(tmp_path, monkeypatch):
    """A bad decision row fails the join while the rewards are read beside the log: their
    reading is told to stop, and then takes no more blocks."""
    from threading import Event

    from horizon_plugins_serving import join
    from horizon_plugins_serving.join_readers import read_rewards
    from horizon_plugins_serving.join_report import BadRows, JoinReport

    rewards = write_jsonl(tmp_path / "r.jsonl", [reward("a", 1.0, clicks=1)] * 3)
    told: list[Event] = []

    def reading(path: Path, bad: BadRows, stop: Event) -> object:
        told.append(stop)
        return read_rewards(path, bad, stop)

    monkeypatch.setattr(join, "read_rewards", reading)
    with_threads(monkeypatch, True)
    no_key = {"decision_id": "", "timestamp": decision("x")["timestamp"]}
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a"), no_key])
    failing("join", decisions, rewards, "-o", tmp_path / "joined.jsonl", "--window", "48h")
    assert told[0].is_set()
    bad = BadRows(False, JoinReport("local", 1.0, None))
    assert read_rewards(rewards, bad, Event()).rows.num_rows == 3
    assert read_rewards(rewards, bad, told[0]).rows.num_rows == 0
