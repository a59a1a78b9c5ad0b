"""A request body's JSON, read at ``horizon serve``'s door: whatever it holds, a parsed value or
a ``BodyError`` saying what is wrong and where, never an exception of the parser's own.

Refused: bytes that are not UTF-8 (named by their offset), JSON's ``NaN`` and ``Infinity``
(Python's extension, not JSON), an integer of more than ``MAX_INTEGER_DIGITS`` digits (no value
a row takes is that large; a 400-digit one used to end in a 500 when checked as a float),
nesting deeper than the parser's recursion allows, and a lone UTF-16 surrogate made by a
``\\ud800`` escape (a string no UTF-8 file can hold, which would stop the join or the next
training run that reads the logged row), named by its path in the body: ``rows[0].mdp_id``.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_INTEGER_DIGITS = 40
"""More digits than float32's largest value (39) or a 64-bit integer (19) has."""

SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""The only way JSON text makes a surrogate; bodies without one need no deeper look."""


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


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate_path(payload: Any) -> str | None:
    """Where in ``payload`` (``body``, ``rows[0].mdp_id``, a key ``rows[0].state_features
    key '\\ud800'``) the first string holding a lone surrogate is, or None; walked without
    recursion, so any depth the parser took is safe."""
    pending: list[tuple[Any, str]] = [(payload, "body")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, str):
            if _has_lone_surrogate(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if _has_lone_surrogate(key):
                    return f"{path} key {key!r}"
                name = key if key.isidentifier() else repr(key)
                pending.append((item, name if path == "body" else f"{path}.{name}"))
        elif isinstance(value, list):
            pending += [(item, f"{path}[{index}]") for index, item in enumerate(value)]
    return None
