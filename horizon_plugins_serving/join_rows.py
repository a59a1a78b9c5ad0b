"""``horizon join``'s checks of its input rows: what is wrong with a decision's or a reward's
decision_id, metrics or timestamp, worded as the report names a bad row.

The local engine's readers (``join_readers``) and the Spark engine (``join_spark``) share these
checks, so that both word a bad row alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from horizon_engine import BadLine, HorizonError, number_problem, parse_json_line

if TYPE_CHECKING:
    import pyarrow as pa


def bad_key(row: Any) -> str | None:
    """What is wrong with a row's ``decision_id`` or ``timestamp`` (its text), or None."""
    if not isinstance(row, dict):
        return f"expected a JSON object, found {type(row).__name__}"
    decision_id = row.get("decision_id")
    if not isinstance(decision_id, str) or not decision_id:
        return f"decision_id is {decision_id!r}, expected a non-empty string"
    if not isinstance(row.get("timestamp"), str):
        return f"timestamp is {row.get('timestamp')!r}, expected an ISO 8601 string"
    return None


MISSING_ID = "decision_id is missing or empty, expected a non-empty string"
"""Why a Parquet row without a decision_id is a bad row."""

JOINED_ALREADY = "has metrics already (a joined row?); the join writes a decision's metrics"
"""Why a decision row with metrics is a bad row."""


def decision_problem(row: Any) -> str | None:
    """What is wrong with a decision row's key, or a metrics field it must not have yet."""
    problem = bad_key(row)
    if problem is None and row.get("metrics") is not None:
        return JOINED_ALREADY
    return problem


def reward_problem(row: Any) -> str | None:
    """What is wrong with a reward row's decision_id or metrics (not its timestamp's text)."""
    return bad_key(row) or bad_metrics(row.get("metrics"))


def parse_timestamp(text: str) -> Any:
    """An ISO 8601 text with a zone as a UTC timestamp scalar, in microseconds.

    A text with more digits than microseconds (nanoseconds, as Java's and Go's clocks write)
    is read as nanoseconds and its digits past the microsecond are dropped: the instant is
    truncated to the microsecond, as the decision log keeps it. Raises Arrow's error for a
    text that is not ISO 8601 with a zone.
    """
    import pyarrow as pa

    micros = pa.timestamp("us", tz="UTC")
    scalar = pa.scalar(text, pa.string())
    try:
        return scalar.cast(micros)
    except pa.ArrowInvalid:
        return scalar.cast(pa.timestamp("ns", tz="UTC")).cast(micros, safe=False)


def timestamp_problem(text: Any) -> str | None:
    """Why a timestamp is not ISO 8601 text with a zone, or None."""
    import pyarrow as pa

    if not isinstance(text, str):
        return f"timestamp is {text!r}, expected an ISO 8601 string"
    try:
        parse_timestamp(text)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return f"timestamp {text!r} is not ISO 8601 with a zone (e.g. 2026-12-01T10:00:00Z)"
    return None


def line_problem(text: str | bytes, check: Callable[[Any], str | None]) -> str | None:
    """What is wrong with a JSON line, as ``check`` and ``timestamp_problem`` word it."""
    try:
        row = parse_json_line(text)
    except BadLine as exc:
        return f"not JSON ({exc})"
    return check(row) or timestamp_problem(row["timestamp"])


def decision_line_problem(line: bytes) -> str | None:
    """What is wrong with a decision line that is not the log's torn last line, as the local
    engine's reader words it: text that is not JSON as ``not JSON (...)``, a line that is
    JSON but not one the next run can take (not UTF-8, a lone surrogate, too deep) by the
    parser's reason alone."""
    try:
        row = parse_json_line(line)
    except BadLine as exc:
        return bad_line_reason(exc)
    return decision_problem(row) or timestamp_problem(row["timestamp"])


def bad_line_reason(exc: BadLine) -> str:
    """Why a decision line the parser refused is a bad row (it is not the torn last line)."""
    return f"not JSON ({exc.reason})" if exc.kind == "invalid_json" else exc.reason


def torn_line(line: bytes, problem: BadLine | None) -> bool:
    """Whether a decision line is torn, counted rather than bad: only the log's last line
    can be cut by a crash mid-write, and it is the only line without a newline. One there
    that the parser refuses (``problem``) for more than its JSON (not UTF-8, a lone
    surrogate, too deep) is still a bad row, as anywhere.
    A line cut short elsewhere (a file damaged or joined by hand: ``horizon serve``'s log,
    reopened after a crash, first cuts off its torn last line) is a bad row: named, or
    skipped with ``--skip-bad-rows``."""
    at_end = not line.endswith(b"\n")
    return at_end and (problem is None or problem.kind == "invalid_json")


def bad_metrics(metrics: Any) -> str | None:
    """What is wrong with a reward row's ``metrics``, or None: each value follows the rule
    of every row's values (``horizon_engine.number_problem``), so that the joined row is one
    the next ``horizon run`` takes."""
    if not isinstance(metrics, dict):
        return f"metrics is {metrics!r}, expected a map of metric names to numbers"
    for name, value in metrics.items():
        problem = number_problem(value)
        if problem is not None:
            return f"metric {name!r}: {problem}"
    return None


def parse_timestamps(texts: pa.Array, where: str) -> tuple[pa.Array, dict[int, str]]:
    """ISO 8601 strings (or timestamps) as UTC microseconds, and why each bad one (null in the
    result) is bad, by index.

    A timestamp must say its zone (``Z`` or ``+00:00``, as the decision log writes): without
    one the instant it names depends on where it was written. A whole chunk is parsed at once;
    a chunk that fails is parsed again row by row, to name the bad rows.
    """
    import pyarrow as pa

    target = pa.timestamp("us", tz="UTC")
    if pa.types.is_timestamp(texts.type):
        if texts.type.tz is None:
            raise HorizonError(f"{where}: the timestamp column has no time zone")
        parsed = texts.cast(target)
        missing = parsed.is_null().to_numpy(zero_copy_only=False).nonzero()[0]
        return parsed, dict.fromkeys(missing.tolist(), timestamp_problem(None))
    parsed = None
    for parse in (
        lambda: texts.cast(target),
        lambda: texts.cast(pa.timestamp("ns", tz="UTC")).cast(target, safe=False),
    ):
        try:
            parsed = parse()
            break
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            continue
    if parsed is not None and parsed.null_count == texts.null_count == 0:
        return parsed, {}
    values, problems = [], {}
    for index, text in enumerate(texts.to_pylist()):
        problem = timestamp_problem(text)
        if problem is not None:
            problems[index] = problem
        values.append(None if problem else parse_timestamp(text).as_py())
    return pa.array(values, target), problems
