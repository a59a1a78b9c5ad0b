"""Row schemas and their validation: RowShaper, RowChecker, detect_layout, derive_not_terminal.

Every rejected row must say where it came from (``file:line``) and why, in words a user can act
on; these tests pin both.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horizon_engine.errors import HorizonError
from horizon_engine.schema import (
    FEATURES,
    ActionType,
    BadRow,
    RowChecker,
    RowFormat,
    RowLayout,
    RowShaper,
    derive_not_terminal,
    detect_layout,
)

PRE_DISCRETE = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
PRE_PARAMETRIC = RowLayout(RowFormat.PRE_TIMELINE, ActionType.PARAMETRIC)
PRE_CONTINUOUS = RowLayout(RowFormat.PRE_TIMELINE, ActionType.CONTINUOUS)
TIMELINE_DISCRETE = RowLayout(RowFormat.TIMELINE, ActionType.DISCRETE)
TIMELINE_PARAMETRIC = RowLayout(RowFormat.TIMELINE, ActionType.PARAMETRIC)
TIMELINE_CONTINUOUS = RowLayout(RowFormat.TIMELINE, ActionType.CONTINUOUS)
ALL_LAYOUTS = [
    PRE_DISCRETE,
    PRE_PARAMETRIC,
    PRE_CONTINUOUS,
    TIMELINE_DISCRETE,
    TIMELINE_PARAMETRIC,
    TIMELINE_CONTINUOUS,
]


def pre_row(**changes: Any) -> dict[str, Any]:
    """A valid pre-timeline discrete row (the seed walkthrough's), with ``changes`` applied."""
    row = {
        "ds": "2019-01-01",
        "mdp_id": "0",
        "sequence_number": 10,
        "state_features": {"0": -0.032, "1": -0.0163},
        "action": "1",
        "reward": 1.0,
        "action_probability": 0.5,
        "possible_actions": ["0", "1"],
        "metrics": {"reward": 1.0},
    }
    row.update(changes)
    return {key: value for key, value in row.items() if value is not DROP}


def timeline_row(**changes: Any) -> dict[str, Any]:
    """A valid post-timeline discrete row, as Horizon wrote them, with ``changes`` applied."""
    row = {
        "mdp_id": "214",
        "sequence_number": 120,
        "propensity": 0.05,
        "state_features": {"0": 0.917, "1": 0.775},
        "action": 1,
        "reward": 1.0,
        "next_state_features": {"0": 0.933, "1": 0.969},
        "time_diff": 1,
        "possible_actions": [1, 1],
        "possible_next_actions": [1, 1],
        "next_action": 0,
        "metrics": {"reward": 1.0},
    }
    row.update(changes)
    return {key: value for key, value in row.items() if value is not DROP}


def parametric_row(**changes: Any) -> dict[str, Any]:
    return timeline_row(
        **{
            "action": {"4": 1.0},
            "next_action": {"5": 1.0},
            "possible_actions": [{"4": 1.0}, {"5": 1.0}],
            "possible_next_actions": [{"4": 1.0}, {"5": 1.0}],
            **changes,
        }
    )


DROP = object()
"""Pass as a field's value to leave the field out of the row."""


def located(rows: list[Any], file: str = "data.jsonl") -> list[tuple[str, Any]]:
    return [(f"{file}:{number}", row) for number, row in enumerate(rows, start=1)]


def validate(layout: RowLayout, rows: list[Any]) -> tuple[pa.Table, list[BadRow]]:
    """Shape then check, as the source stage does; the good rows and every bad one."""
    shaped = RowShaper(layout).shape(located(rows))
    good, rejected = RowChecker(layout).check(shaped.table, shaped.locations)
    return good, [*shaped.bad_rows, *rejected]


def only_bad(layout: RowLayout, rows: list[Any]) -> BadRow:
    """The one bad row among ``rows``; the others must pass."""
    good, bad = validate(layout, rows)
    assert len(bad) == 1, [str(row) for row in bad]
    assert good.num_rows == len(rows) - 1
    return bad[0]


# Structure: RowShaper ----------------------------------------------------------------------


def test_valid_rows_shape_to_the_layout_schema():
    shaped = RowShaper(PRE_DISCRETE).shape(located([pre_row(), pre_row(sequence_number=11)]))
    assert shaped.bad_rows == []
    assert shaped.table.schema == PRE_DISCRETE.schema
    assert shaped.locations == ["data.jsonl:1", "data.jsonl:2"]
    first = shaped.table.to_pylist(maps_as_pydicts="strict")[0]
    assert first["state_features"] == {"0": -0.032, "1": -0.0163}
    assert first["possible_actions"] == ["0", "1"]


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        ("mdp_id", "missing field 'mdp_id'"),
        ("sequence_number", "missing field 'sequence_number'"),
        ("state_features", "missing field 'state_features'"),
        ("action", "missing field 'action'"),
        ("action_probability", "missing field 'action_probability'"),
    ],
)
def test_missing_field(field, reason):
    bad = only_bad(PRE_DISCRETE, [pre_row(), pre_row(**{"sequence_number": 11, field: DROP})])
    assert (bad.location, bad.reason, bad.kind) == ("data.jsonl:2", reason, "missing_field")
    assert str(bad) == f"data.jsonl:2: {reason}"
    assert field not in bad.row  # the row as it was read, for the quarantine


def test_null_counts_as_missing():
    bad = only_bad(TIMELINE_DISCRETE, [timeline_row(next_state_features=None)])
    assert bad.reason == "missing field 'next_state_features'"


def test_pre_timeline_reward_may_come_from_metrics_but_not_from_nothing():
    good, bad = validate(
        PRE_DISCRETE,
        [
            pre_row(reward=DROP),
            pre_row(sequence_number=11, reward=DROP, metrics=DROP),
        ],
    )
    assert good.num_rows == 1
    assert [str(row) for row in bad] == [
        "data.jsonl:2: missing field 'reward' (or a 'metrics' map to compute it from)"
    ]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (
            {"sequence_number": "ten"},
            "field 'sequence_number': expected an integer, found 'ten' (str)",
        ),
        ({"sequence_number": 10.5}, "field 'sequence_number': expected an integer, found 10.5"),
        ({"sequence_number": True}, "field 'sequence_number': expected an integer, found True"),
        (
            {"state_features": {"0": 1.0, "1": "high"}},
            "field 'state_features': feature '1': expected a number, found 'high' (str)",
        ),
        (
            {"state_features": [1.0, 2.0]},
            "field 'state_features': expected a map of feature id -> number, found list",
        ),
        ({"mdp_id": ["a"]}, "field 'mdp_id': expected a string, found ['a'] (list)"),
        ({"reward": "1.0"}, "field 'reward': expected a number, found '1.0' (str)"),
        ({"possible_actions": "0,1"}, "field 'possible_actions': expected a list of action"),
        ({"action": {"0": 1.0}}, "field 'action': expected a string, found {'0': 1.0} (dict)"),
    ],
)
def test_wrong_type(changes, reason):
    bad = only_bad(PRE_DISCRETE, [pre_row(), pre_row(**{"sequence_number": 11, **changes})])
    assert bad.location == "data.jsonl:2"
    assert bad.reason.startswith(reason)
    assert bad.kind == "wrong_type"


def test_whole_numbers_and_integer_ids_are_accepted():
    shaped = RowShaper(PRE_DISCRETE).shape(
        located([pre_row(mdp_id=7, sequence_number=3.0, action=1, possible_actions=[0, 1])])
    )
    assert shaped.bad_rows == []
    row = shaped.table.to_pylist()[0]
    assert (row["mdp_id"], row["sequence_number"], row["action"]) == ("7", 3, "1")
    assert row["possible_actions"] == ["0", "1"]


def test_values_arrow_cannot_hold_reject_the_row_not_the_batch():
    good, bad = validate(
        TIMELINE_DISCRETE,
        [
            timeline_row(),
            timeline_row(sequence_number=2**63),
            timeline_row(sequence_number=122, reward=10**400),
            timeline_row(sequence_number=123, possible_actions=[1, 2]),
        ],
    )
    assert good.num_rows == 1
    assert [(row.location, row.kind, row.reason) for row in bad] == [
        (
            "data.jsonl:2",
            "bad_value",
            "field 'sequence_number': expected a 64-bit integer, found 9223372036854775808",
        ),
        (
            "data.jsonl:3",
            "bad_value",
            "field 'reward': expected a number, found an integer too large for a float",
        ),
        ("data.jsonl:4", "bad_value", "field 'possible_actions': item 1: expected 0 or 1, found 2"),
    ]


def test_a_line_that_is_not_an_object():
    bad = only_bad(PRE_DISCRETE, [pre_row(), [1, 2]])
    assert (bad.location, bad.reason, bad.kind) == (
        "data.jsonl:2",
        "expected a JSON object, found list",
        "not_an_object",
    )


def test_unknown_fields_are_counted_not_dropped_silently():
    shaped = RowShaper(PRE_DISCRETE).shape(
        located([pre_row(extra=1), pre_row(sequence_number=11, extra=2, other="x")])
    )
    assert shaped.bad_rows == []
    assert shaped.ignored_fields == {"extra": 2, "other": 1}


# Values: RowChecker ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('"state_features": {"0": 1.0, "1": NaN}', "'state_features' feature '1' is nan"),
        ('"state_features": {"0": Infinity}', "'state_features' feature '0' is inf"),
        ('"next_state_features": {"0": -Infinity}', "'next_state_features' feature '0' is -inf"),
        ('"metrics": {"reward": NaN}', "'metrics' feature 'reward' is nan"),
        ('"reward": Infinity', "'reward' is inf"),
    ],
)
def test_nan_and_infinity(line, reason):
    # Python's json reads NaN and Infinity; the row shapes, and the checker rejects it.
    changes = json.loads("{" + line + "}")
    bad = only_bad(TIMELINE_DISCRETE, [timeline_row(), timeline_row(sequence_number=2, **changes)])
    assert (bad.location, bad.reason, bad.kind) == ("data.jsonl:2", reason, "non_finite")


def test_nan_in_a_continuous_action():
    bad = only_bad(
        TIMELINE_CONTINUOUS,
        [
            timeline_row(action={"3": 0.5}, next_action={"3": 0.1}, possible_actions=DROP),
            timeline_row(sequence_number=2, action={"3": float("nan")}, next_action={"3": 0.1}),
        ],
    )
    assert (bad.location, bad.reason) == ("data.jsonl:2", "'action' feature '3' is nan")


BEYOND_FLOAT32 = "beyond the 3.4e+38 in magnitude that training's float32 tensors hold"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"state_features": {"0": 1.0, "1": 1e308}}, "'state_features' feature '1' is 1e+308"),
        ({"next_state_features": {"0": -4e38}}, "'next_state_features' feature '0' is -4e+38"),
        ({"metrics": {"reward": 1e300}}, "'metrics' feature 'reward' is 1e+300"),
        ({"reward": -1e39}, "'reward' is -1e+39"),
    ],
)
def test_finite_values_too_large_for_float32(changes, reason):
    bad = only_bad(TIMELINE_DISCRETE, [timeline_row(), timeline_row(sequence_number=2, **changes)])
    assert (bad.location, bad.reason, bad.kind) == (
        "data.jsonl:2",
        f"{reason}, {BEYOND_FLOAT32}",
        "out_of_range",
    )


def test_the_largest_float32_is_fine():
    largest = 3.4028234663852886e38
    good, bad = validate(TIMELINE_DISCRETE, [timeline_row(state_features={"0": -largest})])
    assert (good.num_rows, bad) == (1, [])


@pytest.mark.parametrize(
    ("column", "value", "kind"),
    [
        ("possible_actions", float("nan"), "non_finite"),
        ("possible_next_actions", 1e39, "out_of_range"),
    ],
)
def test_parametric_candidates_are_checked_like_features(column, value, kind):
    candidates = [{"4": 1.0}, {"5": 1.0, "6": value}]
    bad = only_bad(
        TIMELINE_PARAMETRIC,
        [parametric_row(), parametric_row(sequence_number=2, **{column: candidates})],
    )
    assert (bad.location, bad.kind) == ("data.jsonl:2", kind)
    assert bad.reason.startswith(f"'{column}' feature '6' is {value!r}")


@pytest.mark.parametrize(
    ("probability", "reason"),
    [
        (0, "'action_probability' must be in (0, 1], found 0.0"),
        (1.5, "'action_probability' must be in (0, 1], found 1.5"),
        (-0.1, "'action_probability' must be in (0, 1], found -0.1"),
    ],
)
def test_probability_outside_zero_one(probability, reason):
    bad = only_bad(
        PRE_DISCRETE, [pre_row(), pre_row(sequence_number=11, action_probability=probability)]
    )
    assert (bad.location, bad.reason, bad.kind) == ("data.jsonl:2", reason, "bad_probability")


def test_probability_one_is_fine_and_propensity_is_read_as_action_probability():
    good, bad = validate(
        PRE_DISCRETE,
        [
            pre_row(action_probability=1.0),
            pre_row(sequence_number=11, action_probability=DROP, propensity=0.25),
        ],
    )
    assert bad == []
    assert good["action_probability"].to_pylist() == [1.0, 0.25]


def test_action_not_among_discrete_names():
    bad = only_bad(PRE_DISCRETE, [pre_row(), pre_row(sequence_number=11, action="2")])
    assert (bad.location, bad.kind) == ("data.jsonl:2", "impossible_action")
    assert bad.reason == "action '2' is not in possible_actions ['0', '1']"


@pytest.mark.parametrize(
    ("action", "possible", "reason"),
    [
        (1, [1, 0], "action 1 is not possible: possible_actions [1, 0] has a 0 at index 1"),
        (0, [0, 0], "action 0 is not possible: possible_actions [0, 0] has a 0 at index 0"),
        (2, [1, 1], "action 2 is not possible: possible_actions [1, 1] has no entry at index 2"),
        (-1, [1, 1], "action -1 is not possible: possible_actions [1, 1] has no entry at index -1"),
    ],
)
def test_action_not_allowed_by_the_timeline_mask(action, possible, reason):
    rows = [
        timeline_row(),
        timeline_row(sequence_number=2, action=action, possible_actions=possible),
    ]
    bad = only_bad(TIMELINE_DISCRETE, rows)
    assert (bad.location, bad.reason, bad.kind) == ("data.jsonl:2", reason, "impossible_action")


def test_action_not_among_parametric_maps():
    rows = [parametric_row(), parametric_row(sequence_number=2, action={"4": 0.5})]
    bad = only_bad(TIMELINE_PARAMETRIC, rows)
    assert bad.location == "data.jsonl:2"
    assert bad.reason == "action {'4': 0.5} is not in possible_actions [{'4': 1.0}, {'5': 1.0}]"


def test_unrecorded_possible_actions_are_not_checked():
    # Horizon wrote an empty list on the last row of each parametric episode; a missing list
    # or an empty one says nothing about the action.
    good, bad = validate(
        TIMELINE_PARAMETRIC,
        [
            parametric_row(possible_actions=[]),
            parametric_row(sequence_number=2, possible_actions=DROP),
        ],
    )
    assert bad == []
    assert good.num_rows == 2
    good, bad = validate(TIMELINE_DISCRETE, [timeline_row(possible_actions=[])])
    assert (good.num_rows, bad) == (1, [])


def test_duplicate_key_in_one_batch():
    bad = only_bad(PRE_DISCRETE, [pre_row(), pre_row(sequence_number=11), pre_row()])
    assert (bad.location, bad.kind) == ("data.jsonl:3", "duplicate")
    assert bad.reason == "duplicate (mdp_id, sequence_number) = ('0', 10)"


def test_duplicate_key_across_batches():
    checker = RowChecker(PRE_DISCRETE)
    shaper = RowShaper(PRE_DISCRETE)
    first = shaper.shape(located([pre_row(), pre_row(sequence_number=11)], "a.jsonl"))
    second = shaper.shape(located([pre_row(sequence_number=12), pre_row()], "b.jsonl"))
    good, bad = checker.check(first.table, first.locations)
    assert (good.num_rows, bad) == (2, [])
    good, bad = checker.check(second.table, second.locations)
    assert good.num_rows == 1
    assert [str(row) for row in bad] == [
        "b.jsonl:2: duplicate (mdp_id, sequence_number) = ('0', 10)"
    ]


def test_one_reason_per_row_and_rows_read_back_as_json_rows():
    good, bad = validate(
        PRE_DISCRETE,
        [pre_row(), pre_row(sequence_number=11, action_probability=2.0, action="9")],
    )
    assert good.num_rows == 1
    assert len(bad) == 1
    assert bad[0].kind == "bad_probability"
    # Maps come back as dicts, so the quarantine holds the row as it looked in the input.
    assert bad[0].row["state_features"] == {"0": -0.032, "1": -0.0163}
    assert bad[0].row["action"] == "9"


def test_checker_handles_nulls_in_columns_read_from_parquet():
    # A user's Parquet file can hold nulls where JSON rows would have been rejected earlier.
    shaped = RowShaper(TIMELINE_DISCRETE).shape(located([timeline_row()]))
    table = shaped.table.set_column(
        shaped.table.schema.get_field_index("action"), "action", pa.array([None], pa.int64())
    )
    good, bad = RowChecker(TIMELINE_DISCRETE).check(table, ["user.parquet:row 0"])
    assert good.num_rows == 0
    assert [str(row) for row in bad] == ["user.parquet:row 0: missing field 'action'"]


# Layouts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ALL_LAYOUTS, ids=str)
def test_every_layout_has_a_valid_arrow_schema_that_records_it(layout, tmp_path):
    schema = layout.schema
    assert isinstance(schema, pa.Schema)
    assert schema.metadata == {
        b"horizon.row_format": layout.row_format.value.encode(),
        b"horizon.action_type": layout.action_type.value.encode(),
    }
    assert schema.field("state_features").type == FEATURES
    timeline = layout.row_format is RowFormat.TIMELINE
    assert ("next_state_features" in schema.names) is timeline
    has_possible = layout.action_type is not ActionType.CONTINUOUS
    assert ("possible_actions" in schema.names) is has_possible
    pq.write_table(schema.empty_table(), tmp_path / "empty.parquet")
    read_back = pq.read_schema(tmp_path / "empty.parquet")
    assert RowLayout.from_schema(read_back, "empty.parquet") == layout


def test_action_types_by_layout():
    assert PRE_DISCRETE.schema.field("action").type == pa.string()
    assert TIMELINE_DISCRETE.schema.field("action").type == pa.int64()
    assert TIMELINE_DISCRETE.schema.field("possible_actions").type == pa.list_(pa.int8())
    assert PRE_PARAMETRIC.schema.field("possible_actions").type == pa.list_(FEATURES)
    assert TIMELINE_CONTINUOUS.schema.field("next_action").type == FEATURES


def test_schema_without_layout_metadata_is_an_error_naming_the_file():
    with pytest.raises(HorizonError, match=r"^user\.parquet: no Horizon row layout"):
        RowLayout.from_schema(pa.schema([("mdp_id", pa.string())]), "user.parquet")


@pytest.mark.parametrize(
    ("row", "layout"),
    [
        (pre_row(), PRE_DISCRETE),
        (pre_row(action={"4": 1.0}, possible_actions=[{"4": 1.0}]), PRE_PARAMETRIC),
        (pre_row(action={"3": 0.5}, possible_actions=DROP), PRE_CONTINUOUS),
        (timeline_row(), TIMELINE_DISCRETE),
        (parametric_row(), TIMELINE_PARAMETRIC),
        (timeline_row(action={"3": 0.5}, possible_actions=DROP), TIMELINE_CONTINUOUS),
    ],
    ids=str,
)
def test_detect_layout(row, layout):
    assert detect_layout(row, "auto", "auto") == layout


def test_configured_layout_overrides_detection():
    assert detect_layout(pre_row(), "timeline", "auto") == TIMELINE_DISCRETE
    assert detect_layout(timeline_row(), "auto", "parametric") == TIMELINE_PARAMETRIC


# not_terminal ------------------------------------------------------------------------------


def _not_terminal(layout: RowLayout, rows: list[dict[str, Any]]) -> list[bool]:
    shaped = RowShaper(layout).shape(located(rows))
    assert shaped.bad_rows == []
    return derive_not_terminal(shaped.table, layout)["not_terminal"].to_pylist()


def test_not_terminal_from_the_discrete_mask():
    rows = [
        timeline_row(),
        timeline_row(sequence_number=2, possible_next_actions=[0, 0]),
        timeline_row(sequence_number=3, possible_next_actions=[0, 1]),
        timeline_row(sequence_number=4, possible_next_actions=[0, 0], not_terminal=True),
    ]
    assert _not_terminal(TIMELINE_DISCRETE, rows) == [True, False, True, True]


def test_not_terminal_from_the_parametric_list():
    rows = [parametric_row(), parametric_row(sequence_number=2, possible_next_actions=[])]
    assert _not_terminal(TIMELINE_PARAMETRIC, rows) == [True, False]


def test_not_terminal_from_an_empty_next_state_where_no_next_actions_are_recorded():
    rows = [
        timeline_row(possible_next_actions=DROP),
        timeline_row(sequence_number=2, possible_next_actions=DROP, next_state_features={}),
    ]
    assert _not_terminal(TIMELINE_DISCRETE, rows) == [True, False]
    continuous = [
        timeline_row(action={"3": 0.5}, next_action={"3": 0.1}, possible_actions=DROP),
        timeline_row(
            sequence_number=2,
            action={"3": 0.5},
            next_action={"3": 0.1},
            next_state_features={},
        ),
    ]
    assert _not_terminal(TIMELINE_CONTINUOUS, continuous) == [True, False]


def test_pre_timeline_rows_are_left_alone():
    table = RowShaper(PRE_DISCRETE).shape(located([pre_row()])).table
    assert derive_not_terminal(table, PRE_DISCRETE) is table
