"""``horizon join``: late rewards attached to logged decisions by decision_id.

A hand-made log holds every case once (several metric rows for one decision, a late and an
early reward, an unknown decision_id, a repeated decision_id, an unrewarded decision, a torn
last line), so each count of the report has one known value. The same rows as Parquet give the
same output; a big generated log checks the counts at scale; and the joined rows go through
``horizon run`` (timeline and a short dqn training) with the rewards arriving in the timeline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_plugins_serving.decision_log import (
    ParquetDecisionLog,
    decision_rows,
    open_decision_log,
)
from horizon_plugins_serving.join import parse_window
from horizon_plugins_serving.join_report import report_path

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def horizon(*arguments: object) -> str:
    result = CliRunner().invoke(main, [str(argument) for argument in arguments])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def failing(*arguments: object) -> str:
    result = CliRunner().invoke(main, [str(argument) for argument in arguments])
    assert result.exit_code != 0, result.output
    return result.output


def at(hours: float) -> str:
    return (NOON + timedelta(hours=hours)).isoformat()


def decision(decision_id: str, hours: float = 0.0, action: str = "0") -> dict[str, Any]:
    """A decision row as ``horizon score`` logs it, ``hours`` after noon."""
    return {
        "ds": "2026-12-01",
        "mdp_id": decision_id,
        "sequence_number": 0,
        "state_features": {"0": 0.5, "1": -1.0},
        "possible_actions": ["0", "1"],
        "action": action,
        "action_probability": 0.5,
        "decision_id": decision_id,
        "model_id": "0123456789abcdef",
        "timestamp": at(hours),
    }


def reward(decision_id: str, hours: float, **metrics: float) -> dict[str, Any]:
    return {"decision_id": decision_id, "timestamp": at(hours), "metrics": metrics}


def write_jsonl(path: Path, rows: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)
    return path


DECISIONS = [
    decision("rewarded"),  # two reward rows in the window, clicks summed, cost from one
    decision("late"),  # its one reward comes 49 hours after it
    decision("early"),  # its one reward is stamped an hour before it
    decision("quiet"),  # no reward at all
    decision("rewarded", hours=5.0, action="1"),  # a repeated decision_id: left out
    decision("edge", hours=1.0),  # a reward exactly 48 hours later still counts
]
TORN = '{"ds": "2026-12-01", "mdp_id": "cut", "state_feat'
"""What a crash mid-write leaves: the last line, without its end."""

REWARDS = [
    reward("rewarded", 1.0, clicks=1, cost=0.25),
    reward("rewarded", 30.0, clicks=2),
    reward("late", 49.0, clicks=7),
    reward("early", -1.0, clicks=7),
    reward("stranger", 2.0, clicks=7),
    reward("edge", 49.0, clicks=3),
]


@pytest.fixture
def logs(tmp_path: Path) -> tuple[Path, Path]:
    return (
        write_jsonl(tmp_path / "decisions.jsonl", DECISIONS, TORN),
        write_jsonl(tmp_path / "rewards.jsonl", REWARDS),
    )


def read_joined(path: Path) -> list[dict[str, Any]]:
    """JOINED's rows, JSONL or Parquet, as dicts with maps as dicts and no null fields."""
    if path.name.endswith(".parquet"):
        rows = pq.read_table(path).to_pylist(maps_as_pydicts="strict")
        return [{key: value for key, value in row.items() if value is not None} for row in rows]
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_window_is_a_number_and_a_unit():
    assert parse_window("48h") == 48 * 3600
    assert parse_window("90m") == 5400
    assert parse_window("2d") == 172800
    assert parse_window("3600s") == 3600
    assert parse_window("1.5h") == 5400
    for bad in ("48", "h", "-1h", "2w", "48 hours", ""):
        with pytest.raises(ValueError, match="number followed by s, m, h or d"):
            parse_window(bad)


def test_a_bad_window_or_default_is_a_usage_error(logs, tmp_path):
    decisions, rewards = logs
    output = tmp_path / "joined.jsonl"
    printed = failing("join", decisions, rewards, "-o", output, "--window", "2 weeks")
    assert "Invalid value for '--window'" in printed and "'2 weeks'" in printed
    printed = failing("join", decisions, rewards, "-o", output, "--window", "1d", "--default", "x")
    assert "expected METRIC=NUMBER" in printed
    printed = failing(
        "join", decisions, rewards, "-o", output, "--window", "1d", "--default", "reward=0",
        "--drop-unrewarded",
    )  # fmt: skip
    assert "--drop-unrewarded" in printed
    assert not output.exists()


def test_every_case_is_counted_and_the_rewards_summed(logs, tmp_path):
    decisions, rewards = logs
    output = tmp_path / "joined.jsonl"
    printed = horizon(
        "join", decisions, rewards, "-o", output, "--window", "48h",
        "--default", "clicks=0", "--default", "cost=0",
    )  # fmt: skip
    report = json.loads((tmp_path / "_joined.jsonl.report.json").read_text())
    assert report["decision_rows"] == 6 and report["torn_lines"] == 1
    assert report["torn_line_numbers"] == [7]
    assert report["duplicate_decisions"] == 1 and report["duplicate_ids"] == ["rewarded"]
    assert report["decisions"] == 5
    assert (report["rewarded"], report["defaulted"], report["dropped"]) == (2, 3, 0)
    assert report["reward_rows"] == 6 and report["rewards_attached"] == 3
    assert (report["late_rewards"], report["early_rewards"]) == (1, 1)
    assert report["unknown_rewards"] == 1 and report["unknown_ids"] == ["stranger"]
    assert report["written"] == 5 and report["window_seconds"] == 48 * 3600
    assert "joined 5 decisions: 2 rewarded" in printed and "e.g. stranger" in printed
    assert "1 torn decision-log lines skipped" in printed

    joined = read_joined(output)
    assert [row["decision_id"] for row in joined] == ["rewarded", "late", "early", "quiet", "edge"]
    assert joined[0]["metrics"] == {"clicks": 3.0, "cost": 0.25}
    assert joined[0]["action"] == "0"  # the first row of the repeated id, not the later one
    assert joined[4]["metrics"] == {"clicks": 3.0}
    for row in joined[1:4]:
        assert row["metrics"] == {"clicks": 0.0, "cost": 0.0}
    for logged, row in zip([DECISIONS[i] for i in (0, 1, 2, 3, 5)], joined, strict=True):
        assert {key: value for key, value in row.items() if key != "metrics"} == logged


def test_arrows_block_reader_and_the_line_by_line_reader_join_alike(tmp_path):
    """A block of whole lines is read by Arrow's JSON reader; a torn line (or a JSON null in a
    rewards block) sends its block line by line. Both give the same rows."""
    fast = tmp_path / "fast"
    slow = tmp_path / "slow"
    for folder, tail, note in [(fast, "", "read"), (slow, TORN, None)]:
        folder.mkdir()
        write_jsonl(folder / "decisions.jsonl", DECISIONS, tail)
        write_jsonl(folder / "rewards.jsonl", [row | {"note": note} for row in REWARDS])
        horizon(
            "join", folder / "decisions.jsonl", folder / "rewards.jsonl",
            "-o", folder / "joined.jsonl", "--window", "48h",
        )  # fmt: skip
    assert read_joined(fast / "joined.jsonl") == read_joined(slow / "joined.jsonl")
    reports = [
        json.loads((folder / "_joined.jsonl.report.json").read_text()) for folder in (fast, slow)
    ]
    assert reports[0]["torn_lines"] == 0 and reports[1]["torn_lines"] == 1
    del reports[0]["torn_lines"], reports[1]["torn_lines"]
    del reports[0]["torn_line_numbers"], reports[1]["torn_line_numbers"]
    assert reports[0] == reports[1]


def test_unrewarded_decisions_get_reward_zero_or_are_dropped(logs, tmp_path):
    decisions, rewards = logs
    horizon("join", decisions, rewards, "-o", tmp_path / "zero.jsonl", "--window", "48h")
    zero = read_joined(tmp_path / "zero.jsonl")
    assert [row["metrics"] for row in zero[1:4]] == [{"reward": 0.0}] * 3
    output = tmp_path / "dropped.jsonl"
    printed = horizon(
        "join", decisions, rewards, "-o", output, "--window", "48h", "--drop-unrewarded"
    )
    assert "dropped 3 without a reward" in printed
    assert [row["decision_id"] for row in read_joined(output)] == ["rewarded", "edge"]
    report = json.loads((tmp_path / "_dropped.jsonl.report.json").read_text())
    assert (report["rewarded"], report["defaulted"], report["dropped"]) == (2, 0, 3)
    assert report["written"] == 2 and report["default_metrics"] is None


def test_a_shorter_window_makes_the_edge_reward_late(logs, tmp_path):
    decisions, rewards = logs
    horizon("join", decisions, rewards, "-o", tmp_path / "j.jsonl", "--window", "2879m")
    report = json.loads((tmp_path / "_j.jsonl.report.json").read_text())
    assert report["late_rewards"] == 2 and report["rewarded"] == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"timestamp": at(1), "metrics": {"clicks": 1}}, "decision_id is None"),
        ({"decision_id": "", "timestamp": at(1), "metrics": {}}, "decision_id is ''"),
        (reward("quiet", 1) | {"timestamp": "yesterday"}, "timestamp 'yesterday' is not ISO"),
        (reward("quiet", 1) | {"timestamp": "2026-12-01T13:00:00"}, "is not ISO 8601 with a zone"),
        (reward("quiet", 1) | {"timestamp": 1764590400}, "timestamp is 1764590400"),
        (reward("quiet", 1, clicks=1) | {"metrics": {"clicks": "1"}}, "metric 'clicks': expected"),
        (reward("quiet", 1) | {"metrics": {"won": True}}, "metric 'won': expected a number"),
        (reward("quiet", 1) | {"metrics": [1, 2]}, "metrics is [1, 2], expected a map"),
        ("{not json", "not JSON"),
    ],
)
def test_a_bad_reward_row_is_named_or_counted_and_skipped(logs, tmp_path, line, reason):
    decisions, _ = logs
    rewards = tmp_path / "bad_rewards.jsonl"
    text = line if isinstance(line, str) else json.dumps(line)
    rewards.write_text(json.dumps(REWARDS[0]) + "\n" + text + "\n" + json.dumps(REWARDS[1]) + "\n")
    output = tmp_path / "joined.jsonl"
    printed = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert f"{rewards}:2: " in printed and reason in printed and "--skip-bad-rows" in printed
    assert not output.exists()
    printed = horizon(
        "join", decisions, rewards, "-o", output, "--window", "48h", "--skip-bad-rows"
    )
    report = json.loads((tmp_path / "_joined.jsonl.report.json").read_text())
    assert report["bad_reward_rows"] == 1 and report["reward_rows"] == 2
    assert report["bad_rows"][0].startswith(f"{rewards}:2: ") and reason in printed
    assert read_joined(output)[0]["metrics"] == {"clicks": 3.0, "cost": 0.25}


def test_a_decision_row_without_its_key_is_named(tmp_path):
    rows = [decision("a"), {k: v for k, v in decision("b").items() if k != "decision_id"}]
    decisions = write_jsonl(tmp_path / "decisions.jsonl", rows)
    rewards = write_jsonl(tmp_path / "rewards.jsonl", [reward("a", 1, clicks=1)])
    printed = failing("join", decisions, rewards, "-o", tmp_path / "j.jsonl", "--window", "1d")
    assert f"{decisions}:2: decision_id is None" in printed
    horizon(
        "join", decisions, rewards, "-o", tmp_path / "j.jsonl", "--window", "1d", "--skip-bad-rows"
    )
    report = json.loads((tmp_path / "_j.jsonl.report.json").read_text())
    assert report["bad_decision_rows"] == 1 and report["decisions"] == 1


LEFT_BY_A_CRASH = f".part-00000009-{'0' * 32}.parquet.tmp-999"
"""The temporary name of a part a crash interrupted: not a part, so not read."""


def write_parquet_log(folder: Path, rows: list[dict[str, Any]], rows_per_part: int) -> Path:
    """A decision log as ``horizon serve --log NAME.parquet`` writes it (``ParquetDecisionLog``),
    its parts numbered past 9 so that their order is numeric, plus a crash's temporary file."""
    with ParquetDecisionLog(folder, rows_per_part=rows_per_part) as log:
        log.sequence = 8
        for row in rows:
            log.append([row])
    (folder / LEFT_BY_A_CRASH).write_bytes(b"PAR1")
    return folder


def test_parquet_in_and_out_give_the_jsonl_rows(logs, tmp_path):
    decisions, rewards = logs
    horizon("join", decisions, rewards, "-o", tmp_path / "want.jsonl", "--window", "48h")
    want = read_joined(tmp_path / "want.jsonl")
    parquet_log = write_parquet_log(tmp_path / "decisions.parquet", DECISIONS, rows_per_part=2)
    parquet_rewards = tmp_path / "rewards.parquet"
    metrics = pa.map_(pa.string(), pa.float64())
    pq.write_table(
        pa.Table.from_pylist(
            REWARDS,
            schema=pa.schema(
                [("decision_id", pa.string()), ("timestamp", pa.string()), ("metrics", metrics)]
            ),
        ),
        parquet_rewards,
    )
    for inputs in [
        (parquet_log, parquet_rewards),
        (decisions, parquet_rewards),
        (parquet_log, rewards),
    ]:
        for name in ("joined.jsonl", "joined.parquet"):
            output = tmp_path / f"{inputs[0].suffix[1:]}-{inputs[1].suffix[1:]}-{name}"
            horizon("join", *inputs, "-o", output, "--window", "48h")
            assert read_joined(output) == want, output
            report = json.loads(report_path(output).read_text())
            assert report["rewarded"] == 2 and report["unknown_ids"] == ["stranger"]
            assert report["ignored_files"] == (
                [LEFT_BY_A_CRASH] if inputs[0] == parquet_log else []
            )
    assert sorted(path.name[:13] for path in parquet_log.glob("part-*")) == [
        "part-00000008", "part-00000009", "part-00000010"
    ]  # fmt: skip
    assert (tmp_path / "parquet-parquet-joined.parquet").is_dir()


def test_parquet_rewards_name_their_bad_rows(logs, tmp_path):
    decisions, _ = logs
    rewards = tmp_path / "rewards.parquet"
    pq.write_table(
        pa.table(
            {
                "decision_id": ["rewarded", None, "quiet"],
                "timestamp": [at(1), at(1), "noon"],
                "metrics": pa.array(
                    [[("clicks", 1.0)], [("clicks", 1.0)], [("clicks", float("nan"))]],
                    pa.map_(pa.string(), pa.float64()),
                ),
            }
        ),
        rewards,
    )
    printed = failing("join", decisions, rewards, "-o", tmp_path / "j.jsonl", "--window", "1d")
    assert (
        f"{rewards}:row 1: decision_id is missing or empty, expected a non-empty string" in printed
    )
    horizon(
        "join", decisions, rewards, "-o", tmp_path / "j.jsonl", "--window", "1d", "--skip-bad-rows"
    )
    report = json.loads((tmp_path / "_j.jsonl.report.json").read_text())
    assert report["bad_reward_rows"] == 2 and report["rewarded"] == 1
    assert report["bad_rows"] == [
        f"{rewards}:row 1: decision_id is missing or empty, expected a non-empty string",
        f"{rewards}:row 2: metric 'clicks': expected a finite number, found nan",
    ]


def big_logs(tmp_path: Path, count: int) -> tuple[Path, Path, dict[str, int]]:
    """``count`` decisions a second apart, ids ``d<i>``; rewards for every third decision (two
    rows each, one of them late for every sixth), one unknown id per hundred decisions, and
    the first 100 decisions logged twice. Returns the counts each case must give."""
    decisions = tmp_path / "decisions.jsonl"
    rows = [json.dumps(decision(f"d{i}", hours=i / 3600)) for i in range(count)]
    with decisions.open("w") as handle:
        handle.write("\n".join(rows + rows[:100]) + "\n")
    rewards = []
    for i in range(0, count, 3):
        rewards.append(json.dumps(reward(f"d{i}", i / 3600 + 1, clicks=1)))
        rewards.append(json.dumps(reward(f"d{i}", i / 3600 + (49 if i % 6 == 0 else 2), clicks=2)))
    rewards += [json.dumps(reward(f"u{i}", 1, clicks=1)) for i in range(count // 100)]
    rewards_path = tmp_path / "rewards.jsonl"
    rewards_path.write_text("\n".join(rewards) + "\n")
    rewarded = len(range(0, count, 3))
    late = len(range(0, count, 6))
    return (
        decisions,
        rewards_path,
        {
            "decisions": count,
            "duplicate_decisions": 100,
            "rewarded": rewarded,
            "defaulted": count - rewarded,
            "late_rewards": late,
            "unknown_rewards": count // 100,
            "rewards_attached": 2 * rewarded - late,
            "clicks": 3 * rewarded - 2 * late,
        },
    )


def test_a_log_of_several_chunks_joins_correctly(tmp_path):
    """120,000 decisions: two whole chunks of CHUNK_ROWS (50,000) and a part of one."""
    decisions, rewards, want = big_logs(tmp_path, 120_000)
    output = tmp_path / "joined.parquet"
    horizon("join", decisions, rewards, "-o", output, "--window", "48h")
    report = json.loads((tmp_path / "_joined.parquet.report.json").read_text())
    for key, value in want.items():
        if key != "clicks":
            assert report[key] == value, key
    table = pq.read_table(output, columns=["decision_id", "metrics"])
    assert table.num_rows == want["decisions"]
    ids = table.column("decision_id").to_pylist()
    assert ids[:3] == ["d0", "d1", "d2"] and ids[-1] == "d119999"
    entries = pa.concat_arrays([chunk.items for chunk in table.column("metrics").chunks])
    keys = pa.concat_arrays([chunk.keys for chunk in table.column("metrics").chunks])
    clicks = np.asarray(entries)[np.asarray(keys) == "clicks"]
    assert clicks.sum() == want["clicks"]
    rewards_total = np.asarray(entries)[np.asarray(keys) == "reward"]
    assert len(rewards_total) == want["defaulted"] and not rewards_total.any()


# --- JOINED as the next run's source ----------------------------------------------------------

RUN = """
[pipeline]
output_dir = "{output}"
seed = 0

[source]
kind = "{kind}"
path = "{joined}"

[timeline]
actions = ["0", "1"]
reward = {{ clicks = 1.0, cost = -2.0 }}
eval_fraction = 0.0

[normalization]

[trainer]
kind = "dqn"
epochs = 1
layers = [8]
minibatch_size = 16
threads = 1
"""


@pytest.mark.parametrize(
    ("log_name", "name"),
    [
        ("decisions.jsonl", "joined.jsonl"),
        ("decisions.jsonl", "joined.parquet"),
        ("decisions.parquet", "joined.parquet"),
    ],
)
def test_joined_rows_are_the_next_runs_source(tmp_path, log_name, name):
    """A real decision log (``decision_rows`` and the log ``horizon score`` and ``horizon
    serve`` write), its rewards joined, then ``horizon run`` through the timeline and a dqn
    epoch: each timeline row's reward is its decision's clicks - 2 * cost."""
    rng = np.random.default_rng(0)
    count = 64
    states = [{"0": float(x), "1": float(y)} for x, y in rng.normal(size=(count, 2))]
    actions = [str(a) for a in rng.integers(0, 2, count)]
    rows = decision_rows(states, actions, [0.5] * count, "m" * 16, all_actions=["0", "1"], now=NOON)
    with open_decision_log(tmp_path / log_name) as log:
        log.append(rows)
    clicks = rng.integers(0, 4, count)
    rewards = [
        reward(row["decision_id"], 1.0, clicks=int(c), cost=0.5)
        for row, c in zip(rows, clicks, strict=True)
        if c
    ]
    write_jsonl(tmp_path / "rewards.jsonl", rewards)
    joined = tmp_path / name
    horizon(
        "join", tmp_path / log_name, tmp_path / "rewards.jsonl", "-o", joined,
        "--window", "48h", "--default", "clicks=0", "--default", "cost=0",
    )  # fmt: skip
    config = tmp_path / "pipeline.toml"
    kind = "parquet" if name.endswith(".parquet") else "jsonl"
    config.write_text(RUN.format(output=tmp_path / "run", kind=kind, joined=joined))
    horizon("run", config)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["source"]["rows_out"] == count
    timeline = pq.read_table(tmp_path / "run" / "timeline" / "train").to_pylist()
    want = {
        row["mdp_id"]: float(c) - (1.0 if c else 0.0) for row, c in zip(rows, clicks, strict=True)
    }
    assert {row["mdp_id"]: row["reward"] for row in timeline} == want
    assert (tmp_path / "run" / "checkpoints").exists()


# --- the Spark engine -------------------------------------------------------------------------

COUNTS = (
    "decision_rows", "torn_lines", "torn_line_numbers", "ignored_files", "duplicate_decisions",
    "duplicate_ids", "decisions", "rewarded", "defaulted", "dropped", "written", "reward_rows",
    "rewards_attached", "late_rewards", "early_rewards", "unknown_rewards", "unknown_ids",
    "bad_decision_rows", "bad_reward_rows", "bad_rows",
)  # fmt: skip


def both_engines(tmp_path: Path, decisions: Path, rewards: Path, name: str, *options: str):
    """JOINED's rows and report from each engine, for the same inputs and options."""
    results = {}
    for engine in ("local", "spark"):
        output = tmp_path / engine / name
        output.parent.mkdir(exist_ok=True)
        horizon("join", decisions, rewards, "-o", output, "--engine", engine, *options)
        report = json.loads(report_path(output).read_text())
        results[engine] = read_joined(output), {key: report[key] for key in COUNTS}
    return results["local"], results["spark"]


@pytest.mark.spark
@pytest.mark.parametrize("name", ["joined.jsonl", "joined.parquet"])
def test_spark_engine_writes_the_local_engines_rows_and_counts(spark, tmp_path, name):
    """Every case of the hand-made log, plus bad rows skipped, joined by both engines."""
    rewards = write_jsonl(
        tmp_path / "rewards.jsonl",
        [
            *REWARDS,
            {"timestamp": at(1), "metrics": {"clicks": 1}},
            reward("quiet", 1, clicks=1) | {"timestamp": "noon"},
            reward("quiet", 1) | {"metrics": {"clicks": "1"}},
        ],
    )
    decisions = write_jsonl(
        tmp_path / "decisions.jsonl",
        [*DECISIONS, decision("joined") | {"metrics": {"clicks": 1.0}}],
        TORN,
    )
    options = ("--window", "48h", "--default", "clicks=0", "--skip-bad-rows")
    local, spark_result = both_engines(tmp_path, decisions, rewards, name, *options)
    assert spark_result == local
    assert local[1]["bad_reward_rows"] == 3 and local[1]["bad_decision_rows"] == 1
    assert local[1]["torn_line_numbers"] == [8] and local[1]["rewarded"] == 2
    local, spark_result = both_engines(
        tmp_path, decisions, rewards, "dropped-" + name, *options[:2], "--drop-unrewarded",
        "--skip-bad-rows",
    )  # fmt: skip
    assert spark_result == local and len(local[0]) == 2


@pytest.mark.spark
def test_spark_engine_reads_parquet_logs_and_rewards_as_the_local_one(spark, tmp_path):
    parquet_log = write_parquet_log(tmp_path / "decisions.parquet", DECISIONS, rows_per_part=4)
    rewards = tmp_path / "rewards.parquet"
    pq.write_table(pa.Table.from_pylist(REWARDS), rewards)  # metrics as a struct
    for name in ("joined.jsonl", "joined.parquet"):
        local, spark_result = both_engines(tmp_path, parquet_log, rewards, name, "--window", "2d")
        assert spark_result == local and local[1]["rewarded"] == 2


@pytest.mark.spark
def test_spark_engine_names_the_first_bad_row_and_writes_nothing(spark, tmp_path, logs):
    decisions, _ = logs
    rewards = tmp_path / "bad.jsonl"
    rewards.write_text(
        json.dumps(REWARDS[0]) + "\n" + json.dumps(reward("x", 1) | {"timestamp": "noon"}) + "\n"
    )
    output = tmp_path / "joined.jsonl"
    printed = failing(
        "join", decisions, rewards, "-o", output, "--window", "1d", "--engine", "spark"
    )
    assert f"{rewards}:2: timestamp 'noon' is not ISO 8601 with a zone" in printed
    assert not output.exists()


def test_the_join_command_imports_no_spark_unless_asked():
    code = (
        "import sys\n"
        "from horizon_plugins_serving.join import join_command\n"
        "print('pyspark' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
