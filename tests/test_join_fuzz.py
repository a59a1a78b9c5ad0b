"""Property-based tests of ``horizon join``'s local engine on hostile decision logs and rewards:
torn and malformed lines, lone surrogates, metrics that are NaN, infinite, beyond float32 or not
numbers, sums that overflow, timestamps in nanoseconds or without a zone; and of its command
line on an output path spelt to name an input (issue 33).

Every example ends in a joined file or a ``HorizonError``, never another exception; every line
is accounted for in the report (a good row, a torn line or a bad row); and every joined line is
a row the next ``horizon run`` can take: valid JSON (no ``inf``), valid Unicode, and metrics
that training's float32 holds. ``join_local`` is called directly on temporary files.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from horizon_engine import FLOAT32_MAX, parse_json_line
from horizon_engine.cli import main
from horizon_engine.errors import HorizonError
from horizon_plugins_serving.decision_log import ParquetDecisionLog
from horizon_plugins_serving.join import join_local
from tests import test_join

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
        # Only the last line, without its newline, is torn; a line elsewhere is a bad row.
        assert report.torn_lines <= torn_decisions and report.torn_reward_lines <= torn_rewards
        assert report.decisions == report.rewarded + report.defaulted + report.dropped
        assert report.decision_rows == report.decisions + report.duplicate_decisions
        joined = output.read_bytes().splitlines()
        assert len(joined) == report.written
        assert report.written == report.decisions - report.dropped
        for line in joined:
            row = parse_json_line(line)  # valid UTF-8, valid Unicode, no inf or NaN
            for value in row["metrics"].values():
                assert abs(value) <= FLOAT32_MAX


# --- issue 33: the command line's paths ---------------------------------------------------------

PREFIXES = st.lists(st.sampled_from(["./", "sub/../", "sub/deeper/../../", "linked/"]), max_size=4)
"""Ways into the folder the inputs lie in: ``.``, detours through ``..``, a link to it."""


def snapshot(folder: Path) -> dict[str, bytes | str | None]:
    """Every entry under ``folder``: a file's bytes, a link's target, None for a folder."""
    entries: dict[str, bytes | str | None] = {}
    for entry in sorted(folder.rglob("*")):
        name = str(entry.relative_to(folder))
        if entry.is_symlink():
            entries[name] = str(entry.readlink())
        else:
            entries[name] = None if entry.is_dir() else entry.read_bytes()
    return entries


def joined_inputs(root: Path, parquet_log: bool) -> tuple[str, str]:
    """A decision log (JSONL, or a Parquet folder as ``horizon serve`` writes it) and rewards
    under ``root``, with the folders and the link the spellings go through; their names."""
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "linked").symlink_to(root, target_is_directory=True)
    test_join.write_jsonl(root / "rew.jsonl", [test_join.reward("a", 1.0, clicks=1)])
    logged = [test_join.decision("a"), test_join.decision("b")]
    if not parquet_log:
        test_join.write_jsonl(root / "dec.jsonl", logged)
        return "dec.jsonl", "rew.jsonl"
    with ParquetDecisionLog(root / "dec.parquet") as log:
        log.append(logged)
    return "dec.parquet", "rew.jsonl"


@given(
    parquet_log=st.booleans(),
    target=st.sampled_from(["decisions", "rewards", "report", "inside"]),
    link=st.sampled_from([None, "symlink", "hardlink"]),
    prefixes=PREFIXES,
    absolute=st.booleans(),
    parquet_output=st.booleans(),
)
def test_an_output_spelt_to_name_an_input_is_refused_and_changes_nothing(
    parquet_log, target, link, prefixes, absolute, parquet_output
):
    """Whatever spelling of ``-o`` names an input (relative, ``./``, through ``..``, a linked
    folder, absolute, a symlink or a hard link to the file), or puts the output or its report
    on one or inside a Parquet log's folder: the join is refused with one ``error:`` line
    naming both, and every byte under the folder is as it was (no temporary file either)."""
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        root = Path(folder).resolve()
        decisions, rewards = joined_inputs(root, parquet_log)
        suffix = ".parquet" if parquet_output else ".jsonl"
        if target == "report":  # the report beside -o out is _out.report.json: the rewards
            name = f"out{suffix}"
            rewards = f"_{name}.report.json"
            (root / "rew.jsonl").rename(root / rewards)
            named = rewards
        elif target == "inside" and parquet_log:  # written into the log's folder
            name, named = f"{decisions}/out{suffix}", decisions
        else:
            name = named = rewards if target == "rewards" else decisions
            if link is not None and (root / name).is_file():
                alias = f"sub/alias{suffix}"
                if link == "symlink":
                    (root / alias).symlink_to(root / name)
                else:
                    (root / alias).hardlink_to(root / name)
                name = alias
        spelt = "".join(prefixes) + name
        if absolute:
            spelt = str(root / spelt)
        before = snapshot(root)
        result = CliRunner().invoke(
            main, ["join", decisions, rewards, "-o", spelt, "--window", "48h"]
        )
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit)  # an error line, not a traceback
        assert result.output.startswith("error: ") and result.output.count("\n") == 1
        assert str(Path(spelt)) in result.output and f" {named}" in result.output
        assert snapshot(root) == before
