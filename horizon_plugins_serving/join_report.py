"""What ``horizon join`` counts, and how it treats a bad input row.

``JoinReport`` is printed as the join's summary and written as ``_JOINED.report.json``;
``BadRows`` fails the join at the first bad row, or with ``--skip-bad-rows`` counts and skips
each. The local engine (``join``) and the Spark engine (``join_spark``) fill the same report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from horizon_engine import HorizonError

SHOWN = 5
"""How many example ids, lines or rows the report names for each kind of count."""

NAMED_BAD_ROWS = 2 * SHOWN
"""How many skipped bad rows the report names (``JoinReport.bad_rows``)."""


@dataclass
class JoinReport:
    """What the join did, counted: printed as a summary and written as _JOINED.report.json."""

    engine: str
    window_seconds: float
    default_metrics: dict[str, float] | None
    decision_rows: int = 0
    """Good whole rows in the decision log, repeated decision_ids included."""
    torn_lines: int = 0
    torn_line_numbers: list[int] = field(default_factory=list)
    ignored_files: list[str] = field(default_factory=list)
    """Files in a Parquet log's folder that are not parts (a temporary part a crash left)."""
    duplicate_decisions: int = 0
    """Rows whose decision_id an earlier row had: left out, the first row kept."""
    duplicate_ids: list[str] = field(default_factory=list)
    decisions: int = 0
    """Distinct decisions: rewarded + defaulted + dropped."""
    rewarded: int = 0
    defaulted: int = 0
    dropped: int = 0
    written: int = 0
    reward_rows: int = 0
    """Good reward rows: attached + late + early + unknown."""
    torn_reward_lines: int = 0
    """A rewards file's last line torn by a crash mid-write (no newline, not JSON): skipped."""
    rewards_attached: int = 0
    late_rewards: int = 0
    early_rewards: int = 0
    unknown_rewards: int = 0
    unknown_ids: list[str] = field(default_factory=list)
    bad_decision_rows: int = 0
    bad_reward_rows: int = 0
    bad_rows: list[str] = field(default_factory=list)
    """The first bad rows skipped (``--skip-bad-rows``), each as ``file:line: reason``."""

    def summary(self, output: Path) -> str:
        unrewarded = (
            f"dropped {self.dropped} without a reward"
            if self.default_metrics is None
            else f"defaulted {self.defaulted} to {self.default_metrics}"
        )
        lines = [
            f"joined {self.decisions} decisions: {self.rewarded} rewarded, {unrewarded}; "
            f"wrote {self.written} rows to {output}",
            f"reward rows: {self.reward_rows} ({self.rewards_attached} attached, "
            f"{self.late_rewards} late, {self.early_rewards} before their decision, "
            f"{self.unknown_rewards} for unknown decision_ids{_examples(self.unknown_ids)})",
        ]
        if self.duplicate_decisions:
            lines.append(
                f"{self.duplicate_decisions} repeated decision_id rows left out, the first "
                f"row of each kept{_examples(self.duplicate_ids)}"
            )
        if self.torn_lines:
            lines.append(
                f"{self.torn_lines} torn decision-log lines skipped"
                f"{_examples(list(map(str, self.torn_line_numbers)))}"
            )
        if self.torn_reward_lines:
            lines.append(f"{self.torn_reward_lines} torn last line of the rewards skipped")
        if self.ignored_files:
            lines.append(
                f"{len(self.ignored_files)} files in the decision log's folder are not parts "
                f"and were not read{_examples(self.ignored_files[:SHOWN])}"
            )
        if self.bad_decision_rows or self.bad_reward_rows:
            lines.append(
                f"skipped {self.bad_decision_rows} bad decision rows and "
                f"{self.bad_reward_rows} bad reward rows:"
            )
            lines += [f"  {bad}" for bad in self.bad_rows]
        return "\n".join(lines)


def _examples(items: Sequence[str]) -> str:
    return f", e.g. {', '.join(items)}" if items else ""


REPORT_KEYS = frozenset({"engine", "window_seconds", "decision_rows", "written"})
"""Fields every join's report holds, by which a new join knows one it may replace."""

MAX_REPORT_BYTES = 64 * 2**20
"""A join's report names at most a few dozen ids and rows: a larger file is not one."""


def is_join_report(path: Path) -> bool:
    """Whether ``path`` is a report an earlier join wrote (a file holding a JSON object with
    ``REPORT_KEYS`` and an engine's name), which the next join writing beside the same output
    replaces; anything else there is a user's, and the join refuses rather than overwrite it."""
    import json

    if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_REPORT_BYTES:
        return False
    try:
        fields = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(fields, dict)
        and fields.keys() >= REPORT_KEYS
        and fields["engine"] in ("local", "spark")
    )


def report_path(output: Path) -> Path:
    """Where the report of a join writing ``output`` goes: ``_JOINED.report.json`` beside it,
    its name starting with ``_`` so that a folder of joined files read as a ``[source]`` (or
    by Spark or Arrow) leaves it out."""
    return output.with_name(f"_{output.name}.report.json")


class BadRows:
    """Bad input rows: the first fails the join, or with ``skip`` each is counted and skipped.

    A chunk's rows are checked in two steps (each line, then the chunk's timestamps at once),
    so what is found waits for ``flush`` at the chunk's end and is then taken in file order:
    the first bad row named is the first in the file.
    """

    def __init__(self, skip: bool, report: JoinReport) -> None:
        self.skip, self.report = skip, report
        self._pending: list[tuple[int, str, str, str]] = []

    def found(self, location: str, reason: str, kind: str, order: int) -> None:
        """A bad row at ``location``; ``order`` places it in its file (line or row number)."""
        self._pending.append((order, location, reason, kind))

    def flush(self) -> None:
        pending, self._pending = sorted(self._pending), []
        for _, location, reason, kind in pending:
            self._record(location, reason, kind)

    def _record(self, location: str, reason: str, kind: str) -> None:
        if not self.skip:
            raise HorizonError(f"{location}: {reason} (--skip-bad-rows counts and skips such rows)")
        if kind == "decision":
            self.report.bad_decision_rows += 1
        else:
            self.report.bad_reward_rows += 1
        if len(self.report.bad_rows) < NAMED_BAD_ROWS:
            self.report.bad_rows.append(f"{location}: {reason}")

    def add_rewards(self, counted: JoinReport) -> None:
        """Counts after those found so far the bad and torn reward rows ``counted`` holds
        (found apart, on the thread that read the rewards while the log was read): as if
        they had been found in turn."""
        self.report.bad_reward_rows += counted.bad_reward_rows
        self.report.torn_reward_lines += counted.torn_reward_lines
        room = NAMED_BAD_ROWS - len(self.report.bad_rows)
        self.report.bad_rows += counted.bad_rows[:room]
