"""The decision log: one JSON line per decision, a pre-timeline row under a ``decision_id``.

Each row holds ``ds``, ``mdp_id`` (the caller's, or the decision_id for a one-step problem),
``sequence_number``, ``state_features``, ``possible_actions``, ``action``,
``action_probability``, and ``decision_id`` (uuid4 hex), ``model_id`` (the model file's
sha256, 16 hex digits) and ``timestamp`` (ISO 8601, UTC).

Appending is crash-safe in the reader's sense: a batch of records is encoded whole and given
to the operating system in one ``os.write`` on a file opened ``O_APPEND`` (no Python buffer
to flush later), so a crash can tear only the last line written. A log opened on a file whose
last line is torn starts with a newline, so the torn line stays a line of its own;
``read_decisions`` skips every line that is not a whole JSON object and counts it, by line
number.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def decision_rows(
    states: Sequence[Mapping[str, float]],
    actions: Sequence[Any],
    propensities: Iterable[float],
    model_id: str,
    possible_actions: Sequence[Sequence[str] | None] | None = None,
    all_actions: Sequence[str] = (),
    mdp_ids: Sequence[str | None] | None = None,
    sequence_numbers: Sequence[int] | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """The pre-timeline rows of a batch of decisions (a row without possible actions logs
    ``all_actions``; without those either, as for a continuous action, it has no
    ``possible_actions``)."""
    now = now or datetime.now(UTC)
    ds, timestamp = now.strftime("%Y-%m-%d"), now.isoformat()
    rows = []
    for row, (state, action, propensity) in enumerate(
        zip(states, actions, propensities, strict=True)
    ):
        decision_id = uuid.uuid4().hex
        possible = possible_actions[row] if possible_actions is not None else None
        mdp_id = mdp_ids[row] if mdp_ids is not None else None
        record = {
            "ds": ds,
            "mdp_id": mdp_id if mdp_id is not None else decision_id,
            "sequence_number": sequence_numbers[row] if sequence_numbers is not None else 0,
            "state_features": dict(state),
            "possible_actions": list(possible if possible is not None else all_actions),
            "action": action,
            "action_probability": float(propensity),
            "decision_id": decision_id,
            "model_id": model_id,
            "timestamp": timestamp,
        }
        if possible is None and not all_actions:  # a continuous action: no possible actions
            del record["possible_actions"]
        rows.append(record)
    return rows


class DecisionLog:
    """Appends decision rows to a JSONL file; see the module's docstring for the guarantee."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = 0
        size = os.fstat(self._fd).st_size
        if size:
            with open(self.path, "rb") as handle:
                handle.seek(size - 1)
                if handle.read(1) != b"\n":
                    self._write(b"\n")

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Write the rows, complete lines, with one system call."""
        lines = [json.dumps(row, separators=(",", ":")) + "\n" for row in rows]
        if lines:
            self._write("".join(lines).encode("utf-8"))
            self.written += len(lines)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes a write whole; a short write goes on where it ended
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class DecisionLogContents:
    """The whole rows of a decision log and the line numbers (from 1) of the torn ones."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    torn_lines: list[int] = field(default_factory=list)


def read_decisions(path: str | Path) -> DecisionLogContents:
    """Every whole row of a decision log; a line that is not a whole JSON object (what a crash
    mid-write leaves) is skipped and counted."""
    contents = DecisionLogContents()
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict) and line.endswith(b"\n"):
                contents.rows.append(row)
            else:
                contents.torn_lines.append(number)
    return contents
