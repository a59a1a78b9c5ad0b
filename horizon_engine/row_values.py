"""The one rule for the values a row may carry, wherever the row comes in.

``horizon serve`` and ``horizon score`` (a request's rows), ``horizon join`` (a decision log's
and a rewards file's rows) and the data sources (``RowShaper`` and ``RowChecker``) all ask
here, so that a value one door lets in is never refused by the next: a row ``serve`` logged is
a row ``horizon run`` trains on.

The rule:

- a string (an id, a feature name, an action name) is valid Unicode: JSON's ``\\ud800`` escape
  makes a lone surrogate that no UTF-8 file can hold, and it would stop whatever writes the
  row next;
- a number is an int or a float (not a bool), finite, and no larger in magnitude than
  ``FLOAT32_MAX``, since training's tensors are float32;
- an integer (a sequence number, a time difference) fits in 64 bits, as Arrow's int64 does;
  a sequence number in 63 (``SEQUENCE_MIN``, ``SEQUENCE_MAX``), so two differ by an int64;
- a logged propensity is at least ``MIN_PROPENSITY`` (float32's smallest normal number);
- a ``ds`` is a date written ``YYYY-MM-DD`` (``is_bad_ds``).

Each check comes as a scalar function on one parsed value, returning a ``ValueProblem`` or
None, and, for the number rule, as Arrow predicates that flag whole columns at once
(``is_non_finite``, ``is_beyond_float32``); for the text rule, ``invalid_text_rows`` finds the
rows of a column read from Parquet (whose writers need not check UTF-8) that break it.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest magnitude training's float32 tensors hold (about 3.4e38): a larger finite value
becomes infinite there, and overflows the statistics normalization computes on the way."""

OUT_OF_RANGE = f"beyond the {FLOAT32_MAX:.2g} in magnitude that training's float32 tensors hold"
"""Why a finite value too large for float32 is a bad value, as a reason says it."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

FLOAT32_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)
"""float32's smallest normal number, 2**-126, about 1.18e-38: below it float32 loses precision
(subnormal) and then rounds to 0, so nothing the network divides by may be smaller."""

MIN_PROPENSITY = FLOAT32_SMALLEST_NORMAL
"""The smallest logged propensity (``action_probability``) a row may carry: float32's smallest
normal number, about 1.18e-38. Training and the estimators hold propensities as float32, where a
smaller positive value is subnormal or rounds to 0 (``5e-324`` reads as 0.0, and the estimators
then refuse the whole eval split), and its reciprocal, the importance weight ``1 / mu``,
overflows float32; at this floor ``1 / mu`` is about 8.5e37, within ``FLOAT32_MAX``. The sources
quarantine a row below it (``propensity_problem``) and the estimators check the same floor."""

SEQUENCE_MIN, SEQUENCE_MAX = -(2**62), 2**62 - 1
"""The sequence numbers a row may carry: 63-bit signed integers, so that any two of one
episode differ by an int64 (the timeline's ``time_diff`` and ``time_since_first`` are such
differences; ``2**63 - 1`` and ``-2**63`` in one episode would wrap around to -1)."""

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: the only way a JSON line's text can make a string that
is not valid Unicode. Lines without one need no deeper look (``json_text_problem``)."""


@dataclass(frozen=True)
class ValueProblem:
    """Why a value breaks the rule: ``kind`` counts it (``wrong_type``, ``bad_value``,
    ``non_finite``, ``out_of_range``, ``bad_text``), ``reason`` says it to a user."""

    kind: str
    reason: str

    def __str__(self) -> str:
        return self.reason


def type_name(value: Any) -> str:
    """A value's type as a reason names it: JSON's ``null`` for None, else Python's name."""
    return "null" if value is None else type(value).__name__


def text_problem(text: str) -> ValueProblem | None:
    """Why a string is not valid Unicode (it holds a lone surrogate), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ValueProblem(
            "bad_text",
            f"a lone surrogate {text[exc.start]!r} at character {exc.start}, not valid Unicode",
        )
    return None


def number_problem(value: Any) -> ValueProblem | None:
    """Why a parsed value is not a number training can hold, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return ValueProblem(
            "wrong_type", f"expected a number, found {shown_value(value)} ({type_name(value)})"
        )
    try:
        magnitude = abs(float(value))
    except OverflowError:
        return ValueProblem("out_of_range", f"found {_shown(value)}, {OUT_OF_RANGE}")
    if not math.isfinite(magnitude):
        return ValueProblem("non_finite", f"expected a finite number, found {value!r}")
    if magnitude > FLOAT32_MAX:
        return ValueProblem("out_of_range", f"found {value!r}, {OUT_OF_RANGE}")
    return None


def integer_problem(value: Any) -> ValueProblem | None:
    """Why a parsed value is not a 64-bit integer, or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        found = f"{shown_value(value)} ({type_name(value)})"
        return ValueProblem("wrong_type", f"expected an integer, found {found}")
    if not INT64_MIN <= value <= INT64_MAX:
        return ValueProblem("bad_value", f"expected a 64-bit integer, found {_shown(value)}")
    return None


SHORT_REPR = reprlib.Repr()
SHORT_REPR.maxlevel, SHORT_REPR.maxlist, SHORT_REPR.maxdict = 3, 4, 4


def shown_value(value: Any) -> str:
    """A parsed value as a reason shows it: ``repr`` for a scalar, a list or map cut to a few
    levels and items (``[[[[...]]]]``), so that one nested thousands deep neither floods the
    reason nor exhausts Python's recursion (``repr`` of a list 1,000 deep raised
    ``RecursionError``: a 500 at ``horizon serve``'s door)."""
    if isinstance(value, list | dict):
        return SHORT_REPR.repr(value)
    return repr(value)


def propensity_problem(value: float) -> ValueProblem | None:
    """Why a logged propensity is not one training and the estimators can use, or None: it
    must lie in [``MIN_PROPENSITY``, 1]."""
    if MIN_PROPENSITY <= value <= 1:
        return None
    if 0 < value < MIN_PROPENSITY:
        return ValueProblem(
            "bad_probability",
            f"'action_probability' is {value!r}, below {MIN_PROPENSITY:.4g}, the smallest "
            "probability float32 holds as a normal number: training and the estimators would "
            "read it as 0 (or divide by it to infinity)",
        )
    return ValueProblem(
        "bad_probability", f"'action_probability' must be in (0, 1], found {value!r}"
    )


def is_unusable_propensity(values: np.ndarray) -> np.ndarray:
    """``propensity_problem``'s rule on a whole column at once: true where a propensity is
    NaN, outside (0, 1], or below ``MIN_PROPENSITY``."""
    return ~((values >= MIN_PROPENSITY) & (values <= 1))


def sequence_problem(value: int) -> ValueProblem | None:
    """Why a (64-bit) sequence number is outside [``SEQUENCE_MIN``, ``SEQUENCE_MAX``], or None."""
    if SEQUENCE_MIN <= value <= SEQUENCE_MAX:
        return None
    return ValueProblem(
        "out_of_range",
        f"'sequence_number' is {value}, outside [-2**62, 2**62 - 1]: two sequence numbers of "
        "an episode must differ by a 64-bit integer (the timeline's time_diff)",
    )


def _shown(value: int) -> str:
    """A huge integer as a reason shows it: its digits, or their count past 40 (Python will
    not even print one of over 4,300 digits)."""
    if value.bit_length() <= 128:
        return str(value)
    return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"


def feature_map_problem(features: Any, what: str = "feature") -> ValueProblem | None:
    """Why a parsed value is not a map of feature ids (valid strings) to numbers, or None;
    ``what`` names an entry in the reason (``state feature``, ``metric``)."""
    if not isinstance(features, Mapping):
        return ValueProblem(
            "wrong_type", f"expected a map of {what} ids to numbers, found {type_name(features)}"
        )
    for key, value in features.items():
        if not isinstance(key, str):
            return ValueProblem("wrong_type", f"{what} id {key!r} is not a string")
        problem = text_problem(key) or number_problem(value)
        if problem is not None:
            return ValueProblem(problem.kind, f"{what} {key!r}: {problem.reason}")
    return None


def json_text_problem(value: Any) -> ValueProblem | None:
    """Why a parsed JSON value holds a string (a key or a value, at any depth) that is not
    valid Unicode, naming where; None if every string is valid.

    Walked with a stack, not by recursion, so a deeply nested value cannot exhaust Python's.
    """
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return ValueProblem("bad_text", f"{where or 'value'}: {problem.reason}")
        elif isinstance(item, Mapping):
            for key, child in item.items():
                problem = text_problem(key)
                if problem is not None:
                    return ValueProblem(
                        "bad_text", f"a field name in {where or 'the row'}: {problem}"
                    )
                pending.append((f"{where}.{key}" if where else f"field '{key}'", child))
        elif isinstance(item, list):
            pending += [(f"{where}[{index}]", child) for index, child in enumerate(item)]
    return None


def line_text_problem(line: str, parsed: Any) -> ValueProblem | None:
    """``json_text_problem`` of a JSON line's parsed value, looked for only where the line's
    text holds a surrogate escape (a cheap search of the text), so valid lines cost nothing."""
    if SURROGATE_ESCAPE.search(line) is None:
        return None
    return json_text_problem(parsed)


def is_non_finite(values: pa.Array) -> pa.Array:
    """Arrow's form of the rule's ``non_finite``: true for NaN and infinities."""
    return pc.invert(pc.is_finite(values))


def is_beyond_float32(values: pa.Array) -> pa.Array:
    """Arrow's form of the rule's ``out_of_range``: true for finite values beyond float32."""
    return pc.greater(pc.abs(values), FLOAT32_MAX)


DS_FORMAT = "%Y-%m-%d"
"""A row's ``ds``, Horizon's (and Hive's) daily partition: a date written ``YYYY-MM-DD``."""


def is_bad_ds(values: pa.Array) -> pa.Array:
    """True where a ``ds`` (a string column) is present but not a real date written
    ``YYYY-MM-DD``: it must read back as itself, so ``2019-02-30`` and ``2019-1-1`` are bad."""
    dates = pc.strptime(values, format=DS_FORMAT, unit="s", error_is_null=True)
    same = pc.fill_null(pc.equal(pc.strftime(dates, format=DS_FORMAT), values), False)
    return pc.and_(pc.is_valid(values), pc.invert(same))


def invalid_text_rows(array: pa.Array) -> set[int]:
    """The rows of a column holding a string (a value, a map key or value, a list item, a
    struct field) that is not valid UTF-8. Arrow checks the whole column at once; rows are
    looked at only if it fails."""
    from horizon_engine.schema import list_entries, map_entries

    try:
        array.validate(full=True)
        return set()
    except pa.ArrowInvalid:
        pass
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        texts = array.cast(pa.binary()).to_pylist()
        return {row for row, text in enumerate(texts) if text is not None and not _utf8(text)}
    if pa.types.is_map(array.type):
        parents, keys, values = map_entries(array)
        entries = invalid_text_rows(keys) | invalid_text_rows(values)
        return {int(parents[entry]) for entry in entries}
    if pa.types.is_list(array.type):
        parents, values = list_entries(array)
        return {int(parents[entry]) for entry in invalid_text_rows(values)}
    if pa.types.is_struct(array.type):
        return set().union(*(invalid_text_rows(field) for field in array.flatten()))
    return set()


def _utf8(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
