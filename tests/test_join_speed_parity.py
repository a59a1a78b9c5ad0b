"""``horizon join`` made faster writes the rows it wrote before.

The decision_ids are looked up in two hash tables instead of four, and a JSONL log written as
Parquet is shaped a chunk at a time by Arrow (``join_shape``) instead of a row at a time by
``RowShaper``. A generated log with repeated decision_ids, rewards early, late, unknown and
several per decision, and bad rows on both sides is joined and checked against a join written
plainly in Python; and the Parquet written from JSONL is checked against the row-by-row
shaping, which still writes every chunk Arrow's reading could get different.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from horizon_engine.cli import main
from horizon_plugins_serving import join_shape
from horizon_plugins_serving.join_readers import (
    DecisionLogReader,
    block_lines,
    line_blocks,
    text_blocks,
)
from horizon_plugins_serving.join_report import report_path

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WINDOW_HOURS = 48


READ_TWICE = ["--max-memory-gb", "1e-9"]
"""A memory budget no log fits: the join streams the log twice, holding only the keys."""


def run_join(log: Path, rewards: Path, output: Path, *options: str) -> tuple[int, str]:
    arguments = [log, rewards, "-o", output, "--window", f"{WINDOW_HOURS}h", *options]
    arguments += ["--default", "click=0", "--default", "buy=0", "--skip-bad-rows"]
    result = CliRunner().invoke(main, ["join", *map(str, arguments)])
    return result.exit_code, result.output


def decision(number: int, rng: random.Random, shuffled: bool = False) -> dict[str, Any]:
    features = {str(index): round(rng.uniform(-2, 2), 4) for index in range(3)}
    if shuffled and number % 7 == 3:
        features = dict(reversed(list(features.items())))
    return {
        "ds": "2026-12-01",
        "mdp_id": f"m{number}",
        "sequence_number": number,
        "state_features": features,
        "possible_actions": ["0", "1"],
        "action": str(number % 2),
        "action_probability": 0.5,
        "decision_id": f"d{number % 180}",  # d0..d19 come twice
        "model_id": "model",
        "timestamp": (NOON + timedelta(minutes=number)).isoformat(),
    }


def generated_files(folder: Path, shuffled: bool = False) -> tuple[Path, Path]:
    """A decision log of 200 rows (20 repeated decision_ids, three bad rows, a torn last
    line) and rewards for it: several per decision, before the decision, past the window,
    for unknown decision_ids, and bad ones."""
    rng = random.Random(7)
    lines = [json.dumps(decision(number, rng, shuffled)) for number in range(200)]
    lines[50] = lines[50].replace('"decision_id": "d50"', '"decision_id": ""')
    lines[60] = lines[60].replace("+00:00", "")
    lines[70] = lines[70][:-1] + ', "metrics": {"click": 1}}'
    log = folder / "decisions.jsonl"
    log.write_text("\n".join(lines) + '\n{"decision_id": "torn', encoding="utf-8")
    rewards = []
    for number in range(0, 220, 2):
        for _ in range(rng.randint(1, 3)):
            hours = rng.choice([-1.0, 0.5, 3.0, 47.0, 49.0])
            stamp = NOON + timedelta(minutes=number % 180, hours=hours)
            metric = rng.choice(["click", "buy"])
            rewards.append(
                {
                    "decision_id": f"d{number}",
                    "timestamp": stamp.isoformat().replace("+00:00", "Z"),
                    "metrics": {metric: rng.choice([1, 2.5])},
                }
            )
    reward_lines = [json.dumps(row) for row in rewards]
    reward_lines[5] = reward_lines[5].replace("Z", "")
    reward_lines[9] = json.dumps({"decision_id": "d4", "timestamp": "x", "metrics": {}})
    reward_lines[12] = json.dumps(
        {"decision_id": "d6", "timestamp": NOON.isoformat(), "metrics": {"click": 1e39}}
    )
    (folder / "rewards.jsonl").write_text("\n".join(reward_lines) + "\n", encoding="utf-8")
    return log, folder / "rewards.jsonl"


def stamp(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def plain_join(log: Path, rewards: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The join written plainly: each good decision's first row with its metrics summed
    within the window (the defaults where none came), and the report's counts."""
    firsts: dict[str, dict[str, Any]] = {}
    bad_decisions = 0
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn last line
        if not row.get("decision_id") or "metrics" in row or stamp(row["timestamp"]) is None:
            bad_decisions += 1
            continue
        firsts.setdefault(row["decision_id"], row)
    sums: dict[str, dict[str, float]] = {}
    counts = {"late_rewards": 0, "early_rewards": 0, "unknown_rewards": 0, "bad_reward_rows": 0}
    unknown_ids: dict[str, None] = {}
    for line in rewards.read_text(encoding="utf-8").splitlines():
        reward = json.loads(line)
        at = stamp(reward["timestamp"])
        values = reward["metrics"].values()
        if at is None or not all(abs(value) < 3.4e38 for value in values):
            counts["bad_reward_rows"] += 1
            continue
        if reward["decision_id"] not in firsts:
            counts["unknown_rewards"] += 1
            unknown_ids.setdefault(reward["decision_id"])
            continue
        delay = at - stamp(firsts[reward["decision_id"]]["timestamp"])
        if delay < timedelta(0):
            counts["early_rewards"] += 1
        elif delay > timedelta(hours=WINDOW_HOURS):
            counts["late_rewards"] += 1
        else:
            metrics = sums.setdefault(reward["decision_id"], {})
            for name, value in reward["metrics"].items():
                metrics[name] = metrics.get(name, 0.0) + value
    counts["bad_decision_rows"] = bad_decisions
    counts["unknown_ids"] = list(unknown_ids)[:5]
    counts["rewarded"] = len(sums)
    rows = [
        row | {"metrics": sums.get(decision_id, {"click": 0.0, "buy": 0.0})}
        for decision_id, row in firsts.items()
    ]
    return rows, counts


@pytest.mark.parametrize("output_name", ["joined.jsonl", "joined.parquet"])
def test_the_join_writes_what_a_plain_python_join_writes(tmp_path, output_name):
    log, rewards = generated_files(tmp_path)
    output = tmp_path / output_name
    code, printed = run_join(log, rewards, output)
    assert code == 0, printed
    expected_rows, expected_counts = plain_join(log, rewards)
    report = json.loads(report_path(output).read_text())
    assert {name: report[name] for name in expected_counts} == expected_counts
    assert report["duplicate_decisions"] == 20
    assert report["duplicate_ids"] == ["d0", "d1", "d2", "d3", "d4"]
    assert report["torn_lines"] == 1
    if output.suffix == ".parquet":
        table = pq.read_table(output)
        assert table.column("decision_id").to_pylist() == [r["decision_id"] for r in expected_rows]
        written = [dict(metrics) for metrics in table.column("metrics").to_pylist()]
        assert written == [row["metrics"] for row in expected_rows]
        features = [dict(f) for f in table.column("state_features").to_pylist()]
        assert features == [row["state_features"] for row in expected_rows]
    else:
        written = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
        assert written == expected_rows


def join_shaped_row_by_row(log: Path, rewards: Path, output: Path, monkeypatch) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(join_shape, "shape_lines", lambda *arguments: None)
        code, printed = run_join(log, rewards, output)
    assert code == 0, printed


@pytest.mark.parametrize("options", [[], READ_TWICE], ids=["read_once", "read_twice"])
@pytest.mark.parametrize("chunk_rows", [50_000, 40], ids=["one_chunk", "chunks_of_40"])
@pytest.mark.parametrize("shuffled", [False, True], ids=["keys_in_order", "keys_shuffled"])
def test_parquet_shaped_by_arrow_is_what_row_by_row_shaping_wrote(
    tmp_path, monkeypatch, shuffled, chunk_rows, options
):
    """With the keys of every feature map in one order Arrow shapes each chunk; with some
    rows' keys in another order the chunk is shaped row by row (a map keeps its row's
    order); both write exactly the table that shaping every row wrote. The pass that writes
    (read once, the one that reads the keys) reads whole rows with JOINED's types, as the
    first chunk's first row gives them, which the shaping then takes: each line is parsed
    once."""
    monkeypatch.setattr(DecisionLogReader.__init__, "__defaults__", (chunk_rows,))
    log, rewards = generated_files(tmp_path, shuffled)
    shaped_by_arrow = []
    shape = join_shape.shape_lines

    def counted(*arguments: Any) -> Any:
        table = shape(*arguments)
        shaped_by_arrow.append((table is not None, arguments[-1] is not None))
        return table

    monkeypatch.setattr(join_shape, "shape_lines", counted)
    code, printed = run_join(log, rewards, tmp_path / "arrow.parquet", *options)
    assert code == 0, printed
    # Whole rows are read in every chunk Arrow reads whole: not the one holding the bad rows
    # 50, 60 and 70 (nor the one chunk of 50,000 holding them), whose good lines the shaping
    # reads itself.
    read_whole = [False] if chunk_rows > 200 else [True, False, True, True, True]
    assert shaped_by_arrow == [(not shuffled, whole) for whole in read_whole]
    join_shaped_row_by_row(log, rewards, tmp_path / "rows.parquet", monkeypatch)
    ours, before = (pq.read_table(tmp_path / name) for name in ("arrow.parquet", "rows.parquet"))
    assert ours.schema.equals(before.schema, check_metadata=True)
    assert ours.equals(before)


LOGGED = {
    "ds": "2026-12-01",
    "mdp_id": "m",
    "sequence_number": 1,
    "state_features": {"a": 1.5, "b": 2},
    "possible_actions": ["0", "1"],
    "action": "0",
    "action_probability": 0.5,
    "model_id": "model",
    "timestamp": NOON.isoformat(),
}


@pytest.mark.parametrize(
    "change",
    [
        {"state_features": {"b": 2, "a": 1.5}},
        {"state_features": {"a": 1.5}},
        {"state_features": {"a": 1.5, "b": 2, "c": None}},
        {"state_features": {"a": 2**60 + 1, "b": 2}},
        {"state_features": {"a": "1", "b": 2}},
        {"state_features": {"a": True, "b": 2}},
        {"state_features": {"a b": 1.5, "(": 2}},
        {"action": 1},
        {"mdp_id": "caf\u00e9 \u2603"},
        {"mdp_id": "\ud800"},
        {"sequence_number": 2.0},
        {"sequence_number": 2**64},
        {"action_probability": 1},
        {"action_probability": 2**60 + 1},
        {"possible_actions": []},
        {"possible_actions": [0, 1]},
        {"model_id": 7},
        {"model_id": None},
        {"policy": "greedy"},
        {"propensity": 0.5},
        {"truncated": True},
        {"reward": 3},
    ],
)
def test_a_second_row_arrow_could_read_otherwise_is_written_as_row_by_row(
    tmp_path, monkeypatch, change
):
    """A log whose second row differs from its first by one field joins to the same rows, or
    fails with the same message, whether Arrow shapes its chunk or each row is shaped."""
    rows = [LOGGED | {"decision_id": "d1"}, LOGGED | {"decision_id": "d2"} | change]
    log = tmp_path / "decisions.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    rewards = tmp_path / "rewards.jsonl"
    reward = {"decision_id": "d2", "timestamp": NOON.isoformat(), "metrics": {"click": 1}}
    rewards.write_text(json.dumps(reward) + "\n", encoding="utf-8")
    by_arrow = run_join(log, rewards, tmp_path / "arrow.parquet")
    with monkeypatch.context() as patched:
        patched.setattr(join_shape, "shape_lines", lambda *arguments: None)
        by_rows = run_join(log, rewards, tmp_path / "rows.parquet")
    assert by_arrow[0] == by_rows[0]
    if by_rows[0]:
        assert by_arrow[1].replace("arrow.parquet", "rows.parquet") == by_rows[1]
        return
    ours, before = (pq.read_table(tmp_path / name) for name in ("arrow.parquet", "rows.parquet"))
    assert ours.schema.equals(before.schema, check_metadata=True)
    assert ours.equals(before)


def appended_after_planning(monkeypatch, append: Any) -> None:
    """``append`` runs once the first pass is planned, as a live log grows under the join."""
    from horizon_plugins_serving import join

    plan = join.plan_join

    def planned_then_appended(*arguments: Any, **options: Any) -> Any:
        result = plan(*arguments, **options)
        append()
        return result

    monkeypatch.setattr(join, "plan_join", planned_then_appended)


@pytest.mark.parametrize("options", [[], READ_TWICE], ids=["read_once", "read_twice"])
def test_a_jsonl_log_growing_under_the_join_is_joined_as_the_first_pass_read_it(
    tmp_path, monkeypatch, options
):
    """The log's last line half-written when the first pass read it (counted torn), and
    whole, with a row after it, when the second pass writes: the second pass writes the rows
    the first pass planned, not a traceback (read once, the rows that pass kept)."""
    rows = [LOGGED | {"decision_id": f"d{number}"} for number in range(3)]
    torn = json.dumps(LOGGED | {"decision_id": "d3"})
    log = tmp_path / "decisions.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows) + torn[:20], "utf-8")
    rewards = tmp_path / "rewards.jsonl"
    reward = {"decision_id": "d1", "timestamp": NOON.isoformat(), "metrics": {"click": 1}}
    rewards.write_text(json.dumps(reward) + "\n", encoding="utf-8")

    def append() -> None:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(torn[20:] + "\n" + json.dumps(LOGGED | {"decision_id": "d4"}) + "\n")

    appended_after_planning(monkeypatch, append)
    output = tmp_path / "joined.jsonl"
    code, printed = run_join(log, rewards, output, *options)
    assert code == 0, printed
    written = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["decision_id"] for row in written] == ["d0", "d1", "d2"]
    report = json.loads(report_path(output).read_text())
    assert (report["torn_lines"], report["written"]) == (1, 3)


@pytest.mark.parametrize("options", [[], READ_TWICE], ids=["read_once", "read_twice"])
def test_a_parquet_part_written_under_the_join_is_left_for_the_next_join(
    tmp_path, monkeypatch, options
):
    import pyarrow as pa

    log = tmp_path / "decisions.parquet"
    log.mkdir()

    def part(sequence: int, ids: list[str]) -> None:
        table = pa.table({"decision_id": ids, "timestamp": [NOON.isoformat()] * len(ids)})
        pq.write_table(table, log / f"part-{sequence:08d}-x.parquet")

    part(0, ["d0", "d1"])
    rewards = tmp_path / "rewards.jsonl"
    reward = {"decision_id": "d1", "timestamp": NOON.isoformat(), "metrics": {"click": 1}}
    rewards.write_text(json.dumps(reward) + "\n", encoding="utf-8")
    appended_after_planning(monkeypatch, lambda: part(1, ["d2", "d3"]))
    output = tmp_path / "joined.parquet"
    code, printed = run_join(log, rewards, output, *options)
    assert code == 0, printed
    assert pq.read_table(output).column("decision_id").to_pylist() == ["d0", "d1"]


def test_a_parquet_part_of_bad_rows_only_leaves_the_parts_after_it_written(tmp_path):
    import pyarrow as pa

    log = tmp_path / "decisions.parquet"
    log.mkdir()
    for sequence, ids in enumerate([["d0"], ["", ""], ["d1", "d2"]]):
        table = pa.table({"decision_id": ids, "timestamp": [NOON.isoformat()] * len(ids)})
        pq.write_table(table, log / f"part-{sequence:08d}-x.parquet")
    rewards = tmp_path / "rewards.jsonl"
    reward = {"decision_id": "d1", "timestamp": NOON.isoformat(), "metrics": {"click": 1}}
    rewards.write_text(json.dumps(reward) + "\n", encoding="utf-8")
    output = tmp_path / "joined.parquet"
    code, printed = run_join(log, rewards, output)
    assert code == 0, printed
    assert pq.read_table(output).column("decision_id").to_pylist() == ["d0", "d1", "d2"]


def parquet_log(folder: Path) -> Path:
    """The generated decisions (repeated ids, an empty one) as three Parquet parts."""
    import pyarrow as pa

    rng = random.Random(7)
    rows = [decision(number, rng) for number in range(200)]
    rows[50]["decision_id"] = ""
    log = folder / "decisions.parquet"
    log.mkdir()
    for sequence, start in enumerate(range(0, 200, 70)):
        table = pa.Table.from_pylist(rows[start : start + 70])
        pq.write_table(table, log / f"part-{sequence:08d}-x.parquet")
    return log


def passes_over_the_log(monkeypatch) -> list[int]:
    """Counts each pass the join makes over a decision log (each ``chunks`` started)."""
    passes: list[int] = []
    chunks = DecisionLogReader.chunks

    def counted(self: DecisionLogReader, *arguments: Any, **options: Any) -> Any:
        passes.append(1)
        return chunks(self, *arguments, **options)

    monkeypatch.setattr(DecisionLogReader, "chunks", counted)
    return passes


@pytest.mark.parametrize(
    ("log_form", "output_name"),
    [
        ("jsonl", "joined.jsonl"),
        ("jsonl", "joined.parquet"),
        ("parquet", "joined.parquet"),
        ("parquet", "joined.jsonl"),
    ],
)
def test_a_log_read_once_is_joined_as_a_log_read_twice(
    tmp_path, monkeypatch, log_form, output_name
):
    """A log that fits the memory budget is read once, its chunks kept for the write; one that
    does not is read twice: the same rows in the same order, the same quarantine and counts."""
    _, rewards = generated_files(tmp_path)
    log = tmp_path / "decisions.jsonl" if log_form == "jsonl" else parquet_log(tmp_path)
    passes = passes_over_the_log(monkeypatch)
    written: dict[str, Any] = {}
    reports: dict[str, Any] = {}
    for name, options, count in [("once", [], 1), ("twice", READ_TWICE, 2)]:
        output = tmp_path / name / output_name
        output.parent.mkdir()
        passes.clear()
        code, printed = run_join(log, rewards, output, *options)
        assert code == 0, printed
        assert len(passes) == count
        text = printed.replace(str(output), "JOINED")
        reports[name] = (json.loads(report_path(output).read_text()), text)
        written[name] = pq.read_table(output) if output.is_dir() else output.read_bytes()
    assert reports["once"] == reports["twice"]
    bad_rows = 3 if log_form == "jsonl" else 1  # the torn line is counted apart
    assert reports["once"][0]["bad_decision_rows"] == bad_rows
    assert reports["once"][0]["written"] == 180 - bad_rows
    if output_name.endswith(".parquet"):
        assert written["once"].equals(written["twice"])
    else:
        assert written["once"] == written["twice"]


def test_parquet_parts_are_written_as_one_row_group(tmp_path):
    """Three parts of 70 rows, joined: one row group of JOINED, not one per part read."""
    _, rewards = generated_files(tmp_path)
    output = tmp_path / "joined.parquet"
    code, printed = run_join(parquet_log(tmp_path), rewards, output)
    assert code == 0, printed
    joined = pq.ParquetFile(output / "part-00000.parquet")
    assert (joined.metadata.num_row_groups, joined.metadata.num_rows) == (1, 179)


@pytest.mark.parametrize("size", ["0", "-1", "nan", "inf", "lots"])
def test_a_memory_budget_that_is_not_a_size_is_a_usage_error(tmp_path, size):
    log, rewards = generated_files(tmp_path)
    code, printed = run_join(log, rewards, tmp_path / "joined.jsonl", "--max-memory-gb", size)
    assert code == 2
    assert "--max-memory-gb" in printed and "size in GiB" in printed
    assert not (tmp_path / "joined.jsonl").exists()


def test_a_bad_reward_row_after_a_blank_line_and_a_mark_is_named_by_its_line(tmp_path):
    """Rewards read by Arrow a block at a time: a block with a blank line is read line by line,
    and a bad row in a block Arrow read whole is still named by its line number."""
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps(LOGGED | {"decision_id": "d2"}) + "\n", encoding="utf-8")
    good = json.dumps({"decision_id": "d2", "timestamp": NOON.isoformat(), "metrics": {"a": 1}})
    late = json.dumps({"decision_id": "d2", "timestamp": "2026-12-01T12:00", "metrics": {}})
    for name, text in [("blank", f"\ufeff{good}\n\n{good}\n{late}\n"), ("whole", f"{good}\n" * 3)]:
        rewards = tmp_path / f"{name}.jsonl"
        rewards.write_text(text if name == "blank" else text + late + "\n", encoding="utf-8")
        output = tmp_path / f"{name}.out.jsonl"
        arguments = ["join", str(log), str(rewards), "-o", str(output), "--window", "48h"]
        result = CliRunner().invoke(main, arguments)
        assert result.exit_code == 1, result.output
        assert f"{rewards}:4" in result.output


@pytest.mark.fuzz
@given(
    pieces=st.lists(
        st.sampled_from([b'{"a": 1}', b"\n", b"\r\n", b" ", "\ufeff".encode(), b"x"]),
        max_size=30,
    ),
    size=st.integers(1, 12),
)
def test_text_blocks_split_into_the_lines_line_blocks_reads(tmp_path_factory, pieces, size):
    """Whole-line blocks of any size, split where a block needs it, are the lines (and line
    numbers) that reading the file line by line gives: a byte order mark, blank and
    whitespace lines, carriage returns, a last line without its newline."""
    path = tmp_path_factory.mktemp("blocks") / "rewards.jsonl"
    path.write_bytes(b"".join(pieces))
    split = [block_lines(block, first) for block, first in text_blocks(path, size)]
    lines = [line for block, _ in split for line in block]
    numbers = [number for _, block in split for number in block]
    expected = list(line_blocks(path, 1_000))
    assert lines == [line for block, _ in expected for line in block]
    assert numbers == [number for _, block in expected for number in block]


def test_rewards_parsed_by_arrow_in_small_blocks_join_as_in_one(tmp_path, monkeypatch):
    """Arrow's JSON reader parses its blocks apart: a metric first seen in a later block, and
    one an integer in the first block and a float in a later one, are summed as one block
    read them; and the blocks were read whole, not line by line."""
    from horizon_plugins_serving import join_readers

    rows = [LOGGED | {"decision_id": f"d{number}"} for number in range(40)]
    log = tmp_path / "decisions.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    rewards = tmp_path / "rewards.jsonl"
    metrics = [{"click": 1}] * 30 + [{"click": 2.5, "buy": 3}] * 30
    rewards.write_text(
        "".join(
            json.dumps({"decision_id": f"d{n % 40}", "timestamp": NOON.isoformat(), "metrics": m})
            + "\n"
            for n, m in enumerate(metrics)
        ),
        encoding="utf-8",
    )
    read = join_readers.read_json_text
    whole: list[bool] = []

    def counted(*arguments: Any, **options: Any) -> Any:
        table = read(*arguments, **options)
        whole.append(table is not None)
        return table

    monkeypatch.setattr(join_readers, "read_json_text", counted)
    joined = {}
    for block_bytes in [2**20, 300]:
        monkeypatch.setattr(join_readers, "ARROW_BLOCK_BYTES", block_bytes)
        output = tmp_path / f"joined-{block_bytes}.jsonl"
        code, printed = run_join(log, rewards, output)
        assert code == 0, printed
        joined[block_bytes] = output.read_text(encoding="utf-8")
    assert all(whole)
    assert joined[300] == joined[2**20]
    sums = {
        row["decision_id"]: row["metrics"] for row in map(json.loads, joined[300].split("\n")[:-1])
    }
    assert sums["d0"] == {"click": 3.5, "buy": 3.0}
    assert sums["d29"] == {"click": 1.0}


def decision_rows_parsed(monkeypatch) -> list[int]:
    """The rows of each decision log parse by Arrow's JSON reader (a rewards parse holds
    ``metrics``; a decision row that holds it is never parsed whole)."""
    import pyarrow.json as pj

    parsed: list[int] = []
    read = pj.read_json

    def counted(*arguments: Any, **options: Any) -> Any:
        table = read(*arguments, **options)
        if "metrics" not in table.column_names:
            parsed.append(table.num_rows)
        return table

    monkeypatch.setattr(pj, "read_json", counted)
    return parsed


@pytest.mark.parametrize("options", [[], READ_TWICE], ids=["read_once", "read_twice"])
def test_a_jsonl_log_written_as_parquet_parses_each_line_once_a_pass(
    tmp_path, monkeypatch, options
):
    """Read once, the pass that reads the keys reads every field too, with the types JOINED's
    first row gives, and the write shapes those: each line is parsed once, not once for its
    keys and again for its fields. Read twice, once a pass."""
    monkeypatch.setattr(DecisionLogReader.__init__, "__defaults__", (40,))
    _, rewards = generated_files(tmp_path)
    rows = [LOGGED | {"decision_id": f"d{number}"} for number in range(120)]
    log = tmp_path / "clean.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    parsed = decision_rows_parsed(monkeypatch)
    code, printed = run_join(log, rewards, tmp_path / "joined.parquet", *options)
    assert code == 0, printed
    assert parsed == [40, 40, 40] * (2 if options else 1)


def test_rows_read_with_types_a_dropped_first_row_gave_are_shaped_as_joineds(tmp_path, monkeypatch):
    """The first pass reads a chunk with the types of its first row; JOINED takes its schema
    from the first row written, here another (the first is unrewarded and dropped), whose
    field ``note`` is text where the first's is a number. The rows are written as shaping
    each row writes them."""
    rows = [
        LOGGED | {"decision_id": "d1", "note": 5},
        LOGGED | {"decision_id": "d2", "note": "2026-12-01T12:00:00Z"},
    ]
    log = tmp_path / "decisions.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    rewards = tmp_path / "rewards.jsonl"
    reward = {"decision_id": "d2", "timestamp": NOON.isoformat(), "metrics": {"click": 1}}
    rewards.write_text(json.dumps(reward) + "\n", encoding="utf-8")

    def joined(name: str) -> pa.Table:
        output = tmp_path / name
        arguments = [log, rewards, "-o", output, "--window", "48h", "--drop-unrewarded"]
        result = CliRunner().invoke(main, ["join", *map(str, arguments)])
        assert result.exit_code == 0, result.output
        return pq.read_table(output)

    ours = joined("arrow.parquet")
    with monkeypatch.context() as patched:
        patched.setattr(join_shape, "shape_lines", lambda *arguments: None)
        before = joined("rows.parquet")
    assert ours.schema.equals(before.schema, check_metadata=True)
    assert ours.equals(before)
    assert ours.column("note").to_pylist() == ["2026-12-01T12:00:00Z"]


def test_a_chunk_keeps_its_rows_without_a_copy_or_filters_them_all_alike():
    import numpy as np

    from horizon_plugins_serving.join_readers import DecisionChunk

    lines = [f'{{"n":{number}}}\n'.encode() for number in range(4)]
    table = pa.table({"n": list(range(4))})
    chunk = DecisionChunk(pa.array(["a", "b", "c", "d"]), pa.array([1, 2, 3, 4]), lines, rows=table)
    assert chunk.kept(np.ones(4, dtype=bool)) is chunk
    kept = chunk.kept(np.array([True, False, False, True]))
    assert kept.decision_ids.to_pylist() == ["a", "d"]
    assert kept.timestamps.to_pylist() == [1, 4]
    assert kept.lines == [lines[0], lines[3]]
    assert kept.rows.column("n").to_pylist() == [0, 3]


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("log_form", ["jsonl", "parquet"])
def test_row_groups_written_on_the_writing_thread_hold_the_rows_in_order(
    tmp_path, monkeypatch, log_form, threaded
):
    """Row groups of 30 rows, each written on the writing thread while the next chunks are
    shaped (or, where threads do not help, as they gather): the table one row group holds,
    in the same order."""
    from horizon_plugins_serving import join_writer
    from tests.test_join_threads import with_threads

    with_threads(monkeypatch, threaded)
    monkeypatch.setattr(DecisionLogReader.__init__, "__defaults__", (40,))
    _, rewards = generated_files(tmp_path)
    log = tmp_path / "decisions.jsonl" if log_form == "jsonl" else parquet_log(tmp_path)
    written = {}
    for rows in [join_writer.ROW_GROUP_ROWS, 30]:
        monkeypatch.setattr(join_writer, "ROW_GROUP_ROWS", rows)
        output = tmp_path / f"joined-{rows}.parquet"
        code, printed = run_join(log, rewards, output)
        assert code == 0, printed
        written[rows] = pq.read_table(output)
        groups = pq.ParquetFile(output / "part-00000.parquet").metadata.num_row_groups
        assert (groups > 1) == (rows == 30)
    assert written[30].equals(written[join_writer.ROW_GROUP_ROWS])


@pytest.mark.parametrize("threaded", [True, False])
def test_a_full_disk_on_the_writing_thread_fails_the_join_leaving_nothing(
    tmp_path, monkeypatch, threaded
):
    """Arrow's error for a full disk, raised on the writing thread (or where threads do not
    help, on the join's), is the join's one-line error, and no half-written JOINED is left."""
    import errno

    from tests.test_join_threads import with_threads

    with_threads(monkeypatch, threaded)
    monkeypatch.setattr(DecisionLogReader.__init__, "__defaults__", (40,))
    log, rewards = generated_files(tmp_path)

    def disk_full(*arguments: object, **options: object) -> None:
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28]")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)
    output = tmp_path / "joined.parquet"
    code, printed = run_join(log, rewards, output)
    assert code == 1
    assert "No space left on device" in printed
    assert [path.name for path in tmp_path.iterdir()] == ["decisions.jsonl", "rewards.jsonl"]
