"""Property-based tests of ``horizon serve``'s request reading (Hypothesis, marker ``fuzz``):
arbitrary bodies, wrong types, NaN and Infinity, huge numbers, deep nesting, surrogate escapes,
truncated JSON and wrong content types each end in a 200 with one decision a row or a JSON 4xx
whose error names the place, never a 500; and the decisions logged are the decisions answered."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_serve_hostile import tiny_model

from horizon_plugins_serving.decision_log import DecisionLog, read_decisions
from horizon_plugins_serving.predictor import Predictor
from horizon_plugins_serving.server import build_app

pytestmark = pytest.mark.fuzz

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**60), max_value=10**60),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
keys = st.one_of(st.sampled_from(["0", "1", "2", "3"]), st.text(max_size=4))
rows = st.one_of(
    st.fixed_dictionaries(
        {"state_features": st.dictionaries(keys, numbers, max_size=5)},
        optional={
            "mdp_id": st.one_of(st.text(max_size=5), st.integers(), st.none()),
            "sequence_number": st.one_of(st.integers(), st.floats(), st.text(max_size=2)),
            "possible_actions": st.one_of(
                st.lists(st.sampled_from(["0", "1", "2"]), max_size=3), st.text(max_size=2)
            ),
        },
    ),
    st.integers(),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
)


def encoded(payload: object) -> bytes:
    return json.dumps(payload).encode()  # NaN and Infinity as Python writes them


def nested(depth: int) -> bytes:
    return b'{"rows": ' + b"[" * depth + b"]" * depth + b"}"


def mangled(body: bytes, cut: int, junk: bytes) -> bytes:
    return body[: cut % (len(body) + 1)] + junk


bodies = st.one_of(
    st.builds(lambda r: encoded({"rows": r}), st.lists(rows, max_size=4)),
    st.builds(encoded, st.one_of(rows, st.lists(rows, max_size=2), st.none())),
    st.builds(nested, st.integers(1, 200_000)),
    st.builds(
        lambda digits, sign: (
            f'{{"rows": [{{"state_features": {{"0": {sign}{"9" * digits}}}}}]}}'.encode()
        ),
        st.integers(1, 5000),
        st.sampled_from(["", "-"]),
    ),
    st.builds(
        lambda escape, where: (
            '{"rows": [{"state_features": {"KEY": 1.0}, "mdp_id": "ID"}]}'.replace(
                where, escape
            ).encode()
        ),
        st.sampled_from(["\\ud800", "\\udfff", "a\\ud83d", "\\ud83d\\ude00"]),
        st.sampled_from(["KEY", "ID"]),
    ),
    st.builds(
        mangled,
        st.builds(lambda r: encoded({"rows": r}), st.lists(rows, max_size=2)),
        st.integers(0, 400),
        st.binary(max_size=4),
    ),
    st.binary(max_size=64),
)
FIELDS = (
    "rows",
    "row",
    "state_features",
    "feature",
    "mdp_id",
    "sequence_number",
    "possible_actions",
    "possible_action",
    "other",
)
"""Where ``deep_body`` puts its nested value: the body's ``rows``, a row, a row's field, a
value inside ``state_features`` or ``possible_actions``, a field no row has."""
LEAVES = ("1", '"0"', "null", "[]", "{}", "1e400")


def deep_value(levels: list[str], depth: int, leaf: str) -> str:
    """A JSON value ``depth`` containers deep, each a list or an object by ``levels`` in turn."""
    kinds = [levels[level % len(levels)] for level in range(depth)]
    opening = "".join("[" if kind == "list" else '{"0": ' for kind in kinds)
    closing = "".join("]" if kind == "list" else "}" for kind in reversed(kinds))
    return opening + leaf + closing


def deep_body(field: str, value: str) -> bytes:
    """A request body holding ``value`` at ``field`` (``FIELDS``), the rest of it good."""
    row = {
        "row": value,
        "state_features": f'{{"state_features": {value}}}',
        "feature": f'{{"state_features": {{"0": {value}}}}}',
        "possible_action": f'{{"state_features": {{"0": 1}}, "possible_actions": ["0", {value}]}}',
    }.get(field, f'{{"state_features": {{"0": 1}}, "{field}": {value}}}')
    return (f'{{"rows": {value}}}' if field == "rows" else f'{{"rows": [{row}]}}').encode()


deep_bodies = st.builds(
    deep_body,
    st.sampled_from(FIELDS),
    st.builds(
        deep_value,
        st.lists(st.sampled_from(["list", "object"]), min_size=1, max_size=3),
        st.one_of(st.integers(0, 40), st.integers(990, 1100), st.integers(1101, 5000)),
        st.sampled_from(LEAVES),
    ),
)
content_types = st.sampled_from(
    ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("fuzz")
    log = folder / "decisions.jsonl"
    app = build_app(Predictor(tiny_model(folder / "model.onnx")), DecisionLog(log))
    with TestClient(app) as client:
        yield client, log


@given(body=bodies, content_type=content_types)
def test_every_body_gets_decisions_or_a_json_4xx_naming_the_place(served, body, content_type):
    client, log = served
    before = len(read_decisions(log).rows)
    answer = client.post("/decisions", content=body, headers={"content-type": content_type})
    assert answer.status_code in (200, 400, 413, 422), answer.text
    payload = answer.json()
    logged = len(read_decisions(log).rows) - before
    if answer.status_code == 200:
        assert logged == len(payload["decisions"]) == len(json.loads(body)["rows"])
    else:
        assert logged == 0
        error = payload["error"]
        assert error.startswith(("body", "row ", "expected", "Content-Length")) or "rows" in error


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (nested(100_000), "body is nested too deep"),
        (b'{"rows": [{"state_features": {"0": ' + b"9" * 400 + b"}}]}", "integer of 400 digits"),
        (b'{"rows": [{"state_features": {"0": NaN}}]}', "body has NaN"),
        (b'{"rows": [{"state_features": {"0": 1.0}, "mdp_id": "\\ud800"}]}', "rows[0].mdp_id"),
        (b'{"rows": [{"state_features": {"\\udfff": 1.0}}]}', "rows[0].state_features key"),
        (b'{"rows": [{"state_features": {"0": 1.0}}], "x": "\xff"}', "byte 49 is b'\\xff'"),
        (b'{"rows": [{"state_features": {"0": 1.0', "line 1 column 39"),
    ],
)
def test_the_door_refuses_with_a_reason_and_a_place(served, body, reason):
    client, _ = served
    answer = client.post("/decisions", content=body)
    assert answer.status_code == 400
    assert reason in answer.json()["error"]


@given(body=deep_bodies)
def test_any_depth_of_lists_and_objects_at_any_field_gets_decisions_or_a_4xx(served, body):
    """Nested about 1,000 deep (within orjson's 1,024) in ``mdp_id``, ``possible_actions`` or a
    feature, a value's ``repr`` in the row's reason raised ``RecursionError``: a 500."""
    client, log = served
    before = len(read_decisions(log).rows)
    answer = client.post("/decisions", content=body)
    assert answer.status_code in (200, 400, 422), answer.text
    logged = len(read_decisions(log).rows) - before
    assert logged == (len(answer.json()["decisions"]) if answer.status_code == 200 else 0)
    assert len(answer.content) < 1000  # the reason shows a nested value cut short


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("kind", ["list", "object"])
def test_a_value_nested_1000_deep_anywhere_gets_a_4xx_naming_the_row(served, field, kind):
    client, _ = served
    answer = client.post("/decisions", content=deep_body(field, deep_value([kind], 1000, "1")))
    if field == "other":  # a field no row has is not read
        assert answer.status_code == 200
    else:
        assert answer.status_code == 422, answer.text
        error = answer.json()["error"]
        assert error.startswith("row 0: ") or (field == "rows" and '{"rows": [row' in error)
