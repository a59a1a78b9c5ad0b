"""The decision log: every decision a pre-timeline row under a ``decision_id``, in JSONL or in
Parquet part files.

Each row holds ``ds``, ``mdp_id`` (the caller's, or the decision_id for a one-step problem),
``sequence_number``, ``state_features``, ``possible_actions``, ``action``,
``action_probability``, and ``decision_id`` (uuid4 hex), ``model_id`` (the model file's
sha256, 16 hex digits), ``timestamp`` (ISO 8601, UTC) and, from ``horizon serve`` and
``horizon score``, ``policy`` (the policy the action was drawn by, ``ServedPolicy.label``:
``greedy``, ``epsilon_greedy(epsilon=0.1)``, ``softmax(temperature=0.5)``, ``send_drop(...)`` or
``actor``). Readers take all four as the log's own fields (``DECISION_LOG_FIELDS``), outside
the timeline. ``open_decision_log`` picks the form by the path's name.

JSONL (``DecisionLog``): appending is crash-safe in the reader's sense: a batch of records is
encoded whole and given to the operating system in one ``os.write`` on a file opened
``O_APPEND`` (no Python buffer to flush later), so a crash can tear only the last line written.
A log opened on a file whose last line is torn first cuts that line off (logging how many bytes):
it is the line of a request the crash left unanswered, so nothing anybody was told is lost, and
a torn line stays what only a crash in progress leaves, the last line; a last line that is a
whole JSON object missing only its newline gets the newline. ``read_decisions`` skips a line
that is not a whole JSON object and counts it, by line number; ``horizon join`` takes such a
line anywhere but at the end as a bad row.

Parquet (``ParquetDecisionLog``, a path ending ``.parquet``): a folder of part files
``part-<sequence>-<uuid>.parquet``, one per flush, each written under a temporary name
(``.part-....parquet.tmp-PID``), synced and renamed, so a crash leaves no half-written part
(only a temporary file, which readers skip: ``read_decisions`` names it, and
``[source] kind = "parquet"`` reads only names ending ``.parquet``). Rows are gathered in
memory and written as a part when ``rows_per_part`` are gathered or the oldest has waited
``seconds_per_part`` at an append, and at ``flush`` or ``close``: a crash loses the rows
gathered since the last part. Each part's columns have the pre-timeline schema's types (maps
as Arrow maps) and record the row layout, so a decision folder is a ``[source]`` as it is.

Both forms keep the rows of a failed write: once ``append`` is called the rows are the log's,
and a write that fails (no file descriptor left, a full disk) leaves them with it, in order,
for the next ``append``, ``flush`` or ``close`` to write (``pending`` counts them). JSONL keeps
the bytes not yet written, so a retry goes on where a short write ended and never writes a
line twice; Parquet keeps the gathered rows and writes them as the next part.

What a kill (SIGKILL, a power cut) of ``horizon serve`` can lose, which the Operations section
of the README repeats:

- JSONL: nothing it answered. An answer's rows are written (one ``os.write`` into the
  operating system's cache, which a killed process cannot take back) before the answer is
  sent; a kill mid-write tears at most the last line, of a request not yet answered
  (skipped and counted by ``read_decisions``). A power cut can lose what the operating system
  had not yet put on the disk. ``tests/reliability/test_serve_kill.py`` kills a server under
  load and finds every decision_id its clients were answered in the log.
- Parquet: the rows gathered since the last part: at most ``rows_per_part`` rows (10,000) or
  ``seconds_per_part`` (60 s) of decisions, whichever comes first, plus the writer's queue.
  ``horizon serve`` flushes a part after each idle second, so under a steady load the window is
  ``rows_per_part`` rows. Where that window is too wide, serve with a JSONL log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from horizon_engine import MAX_LINE_BYTES, HorizonError, detect_layout

logger = logging.getLogger("horizon.serve")

TAIL_BLOCK_BYTES = 1 << 16
"""Bytes read back at a time while looking for a JSONL log's last newline at opening."""

RANDOM_POOL_BYTES = 1 << 14
"""Bytes drawn from ``os.urandom`` at a time for decision ids: 1,024 of them a system call."""


class RandomPool:
    """Bytes of ``os.urandom`` drawn ``RANDOM_POOL_BYTES`` at a time and handed out once
    each: ``uuid.uuid4`` makes a system call per id, which at batch 1 cost as much as
    encoding the decision's log line. A lock keeps two threads from taking the same bytes,
    and a forked child forgets the parent's (which the parent hands out too)."""

    def __init__(self) -> None:
        self._bytes = b""
        self._taken = 0
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def take(self, size: int) -> bytes:
        with self._lock:
            if self._taken + size > len(self._bytes):
                self._bytes, self._taken = os.urandom(max(size, RANDOM_POOL_BYTES)), 0
            start, self._taken = self._taken, self._taken + size
            return self._bytes[start : self._taken]

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._bytes, self._taken = b"", 0


RANDOM = RandomPool()


def decision_ids(count: int) -> list[str]:
    """``count`` random (version 4) UUIDs as 32 hex digits, what ``uuid.uuid4().hex`` gives,
    from ``RandomPool``'s bytes: the version and variant bits set on all of them at once in
    numpy, then one hex string cut into ids (no integer and no format call per id)."""
    randomness = np.frombuffer(RANDOM.take(16 * count), np.uint8).reshape(count, 16).copy()
    randomness[:, 6] = randomness[:, 6] & 0x0F | 0x40
    randomness[:, 8] = randomness[:, 8] & 0x3F | 0x80
    digits = randomness.tobytes().hex()
    return [digits[start : start + 32] for start in range(0, 32 * count, 32)]


def json_line(record: Mapping[str, Any]) -> bytes:
    """A record as one line of compact JSON (UTF-8, newline-ended): by orjson, or by Python's
    ``json`` for what orjson refuses (an integer beyond 64 bits, which a feature value of up to
    float32's 39 digits may be)."""
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


@dataclass
class _Batch:
    """What every row of a batch of decisions shares, and its columns as the log records them:
    ``decision_rows`` makes dicts of them, ``decision_lines`` JSON lines."""

    ds: str
    timestamp: str
    ids: list[str]
    mdp_ids: list[str]
    sequence_numbers: Sequence[int]
    possible_actions: Sequence[Sequence[Any] | None]
    chances: list[float]
    logs_possible: bool
    """Whether any row has ``possible_actions`` (every row does when ``all_actions`` is given;
    a row without them, among rows with them, has none then)."""


def _batch(
    count: int,
    propensities: Iterable[float],
    possible_actions: Sequence[Sequence[Any] | None] | None,
    all_actions: Sequence[str],
    mdp_ids: Sequence[str | None] | None,
    sequence_numbers: Sequence[int] | None,
    now: datetime | None,
) -> _Batch:
    timestamp = (now or datetime.now(UTC)).isoformat()
    ids = decision_ids(count)
    possible_actions = [None] * count if possible_actions is None else possible_actions
    return _Batch(
        ds=timestamp[:10],  # the date, as strftime("%Y-%m-%d") gives it in a tenth of the time
        timestamp=timestamp,
        ids=ids,
        mdp_ids=(
            ids
            if mdp_ids is None
            else [
                mdp_id if mdp_id is not None else own
                for mdp_id, own in zip(mdp_ids, ids, strict=True)
            ]
        ),
        sequence_numbers=[0] * count if sequence_numbers is None else sequence_numbers,
        possible_actions=possible_actions,
        chances=np.fromiter(propensities, np.float64).tolist(),
        logs_possible=bool(all_actions)
        or any(possible is not None for possible in possible_actions),
    )


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
    policy: str | None = None,
) -> list[dict[str, Any]]:
    """The pre-timeline rows of a batch of decisions (a row without possible actions logs
    ``all_actions``; without those either, as for a continuous action, it has no
    ``possible_actions``); with ``policy`` (``ServedPolicy.label``), each row records the
    policy its action was drawn by, so its ``action_probability`` can be told apart from
    another policy's in a log that several served."""
    batch = _batch(
        len(states), propensities, possible_actions, all_actions, mdp_ids, sequence_numbers, now
    )
    ds, timestamp = batch.ds, batch.timestamp
    columns = (
        batch.mdp_ids,
        batch.sequence_numbers,
        states,
        batch.possible_actions,
        actions,
        batch.chances,
        batch.ids,
    )
    if not batch.logs_possible:
        rows = [  # a continuous action: no possible actions
            {
                "ds": ds,
                "mdp_id": mdp_id,
                "sequence_number": sequence_number,
                "state_features": dict(state),
                "action": action,
                "action_probability": chance,
                "decision_id": decision_id,
                "model_id": model_id,
                "timestamp": timestamp,
            }
            for mdp_id, sequence_number, state, _, action, chance, decision_id in zip(
                *columns, strict=True
            )
        ]
    else:
        rows = [
            {
                "ds": ds,
                "mdp_id": mdp_id,
                "sequence_number": sequence_number,
                "state_features": dict(state),
                "possible_actions": list(all_actions if possible is None else possible),
                "action": action,
                "action_probability": chance,
                "decision_id": decision_id,
                "model_id": model_id,
                "timestamp": timestamp,
            }
            for mdp_id, sequence_number, state, possible, action, chance, decision_id in zip(
                *columns, strict=True
            )
        ]
        if not all_actions:  # a row without them, among rows with them: none logged
            for row, possible in zip(rows, batch.possible_actions, strict=True):
                if possible is None:
                    del row["possible_actions"]
    if policy is not None:
        for row in rows:
            row["policy"] = policy
    return rows


def json_values(values: Sequence[Any]) -> list[bytes]:
    """Each value as compact JSON: by orjson, or, when orjson refuses one (an integer beyond
    64 bits), each by ``json_value``."""
    try:
        return [orjson.dumps(value) for value in values]
    except orjson.JSONEncodeError:
        return [json_value(value) for value in values]


def json_value(value: Any) -> bytes:
    """``value`` as compact JSON: by orjson, or by Python's ``json`` for what orjson refuses."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def json_ids(ids: Sequence[str]) -> list[bytes]:
    """Decision ids (hex digits, which JSON writes as they are) as JSON strings, in three C
    calls."""
    return ('"' + '","'.join(ids) + '"').encode().split(b",") if ids else []


def json_labels(values: Sequence[Any]) -> list[bytes]:
    """Each value as compact JSON, by ``json_values``, but a list of strings (action names)
    with each distinct one encoded once."""
    if not set(map(type, values)) <= {str}:
        return json_values(values)
    encoded = {value: json_value(value) for value in set(values)}
    return list(map(encoded.__getitem__, values))


NUMBER_TYPES = frozenset({int, float, bool, type(None)})


def json_numbers(numbers: Sequence[Any]) -> list[bytes]:
    """Each value as compact JSON, by ``json_values``; a list of numbers (floats, 64-bit
    integers, None) from one orjson call: a number's JSON holds no comma, so the list's JSON
    splits into them."""
    if not numbers or not set(map(type, numbers)) <= NUMBER_TYPES:
        return json_values(numbers)
    try:
        return orjson.dumps(numbers)[1:-1].split(b",")
    except orjson.JSONEncodeError:
        return json_values(numbers)


@dataclass
class DecisionLines:
    """A batch of decisions as the JSONL log's lines (``data``), what ``json_line`` writes of
    each of ``decision_rows``' rows for the same decisions, and what an answer repeats of them:
    the ``ids`` and the ``timestamp``."""

    data: bytes
    ids: list[str]
    timestamp: str

    def __len__(self) -> int:
        return len(self.ids)


def decision_lines(
    states: Sequence[Mapping[str, float]],
    actions: Sequence[Any],
    propensities: Iterable[float],
    model_id: str,
    possible_actions: Sequence[Sequence[Any] | None] | None = None,
    all_actions: Sequence[str] = (),
    mdp_ids: Sequence[str | None] | None = None,
    sequence_numbers: Sequence[int] | None = None,
    now: datetime | None = None,
    policy: str | None = None,
) -> DecisionLines:
    """``decision_rows``' rows (its arguments are the same) as JSONL lines, made without a
    Python dict per row: each row's values that vary (its state, action, mdp_id) encoded
    one by one, the numbers of the whole batch in one orjson call, the fields every row shares
    once, and each line put together by one ``bytes`` formatting. Byte for byte what
    ``json_line`` makes of the rows, but where ``json_line`` writes a whole row by Python's
    ``json`` (a value orjson refuses), here only that value is: the same JSON values in the
    same order, a float perhaps written otherwise (``1e-05`` for ``1e-5``)."""
    batch = _batch(
        len(states), propensities, possible_actions, all_actions, mdp_ids, sequence_numbers, now
    )
    ids = json_ids(batch.ids)
    fields: list[tuple[bytes, bytes | list[bytes]]] = [
        (b'{"ds":', json_value(batch.ds)),
        (b',"mdp_id":', ids if batch.mdp_ids is batch.ids else json_values(batch.mdp_ids)),
        (
            b',"sequence_number":',
            b"0" if sequence_numbers is None else json_numbers(batch.sequence_numbers),
        ),
        (b',"state_features":', json_values(states)),
    ]
    if batch.logs_possible:
        given = [offered for offered in batch.possible_actions if offered is not None]
        if not given and all_actions:
            fields.append((b',"possible_actions":', json_value(list(all_actions))))
        else:
            everyone = (
                b',"possible_actions":%s' % json_value(list(all_actions)) if all_actions else b""
            )
            possible = [
                everyone
                if offered is None
                else b',"possible_actions":%s' % json_value(list(offered))
                for offered in batch.possible_actions
            ]
            fields.append((b"", possible))
    fields += [
        (b',"action":', json_labels(actions)),
        (b',"action_probability":', json_numbers(batch.chances)),
        (b',"decision_id":', ids),
        (b',"model_id":', json_value(model_id)),
        (b',"timestamp":', json_value(batch.timestamp)),
    ]
    if policy is not None:
        fields.append((b',"policy":', json_value(policy)))
    line, columns = _line_template(fields)
    data = b"".join([line % values for values in zip(*columns, strict=True)])
    return DecisionLines(data, batch.ids, batch.timestamp)


def _line_template(
    fields: Sequence[tuple[bytes, bytes | list[bytes]]],
) -> tuple[bytes, list[list[bytes]]]:
    """A line as a ``bytes`` template and the columns of values it takes, from its fields in
    order, each a prefix (``,"action":``) and either its value in every row, written into the
    template (a ``%`` in it escaped), or a column of each row's, a ``%s`` in the template."""
    template = b""
    columns = []
    for prefix, value in fields:
        if isinstance(value, bytes):
            template += (prefix + value).replace(b"%", b"%%")
        else:
            template += prefix.replace(b"%", b"%%") + b"%s"
            columns.append(value)
    return template + b"}\n", columns


def _after_last_newline(fd: int, size: int) -> int | None:
    """The offset just after the last newline of the file's first ``size`` bytes (0: none),
    read back from the end a block at a time; None when none is within ``MAX_LINE_BYTES`` of
    the end (no log line is longer)."""
    end = size
    while end:
        if size - end > MAX_LINE_BYTES:
            return None
        start = max(end - TAIL_BLOCK_BYTES, 0)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _last_line_is_a_row(fd: int, end: int) -> bool:
    """Whether the whole line that ends at ``end`` (just after its newline) is a JSON object."""
    start = _after_last_newline(fd, end - 1)
    return start is not None and _is_a_row(os.pread(fd, end - start, start))


def _is_a_row(line: bytes) -> bool:
    """Whether a line is a JSON object (a log row), or blank."""
    if not line.strip():
        return True
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


class DecisionLog:
    """Appends decision rows to a JSONL file; see the module's docstring for the guarantee."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = 0
        self._unwritten = b""
        self.pending = 0
        """Rows whose lines are not (all) written yet: a failed write's."""
        self.cut_torn_bytes = self._end_last_line()
        """Bytes of a torn last line cut off at opening (0 when the log ended whole)."""

    def _end_last_line(self) -> int:
        """End the file on a whole line: a newline after a last line that is a whole JSON
        object, and a torn last line cut off (its length returned and logged). A file that
        does not end as a decision log does (its last whole line no JSON object, a tail that
        is no JSON object's start, or no line end within ``MAX_LINE_BYTES``: a model or any
        other file named by mistake) is refused untouched, the log closed."""
        size = os.fstat(self._fd).st_size
        start = _after_last_newline(self._fd, size)
        tail = os.pread(self._fd, size - start, start) if start is not None else b""
        before = start is not None and (start == 0 or _last_line_is_a_row(self._fd, start))
        if start is None or not before or (tail and not tail.lstrip().startswith(b"{")):
            self.close()
            raise HorizonError(
                f"{self.path} does not end as a decision log does (one JSON object a line), "
                "and a log is appended to: name a new file or an earlier log; nothing was "
                "written"
            )
        if not tail:
            return 0
        if _is_a_row(tail):
            self._write(b"\n")
            return 0
        os.ftruncate(self._fd, start)
        logger.warning(
            "decision log %s: cut off its torn last line (%d bytes, a request a crash left "
            "unanswered)",
            self.path,
            size - start,
        )
        return size - start

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Write the rows, complete lines, with one system call (after the rows of an earlier
        failed write, which are written first)."""
        lines = [json_line(row) for row in rows]
        self._append(b"".join(lines), len(lines))

    def append_lines(self, lines: DecisionLines) -> None:
        """``append`` of rows already made into their lines (``decision_lines``)."""
        self._append(lines.data, len(lines))

    def _append(self, data: bytes, count: int) -> None:
        if count:
            self._unwritten += data
            self.pending += count
            self.flush()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes a write whole; a short write goes on where it ended
            view = view[os.write(self._fd, view) :]

    def flush(self) -> None:
        """Write what a failed write left (a no-op otherwise: appends go straight to the
        file); a short write keeps the rest for the next try, so no line is written twice."""
        while self._unwritten:
            written = os.write(self._fd, self._unwritten)
            self._unwritten = self._unwritten[written:]
        self.written += self.pending
        self.pending = 0

    def close(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PART_NAME = re.compile(r"part-(\d+)-[0-9a-f]{32}\.parquet")
"""A Parquet decision log's part files; anything else in its folder is not read."""


class ParquetDecisionLog:
    """Gathers decision rows and writes them as Parquet parts of a folder; see the module's
    docstring. ``written`` counts the rows in parts, ``len(gathered)`` those still waiting.
    The default part of 10,000 rows keeps the gathered rows (Python dicts, about a kilobyte
    each) to some ten megabytes."""

    def __init__(
        self, path: str | Path, rows_per_part: int = 10_000, seconds_per_part: float = 60.0
    ) -> None:
        import pyarrow.parquet  # noqa: F401  now: importing it while files run short would fail

        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise HorizonError(
                f"{self.path}: a Parquet decision log is a folder of part files; a file is there"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        self.rows_per_part = rows_per_part
        self.seconds_per_part = seconds_per_part
        sequences = [
            int(match[1]) for match in map(PART_NAME.fullmatch, _names(self.path)) if match
        ]
        self.sequence = max(sequences, default=-1) + 1
        self.gathered: list[Mapping[str, Any]] = []
        self._first_gathered = 0.0
        self.written = 0

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Gather the rows; write a part when enough are gathered or the oldest is old enough."""
        if not self.gathered:
            self._first_gathered = time.monotonic()
        self.gathered.extend(rows)
        if len(self.gathered) >= self.rows_per_part or (
            self.gathered and time.monotonic() - self._first_gathered >= self.seconds_per_part
        ):
            self.flush()

    def flush(self) -> None:
        """Write the gathered rows as one part: a temporary file, synced, then renamed."""
        if not self.gathered:
            return
        import pyarrow.parquet as pq

        table = decision_table(self.gathered, str(self.path))
        name = f"part-{self.sequence:08d}-{uuid.uuid4().hex}.parquet"
        temporary = self.path / f".{name}.tmp-{os.getpid()}"
        try:
            with open(temporary, "wb") as handle:
                pq.write_table(table, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path / name)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self.written += len(self.gathered)
        self.sequence += 1
        self.gathered = []

    @property
    def pending(self) -> int:
        """Rows gathered and not yet in a part."""
        return len(self.gathered)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> ParquetDecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_decision_log(path: str | Path) -> DecisionLog | ParquetDecisionLog:
    """The decision log at ``path``: Parquet parts when its name ends ``.parquet``, else JSONL."""
    return ParquetDecisionLog(path) if str(path).endswith(".parquet") else DecisionLog(path)


def decision_table(rows: Sequence[Mapping[str, Any]], where: str) -> Any:
    """Decision rows as an Arrow table: the pre-timeline schema's type for each column the rows
    have (their layout told by the first row, as ``[source]`` tells it) and strings for the
    log's own ``decision_id``, ``model_id`` and ``timestamp``."""
    import pyarrow as pa

    layout = detect_layout(rows[0], "pre_timeline", "auto")
    types = {column.name: column.type for column in layout.columns}
    schema = pa.schema(
        [pa.field(name, types.get(name, pa.string())) for name in rows[0]],
        metadata=layout.metadata,
    )
    try:
        return pa.Table.from_pylist(list(rows), schema=schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise HorizonError(f"{where}: decision rows that do not fit {layout} ({exc})") from None


@dataclass
class DecisionLogContents:
    """The whole rows of a decision log, the line numbers (from 1) of a JSONL log's torn lines,
    and the names of the files in a Parquet log's folder that are not parts (a temporary part
    a crash left behind)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    torn_lines: list[int] = field(default_factory=list)
    ignored_files: list[str] = field(default_factory=list)


def read_decisions(path: str | Path) -> DecisionLogContents:
    """Every whole row of a decision log, JSONL or a Parquet folder (parts in sequence order);
    a JSONL line that is not a whole JSON object (what a crash mid-write leaves) is skipped and
    counted, and so is a file in a Parquet folder that is not a part."""
    path = Path(path)
    if path.is_dir():
        return _read_parts(path)
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


def _names(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir())


def _read_parts(folder: Path) -> DecisionLogContents:
    import pyarrow as pa
    import pyarrow.parquet as pq

    contents = DecisionLogContents()
    parts = []
    for name in _names(folder):
        match = PART_NAME.fullmatch(name)
        if match:
            parts.append((int(match[1]), name))
        else:
            contents.ignored_files.append(name)
    for _, name in sorted(parts):
        try:
            table = pq.read_table(folder / name)
        except (OSError, pa.ArrowException) as exc:
            raise HorizonError(f"{folder / name}: not a readable Parquet part ({exc})") from None
        contents.rows += table.to_pylist(maps_as_pydicts="strict")
    return contents
