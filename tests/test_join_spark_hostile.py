"""``horizon join --engine spark`` on hostile rows (issue 21, defects 4, 6 and 9): one decision
log and one rewards file hold every hostile case at once, and the Spark engine must write the
local engine's rows and counts, and fail on the same first bad row with the same message.

The cases: a UTF-8 byte order mark, a byte that is not UTF-8, a lone surrogate escape in an id,
a feature name and a metric name (and, beside them, an escaped surrogate pair and an escaped
backslash, which are valid), a timestamp with nanoseconds and an offset, a metric beyond
float32, a 400-digit integer, a sum that overflows float32, and a torn last line in each file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizon_plugins_serving.join_report import report_path
from tests.test_join import COUNTS as JOIN_COUNTS
from tests.test_join import at, decision, failing, horizon, read_joined, reward

COUNTS = (*JOIN_COUNTS, "torn_reward_lines")

NANOSECONDS = "2026-12-01T14:00:00.123456789+02:00"
"""Noon UTC and a fraction of a second, in nanoseconds with an offset (Java's clock)."""


def line(row: dict) -> bytes:
    return json.dumps(row).encode() + b"\n"


def hostile_logs(folder: Path) -> tuple[Path, Path]:
    """A decision log and a rewards file holding every hostile case, in that order."""
    decisions = folder / "decisions.jsonl"
    decisions.write_bytes(
        b"\xef\xbb\xbf"
        + line(decision("bom") | {"timestamp": NANOSECONDS})
        + line(decision("surrogate feature") | {"state_features": {"\ud800": 1.0}})
        + line(decision("\udc80"))
        + line(decision("pair \U0001f600"))  # json.dumps escapes it as a valid surrogate pair
        + line(decision("escaped") | {"mdp_id": "\\ud800"})  # a backslash, then text
        + line(decision("bytes")).replace(b'"bytes"', b'"bytes\xff"', 1)
        + line(decision("overflow"))
        + line(decision("plain"))
        + b'{"ds": "2026-12-01", "mdp_id": "cut", "state_feat'
    )
    rewards = folder / "rewards.jsonl"
    rewards.write_bytes(
        b"\xef\xbb\xbf"
        + line(reward("bom", 1.0, clicks=1) | {"timestamp": NANOSECONDS})
        + line(reward("pair \U0001f600", 1.0, clicks=2))
        + line(reward("escaped", 1.0, clicks=3))
        + line(reward("plain", 1.0, **{"\ud800": 1.0}))
        + line(reward("plain", 1.0, clicks=1e39))
        + line(reward("plain", 1.0, clicks=4)).replace(b'"plain"', b'"pl\xe9ain"', 1)
        + line(reward("plain", 1.0, clicks=5)).replace(b"5", b"9" * 400, 1)
        + line(reward("\udfff", 1.0, clicks=6))
        + line(reward("overflow", 1.0, clicks=3e38))
        + line(reward("overflow", 2.0, clicks=3e38))
        + line(reward("plain", 2.0, clicks=7))
        + b'{"decision_id": "plain", "timestamp": "'
        + at(3).encode()
    )
    return decisions, rewards


def joined(tmp_path: Path, engine: str, name: str, *options: str):
    decisions, rewards = hostile_logs(tmp_path)
    output = tmp_path / engine / name
    output.parent.mkdir(exist_ok=True)
    arguments = ("join", decisions, rewards, "-o", output, "--window", "48h", *options)
    if "--skip-bad-rows" not in options:
        return failing(*arguments, "--engine", engine)
    horizon(*arguments, "--engine", engine)
    report = json.loads(report_path(output).read_text())
    return read_joined(output), {key: report[key] for key in COUNTS}


@pytest.mark.spark
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("joined.jsonl", ("--skip-bad-rows",)),
        ("joined.jsonl", ()),
    ],
)
def test_spark_engine_takes_hostile_rows_as_the_local_one(spark, tmp_path, name, options):
    local = joined(tmp_path, "local", name, *options)
    assert joined(tmp_path, "spark", name, *options) == local
    if not options:
        assert "lone surrogate" in local
        return
    rows, counts = local
    assert counts["bad_decision_rows"] == 4 and counts["bad_reward_rows"] == 5
    assert counts["torn_lines"] == 1 and counts["torn_reward_lines"] == 1
    assert {row["decision_id"]: row["metrics"] for row in rows} == {
        "bom": {"clicks": 1.0},
        "pair \U0001f600": {"clicks": 2.0},
        "escaped": {"clicks": 3.0},
        "plain": {"clicks": 7.0},
    }
