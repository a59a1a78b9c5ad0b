"""A request body's JSON, read at ``horizon serve``'s door: whatever it holds, a parsed value or
a ``BodyError`` saying what is wrong and where, never an exception of the parser's own.

Refused: bytes that are not UTF-8 (named by their offset), JSON's ``NaN`` and ``Infinity``
(Python's extension, not JSON), an integer of more than ``MAX_INTEGER_DIGITS`` digits (no value
a row takes is that large; a 400-digit one used to end in a 500 when checked as a float),
nesting deeper than the parser's recursion allows, and a lone UTF-16 surrogate made by a
``\\ud800`` escape (a string no UTF-8 file can hold, which would stop the join or the next
training run that reads the logged row), named by its path in the body: ``rows[0].mdp_id``.

Two readers: orjson first, which takes a well-formed body in about a microsecond and refuses
everything above but huge integers (it reads an integer beyond 64 bits as a float); then, for
a body orjson refuses or one with an integer of 19 digits (``LONG_DIGITS``), Python's ``json``
with the checks above, which says what is wrong and where, or reads it (an integer of 20 to 40
digits, a number too large for a double, which the row check then refuses by name).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from horizon_engine import text_problem

MAX_INTEGER_DIGITS = 40
"""More digits than float32's largest value (39) or a 64-bit integer (19) has."""

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""The only way JSON text makes a surrogate; bodies without one need no deeper look."""

LONG_DIGITS = re.compile(rb"(?<![.\d])\d{19}(?![.eE])")
"""An integer of 19 digits or more (a run of digits not after a decimal point, nor before one
or an exponent): orjson reads one below -2**63 or above 2**64 - 1 as a float, so the body
goes to the exact reader. A float's long fraction does not count."""

DIGITS_AS_ZEROS = bytes(
    ord("0") if byte in b"0123456789" else byte if byte == ord(".") else ord(" ")
    for byte in range(256)
)
"""A translation that keeps a body's digits (as zeros) and decimal points, and makes every
other byte a space."""
START_OF_LONG_RUN = b" " + b"0" * 19
"""What ``LONG_DIGITS`` needs, in a body so translated (after one more space, for a run at the
start): 19 digits after neither a digit nor a decimal point. A translation and a substring
search, both in C at a byte's cost, find it; only a body that has it goes to the regular
expression, which, tried at every digit of a body of floats, took as long as the rest of
reading a 64-row request."""


def _has_long_integer(body: bytes) -> bool:
    """Whether ``body`` holds what ``LONG_DIGITS`` matches."""
    translated = b" " + body.translate(DIGITS_AS_ZEROS)
    return START_OF_LONG_RUN in translated and LONG_DIGITS.search(body) is not None


class BodyError(ValueError):
    """A request body that is not the JSON ``horizon serve`` reads; the message says why."""


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INTEGER_DIGITS:
        raise BodyError(
            f"body has an integer of {digits} digits; no value takes more than {MAX_INTEGER_DIGITS}"
        )
    return int(text)


def _constant(name: str) -> Any:
    raise BodyError(f"body has {name}, which is not a JSON number")


def decode_body(body: bytes) -> Any:
    """The JSON value of ``body``, or a ``BodyError`` naming what is wrong and where."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _decode_exactly(body)
    if _has_long_integer(body):
        return _decode_exactly(body)
    return payload


def _decode_exactly(body: bytes) -> Any:
    """``decode_body`` by Python's ``json``: the reason for a body orjson refuses, or the value
    of one it would read differently."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            f"body is not UTF-8: byte {exc.start} is {body[exc.start : exc.start + 1]!r}"
        ) from None
    try:
        payload = json.loads(text, parse_int=_integer, parse_constant=_constant)
    except BodyError:
        raise
    except RecursionError:
        raise BodyError("body is nested too deep to read") from None
    except ValueError as exc:  # json.JSONDecodeError names the line and column
        raise BodyError(f"body is not JSON ({exc})") from None
    if SURROGATE_ESCAPE.search(text):
        where = lone_surrogate_path(payload)
        if where is not None:
            raise BodyError(
                f"body has a lone surrogate escape (\\ud800 to \\udfff) in {where}: "
                "strings must be valid Unicode"
            )
    return payload


def lone_surrogate_path(payload: Any) -> str | None:
    """Where in ``payload`` (``body``, ``rows[0].mdp_id``, a key ``rows[0].state_features
    key '\\ud800'``) the first string holding a lone surrogate is, or None; walked without
    recursion, so any depth the parser took is safe."""
    pending: list[tuple[Any, str]] = [(payload, "body")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, str):
            if text_problem(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if text_problem(key):
                    return f"{path} key {key!r}"
                name = key if key.isidentifier() else repr(key)
                pending.append((item, name if path == "body" else f"{path}.{name}"))
        elif isinstance(value, list):
            pending += [(item, f"{path}[{index}]") for index, item in enumerate(value)]
    return None
