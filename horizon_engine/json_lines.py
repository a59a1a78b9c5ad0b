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
- a string that is not valid Unicode (``bad_text``: a lone surrogate escape, ``row_values``);
- an object that names one key twice (``duplicate_key``): Python's parser would keep the last
  value silently, another reader the first;
- a line longer than ``MAX_LINE_BYTES`` (``too_long``): ``read_lines`` never holds more of it
  than that, and gives it as a ``LongLine`` that ``parse_json_line`` refuses.

A UTF-8 byte order mark at the start of a file is not part of its first line:
``strip_bom`` removes it (``read_lines`` does, for its first line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from horizon_engine.row_values import line_text_problem

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a row may have."""

MAX_LINE_BYTES = 16 * 2**20
"""The longest line (its newline not counted) the readers take, 16 MiB: a row of 10,000
features is about 300 KB, and ``horizon serve`` takes request bodies of 1 MiB; a longer line
is a bad line of its own (``too_long``), read past in pieces rather than held whole (one line
of 600 MB took a source to 2.8 GB of memory, one that never ends to MemoryError). The JSONL
source's ``max_line_bytes`` raises it."""

SHOWN_LINE_BYTES = 4096
"""How much of a bad line a quarantine keeps: enough to recognize the row, never the whole
of a line of many megabytes."""

READ_PAST_BYTES = 2**20
"""The piece size in which the rest of a too-long line is read and dropped."""

BOM = b"\xef\xbb\xbf"


class BadLine(Exception):
    """A line that does not hold a usable JSON value: ``kind`` counts it, the message says why."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.reason, self.kind = reason, kind


class LongLine(bytes):
    """A line longer than its reader's limit, as ``read_lines`` gives it: the bytes are its
    first ``SHOWN_LINE_BYTES`` (with no newline, so that no reader of whole lines takes them
    for one), ``length`` the line's full length; ``parse_json_line`` refuses it."""

    length: int
    limit: int

    def __new__(cls, prefix: bytes, length: int, limit: int) -> LongLine:
        line = super().__new__(cls, prefix)
        line.length, line.limit = length, limit
        return line

    def strip(self, chars: bytes | None = None) -> bytes:
        """Never blank: a reader's test for a blank line must not pass over a line it could
        not read whole (its first bytes may be blanks)."""
        return bytes(self).strip(chars) or b"?"


def read_lines(
    handle: IO[bytes], max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """Each line of a file open for reading bytes, with its number (from 1), the first without
    a byte order mark; a line longer than ``max_line_bytes`` as a ``LongLine``, whose rest is
    read past in pieces: no more than ``max_line_bytes`` of a line is ever held."""
    number = 0
    while line := handle.readline(max_line_bytes + 1):
        number += 1
        if number == 1:
            line = strip_bom(line)
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            yield number, read_past_line(handle, line, max_line_bytes)
            continue
        yield number, line


def read_past_line(handle: IO[bytes], start: bytes, max_line_bytes: int) -> LongLine:
    """The line that began with ``start`` (already read, over ``max_line_bytes``, with no
    newline) as a ``LongLine``: its rest is read from ``handle`` up to and with its newline,
    in pieces, and dropped."""
    length, piece = len(start), start
    while not piece.endswith(b"\n") and (piece := handle.readline(READ_PAST_BYTES)):
        length += len(piece)
    return LongLine(line_prefix(start), length - piece.endswith(b"\n"), max_line_bytes)


def line_prefix(line: bytes) -> bytes:
    """The first ``SHOWN_LINE_BYTES`` of a line, as a quarantine keeps it."""
    return line[:SHOWN_LINE_BYTES]


def strip_bom(line: bytes) -> bytes:
    """A file's first line without the UTF-8 byte order mark some editors write."""
    if isinstance(line, LongLine):
        return line
    return line[len(BOM) :] if line.startswith(BOM) else line


class _DuplicateKey(Exception):
    """Raised by ``_unique_keys`` for the key an object names twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict, refusing one that names a key twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return value


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)
"""One decoder for every line: ``json.loads`` with a hook would build one per call."""


def parse_json_line(line: bytes | str) -> Any:
    """The JSON value of one line (bytes as read from a file, or text), or ``BadLine``."""
    if isinstance(line, LongLine):
        raise BadLine(
            f"a line of {line.length:,} bytes, longer than the {line.limit:,} a line may have",
            "too_long",
        )
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadLine(
                f"not UTF-8: byte 0x{line[exc.start]:02x} at column {exc.start + 1}", "not_utf8"
            ) from None
    text = line.rstrip("\r\n")
    try:
        value = _DECODER.decode(text)
    except _DuplicateKey as exc:
        raise BadLine(
            f"the key {exc.args[0]!r} appears twice in one object", "duplicate_key"
        ) from None
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
