"""The row formats, as Arrow schemas, and their validation.

Two formats, each for three kinds of action:

- pre-timeline rows: logged decisions in the RLDataset format of the seed walkthrough
  (``ds``, ``mdp_id``, ``sequence_number``, ``state_features``, ``action``, ``reward``,
  ``action_probability``, ``possible_actions``, ``metrics``), and our optional ``truncated``:
  true on the last row of an episode that a time limit cut short, so that the timeline does
  not make it terminal (Horizon's rows cannot say, and keep Horizon's meaning);
- timeline rows: what the Timeline job writes (adds ``next_state_features``, ``next_action``,
  ``possible_next_actions``, ``time_diff``, ``sequence_number_ordinal``, ``time_since_first``,
  ``not_terminal``). Horizon called ``action_probability`` ``propensity``; both are read.

Discrete actions are names (``"0"``, ``"left"``) before the timeline and indices into the
``actions`` list after it, with ``possible_actions`` a 0/1 mask. Parametric actions are feature
maps, with ``possible_actions`` a list of feature maps. Continuous actions are feature maps with
no ``possible_actions``.

Validation runs in two steps. ``RowShaper`` turns parsed rows (dicts, from JSONL or gym) into an
Arrow table, rejecting rows whose structure is wrong (missing field, wrong type). ``RowChecker``
then checks values on whole Arrow batches, whatever the source: NaN or inf features, a
probability outside (0, 1] or below ``row_values.MIN_PROPENSITY``, a sequence number beyond
63 bits, a ``ds`` that is not a ``YYYY-MM-DD`` date, an action not among the possible
actions, a duplicate (mdp_id, sequence_number). Every rejected row keeps its location and
reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from horizon_engine.errors import HorizonError
from horizon_engine.row_values import (
    OUT_OF_RANGE,
    SEQUENCE_MAX,
    SEQUENCE_MIN,
    integer_problem,
    is_bad_ds,
    is_beyond_float32,
    is_non_finite,
    is_unusable_propensity,
    propensity_problem,
    sequence_problem,
    text_problem,
    type_name,
)

FEATURES = pa.map_(pa.string(), pa.float64())
"""A sparse feature map: feature id -> value. Ids are strings, as in Horizon's JSON."""


class RowFormat(StrEnum):
    PRE_TIMELINE = "pre_timeline"
    TIMELINE = "timeline"


class ActionType(StrEnum):
    DISCRETE = "discrete"
    PARAMETRIC = "parametric"
    CONTINUOUS = "continuous"


@dataclass(frozen=True)
class BadRow:
    """A row that was rejected: where it came from, why, and its content for the quarantine."""

    location: str
    reason: str
    kind: str
    row: Any = None

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


class _Reject(Exception):
    """Raised by a coercer; the message is the reason recorded for the row."""

    def __init__(self, reason: str, kind: str = "wrong_type") -> None:
        super().__init__(reason)
        self.kind = kind


def _to_id(value: Any) -> str:
    if isinstance(value, str):
        # A lone surrogate (JSON's "\ud800") is refused here, by its row, rather than by
        # Arrow, which would stop the whole batch with a UnicodeEncodeError.
        problem = text_problem(value)
        if problem is not None:
            raise _Reject(problem.reason, problem.kind)
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise _Reject(f"expected a string, found {value!r} ({type_name(value)})")


def _to_int(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    # Python ints are unbounded; Arrow's int64 is not, and one huge value would otherwise
    # fail the whole batch instead of this row.
    problem = integer_problem(value)
    if problem is not None:
        raise _Reject(problem.reason, problem.kind)
    return value


def _to_float(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise _Reject(
                "expected a number, found an integer too large for a float", "bad_value"
            ) from None
    raise _Reject(f"expected a number, found {value!r} ({type_name(value)})")


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Reject(f"expected true or false, found {value!r} ({type_name(value)})")


def _to_features(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise _Reject(f"expected a map of feature id -> number, found {type_name(value)}")
    features = {}
    for key, item in value.items():
        try:
            features[_to_id(key)] = _to_float(item)
        except _Reject as exc:
            raise _Reject(f"feature {key!r}: {exc}", exc.kind) from None
    return features


def _list_of(coerce: Callable[[Any], Any], what: str) -> Callable[[Any], list]:
    def to_list(value: Any) -> list:
        if not isinstance(value, list):
            raise _Reject(f"expected a list of {what}, found {type_name(value)}")
        items = []
        for index, item in enumerate(value):
            try:
                items.append(coerce(item))
            except _Reject as exc:
                raise _Reject(f"item {index}: {exc}", exc.kind) from None
        return items

    return to_list


def _to_mask_bit(value: Any) -> int:
    bit = _to_int(value)
    if bit not in (0, 1):
        raise _Reject(f"expected 0 or 1, found {bit}", "bad_value")
    return bit


@dataclass(frozen=True)
class Column:
    """One column of a row schema: its Arrow type, whether rows must have it, how to coerce."""

    name: str
    type: pa.DataType
    required: bool
    coerce: Callable[[Any], Any]
    aliases: tuple[str, ...] = ()


def _columns(row_format: RowFormat, action_type: ActionType) -> list[Column]:
    discrete = action_type is ActionType.DISCRETE
    pre = row_format is RowFormat.PRE_TIMELINE
    if discrete and pre:
        action = Column("action", pa.string(), True, _to_id)
    elif discrete:
        action = Column("action", pa.int64(), True, _to_int)
    else:
        action = Column("action", FEATURES, True, _to_features)
    if discrete and pre:
        possible = pa.list_(pa.string()), _list_of(_to_id, "action names")
    elif discrete:
        possible = pa.list_(pa.int8()), _list_of(_to_mask_bit, "0/1 flags")
    else:
        possible = pa.list_(FEATURES), _list_of(_to_features, "feature maps")
    columns = [
        Column("ds", pa.string(), False, _to_id),
        Column("mdp_id", pa.string(), True, _to_id),
        Column("sequence_number", pa.int64(), True, _to_int),
        Column("state_features", FEATURES, True, _to_features),
        action,
        Column("action_probability", pa.float64(), True, _to_float, aliases=("propensity",)),
        Column("reward", pa.float64(), not pre, _to_float),
        Column("metrics", FEATURES, False, _to_features),
    ]
    if action_type is not ActionType.CONTINUOUS:
        columns.append(Column("possible_actions", possible[0], False, possible[1]))
    if pre:
        return [*columns, Column("truncated", pa.bool_(), False, _to_bool)]
    next_action = Column("next_action", action.type, False, action.coerce)
    columns += [
        Column("sequence_number_ordinal", pa.int64(), False, _to_int),
        Column("time_since_first", pa.int64(), False, _to_int),
        Column("next_state_features", FEATURES, True, _to_features),
        next_action,
        Column("time_diff", pa.int64(), True, _to_int),
        Column("not_terminal", pa.bool_(), False, _to_bool),
    ]
    if action_type is not ActionType.CONTINUOUS:
        columns.append(Column("possible_next_actions", possible[0], False, possible[1]))
    return columns


DECISION_LOG_FIELDS = frozenset({"decision_id", "model_id", "timestamp", "policy"})
"""What a serving decision log adds to a pre-timeline row (``horizon score``, ``serve`` and
``join`` write them; ``policy`` names the policy the action was drawn by): expected in logged
rows, read past without a warning, not part of the timeline."""


@dataclass(frozen=True)
class RowLayout:
    """Which row format and action type a table holds; it decides the Arrow schema."""

    row_format: RowFormat
    action_type: ActionType

    @property
    def columns(self) -> list[Column]:
        return _columns(self.row_format, self.action_type)

    @property
    def known_fields(self) -> set[str]:
        """Every field name the layout reads (its columns and their aliases) or knowingly
        reads past (a pre-timeline row's ``DECISION_LOG_FIELDS``); others are reported."""
        known = {name for col in self.columns for name in (col.name, *col.aliases)}
        if self.row_format is RowFormat.PRE_TIMELINE:
            known |= DECISION_LOG_FIELDS
        return known

    @property
    def schema(self) -> pa.Schema:
        fields = [pa.field(col.name, col.type, nullable=True) for col in self.columns]
        return pa.schema(fields, metadata=self.metadata)

    @property
    def metadata(self) -> dict[bytes, bytes]:
        return {
            b"horizon.row_format": self.row_format.value.encode(),
            b"horizon.action_type": self.action_type.value.encode(),
        }

    @classmethod
    def from_schema(cls, schema: pa.Schema, where: str) -> RowLayout:
        """The layout recorded in a Parquet file that Horizon Engine wrote."""
        metadata = schema.metadata or {}
        try:
            return cls(
                RowFormat(metadata[b"horizon.row_format"].decode()),
                ActionType(metadata[b"horizon.action_type"].decode()),
            )
        except (KeyError, ValueError):
            raise HorizonError(
                f"{where}: no Horizon row layout in the Parquet metadata; "
                "set [source] row_format and action_type"
            ) from None

    def __str__(self) -> str:
        return f"{self.row_format.value} rows with {self.action_type.value} actions"


def detect_layout(row: Mapping[str, Any], row_format: str, action_type: str) -> RowLayout:
    """Decide the layout from the first row where the config says ``auto``.

    A row with ``next_state_features`` is a timeline row. A map action with a
    ``possible_actions`` key is parametric, a map action without one is continuous, and any
    other action is discrete.
    """
    if row_format == "auto":
        is_timeline = "next_state_features" in row
        row_format = RowFormat.TIMELINE if is_timeline else RowFormat.PRE_TIMELINE
    if action_type == "auto":
        if not isinstance(row.get("action"), Mapping):
            action_type = ActionType.DISCRETE
        elif "possible_actions" in row:
            action_type = ActionType.PARAMETRIC
        else:
            action_type = ActionType.CONTINUOUS
    return RowLayout(RowFormat(row_format), ActionType(action_type))


def majority_layout(rows: Iterable[Any], row_format: str, action_type: str) -> RowLayout | None:
    """The layout most of ``rows`` (parsed JSON values) show, as ``detect_layout`` reads each
    object; None if none is an object. A tie goes to the layout seen first.

    One row does not decide a file's format: a first row with an odd action would otherwise
    make every row after it a bad row, and the run "succeed" on that one row.
    """
    votes: Counter[RowLayout] = Counter()
    for row in rows:
        if isinstance(row, Mapping):
            votes[detect_layout(row, row_format, action_type)] += 1
    return votes.most_common(1)[0][0] if votes else None


@dataclass
class ShapedRows:
    """The result of shaping parsed rows: a table, where each row came from, and rejects."""

    table: pa.Table
    locations: list[str]
    bad_rows: list[BadRow] = field(default_factory=list)
    ignored_fields: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)


INTEGER_ACTION_NOTE = (
    "a discrete action (or possible action) given as an integer, read as its decimal "
    'name (1 as "1", the name [timeline] actions and possible_actions use)'
)
"""The source stage's warning, with its count of rows: an integer action is read as the name
it spells, the same way in every row, rather than refused, and the user is told so once."""


class RowShaper:
    """Turns parsed rows (dicts) into an Arrow table of one layout, rejecting malformed rows."""

    def __init__(self, layout: RowLayout) -> None:
        self.layout = layout
        self._columns = layout.columns
        self._known = layout.known_fields
        self._named_actions = (
            layout.action_type is ActionType.DISCRETE
            and layout.row_format is RowFormat.PRE_TIMELINE
        )

    def shape(self, rows: Iterable[tuple[str, Any]]) -> ShapedRows:
        """Shape ``(location, row)`` pairs. A row that is not a JSON object is rejected too."""
        values: dict[str, list] = {col.name: [] for col in self._columns}
        locations: list[str] = []
        bad_rows: list[BadRow] = []
        ignored: dict[str, int] = {}
        integer_actions = 0
        for location, row in rows:
            try:
                shaped, unknown = self._shape_one(row)
            except _Reject as exc:
                bad_rows.append(BadRow(location, str(exc), exc.kind, row))
                continue
            for name, value in shaped.items():
                values[name].append(value)
            locations.append(location)
            for key in unknown:
                ignored[key] = ignored.get(key, 0) + 1
            if self._named_actions and _integer_action(row):
                integer_actions += 1
        table = pa.Table.from_pydict(values, schema=self.layout.schema)
        notes = {INTEGER_ACTION_NOTE: integer_actions} if integer_actions else {}
        return ShapedRows(table, locations, bad_rows, ignored, notes)

    def _shape_one(self, row: Any) -> tuple[dict[str, Any], set[str]]:
        """The row's values by column, and the names of the fields it has besides them."""
        if not isinstance(row, Mapping):
            raise _Reject(f"expected a JSON object, found {type_name(row)}", "not_an_object")
        shaped = {}
        for col in self._columns:
            value = row.get(col.name)
            for alias in col.aliases:
                if value is None:
                    value = row.get(alias)
            if value is None:
                if col.required:
                    raise _Reject(f"missing field '{col.name}'", "missing_field")
                shaped[col.name] = None
                continue
            try:
                shaped[col.name] = col.coerce(value)
            except _Reject as exc:
                raise _Reject(f"field '{col.name}': {exc}", exc.kind) from None
        pre = self.layout.row_format is RowFormat.PRE_TIMELINE
        if pre and shaped["reward"] is None and shaped["metrics"] is None:
            raise _Reject(
                "missing field 'reward' (or a 'metrics' map to compute it from)", "missing_field"
            )
        unknown = row.keys() - self._known
        for key in unknown:
            # An ignored field's name is still reported, and must be printable.
            problem = text_problem(key) if isinstance(key, str) else None
            if problem is not None:
                raise _Reject(f"a field name: {problem.reason}", problem.kind)
        return shaped, unknown


def rows_as_dicts(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows as dicts, maps (and lists of maps) as dicts, so that a quarantined row
    reads like the JSON row it came from. Converted a column at a time: Arrow's row-wise
    ``to_pylist(maps_as_pydicts=...)`` took 5.7 s for 100,000 rows, this about 1 s. Where a
    map names a key twice, the last value is kept."""
    columns = []
    for index in range(table.num_columns):
        values = table.column(index).to_pylist()
        kind = table.schema.field(index).type
        if pa.types.is_map(kind):
            values = [None if item is None else dict(item) for item in values]
        elif pa.types.is_list(kind) and pa.types.is_map(kind.value_type):
            values = [
                None if item is None else [None if m is None else dict(m) for m in item]
                for item in values
            ]
        columns.append(values)
    return [dict(zip(table.column_names, row, strict=True)) for row in zip(*columns, strict=True)]


def _integer_action(row: Mapping[str, Any]) -> bool:
    """Whether a discrete row's action or one of its possible actions is a JSON integer."""
    possible = row.get("possible_actions")
    return isinstance(row.get("action"), int) or (
        isinstance(possible, list) and any(isinstance(item, int) for item in possible)
    )


def list_entries(array: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """For a map or list array: the row index of every entry, and the entries' values."""
    offsets = array.offsets.to_numpy(zero_copy_only=False)
    counts = np.diff(offsets)
    parents = np.repeat(np.arange(len(array)), counts)
    if isinstance(array, pa.MapArray):
        items = array.items.slice(offsets[0], offsets[-1] - offsets[0])
    else:
        items = array.values.slice(offsets[0], offsets[-1] - offsets[0])
    return parents, items


def map_entries(array: pa.MapArray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """For a map array: the row index, key and value of every entry."""
    parents, values = list_entries(array)
    offsets = array.offsets.to_numpy(zero_copy_only=False)
    return parents, array.keys.slice(offsets[0], offsets[-1] - offsets[0]), values


def duplicate_key_rows(array: pa.Array) -> dict[int, str]:
    """Rows of a map column (or of a column of lists of maps) in which one map holds a key
    twice, with the first such key. A JSON object cannot (``json_lines`` refuses the line), but
    a Parquet writer can: which of the two values a reader then keeps is its own choice."""
    if pa.types.is_list(array.type) and pa.types.is_map(array.type.value_type):
        rows, maps = list_entries(array)
        return {int(rows[index]): key for index, key in duplicate_key_rows(maps).items()}
    if not pa.types.is_map(array.type) or len(array) == 0:
        return {}
    parents, keys, _ = map_entries(array)
    if len(keys) < 2:
        return {}
    encoded = pc.dictionary_encode(keys.cast(pa.string()))
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    pairs = parents.astype(np.int64) * (len(encoded.dictionary) + 1) + codes + 1
    _, first, counts = np.unique(pairs, return_index=True, return_counts=True)
    found: dict[int, str] = {}
    raw = keys.cast(pa.binary())
    for entry in np.sort(first[counts > 1]):
        key = raw[int(entry)].as_py()
        found.setdefault(int(parents[entry]), key.decode("utf-8", "backslashreplace"))
    return found


def _first_features_where(
    array: pa.MapArray | pa.ListArray, is_bad: Callable[[pa.Array], pa.Array]
) -> dict[int, tuple[str, float]]:
    """Rows of a feature-map array (or of an array of lists of feature maps) holding a value
    ``is_bad`` flags, with the first such feature.

    The feature is named in the reason, so that a user can find it among hundreds.
    """
    found: dict[int, tuple[str, float]] = {}
    if not isinstance(array, pa.MapArray):
        # A list of feature maps (parametric possible actions): a row owns its maps' finds.
        rows, maps = list_entries(array)
        for index, feature in _first_features_where(maps, is_bad).items():
            found.setdefault(int(rows[index]), feature)
        return found
    parents, keys, values = map_entries(array)
    bad = pc.fill_null(is_bad(values), False).to_numpy(zero_copy_only=False)
    for entry in np.flatnonzero(bad):
        found.setdefault(int(parents[entry]), (keys[entry].as_py(), values[entry].as_py()))
    return found


FEATURE_COLUMNS = (
    "state_features",
    "next_state_features",
    "metrics",
    "action",
    "next_action",
    "possible_actions",
    "possible_next_actions",
)
"""Columns whose values are checked where they hold feature maps (or lists of them, as the
possible actions of parametric rows do): these values become training's tensors."""


class RowChecker:
    """Checks values on whole Arrow tables of one layout; remembers keys to find duplicates.

    ``actions``, the ``[timeline] actions`` of a pipeline that builds a timeline, makes a
    logged discrete action (or possible action) outside that list a bad row here, where its
    file and line are known, rather than in the timeline, which sees only the validated rows.
    """

    def __init__(self, layout: RowLayout, actions: list[str] | None = None) -> None:
        self.layout = layout
        discrete = layout.action_type is ActionType.DISCRETE
        named = discrete and layout.row_format is RowFormat.PRE_TIMELINE
        self.actions = actions if named else None
        self._seen: set[tuple[str, int]] = set()

    def check(self, table: pa.Table, locations: list[str]) -> tuple[pa.Table, list[BadRow]]:
        """Return the good rows and the bad ones, each bad row with its first reason."""
        table = table.combine_chunks()
        reasons: dict[int, tuple[str, str]] = {}

        def reject(rows: Iterable[int], kind: str, reason: Callable[[int], str] | str) -> None:
            for row in rows:
                row = int(row)
                if row not in reasons:
                    reasons[row] = (kind, reason(row) if callable(reason) else reason)

        for col in self.layout.columns:
            if col.required:
                missing = np.flatnonzero(table[col.name].is_null().to_numpy(zero_copy_only=False))
                reject(missing, "missing_field", f"missing field '{col.name}'")
        for name in FEATURE_COLUMNS:
            if name not in table.column_names or not table.num_rows:
                continue
            if table.schema.field(name).type in (FEATURES, pa.list_(FEATURES)):
                self._check_feature_values(name, table[name].chunk(0), reject)
        reward = table["reward"]
        for kind, is_bad, beyond in (
            ("non_finite", is_non_finite, ""),
            ("out_of_range", is_beyond_float32, f", {OUT_OF_RANGE}"),
        ):
            flagged = pc.fill_null(is_bad(reward), False).to_numpy(zero_copy_only=False)
            reject(
                np.flatnonzero(flagged),
                kind,
                lambda row, beyond=beyond: f"'reward' is {reward[row].as_py()!r}{beyond}",
            )
        self._check_probability(table, reject)
        self._check_sequence_numbers(table, reject)
        self._check_ds(table, reject)
        self._check_action_names(table, reject)
        self._check_action_possible(table, reject)
        self._check_duplicates(table, reasons, reject)
        bad_index = sorted(reasons)
        if not bad_index:
            return table, []
        contents = rows_as_dicts(table.take(pa.array(bad_index, pa.int64())))
        bad_rows = [
            BadRow(locations[row], reasons[row][1], reasons[row][0], content)
            for row, content in zip(bad_index, contents, strict=True)
        ]
        keep = np.ones(table.num_rows, dtype=bool)
        keep[bad_index] = False
        return table.filter(pa.array(keep)), bad_rows

    @staticmethod
    def _check_feature_values(
        name: str, array: pa.MapArray | pa.ListArray, reject: Callable
    ) -> None:
        """Reject rows of the feature-map column ``name`` (or list of feature maps) holding a
        NaN or infinite value, or a finite one too large for training's float32 tensors."""
        for kind, is_bad, beyond in (
            ("non_finite", is_non_finite, ""),
            ("out_of_range", is_beyond_float32, f", {OUT_OF_RANGE}"),
        ):
            found = _first_features_where(array, is_bad)
            reject(
                found,
                kind,
                lambda row, found=found, beyond=beyond: (
                    f"'{name}' feature {found[row][0]!r} is {found[row][1]!r}{beyond}"
                ),
            )

    def _check_probability(self, table: pa.Table, reject: Callable) -> None:
        """Reject rows whose logged propensity training and the estimators cannot use:
        outside (0, 1], or below ``MIN_PROPENSITY`` (``row_values``' one rule)."""
        column = table["action_probability"]
        probability = column.to_numpy(zero_copy_only=False).astype(np.float64)
        present = ~column.is_null().to_numpy(zero_copy_only=False)
        unusable = present & is_unusable_propensity(probability)
        reject(
            np.flatnonzero(unusable),
            "bad_probability",
            lambda row: str(propensity_problem(float(probability[row]))),
        )

    def _check_sequence_numbers(self, table: pa.Table, reject: Callable) -> None:
        """Reject rows whose sequence number lies beyond ``SEQUENCE_MIN``..``SEQUENCE_MAX``:
        the timeline's differences of two of them would wrap around in int64."""
        sequence = table["sequence_number"]
        outside = pc.or_(pc.less(sequence, SEQUENCE_MIN), pc.greater(sequence, SEQUENCE_MAX))
        rows = np.flatnonzero(pc.fill_null(outside, False).to_numpy(zero_copy_only=False))
        reject(rows, "out_of_range", lambda row: str(sequence_problem(sequence[row].as_py())))

    def _check_ds(self, table: pa.Table, reject: Callable) -> None:
        """Reject rows whose ``ds`` is not a date written ``YYYY-MM-DD`` (``row_values``)."""
        ds = table["ds"]
        rows = np.flatnonzero(is_bad_ds(ds).to_numpy(zero_copy_only=False))
        reject(
            rows,
            "bad_value",
            lambda row: f"'ds' is {ds[row].as_py()!r}, not a date written YYYY-MM-DD",
        )

    def _check_action_names(self, table: pa.Table, reject: Callable) -> None:
        """Reject rows whose action, or a possible action, is not one of ``actions``."""
        if self.actions is None or table.num_rows == 0:
            return
        names = pa.array(self.actions, pa.string())
        action = table["action"].chunk(0)
        unknown = pc.and_(pc.is_null(pc.index_in(action, value_set=names)), pc.is_valid(action))
        reject(
            np.flatnonzero(unknown.to_numpy(zero_copy_only=False)),
            "unknown_action",
            lambda row: (
                f"action {action[row].as_py()!r} is not in [timeline] actions {self.actions}"
            ),
        )
        if "possible_actions" not in table.column_names:
            return
        possible = table["possible_actions"].chunk(0)
        parents, listed = list_entries(possible)
        outside = pc.is_null(pc.index_in(listed, value_set=names)).to_numpy(zero_copy_only=False)
        reject(
            np.unique(parents[outside]),
            "unknown_action",
            lambda row: (
                f"possible_actions {possible[row].as_py()!r} name an action not in "
                f"[timeline] actions {self.actions}"
            ),
        )

    def _check_action_possible(self, table: pa.Table, reject: Callable) -> None:
        """Reject rows whose action is not among their possible actions.

        An empty or missing ``possible_actions`` list means the possible actions were not
        recorded, and is not checked: Horizon wrote an empty list on the last row of every
        parametric episode. A discrete mask of zeros, by contrast, says no action was possible.
        """
        if "possible_actions" not in table.column_names or table.num_rows == 0:
            return
        possible = table["possible_actions"].chunk(0)
        action = table["action"].chunk(0)
        lengths = pc.fill_null(pc.list_value_length(possible), 0).to_numpy(zero_copy_only=False)
        checked = (lengths > 0) & ~action.is_null().to_numpy(zero_copy_only=False)
        is_mask = (
            self.layout.action_type is ActionType.DISCRETE
            and self.layout.row_format is RowFormat.TIMELINE
        )
        if self.layout.action_type is ActionType.PARAMETRIC:
            actions = action.to_pylist(maps_as_pydicts="lossy")
            choices = possible.to_pylist(maps_as_pydicts="lossy")
            found = np.array(
                [bool(c) and a in c for a, c in zip(actions, choices, strict=True)], dtype=bool
            )
        elif is_mask:
            index = pc.fill_null(action, -1).to_numpy(zero_copy_only=False)
            in_range = (index >= 0) & (index < lengths)
            _, flags = list_entries(possible)
            flags = pc.fill_null(flags, 0).to_numpy(zero_copy_only=False)
            offsets = possible.offsets.to_numpy(zero_copy_only=False)
            position = offsets[:-1] - offsets[0] + index
            found = np.zeros(len(possible), dtype=bool)
            found[in_range] = flags[position[in_range]] == 1
        else:
            parents, names = list_entries(possible)
            matches = pc.fill_null(pc.equal(names, action.take(pa.array(parents))), False)
            matched_rows = parents[matches.to_numpy(zero_copy_only=False)]
            found = np.bincount(matched_rows, minlength=len(possible)) > 0

        def reason(row: int) -> str:
            taken = action[row].as_py(maps_as_pydicts="lossy")
            allowed = possible[row].as_py(maps_as_pydicts="lossy")
            if is_mask:
                entry = "a 0" if 0 <= taken < len(allowed) else "no entry"
                return (
                    f"action {taken} is not possible: "
                    f"possible_actions {allowed} has {entry} at index {taken}"
                )
            return f"action {taken!r} is not in possible_actions {allowed!r}"

        reject(np.flatnonzero(checked & ~found), "impossible_action", reason)

    def _check_duplicates(
        self, table: pa.Table, reasons: dict[int, tuple[str, str]], reject: Callable
    ) -> None:
        mdp_ids = table["mdp_id"].to_pylist()
        sequence_numbers = table["sequence_number"].to_pylist()
        duplicates = []
        for row, key in enumerate(zip(mdp_ids, sequence_numbers, strict=True)):
            if row in reasons or None in key:
                continue
            if key in self._seen:
                duplicates.append(row)
            else:
                self._seen.add(key)
        reject(
            duplicates,
            "duplicate",
            lambda row: (
                f"duplicate (mdp_id, sequence_number) = ({mdp_ids[row]!r}, {sequence_numbers[row]})"
            ),
        )


def derive_not_terminal(table: pa.Table, layout: RowLayout) -> pa.Table:
    """Fill ``not_terminal`` where a timeline row does not carry it.

    Horizon marked a terminal row by its possible next actions: an all-zero mask (discrete) or
    an empty list (parametric). Continuous rows have no such list; an empty next state marks
    the end of an episode there, and it does too for a row whose possible next actions were not
    recorded, rather than every such row silently counting as not terminal.
    """
    if layout.row_format is not RowFormat.TIMELINE or table.num_rows == 0:
        return table
    given = table["not_terminal"].combine_chunks()
    if given.null_count == 0:
        return table
    next_state = table["next_state_features"].combine_chunks()
    has_next_state = pa.array(np.diff(next_state.offsets.to_numpy(zero_copy_only=False)) > 0)
    if layout.action_type is ActionType.CONTINUOUS:
        derived = pc.coalesce(given, has_next_state)
    else:
        possible = table["possible_next_actions"].combine_chunks()
        if layout.action_type is ActionType.DISCRETE:
            any_possible = pc.greater(_list_sums(possible), 0)
        else:
            any_possible = pc.greater(pc.list_value_length(possible), 0)
        derived = pc.coalesce(given, any_possible, has_next_state)
    index = table.schema.get_field_index("not_terminal")
    return table.set_column(index, "not_terminal", derived)


def _list_sums(array: pa.ListArray) -> pa.Array:
    """Each list's sum (null for a null list): how many next actions a discrete mask allows."""
    parents, items = list_entries(array)
    sums = np.bincount(parents, weights=items.to_numpy(zero_copy_only=False), minlength=len(array))
    nulls = array.is_null().to_numpy(zero_copy_only=False)
    return pa.array(sums, mask=nulls)
