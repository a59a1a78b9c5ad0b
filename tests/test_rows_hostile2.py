"""Hostile rows at the sources' door, issue 33: each costs its row (quarantined with its file,
line and reason, or named by the error that stops the run), never the whole run or file, a
silent change of meaning, a hang or an unbounded read.

Rows go through the source stage (``Engine.run`` with a ``[source]`` only) as in
tests/test_sources.py; ``row_values``, ``json_lines`` and ``source_paths`` are tested directly.
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.errors import BadRowsError, HorizonError
from horizon_engine.json_lines import (
    SHOWN_LINE_BYTES,
    BadLine,
    LongLine,
    parse_json_line,
    read_lines,
)
from horizon_engine.pipeline import Engine
from horizon_engine.row_values import (
    FLOAT32_MAX,
    MIN_PROPENSITY,
    SEQUENCE_MAX,
    SEQUENCE_MIN,
    is_bad_ds,
    propensity_problem,
)
from horizon_engine.schema import ActionType, RowChecker, RowFormat, RowLayout, RowShaper
from horizon_engine.source_paths import expand_paths
from tests.test_rows_hostile import quarantined, row_bytes, write_lines
from tests.test_sources import decision, keys, read_rows, run_source

# Defect 1: a propensity training reads as 0 ---------------------------------------------------


def test_the_propensity_floor_is_float32s_smallest_normal_number():
    floor = np.float32(MIN_PROPENSITY)
    assert floor > 0 and float(floor) == MIN_PROPENSITY  # float32 holds it exactly
    assert np.isfinite(np.float32(1) / floor) and 1 / MIN_PROPENSITY < FLOAT32_MAX
    assert np.float32(5e-324) == 0 and np.float32(1e-46) == 0
    assert propensity_problem(MIN_PROPENSITY) is None and propensity_problem(1.0) is None
    assert "below 1.175e-38" in str(propensity_problem(1e-39))
    assert propensity_problem(0.0).reason == "'action_probability' must be in (0, 1], found 0.0"


@pytest.mark.parametrize("tiny", [5e-324, 1e-46, 1e-39])
def test_a_propensity_below_the_floor_is_quarantined_at_the_source(tmp_path, tiny):
    rows = [decision("0", 0), decision("0", 1, action_probability=tiny), decision("0", 2)]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"bad_probability": 1}
    assert keys(read_rows(output)) == [("0", 0), ("0", 2)]
    (bad,) = quarantined(output)
    assert bad["location"] == f"{path}:2"
    assert bad["reason"].startswith(f"'action_probability' is {tiny!r}, below 1.175e-38")


def test_a_propensity_below_the_floor_stops_the_run_naming_its_row(tmp_path):
    rows = [decision("0", 0), decision("0", 1, action_probability=5e-324)]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    with pytest.raises(BadRowsError, match=rf"{path}:2: 'action_probability' is 5e-324"):
        run_source(tmp_path / "run", "jsonl", path)


def test_the_estimators_check_the_sources_floor():
    """One rule: what the source lets in, CPE takes; what it refuses, CPE refuses too."""
    from horizon_plugins_cpe.formulas import CpeInputError, CpeInputs, CpeOptions, estimate
    from tests.test_cpe_formulas import random_data

    inputs, _ = random_data(seed=10)
    for propensity, refused in ((MIN_PROPENSITY, False), (np.nextafter(MIN_PROPENSITY, 0), True)):
        logged = inputs.logged_propensity.copy()
        logged[17] = propensity
        changed = CpeInputs(**{**inputs.__dict__, "logged_propensity": logged})
        assert (propensity_problem(float(propensity)) is not None) == refused
        if refused:
            with pytest.raises(CpeInputError, match=r"of at least 1\.175e-38"):
                estimate("ips", changed, None, CpeOptions())
        else:
            estimate("ips", changed, None, CpeOptions())


# Defect 2: a damaged .gz or .bz2 keeps the rows before the damage ------------------------------


ROW_LINES = [row_bytes(decision(str(step // 5), step % 5)) + b"\n" for step in range(421)]


def damaged(path: Path, compress: callable, lines: int, tail: bytes) -> Path:
    """The first ``lines`` rows compressed whole, then ``tail`` (garbage, or a member cut)."""
    path.write_bytes(compress(b"".join(ROW_LINES[:lines])) + tail)
    return path


@pytest.mark.parametrize(
    ("name", "lines", "tail", "error"),
    [
        ("trailing.jsonl.gz", 421, b"garbage after the last member", "Not a gzipped file"),
        # A second member cut off right after its 10-byte header: no line of it is whole.
        # (mtime=0: the header's time would differ between the test processes' collections)
        (
            "cut.jsonl.gz",
            53,
            gzip.compress(b"".join(ROW_LINES[53:]), mtime=0)[:10],
            "Compressed file",
        ),
        # A second bzip2 stream cut off in its middle: bzip2 decodes whole blocks only.
        ("cut.jsonl.bz2", 53, bz2.compress(b"".join(ROW_LINES[53:]))[:200], "Compressed file"),
    ],
    ids=["gzip_trailing_garbage", "gzip_cut_member", "bzip2_cut_stream"],
)
def test_a_damaged_compressed_file_keeps_the_rows_before_the_damage(
    tmp_path, name, lines, tail, error
):
    compress = gzip.compress if name.endswith(".gz") else bz2.compress
    path = damaged(tmp_path / name, compress, lines, tail)
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["rows_out"] == lines
    assert manifest["stages"]["source"]["dropped"] == {"damaged_file": 1}
    (bad,) = quarantined(output)
    assert bad["location"] == f"{path}:{lines + 1}"
    offset = len(b"".join(ROW_LINES[:lines]))
    assert bad["reason"].startswith(
        f"the file cannot be read past line {lines} (byte {offset:,} of its text): {error}"
    )
    with pytest.raises(BadRowsError, match=rf"{path}:{lines + 1}: the file cannot be read"):
        run_source(tmp_path / "failing", "jsonl", path)


def test_a_damaged_file_among_others_costs_only_its_damage(tmp_path):
    (tmp_path / "logs").mkdir()
    good = write_lines(tmp_path / "logs" / "a.jsonl", [row_bytes(decision("a", 0))])
    damaged(tmp_path / "logs" / "b.jsonl.gz", gzip.compress, 421, b"\x00\x01junk")
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", good.parent, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["rows_in"] == 1 + 421 + 1
    assert manifest["stages"]["source"]["rows_out"] == 1 + 421


# Defect 3: sequence numbers whose differences wrap around in int64 ----------------------------

EXTREMES = [-(2**63), 2**63 - 1]


def test_sequence_numbers_beyond_63_bits_are_quarantined_from_jsonl(tmp_path):
    rows = [decision("0", step) for step in [*EXTREMES, 5]]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"out_of_range": 2}
    assert keys(read_rows(output)) == [("0", 5)]
    reasons = [bad["reason"] for bad in quarantined(output)]
    assert reasons[0].startswith(f"'sequence_number' is {-(2**63)}, outside [-2**62, 2**62 - 1]")


def test_sequence_numbers_beyond_63_bits_are_quarantined_from_parquet(tmp_path):
    rows = [decision("0", step) for step in [*EXTREMES, 5]]
    schema = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE).schema
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    output = tmp_path / "run"
    manifest = run_source(output, "parquet", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"out_of_range": 2}
    assert [bad["location"] for bad in quarantined(output)] == [f"{path}:row 0", f"{path}:row 1"]


def test_the_widest_sequence_numbers_difference_exactly(tmp_path):
    """At the bounds, one episode's time_diff is 2**63 - 1: int64's largest, not -1."""
    rows = [decision("0", SEQUENCE_MIN), decision("0", SEQUENCE_MAX)]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    output = tmp_path / "run"
    config = {
        "pipeline": {"output_dir": str(output)},
        "source": {"kind": "jsonl", "path": str(path)},
        "timeline": {"eval_fraction": 0.0},
    }
    Engine(show_progress=False).run(config, stages=["source", "timeline"])
    timeline = pq.read_table(output / "timeline" / "train").to_pylist()
    first = next(row for row in timeline if row["sequence_number"] == SEQUENCE_MIN)
    assert first["time_diff"] == 2**63 - 1
    last = next(row for row in timeline if row["sequence_number"] == SEQUENCE_MAX)
    assert last["time_since_first"] == 2**63 - 1


# Defect 4: a line too long to hold ------------------------------------------------------------


def test_a_line_longer_than_the_limit_is_read_past_not_held(tmp_path):
    """A 50 MB line in a gzip file of 50 KB, with a 1 MiB limit: a bad row, read in pieces
    (the memory traced stays within a few MiB), quarantined as its first 4 KiB."""
    huge = b'{"mdp_id": "' + b"x" * 50_000_000 + b'"}'
    lines = [row_bytes(decision("0", 0)), huge, row_bytes(decision("0", 2))]
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n", compresslevel=1))
    output = tmp_path / "run"
    tracemalloc.start()
    try:
        manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine", max_line_bytes=2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20
    assert manifest["stages"]["source"]["dropped"] == {"too_long": 1}
    assert keys(read_rows(output)) == [("0", 0), ("0", 2)]
    (bad,) = quarantined(output)
    assert (
        bad["reason"] == f"a line of {len(huge):,} bytes, longer than the 1,048,576 a line may have"
    )
    assert bad["row"] == huge[:SHOWN_LINE_BYTES].decode()
    assert (output / "source" / "quarantine.jsonl").stat().st_size < 2 * SHOWN_LINE_BYTES


def test_a_line_that_never_ends_is_one_bad_line():
    endless = io.BytesIO(b'{"a": 1}\n' + b"[" * 3_000_000)
    lines = list(read_lines(endless, max_line_bytes=2**20))
    assert [number for number, _ in lines] == [1, 2]
    long_line = lines[1][1]
    assert isinstance(long_line, LongLine) and long_line.length == 3_000_000
    assert len(long_line) == SHOWN_LINE_BYTES and long_line.strip()
    with pytest.raises(BadLine, match="a line of 3,000,000 bytes") as caught:
        parse_json_line(long_line)
    assert caught.value.kind == "too_long"


def test_a_line_at_the_limit_is_a_line():
    line = b'"' + b"x" * 1022 + b'"'
    (only,) = read_lines(io.BytesIO(line + b"\n"), max_line_bytes=1024)
    assert only == (1, line + b"\n") and not isinstance(only[1], LongLine)


def test_the_max_line_bytes_option_is_checked(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(decision("0", 0))])
    with pytest.raises(HorizonError, match="max_line_bytes"):
        run_source(tmp_path / "run", "jsonl", path, max_line_bytes=10)


def test_join_and_score_read_lines_through_the_same_limit(tmp_path):
    from horizon_plugins_serving.join_readers import line_blocks

    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b" " * (16 * 2**20 + 1) + b'{"b": 2}\n{"c": 3}\n')
    ((lines, numbers),) = line_blocks(path, 10)
    assert numbers == [1, 2, 3] and isinstance(lines[1], LongLine)
    with pytest.raises(BadLine, match="longer than the 16,777,216"):
        parse_json_line(lines[1])


# Defect 5: rows read as something they are not -----------------------------------------------


def test_an_integer_action_is_read_as_its_name_and_said_once(tmp_path):
    rows = [
        decision("0", 0, action=1, possible_actions=[0, 1]),
        decision("0", 1),
        decision("0", 2, action=0),
    ]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path)
    assert [row["action"] for row in read_rows(output)] == ["1", "1", "0"]
    (warning,) = manifest["stages"]["source"]["warnings"]
    assert warning.startswith("a discrete action (or possible action) given as an integer")
    assert warning.endswith(" in 2 rows")


def test_an_integer_action_in_parquet_is_read_as_its_name_and_said_once(tmp_path):
    rows = [decision("0", step, action=step % 2, possible_actions=[0, 1]) for step in range(3)]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    output = tmp_path / "run"
    manifest = run_source(output, "parquet", path)
    assert [row["action"] for row in read_rows(output)] == ["0", "1", "0"]
    (warning,) = manifest["stages"]["source"]["warnings"]
    assert warning.startswith("a discrete action (or possible action) given as an integer")
    assert warning.endswith(" in 3 rows")


def test_ds_must_be_a_date_written_as_horizons_partitions_are(tmp_path):
    good = ["2019-01-01", "2020-02-29", None]
    bad = ["2019-02-30", "2019-1-1", 20190101, "yesterday"]
    rows = [decision("0", step, ds=ds) for step, ds in enumerate(good + bad)]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"bad_value": 4}
    assert [row["ds"] for row in read_rows(output)] == good
    reasons = [bad["reason"] for bad in quarantined(output)]
    assert reasons[0] == "'ds' is '2019-02-30', not a date written YYYY-MM-DD"
    assert reasons[2] == "'ds' is '20190101', not a date written YYYY-MM-DD"
    flags = is_bad_ds(pa.array(["2019-12-31", "2019-12-32", None]))
    assert flags.to_pylist() == [False, True, False]


def test_a_parquet_map_with_a_key_twice_is_quarantined(tmp_path):
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    rows = [decision("0", step) for step in range(3)]
    table = pa.Table.from_pylist(rows, schema=layout.schema)
    features = pa.MapArray.from_arrays(
        pa.array([0, 1, 3, 4], pa.int32()),
        pa.array(["0", "0", "0", "1"]),
        pa.array([1.0, 2.0, 3.0, 4.0]),
    )
    index = table.schema.get_field_index("state_features")
    table = table.set_column(index, "state_features", features)
    path = tmp_path / "rows.parquet"
    pq.write_table(table, path)
    output = tmp_path / "run"
    manifest = run_source(output, "parquet", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"duplicate_key": 1}
    (bad,) = quarantined(output)
    assert bad["location"] == f"{path}:row 1"
    assert bad["reason"].startswith("column 'state_features' (map<string, double")
    assert bad["reason"].endswith("): a map holds the key '0' twice")
    assert bad["row"]["state_features"] == {"0": 3.0}  # the last value of the two


def test_a_parquet_file_with_a_column_twice_is_an_error_naming_both(tmp_path):
    rows = [decision("0", step) for step in range(2)]
    table = pa.Table.from_pylist(rows)
    table = table.append_column("action", pa.array(["0", "1"]))
    path = tmp_path / "rows.parquet"
    pq.write_table(table, path)
    with pytest.raises(HorizonError, match=rf"{path}: the file has 2 columns named 'action'"):
        run_source(tmp_path / "run", "parquet", path)


def test_a_fifo_is_refused_not_opened(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(HorizonError, match=r"rows\.jsonl is a FIFO \(named pipe\)"):
        expand_paths(str(fifo), (".jsonl",))
    with pytest.raises(HorizonError, match="a FIFO"):
        run_source(tmp_path / "run", "jsonl", fifo)


def test_a_source_folder_holding_the_run_folder_does_not_read_the_runs_files(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    path = write_lines(logs / "rows.jsonl", [row_bytes(decision("0", step)) for step in range(2)])
    output = logs / "run"
    run_source(output, "jsonl", logs)
    assert (output / "manifest.json").is_file()
    # Once more: the first run's manifest.json and the rerun's own are not rows.
    config = {
        "pipeline": {"output_dir": str(output)},
        "source": {"kind": "jsonl", "path": str(logs)},
    }
    manifest = Engine(show_progress=False).run(config, overwrite=True)
    assert manifest["stages"]["source"]["rows_in"] == 2
    assert keys(read_rows(output)) == [("0", 0), ("0", 1)]
    config["source"]["path"] = str(output / "manifest.json")
    with pytest.raises(HorizonError, match="lies in the run's own output_dir"):
        Engine(show_progress=False).run(config, overwrite=True)
    assert path.is_file()


def test_a_json_line_naming_a_key_twice_is_a_bad_line(tmp_path):
    with pytest.raises(BadLine, match="the key 'mdp_id' appears twice") as caught:
        parse_json_line(b'{"mdp_id": "0", "x": {"a": 1}, "mdp_id": "1"}')
    assert caught.value.kind == "duplicate_key"
    with pytest.raises(BadLine, match="the key 'a' appears twice"):
        parse_json_line('[{"a": 1, "b": 2, "a": 1}]')
    lines = [row_bytes(decision("0", 0)), row_bytes(decision("0", 1))[:-1] + b', "reward": 2}']
    path = write_lines(tmp_path / "rows.jsonl", lines)
    output = tmp_path / "run"
    manifest = run_source(output, "jsonl", path, on_bad_rows="quarantine")
    assert manifest["stages"]["source"]["dropped"] == {"duplicate_key": 1}


def test_many_duplicate_rows_are_quarantined_in_one_pass(monkeypatch):
    """20,000 duplicates of one row: their contents are converted in one pass over the bad
    rows, a column at a time (``rows_as_dicts``), not sliced out and converted row by row
    (300,000 duplicates took 14 s of that alone). Counted, not timed."""
    from horizon_engine import schema

    converted: list[int] = []

    def counted(table: pa.Table) -> list[dict]:
        converted.append(table.num_rows)
        return schema_rows_as_dicts(table)

    schema_rows_as_dicts = schema.rows_as_dicts
    monkeypatch.setattr(schema, "rows_as_dicts", counted)
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    count = 20_000
    shaped = RowShaper(layout).shape((f"rows.jsonl:{n}", decision("0", 0)) for n in range(count))
    good, bad = RowChecker(layout).check(shaped.table, shaped.locations)
    assert good.num_rows == 1 and len(bad) == count - 1
    assert converted == [count - 1]
    assert bad[-1].location == f"rows.jsonl:{count - 1}"
    assert bad[-1].row == {**decision("0", 0), "truncated": None}


@pytest.mark.spark
def test_the_widest_sequence_numbers_build_the_same_timeline_on_spark(tmp_path, spark):
    """Spark's engine differences the bounds as the local one does: 2**63 - 1, no wrap."""
    from tests.test_timeline_parity import read_timeline

    steps = [SEQUENCE_MIN, -5, 0, SEQUENCE_MAX]
    rows = [decision(episode, step) for episode in "abcdef" for step in steps]
    path = write_lines(tmp_path / "rows.jsonl", [row_bytes(row) for row in rows])
    built = {}
    for engine in ("local", "spark"):
        config = {
            "pipeline": {"output_dir": str(tmp_path / engine)},
            "source": {"kind": "jsonl", "path": str(path)},
            "timeline": {"engine": engine, "eval_fraction": 0.5, "n_step": 2},
        }
        manifest = Engine(show_progress=False).run(config, stages=["source", "timeline"])
        built[engine] = read_timeline(tmp_path / engine, manifest)
    local, on_spark = built["local"], built["spark"]
    for split in ("train", "eval"):
        assert local[split].num_rows > 0
        assert on_spark[split].schema.equals(local[split].schema, check_metadata=False)
        assert on_spark[split].equals(local[split]), split
    assert on_spark["manifest"]["dropped"] == local["manifest"]["dropped"]
    both = pa.concat_tables([built["local"]["train"], built["local"]["eval"]])
    assert set(both["time_diff"].to_pylist()) <= {2**62 - 5, 5, 2**62 - 1, 0}
    assert max(both["time_since_first"].to_pylist()) == 2**63 - 1
