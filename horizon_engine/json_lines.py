"""One JSON line, as every reader of logged rows parses it: a bad line is a ``BadLine`` with a
kind and a reason that names the place in the line, never an exception of Python's.

The JSONL source, ``horizon score`` and ``horizon join`` read their lines here, so that a line
one of them takes is a line the others take too. What makes a line bad:

- bytes that are not UTF-8 (``not_utf8``, naming the first bad byte and its column): a file's
  lines are decoded one by one, so one bad byte costs its line and not the file;
- text that is not JSON (``invalid_json``), at the column where the parser stopped (a torn line
  is reported at its end, not at "line 2, column 1" past its newline);
- a number of more digits than Python converts (``bad_value``);
- nesting deeper than ``MAX_DEPTH`` (``too_deep``): no row of Horizon's formats nests more than
  four levels, and a deeper value is where the next writer's recursion would fail;
- a string that is not valid Unicode (``bad_text``: a lone surrogate escape, ``row_values``).

A UTF-8 byte order mark at the start of a file is not part of its first line:
``strip_bom`` removes it.
"""

from __future__ import annotations

import json
from typing import Any

from horizon_engine.row_values import line_text_problem

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a row may have."""

BOM = b"\xef\xbb\xbf"


class BadLine(Exception):
    """A line that does not hold a usable JSON value: ``kind`` counts it, the message says why."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind


def strip_bom(line: bytes) -> bytes:
    """A file's first line without the UTF-8 byte order mark some editors write."""
    return line[len(BOM) :] if line.startswith(BOM) else line


def parse_json_line(line: bytes | str) -> Any:
    """The JSON value of one line (bytes as read from a file, or text), or ``BadLine``."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadLine(
                f"not UTF-8: byte 0x{line[exc.start]:02x} at column {exc.start + 1}", "not_utf8"
            ) from None
    text = line.rstrip("\r\n")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        end = " (the end of the line: a torn line?)" if exc.pos >= len(text) else ""
        raise BadLine(
            f"invalid JSON at column {exc.pos + 1}{end}: {exc.msg}", "invalid_json"
        ) from None
    except RecursionError:
        raise BadLine(f"nested more than {MAX_DEPTH} levels deep", "too_deep") from None
    except ValueError as exc:  # Python refuses to convert an integer of over 4,300 digits
        raise BadLine(
            f"a number too long to read ({str(exc).split(':')[0]})", "bad_value"
        ) from None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        depth = nesting_depth(value)
        if depth > MAX_DEPTH:
            raise BadLine(f"nested {depth} levels deep, more than {MAX_DEPTH}", "too_deep")
    problem = line_text_problem(text, value)
    if problem is not None:
        raise BadLine(problem.reason, problem.kind)
    return value


def nesting_depth(value: Any) -> int:
    """How many levels of arrays and objects a parsed JSON value nests (0 for a scalar);
    measured with a stack, not by recursion."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        pending += [(child, depth + 1) for child in children]
    return deepest
