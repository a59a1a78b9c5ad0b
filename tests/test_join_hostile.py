"""``horizon join`` on hostile rows (issue 21, defects 4, 6 and 9): a string that is not valid
Unicode, a metric training cannot hold, a sum that overflows, a torn rewards file and a
timestamp finer than microseconds. Each is counted, skipped or named; the joined file is always
one the next ``horizon run`` takes whole (local engine, small files).

And on hostile command lines (issue 33): an output that names an input however spelt, a folder
where a file belongs, a default training cannot hold, a user's file where the report goes, and
a torn line in mid-file; each refused before anything is written, every input left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine import MAX_LINE_BYTES
from horizon_plugins_serving.decision_log import DecisionLog
from tests.test_join import (
    decision,
    failing,
    horizon,
    read_joined,
    report_path,
    reward,
    write_jsonl,
    write_parquet_log,
)
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


@pytest.mark.parametrize("ends", [True, False], ids=["ended", "never_ended"])
def test_a_rewards_line_longer_than_the_limit_is_a_bad_row_read_past(tmp_path, ends):
    """The rewards are read in blocks of whole lines; a line still without its newline after
    a block was kept and grown by the next (a line that never ends: without bound). Past
    ``MAX_LINE_BYTES`` it is a bad row of its own (``too_long``), read past in pieces, and
    the rows after it are joined."""
    decisions = write_jsonl(tmp_path / "d.jsonl", [decision("a"), decision("b")])
    long_line = '{"decision_id": "a", "metrics": {"' + "x" * (MAX_LINE_BYTES + 2**20)
    rewards = tmp_path / "r.jsonl"
    with rewards.open("w") as handle:
        handle.write(json.dumps(reward("a", 1.0, clicks=1)) + "\n" + long_line)
        if ends:
            handle.write('": 1}}\n' + json.dumps(reward("b", 1.0, clicks=2)) + "\n")
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    length = len(long_line) + 6 * ends
    assert f"{rewards}:2: not JSON (a line of {length:,} bytes, longer than the" in message
    join(decisions, rewards, output, "--skip-bad-rows")
    assert report_of(output)["bad_reward_rows"] == 1
    metrics = {row["decision_id"]: row["metrics"] for row in read_joined(output)}
    assert metrics["a"] == {"clicks": 1.0}
    assert metrics["b"] == ({"clicks": 2.0} if ends else {"reward": 0.0})


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


# --- issue 33: hostile command lines ---------------------------------------------------------


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder`` (a folder as None, a link as its target), to find what a
    refused join changed: nothing, not even a temporary file."""
    entries: dict[str, bytes | None] = {}
    for entry in sorted(folder.rglob("*")):
        name = str(entry.relative_to(folder))
        if entry.is_symlink():
            entries[name] = str(entry.readlink()).encode()
        else:
            entries[name] = None if entry.is_dir() else entry.read_bytes()
    return entries


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "sub").mkdir()
    return (
        write_jsonl(tmp_path / "dec.jsonl", [decision("a"), decision("b")]),
        write_jsonl(tmp_path / "rew.jsonl", [reward("a", 1.0, clicks=1)]),
    )


@pytest.mark.parametrize(
    ("spelling", "named"),
    [
        ("rew.jsonl", "rewards file"),
        ("dec.jsonl", "decision log"),
        ("./sub/../sub/../dec.jsonl", "decision log"),
        ("ABSOLUTE", "rewards file"),
        ("SYMLINK", "rewards file"),
        ("HARDLINK", "decision log"),
    ],
)
def test_an_output_that_names_an_input_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, inputs, spelling, named
):
    """Defect 1: ``-o rew.jsonl`` replaced the rewards with the joined rows. Every spelling of
    an input (relative, through ``..``, absolute, a symlink, a hard link) is refused naming
    both, and the folder is byte for byte as it was."""
    decisions, rewards = inputs
    monkeypatch.chdir(tmp_path)
    if spelling == "ABSOLUTE":
        spelling = str(rewards)
    elif spelling == "SYMLINK":
        (tmp_path / "sub" / "link.jsonl").symlink_to(rewards)
        spelling = "sub/link.jsonl"
    elif spelling == "HARDLINK":
        (tmp_path / "sub" / "hard.jsonl").hardlink_to(decisions)
        spelling = "sub/hard.jsonl"
    before = snapshot(tmp_path)
    message = failing("join", "dec.jsonl", "rew.jsonl", "-o", spelling, "--window", "48h")
    source = "rew.jsonl" if named == "rewards file" else "dec.jsonl"
    assert message.startswith(f"error: -o {Path(spelling)} is the {named} {source}: ")
    assert "Nothing was written" in message
    assert snapshot(tmp_path) == before


def test_a_report_that_would_land_on_an_input_is_refused(tmp_path, inputs):
    """The report beside ``-o joined.jsonl`` is ``_joined.jsonl.report.json``: a rewards file
    of that name would be replaced by it."""
    decisions, rewards = inputs
    named = rewards.rename(tmp_path / "_joined.jsonl.report.json")
    before = snapshot(tmp_path)
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, named, "-o", output, "--window", "48h")
    assert f"the report {named}, beside -o {output}, is the rewards file {named}" in message
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("output", "meets"),
    [
        ("log.parquet", "is"),
        ("log.parquet/joined.parquet", "lies inside"),
        ("log.parquet/sub/../joined.jsonl", "lies inside"),
        ("LINKED/joined.jsonl", "lies inside"),
    ],
)
def test_an_output_in_or_over_a_parquet_log_folder_is_refused(tmp_path, inputs, output, meets):
    """A Parquet decision log is a folder: an output inside it (the next read would take a
    ``.parquet`` one as a part of the log), or the folder itself, is refused, and so is a
    Parquet output folder that holds the log."""
    _, rewards = inputs
    log = write_parquet_log(tmp_path / "log.parquet", [decision("a")], rows_per_part=1)
    (tmp_path / "linked").symlink_to(log)
    output = tmp_path / output.replace("LINKED", "linked")
    before = snapshot(tmp_path)
    message = failing("join", log, rewards, "-o", output, "--window", "48h")
    assert f"-o {output} {meets} the decision log {log}: " in message
    assert snapshot(tmp_path) == before
    inner = tmp_path / "outer.parquet" / "log.parquet"
    inner.parent.mkdir()
    log.rename(inner)
    message = failing("join", inner, rewards, "-o", inner.parent, "--window", "48h")
    assert f"-o {inner.parent} holds the decision log {inner}: the join would replace" in message
    assert inner.is_dir()


@pytest.mark.parametrize("which", ["decisions", "rewards"])
def test_an_input_folder_not_named_parquet_is_a_clear_error(tmp_path, inputs, which):
    """Defect 2: a decision log given as a folder was opened as a JSONL file
    (``IsADirectoryError``); a folder is a Parquet log's parts only where its name ends
    ``.parquet``."""
    decisions, rewards = inputs
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "part-0.jsonl").write_bytes(decisions.read_bytes())
    arguments = (folder, rewards) if which == "decisions" else (decisions, folder)
    output = tmp_path / "joined.jsonl"
    message = failing("join", *arguments, "-o", output, "--window", "48h")
    what = "decision log" if which == "decisions" else "rewards file"
    assert message == (
        f"error: {folder}: the {what} is a folder; a folder is read as Parquet part files only "
        "where its name ends .parquet (JSONL is one file)\n"
    )
    assert not output.exists()


def test_an_existing_folder_as_jsonl_output_is_refused_leaving_nothing(tmp_path, inputs):
    """Defect 2: ``-o`` naming an existing folder ended in ``IsADirectoryError`` with the
    joined rows left as ``.NAME.tmp-PID``. Refused before the join; a Parquet output folder
    is replaced only where it holds nothing but the part files a join writes."""
    decisions, rewards = inputs
    folder = tmp_path / "out"
    folder.mkdir()
    before = snapshot(tmp_path)
    message = failing("join", decisions, rewards, "-o", folder, "--window", "48h")
    assert f"error: -o {folder} is a folder: JSONL is written to a file" in message
    assert snapshot(tmp_path) == before
    joined = tmp_path / "joined.parquet"
    horizon("join", decisions, rewards, "-o", joined, "--window", "48h")
    horizon("join", decisions, rewards, "-o", joined, "--window", "48h")  # an earlier join's
    assert len(read_joined(joined)) == 2
    (joined / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    message = failing("join", decisions, rewards, "-o", joined, "--window", "48h")
    assert f"-o {joined} is a folder holding notes.txt, which a join does not write" in message
    assert snapshot(tmp_path) == before


def test_an_output_under_a_file_is_a_clear_error(tmp_path, inputs):
    decisions, rewards = inputs
    (tmp_path / "plain").write_text("a file")
    output = tmp_path / "plain" / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert message == f"error: -o {output}: {tmp_path / 'plain'} is not a folder\n"


@pytest.mark.parametrize(
    ("pair", "reason"),
    [
        ("reward=1e39", "found 1e+39, beyond the 3.4e+38 in magnitude"),
        ("reward=-3.5e38", "found -3.5e+38, beyond the 3.4e+38 in magnitude"),
        ("reward=inf", "expected a finite number, found inf"),
        ("\udcff=1", "a lone surrogate '\\udcff' at character 0, not valid Unicode"),
    ],
)
def test_a_default_breaking_the_row_value_rule_is_refused_naming_the_option(
    tmp_path, inputs, pair, reason
):
    """Defect 3: ``--default reward=1e39`` was accepted, and the next run's source
    quarantined every defaulted row. A default follows the rule of every row's values."""
    decisions, rewards = inputs
    output = tmp_path / "joined.jsonl"
    arguments = ("join", decisions, rewards, "-o", output, "--window", "48h")
    message = failing(*arguments, "--default", pair)
    assert "Invalid value for --default" in message and reason in message
    assert not output.exists()
    message = failing(*arguments, "--default", "reward=1", "--default", "reward=2")
    assert "metric 'reward' is given a default twice" in message


def test_a_default_within_the_rule_reaches_the_next_runs_source_whole(tmp_path, inputs):
    """The largest default float32 holds is written, and the next run's source takes every
    row: none quarantined."""
    decisions, rewards = inputs
    output = tmp_path / "joined.jsonl"
    horizon("join", decisions, rewards, "-o", output, "--window", "48h", "--default", "reward=3e38")
    assert read_joined(output)[1]["metrics"] == {"reward": 3e38}
    manifest = run_source(tmp_path / "run", "jsonl", output)
    assert manifest["stages"]["source"]["rows_out"] == 2


def test_a_users_file_where_the_report_goes_is_not_overwritten(tmp_path, inputs):
    """Defect 4: ``_NAME.report.json`` beside the output was overwritten whatever it held.
    A report an earlier join wrote is replaced; anything else refuses the join."""
    decisions, rewards = inputs
    output = tmp_path / "joined.jsonl"
    report = report_path(output)
    report.write_text('{"engine": "mine", "notes": "keep me"}\n')
    before = snapshot(tmp_path)
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert f"error: {report}: the join writes its report there (beside -o {output})" in message
    assert snapshot(tmp_path) == before
    report.unlink()
    horizon("join", decisions, rewards, "-o", output, "--window", "48h")
    horizon("join", decisions, rewards, "-o", output, "--window", "24h")
    assert report_of(output)["window_seconds"] == 24 * 3600


CUT = b'{"ds": "2026-12-01", "mdp_id": "cut", "state_feat'
"""A decision line cut short, as a crash mid-write leaves it."""


@pytest.mark.parametrize("line", [CUT, b"[1, 2]", b'"text"', b"{not json"])
def test_a_line_that_is_no_row_in_mid_file_is_a_bad_row_not_torn(tmp_path, inputs, line):
    """Defect 4: a line that is not a whole JSON object in mid-file was counted as torn and
    skipped without ``--skip-bad-rows``. Only the last line, without its newline, can be torn
    by a crash mid-write; elsewhere such a line is a bad row, named by file and line."""
    _, rewards = inputs
    decisions = tmp_path / "d.jsonl"
    decisions.write_bytes(
        json.dumps(decision("a")).encode() + b"\n" + line + b"\n"
        + json.dumps(decision("b")).encode() + b"\n" + CUT
    )  # fmt: skip
    output = tmp_path / "joined.jsonl"
    message = failing("join", decisions, rewards, "-o", output, "--window", "48h")
    assert message.startswith(f"error: {decisions}:2: ") and "--skip-bad-rows" in message
    assert not output.exists()
    join(decisions, rewards, output, "--skip-bad-rows")
    report = report_of(output)
    assert (report["bad_decision_rows"], report["torn_lines"]) == (1, 1)
    assert report["torn_line_numbers"] == [4]
    assert [row["decision_id"] for row in read_joined(output)] == ["a", "b"]


def test_a_log_a_restarted_writer_went_on_after_a_crash_joins_whole(tmp_path, inputs):
    """``DecisionLog`` reopened on a log whose last line a crash cut cuts that line off (an
    unanswered request's), so the log a restarted server goes on writing holds no torn line
    in mid-file: it joins without ``--skip-bad-rows``, the rows on either side of the cut."""
    _, rewards = inputs
    decisions = tmp_path / "served.jsonl"
    with DecisionLog(decisions) as log:
        log.append([decision("a")])
    with open(decisions, "ab") as handle:
        handle.write(CUT)
    with DecisionLog(decisions) as log:
        log.append([decision("b")])
    output = tmp_path / "joined.jsonl"
    join(decisions, rewards, output)
    assert report_of(output)["bad_decision_rows"] == 0
    assert [row["decision_id"] for row in read_joined(output)] == ["a", "b"]


@pytest.mark.spark
def test_spark_engine_takes_a_mid_file_cut_line_as_the_local_one(spark, tmp_path, inputs):
    """The one rule of torn lines (``join_rows.torn_line``) in both engines: the same first bad
    row named, the same counts skipped."""
    from tests.test_join import COUNTS

    _, rewards = inputs
    decisions = tmp_path / "d.jsonl"
    decisions.write_bytes(
        json.dumps(decision("a")).encode() + b"\n" + CUT + b"\n" + b"[1]\n"
        + json.dumps(decision("b")).encode() + b"\n" + CUT
    )  # fmt: skip
    results = {}
    for engine in ("local", "spark"):
        output = tmp_path / engine / "joined.jsonl"
        output.parent.mkdir()
        arguments = ("join", decisions, rewards, "-o", output, "--window", "48h")
        message = failing(*arguments, "--engine", engine)
        horizon(*arguments, "--engine", engine, "--skip-bad-rows")
        report = report_of(output)
        results[engine] = message, read_joined(output), {key: report[key] for key in COUNTS}
    assert results["spark"] == results["local"]
    message, _, counts = results["local"]
    assert message.startswith(f"error: {decisions}:2: not JSON")
    assert (counts["bad_decision_rows"], counts["torn_line_numbers"]) == (2, [5])
