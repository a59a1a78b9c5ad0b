"""JSONL decision rows shaped as JOINED's Parquet table by Arrow, a chunk at a time.

``RowShaper`` shapes a row at a time in Python, which made a JSONL log written as Parquet
several times slower than written as JSONL. Here Arrow's JSON reader reads a chunk's lines
whole and each column is cast to the joined schema's type, but only where that can give
nothing but what ``RowShaper`` gives: a chunk that holds anything it would word, refuse or
convert otherwise (an escape, a ``null``, a number where text belongs, a feature map whose keys
are not in the same order on every row, ...) is answered None, and shaped row by row as before.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from horizon_engine import RowLayout

if TYPE_CHECKING:
    import pyarrow as pa

MAX_EXACT_INTEGER = 2**53
"""Past this a double read from a JSON integer may be rounded where Python's is exact."""


def read_types(schema: pa.Schema) -> pa.Schema:
    """The fields of ``schema`` (``joined_schema``'s) that Arrow's JSON reader is told the
    types of: those holding text, which it would otherwise take for timestamps where they
    look like them."""
    import pyarrow as pa

    return pa.schema(
        field
        for field in schema
        if field.type in (pa.string(), pa.list_(pa.string())) and field.name != "metrics"
    )


def shape_lines(
    lines: list[bytes],
    metrics: pa.MapArray,
    layout: RowLayout,
    schema: pa.Schema,
    read: pa.Table | None = None,
) -> pa.Table | None:
    """The table ``RowShaper`` would make of these decision lines (whole JSON objects, each
    ending with a newline) with ``metrics`` added, in ``schema`` (``joined_schema``'s); None
    where Arrow's reading could differ from it, and the rows must be shaped one by one.
    ``read``: the lines as Arrow's JSON reader read them with ``read_types``, if they were."""
    import pyarrow as pa
    import pyarrow.json as pj

    block = b"".join(lines)
    if not lines or b"\\" in block or b"null" in block:
        return None
    names = {column.name for column in layout.columns}
    options = pj.ParseOptions(explicit_schema=read_types(schema), unexpected_field_behavior="infer")
    table = read
    if table is None:
        try:
            table = pj.read_json(
                pa.BufferReader(block),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
                parse_options=options,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
    logged = set(table.column_names)
    if table.num_rows != len(lines) or "metrics" in logged or not logged <= set(schema.names):
        return None
    required = {column.name for column in layout.columns if column.required}
    arrays = []
    for field in schema:
        if field.name == "metrics":
            arrays.append(metrics.cast(field.type))
            continue
        if field.name not in table.column_names:
            if field.name in required:
                return None
            arrays.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name).combine_chunks()
        if field.name in required and column.null_count:
            return None
        array = _cast(column, field.type, field.name, lines, field.name in names)
        if array is None:
            return None
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=schema)


def _cast(
    column: pa.Array, target: pa.DataType, name: str, lines: list[bytes], in_layout: bool
) -> pa.Array | None:
    """A column as read, in the joined schema's type, where that is what ``RowShaper`` (a
    layout column) or ``pa.array`` of the parsed values (another field) makes of it."""
    import pyarrow as pa

    if pa.types.is_null(column.type):
        return column.cast(target)
    if pa.types.is_map(target):
        return _feature_map(column, target, name, lines) if in_layout else None
    if column.type != target:
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
        if not numeric or target not in (pa.int64(), pa.float64()):
            return None
        if in_layout and target == pa.int64():
            return None  # RowShaper takes 2.0 for 2, which Arrow's cast need not match
        try:
            column = column.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
    if target == pa.float64() and not _exact(column):
        return None
    return column


def _exact(values: pa.Array) -> bool:
    """Whether every number is within the integers a double holds exactly: a JSON integer past
    them is rounded by Arrow's reader where Python's ``float`` may refuse it."""
    import pyarrow.compute as pc

    return pc.all(pc.less_equal(pc.abs(values), float(MAX_EXACT_INTEGER))).as_py() is not False


def _feature_map(
    column: pa.Array, target: pa.DataType, name: str, lines: list[bytes]
) -> pa.Array | None:
    """A feature map read as a struct (Arrow's JSON reader has no maps) as the map
    ``RowShaper`` makes: every row has every key, in the struct's order, each a number."""
    import numpy as np
    import pyarrow as pa

    if not pa.types.is_struct(column.type) or column.null_count:
        return None
    keys = [column.type.field(index).name for index in range(column.type.num_fields)]
    children = column.flatten()
    for child in children:
        if child.null_count or not (
            pa.types.is_integer(child.type) or pa.types.is_floating(child.type)
        ):
            return None
    if not _keys_in_order(lines, name, keys):
        return None
    try:
        values = [child.cast(pa.float64()) for child in children]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    rows, width = len(column), len(keys)
    if not all(_exact(value) for value in values):
        return None
    flat = np.column_stack([value.to_numpy() for value in values]).ravel() if width else []
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * width)
    names = pa.array(keys, pa.string()).take(pa.array(np.tile(np.arange(width), rows)))
    return pa.MapArray.from_arrays(offsets, names, pa.array(flat, pa.float64())).cast(target)


def _keys_in_order(lines: list[bytes], name: str, keys: list[str]) -> bool:
    """Whether each line's ``name`` object holds ``keys`` in that order (a row's own order is
    the one its map keeps; Arrow's struct holds the keys in the order first seen).

    Without escapes a key's text is its name; and the first ``"name":{`` in a line is the
    row's own field, since a row that ``shape_lines`` keeps holds no other object (its feature
    maps hold numbers, its other fields numbers, strings and lists of strings)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not all(key.isascii() and key.isprintable() for key in keys):
        return False  # matched as bytes below
    texts = pa.array(lines, pa.binary())
    field = f'"{name}"'
    entries = ",".join(rf'\s*"{re.escape(key)}"\s*:[^,{{}}]*' for key in keys)
    pattern = re.escape(field) + r"\s*:\s*\{" + (entries or r"\s*") + r"\}"
    try:
        return pc.all(pc.match_substring_regex(texts, pattern)).as_py()
    except pa.ArrowInvalid:  # a key that RE2 reads otherwise
        return False
