"""Property-based tests of the row readers: the JSONL source (plain, gzip, bzip2, truncated
compressed and empty files) and the Parquet source, on hostile files.

Every example ends in batches or a ``HorizonError`` naming the file, never another exception;
row accounting holds (every non-blank line, or Parquet row, is a good row or a bad row with
its own location and a reason); and the good rows are a table the source stage can check and
write (valid Unicode, values Arrow holds). The readers are called directly on a temporary file,
as the source stage calls them, to keep each example cheap.
"""

from __future__ import annotations

import bz2
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from horizon_engine.builtin.sources import (
    JsonlSource,
    JsonlSourceConfig,
    ParquetSource,
    ParquetSourceConfig,
)
from horizon_engine.errors import HorizonError
from horizon_engine.schema import RowChecker

pytestmark = pytest.mark.fuzz

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.sampled_from([1e39, -3.5e38, 2**63, 10**400]),
)
TEXT = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["\ud800", "a\udfff", "\U0001f600", "", "0", "1"]),
)
VALUES = st.one_of(NUMBERS, TEXT, st.none(), st.booleans(), st.lists(st.integers(), max_size=2))


@st.composite
def rows(draw: st.DrawFn) -> dict[str, Any]:
    """A pre-timeline row, mostly valid, with any field possibly replaced by a hostile value."""
    row: dict[str, Any] = {
        "mdp_id": draw(st.one_of(TEXT, st.integers(0, 3))),
        "sequence_number": draw(st.one_of(st.integers(0, 5), NUMBERS)),
        "state_features": draw(st.dictionaries(TEXT, NUMBERS, max_size=3)),
        "action": draw(st.one_of(st.sampled_from(["0", "1"]), st.just({"0": 1.0}), TEXT)),
        "action_probability": draw(st.one_of(st.just(0.5), NUMBERS)),
        "reward": draw(st.one_of(st.just(1.0), NUMBERS)),
    }
    if draw(st.booleans()):
        row[draw(st.sampled_from([*row, "possible_actions", "metrics", "\ud800x"]))] = draw(VALUES)
    return row


def hostile_line(value: Any) -> bytes:
    """A JSON value's line, with surrogates written as JSON escapes (as serve's log did)."""
    return json.dumps(value).encode()


LINES = st.one_of(
    rows().map(hostile_line),
    rows().map(hostile_line),
    st.binary(max_size=30),
    st.sampled_from(
        [
            b"{not json",
            b"[" * 5000,
            b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}",
            b"1" * 5000,
            b"\xef\xbb\xbf{}",
            b'{"mdp_id": "\\ud800"}',
            b"",
            b"   ",
        ]
    ),
)


def read_all(source: Any) -> list[Any]:
    return list(source.read(None))


def check_batches(batches: list[Any], expected: int, path: Path) -> None:
    """Row accounting, locations, and good rows the source stage takes."""
    seen = 0
    checker = None
    for batch in batches:
        checker = checker or RowChecker(batch.layout)
        assert batch.table.num_rows == len(batch.locations)
        seen += batch.table.num_rows + len(batch.bad_rows)
        for bad in batch.bad_rows:
            assert bad.location.startswith(f"{path}:") and bad.reason and bad.kind
        good, rejected = checker.check(batch.table, batch.locations)
        assert good.num_rows + len(rejected) == batch.table.num_rows
        good.validate(full=True)
        good.to_pylist()  # every string decodes
        for bad in rejected:
            json.dumps(bad.row, default=str)  # as the quarantine writes it
    assert seen == expected


@given(
    lines=st.lists(LINES, max_size=12),
    bom=st.booleans(),
    torn=st.booleans(),
    compression=st.sampled_from(["", ".gz", ".bz2"]),
)
def test_jsonl_reader_on_hostile_lines(lines, bom, torn, compression):
    data = b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines)
    if torn and data:
        data = data[:-1]  # the last line without its end
    data = (b"\xef\xbb\xbf" if bom else b"") + data
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"rows.jsonl{compression}"
        opener = {".gz": gzip.compress, ".bz2": bz2.compress}.get(compression, bytes)
        path.write_bytes(opener(data))
        split = data.split(b"\n")
        split[0] = split[0].removeprefix(b"\xef\xbb\xbf")  # as the reader: a BOM is no line
        expected = sum(1 for line in split if line.strip())
        try:
            batches = read_all(JsonlSource(JsonlSourceConfig(path=str(path))))
        except HorizonError as exc:
            # Only a file without a single JSON object is refused whole.
            assert str(exc).startswith(f"{path}: no line holds a JSON object")
            return
        check_batches(batches, expected, path)


@given(
    lines=st.lists(rows().map(hostile_line), min_size=1, max_size=8),
    cut=st.integers(min_value=0, max_value=200),
    compression=st.sampled_from([".gz", ".bz2"]),
)
def test_jsonl_reader_on_truncated_compressed_files(lines, cut, compression):
    data = b"".join(line + b"\n" for line in lines)
    packed = {".gz": gzip.compress, ".bz2": bz2.compress}[compression](data)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"rows.jsonl{compression}"
        path.write_bytes(packed[: max(0, len(packed) - cut)])
        try:
            batches = read_all(JsonlSource(JsonlSourceConfig(path=str(path))))
        except HorizonError as exc:
            assert str(exc).startswith(str(path))
            return
        # Cut to nothing, the file is an empty one; cut less, it is whole, or refused, or its
        # lines before the cut are kept and the cut is one bad row after them.
        damage = [bad for batch in batches for bad in batch.bad_rows if bad.kind == "damaged_file"]
        if damage:
            (bad,) = damage
            after = int(bad.location.rsplit(":", 1)[1])  # the line after the last one read
            assert after <= len(lines) + 1
            check_batches(batches, after, path)
        else:
            check_batches(batches, len(lines) if cut < len(packed) else 0, path)


def test_an_empty_jsonl_file_yields_no_rows(tmp_path):
    for name, data in (("a.jsonl", b""), ("b.jsonl.gz", gzip.compress(b"")), ("c.jsonl", b"\n\n")):
        path = tmp_path / name
        path.write_bytes(data)
        assert read_all(JsonlSource(JsonlSourceConfig(path=str(path)))) == []


COLUMN_VALUES = {
    "mdp_id": st.one_of(st.text(max_size=4), st.sampled_from(["a", "\U0001f600"])),
    "sequence_number": st.one_of(st.integers(0, 9).map(float), st.floats(-1e20, 1e20)),
    "reward": st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(str),
        st.sampled_from(["1.5", "lots", "", "1e39", "-0"]),
    ),
    "action_probability": st.one_of(st.floats(allow_nan=True), st.just(0.5)),
    "action": st.sampled_from(["0", "1", "2"]),
}


@given(
    columns=st.fixed_dictionaries(
        {name: st.lists(values, min_size=1, max_size=8) for name, values in COLUMN_VALUES.items()}
    ),
    features=st.lists(
        st.dictionaries(st.text(max_size=3), st.floats(allow_nan=True), max_size=3),
        min_size=1,
        max_size=8,
    ),
)
def test_parquet_reader_on_hostile_columns(columns, features):
    count = min(len(values) for values in [*columns.values(), features])
    data = {name: values[:count] for name, values in columns.items()}
    data["state_features"] = [list(f.items()) for f in features[:count]]
    table = pa.table(
        {
            **{name: pa.array(values) for name, values in data.items() if name != "state_features"},
            "state_features": pa.array(data["state_features"], pa.map_(pa.string(), pa.float64())),
        }
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rows.parquet"
        pq.write_table(table, path)
        try:
            batches = read_all(ParquetSource(ParquetSourceConfig(path=str(path))))
        except HorizonError as exc:
            assert str(exc).startswith(str(path))
            return
        check_batches(batches, count, path)
