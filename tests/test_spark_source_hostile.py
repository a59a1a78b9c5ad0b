"""The ``spark_table`` source on hostile JSON rows (issue 21, defects 4, 5 and 6): the rows the
JSONL source quarantines, Spark's source quarantines too, with the same reasons, where Spark
would otherwise read them differently (a line that is not UTF-8 came through as an empty row, a
sequence number of 1.5 as 1). A lone surrogate escape in a value is the one documented
exception: Spark's reader takes it as ``?`` (``horizon_plugins_spark.source``).
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.test_timeline_spark import decision, run


def line(row: dict) -> bytes:
    return json.dumps(row).encode() + b"\n"


@pytest.mark.spark
def test_spark_source_quarantines_the_rows_the_jsonl_source_does(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "part-0.json").write_bytes(
        b"".join(line(decision("a", step)) for step in range(3))
        + line(decision("bytes", 0)).replace(b'"bytes"', b'"by\xfftes"')
        + line(decision("feature", 0, state_features={"\udc00": 1.0}))
        + line(decision("big", 0, state_features={"0": 1e39}))
        + line(decision("fraction", 0)).replace(b'"sequence_number": 0', b'"sequence_number": 1.5')
        + line(decision("reward", 0, reward=1e39))
    )
    reasons = {}
    for name, source in [
        ("jsonl", {"kind": "jsonl", "path": str(logs / "part-0.json")}),
        ("spark", {"kind": "spark_table", "path": str(logs), "format": "json"}),
    ]:
        manifest = run(tmp_path / name, source, on_bad_rows="quarantine")
        assert manifest["stages"]["source"]["rows_out"] == 3
        quarantine = (tmp_path / name / "source" / "quarantine.jsonl").read_text()
        reasons[name] = sorted(json.loads(row)["reason"] for row in quarantine.splitlines())
        kept = pq.read_table(tmp_path / name / "source" / "rows.parquet").column("mdp_id")
        assert kept.to_pylist() == ["a", "a", "a"]
    assert reasons["spark"] == reasons["jsonl"]
    assert "not UTF-8: byte 0xff at column 15" in reasons["spark"]
    assert "field 'sequence_number': expected an integer, found 1.5 (float)" in reasons["spark"]
