"""Property-based tests of ``horizon join``'s local engine on hostile decision logs and rewards:
torn and malformed lines, lone surrogates, metrics that are NaN, infinite, beyond float32 or not
numbers, sums that overflow, timestamps in nanoseconds or without a zone.

Every example ends in a joined file or a ``HorizonError``, never another exception; every line
is accounted for in the report (a good row, a torn line or a bad row); and every joined line is
a row the next ``horizon run`` can take: valid JSON (no ``inf``), valid Unicode, and metrics
that training's float32 holds. ``join_local`` is called directly on temporary files.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horizon_engine import FLOAT32_MAX, parse_json_line
from horizon_engine.errors import HorizonError
from horizon_plugins_serving.join import join_local

pytestmark = pytest.mark.fuzz

IDS = st.one_of(st.sampled_from(["a", "b", "c", "\ud800", "\U0001f600", ""]), st.text(max_size=3))
STAMPS = st.sampled_from(
    [
        "2026-12-01T12:00:00Z",
        "2026-12-01T13:00:00.123456789+02:00",
        "2026-12-01T12:30:00.5+00:00",
        "2026-12-03T12:00:01Z",
        "2026-12-01T12:00:00",
        "yesterday",
    ]
)
METRIC_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([3e38, -3e38, 1e39, 10**400, 1, "1", True, None]),
)


def decision(decision_id: str, stamp: str) -> dict[str, Any]:
    return {
        "mdp_id": decision_id,
        "sequence_number": 0,
        "state_features": {"0": 0.5},
        "action": "0",
        "action_probability": 0.5,
        "decision_id": decision_id,
        "timestamp": stamp,
    }


DECISION_LINES = st.one_of(
    st.builds(decision, IDS, STAMPS).map(lambda row: json.dumps(row).encode()),
    st.sampled_from([b"{not json", b"\xff\xfe", b"[" * 3000, b'{"decision_id": 7}', b"{}"]),
)
REWARD_LINES = st.one_of(
    st.fixed_dictionaries(
        {
            "decision_id": IDS,
            "timestamp": STAMPS,
            "metrics": st.dictionaries(st.sampled_from(["clicks", "\udc00"]), METRIC_VALUES),
        }
    ).map(lambda row: json.dumps(row).encode()),
    st.sampled_from([b"{not json", b"\xff", b'{"decision_id": "a"}', b"[1]"]),
)


def write_lines(path: Path, lines: list[bytes], torn: bool) -> int:
    """Write the lines (the last without its end when ``torn``); the count of non-blank ones."""
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(data[:-1] if torn and data else data)
    return sum(1 for line in lines if line.strip())


@given(
    decisions=st.lists(DECISION_LINES, max_size=8),
    rewards=st.lists(REWARD_LINES, max_size=8),
    torn_decisions=st.booleans(),
    torn_rewards=st.booleans(),
    skip=st.booleans(),
    defaults=st.sampled_from([None, {"reward": 0.0}]),
)
def test_join_on_hostile_rows(decisions, rewards, torn_decisions, torn_rewards, skip, defaults):
    with tempfile.TemporaryDirectory() as folder:
        decision_path, reward_path = Path(folder) / "d.jsonl", Path(folder) / "r.jsonl"
        decision_lines = write_lines(decision_path, decisions, torn_decisions)
        reward_lines = write_lines(reward_path, rewards, torn_rewards)
        output = Path(folder) / "joined.jsonl"
        try:
            report = join_local(decision_path, reward_path, output, 3600 * 48, defaults, skip)
        except HorizonError as exc:
            assert not skip  # with --skip-bad-rows every bad row is counted instead
            assert str(exc).startswith((str(decision_path), str(reward_path), "decision "))
            assert not output.exists()
            return
        assert report.decision_rows + report.torn_lines + report.bad_decision_rows == decision_lines
        assert (
            report.reward_rows + report.bad_reward_rows + report.torn_reward_lines == reward_lines
        )
        assert report.decisions == report.rewarded + report.defaulted + report.dropped
        assert report.decision_rows == report.decisions + report.duplicate_decisions
        joined = output.read_bytes().splitlines()
        assert len(joined) == report.written
        assert report.written == report.decisions - report.dropped
        for line in joined:
            row = parse_json_line(line)  # valid UTF-8, valid Unicode, no inf or NaN
            for value in row["metrics"].values():
                assert abs(value) <= FLOAT32_MAX
