"""``horizon serve``'s batch-wide paths decide and refuse exactly as the one-value-at-a-time
paths they stand in front of: feature maps made into dense arrays by ``itemgetter`` and
``numpy.fromiter`` (a column at a time for a tall batch) equal the arrays filled a feature at a
time, bit for bit, on rows with missing, unknown, integer and huge values, so scores and
propensities are the same; a batch's rows are refused with the first bad row's index and
reason, as the per-row check gives them; the prefilter in front of the long-integer regular
expression sends every body it matches to it; decision ids set the uuid4 bits as ``uuid``
does."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_serve_hostile import tiny_model

from horizon_plugins_serving import decision_log
from horizon_plugins_serving.decision_log import decision_ids
from horizon_plugins_serving.predictor import (
    BATCH_CHECK_ROWS,
    COLUMN_WISE_ROWS,
    FeatureColumns,
    Predictor,
)
from horizon_plugins_serving.request_body import LONG_DIGITS, _has_long_integer

IDS = ["0", "1", "2", "3"]

numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.floats(-1e6, 1e6),
    st.integers(-(2**70), 2**70),
)
feature_maps = st.dictionaries(st.sampled_from([*IDS, "unknown", "é"]), numbers, max_size=6)
full_maps = st.fixed_dictionaries({feature: numbers for feature in IDS})


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model.onnx")


def same_arrays(left: tuple[np.ndarray, ...], right: tuple[np.ndarray, ...]) -> bool:
    return all(
        a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(left, right, strict=True)
    )


@pytest.mark.fuzz
@given(maps=st.lists(st.one_of(full_maps, feature_maps), max_size=20))
def test_dense_arrays_equal_those_filled_a_feature_at_a_time(maps):
    columns = FeatureColumns(IDS)
    shape = (len(maps), len(IDS))
    assert same_arrays(columns.arrays(maps), columns._one_at_a_time(maps, shape))


@pytest.mark.fuzz
@given(maps=st.lists(st.one_of(full_maps, full_maps, feature_maps), min_size=1, max_size=8))
def test_a_tall_batch_read_a_column_at_a_time_equals_the_arrays_filled_a_feature_at_a_time(
    maps,
):
    tall = maps * math.ceil(COLUMN_WISE_ROWS / len(maps))
    columns = FeatureColumns(IDS)
    shape = (len(tall), len(IDS))
    assert same_arrays(columns.arrays(tall), columns._one_at_a_time(tall, shape))


@pytest.mark.parametrize("ids", [[], ["a"]])
def test_dense_arrays_of_no_feature_and_of_one(ids):
    columns = FeatureColumns(ids)
    maps = [{"a": 2.5, "b": 1.0}, {"a": 3}, {"b": 1.0}]
    assert same_arrays(columns.arrays(maps), columns._one_at_a_time(maps, (3, len(ids))))


def test_a_value_that_is_not_a_number_raises_as_it_did():
    columns = FeatureColumns(IDS)
    with pytest.raises(ValueError, match="could not convert string to float"):
        columns.arrays([dict.fromkeys(IDS, 1.0), {**dict.fromkeys(IDS, 1.0), "2": "x"}])


@pytest.mark.parametrize("policy", ["greedy", "epsilon_greedy", "softmax"])
def test_scores_and_propensities_are_those_of_the_one_at_a_time_arrays(model, policy):
    """A batch with every feature and one with some missing, through the fast path and through
    a Predictor whose maps are all made a feature at a time: the same draws, to the bit."""
    from horizon_engine import Exploration

    exploration = Exploration(policy, epsilon=0.3, temperature=0.7)
    rng = np.random.default_rng(7)
    full = [dict(zip(IDS, map(float, row), strict=True)) for row in rng.normal(size=(300, 4))]
    sparse = [{k: v for k, v in row.items() if rng.random() < 0.7} for row in full]
    for rows in (full, sparse):
        fast, slow = (Predictor(model, exploration, seed=3) for _ in range(2))
        slow.state_columns._every = None
        ours, theirs = fast.predict(rows), slow.predict(rows)
        assert ours.scores.tobytes() == theirs.scores.tobytes()
        assert ours.propensities.tobytes() == theirs.propensities.tobytes()
        assert ours.actions == theirs.actions and all(type(a) is str for a in ours.actions)


good_row = st.fixed_dictionaries(
    {"state_features": st.one_of(full_maps, st.dictionaries(st.sampled_from(IDS), numbers))},
    optional={
        "mdp_id": st.text(max_size=3),
        "sequence_number": st.integers(-5, 5),
        "possible_actions": st.lists(st.sampled_from(["0", "1"]), max_size=2),
    },
)
HOSTILE_VALUES = [math.nan, math.inf, -math.inf, 1e39, -(10**39), 10**400, True, None, "1.5", [1]]
hostile_value = st.one_of(
    st.sampled_from(HOSTILE_VALUES),
    numbers,
    st.lists(st.integers(), max_size=1),
)
hostile_row = st.one_of(
    st.builds(
        lambda row, key, value: {**row, "state_features": {**row["state_features"], key: value}},
        good_row,
        st.sampled_from(["0", "3", "unknown", "é", "\ud800"]),
        hostile_value,
    ),
    st.builds(lambda row, mdp: {**row, "mdp_id": mdp}, good_row, st.sampled_from([3, "\udfff"])),
    st.builds(lambda row: {**row, "possible_actions": ["9"]}, good_row),
    st.builds(lambda row: {**row, "sequence_number": 2**64}, good_row),
    st.sampled_from([[], "row", None, {"state_features": [1.0]}, {"rows": 1}]),
)


@pytest.fixture(scope="module")
def predictors(model) -> dict[bool, Predictor]:
    return {strict: Predictor(model, strict_features=strict) for strict in (False, True)}


@pytest.mark.fuzz
@given(rows=st.lists(st.one_of(good_row, hostile_row), max_size=12), strict=st.booleans())
def test_a_batch_is_refused_at_its_first_bad_row_with_the_per_row_reason(predictors, rows, strict):
    predictor = predictors[strict]
    expected = next(
        (
            (number, problem)
            for number, row in enumerate(rows)
            if (problem := predictor.row_problem(row))
        ),
        None,
    )
    assert predictor.rows_problem(rows) == expected


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("key", ["0", "unknown"])
def test_each_bad_value_in_a_batch_of_good_rows_is_refused_as_alone(predictors, key, value):
    good = {"state_features": dict.fromkeys(IDS, 0.5), "mdp_id": "a"}
    rows = [good] * BATCH_CHECK_ROWS + [{"state_features": {**good["state_features"], key: value}}]
    problem = predictors[False].row_problem(rows[-1])
    assert problem is not None
    assert predictors[False].rows_problem(rows) == (BATCH_CHECK_ROWS, problem)


def test_a_bad_value_after_good_rows_is_named_by_its_row(model):
    rows = [{"state_features": {"0": 1.0}}] * 3 + [{"state_features": {"1": float("nan")}}]
    assert Predictor(model).rows_problem(rows) == (
        3,
        "state feature '1': expected a finite number, found nan",
    )


@pytest.mark.fuzz
@given(body=st.binary(max_size=80) | st.text("0123456789.eE-x ,[]", max_size=120).map(str.encode))
def test_the_long_integer_prefilter_sends_every_match_to_the_regex(body):
    assert _has_long_integer(body) == (LONG_DIGITS.search(body) is not None)


@pytest.mark.parametrize(
    "body", [b"1234567890123456789", b"[-12345678901234567890]", b'{"a": 0.1234567890123456789}']
)
def test_the_long_integer_prefilter_on_runs_at_the_edges(body):
    assert _has_long_integer(body) == (LONG_DIGITS.search(body) is not None)


def test_decision_ids_set_the_uuid4_bits_as_uuid_does(monkeypatch):
    randomness = np.random.default_rng(0).bytes(16 * 50)
    monkeypatch.setattr(decision_log.RANDOM, "take", lambda size: randomness[:size])
    expected = [uuid.UUID(bytes=randomness[i : i + 16], version=4).hex for i in range(0, 800, 16)]
    assert decision_ids(50) == expected


def test_decision_rows_keep_each_rows_possible_actions_and_key_order():
    """Built a column at a time: a row without possible actions among rows with them logs
    ``all_actions``, or none when there are none (a continuous action), and keys keep their
    order, ``policy`` last."""
    from datetime import UTC, datetime

    from horizon_plugins_serving.decision_log import decision_rows

    states, actions = [{"a": 1.0}, {"a": 2.0}], ["x", "y"]
    now = datetime(2020, 1, 2, tzinfo=UTC)
    mixed = decision_rows(states, actions, np.array([0.5, 1], np.float32), "m", [None, ["x"]])
    assert "possible_actions" not in mixed[0] and mixed[1]["possible_actions"] == ["x"]
    listed = decision_rows(states, actions, [0.5, 1], "m", [None, ["x"]], ["x", "y"], now=now)
    assert [row["possible_actions"] for row in listed] == [["x", "y"], ["x"]]
    rows = decision_rows(states, actions, [0.25, 1], "m", None, (), ["u", None], [3, 4], now, "p")
    assert list(rows[0]) == [
        "ds", "mdp_id", "sequence_number", "state_features", "action", "action_probability",
        "decision_id", "model_id", "timestamp", "policy",
    ]  # fmt: skip
    assert [row["mdp_id"] for row in rows] == ["u", rows[1]["decision_id"]]
    assert [type(row["action_probability"]) for row in rows] == [float, float]
    with pytest.raises(ValueError):
        decision_rows(states, actions[:1], [0.5, 1], "m")


def test_a_wide_request_is_answered_and_logged_as_its_rows_score_one_by_one(model, tmp_path):
    """64 rows, some missing features, some with mdp_ids, through POST /decisions: each answer's
    scores are those of the row scored alone, and the log holds every answered row, in order,
    once the server has stopped."""
    from starlette.testclient import TestClient

    from horizon_plugins_serving.decision_log import DecisionLog, read_decisions
    from horizon_plugins_serving.server import build_app

    rng = np.random.default_rng(5)
    rows = [
        {"state_features": {k: float(v) for k, v in zip(IDS, values, strict=True) if v > -1.5}}
        | ({"mdp_id": f"u{number}"} if number % 3 == 0 else {})
        for number, values in enumerate(rng.normal(size=(64, 4)))
    ]
    predictor = Predictor(model)
    with TestClient(build_app(predictor, DecisionLog(tmp_path / "d.jsonl"))) as client:
        answer = client.post("/decisions", json={"rows": rows})
    assert answer.status_code == 200, answer.text
    decisions = answer.json()["decisions"]
    alone = [predictor.predict([row["state_features"]]).scores[0] for row in rows]
    assert [list(d["scores"].values()) for d in decisions] == [s.tolist() for s in alone]
    logged = read_decisions(tmp_path / "d.jsonl").rows
    assert [row["decision_id"] for row in logged] == [d["decision_id"] for d in decisions]
    assert [row["state_features"] for row in logged] == [row["state_features"] for row in rows]
