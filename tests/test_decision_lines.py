"""``decision_lines``, the JSONL log's lines made without a dict per row, against what
``json_line`` makes of ``decision_rows``' rows for the same decisions (Hypothesis, marker
``fuzz``): the same bytes whenever orjson writes every value, and the same JSON values in the
same order when Python's ``json`` writes one that orjson refuses (an integer beyond 64 bits);
and ``horizon serve``'s answers, put together from a template from ``LINES_ROWS`` rows, are
the JSON of the dicts they replaced, for action names that need escaping and a ``%`` that the
template must not read."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient
from test_serve_hostile import tiny_model

from horizon_plugins_serving import decision_log
from horizon_plugins_serving.decision_log import (
    DecisionLog,
    decision_lines,
    decision_rows,
    json_line,
    read_decisions,
)
from horizon_plugins_serving.predictor import Predictor
from horizon_plugins_serving.server import LINES_ROWS, build_app

NOW = datetime(2026, 12, 2, 7, 35, 1, 123456, tzinfo=UTC)

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)  # as the door lets in
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(min_value=-(10**39), max_value=10**39),  # beyond 64 bits: Python's json
)
states = st.dictionaries(texts, values, max_size=4)
possible = st.one_of(st.none(), st.lists(texts, max_size=3))
percents = st.sampled_from(["50%", "%s", "%%d"])  # text a bytes template must not read


@st.composite
def batches(draw: st.DrawFn) -> dict:
    count = draw(st.integers(0, 5))
    column = lambda strategy: draw(st.lists(strategy, min_size=count, max_size=count))  # noqa: E731
    return {
        "states": column(states),
        "actions": column(st.one_of(texts, st.dictionaries(texts, values, max_size=2))),
        "propensities": column(st.floats(0.0, 1.0)),
        "model_id": draw(st.one_of(texts, percents)),
        "possible_actions": draw(st.one_of(st.none(), st.just(column(possible)))),
        "all_actions": draw(st.lists(texts, max_size=3)),
        "mdp_ids": draw(st.one_of(st.none(), st.just(column(st.one_of(st.none(), texts))))),
        "sequence_numbers": draw(
            st.one_of(
                st.none(), st.just(column(st.integers(min_value=-(2**63), max_value=2**63 - 1)))
            )
        ),
        "policy": draw(st.one_of(st.none(), texts, percents)),
    }


def counted_ids(count: int) -> list[str]:
    """Decision ids 0, 1, 2, ... (as 32 hex digits), the same for both encodings."""
    return [f"{i:032x}" for i in range(count)]


@pytest.mark.fuzz
@given(batch=batches())
def test_decision_lines_are_json_line_of_decision_rows(batch):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decision_log, "decision_ids", counted_ids)
        expected = b"".join(json_line(row) for row in decision_rows(**batch, now=NOW))
        lines = decision_lines(**batch, now=NOW)
    assert [json.loads(line) for line in lines.data.splitlines()] == [
        json.loads(line) for line in expected.splitlines()
    ]
    assert [list(json.loads(line)) for line in lines.data.splitlines()] == [
        list(json.loads(line)) for line in expected.splitlines()
    ]
    beyond_64_bits = any(
        isinstance(value, int) and not -(2**63) <= value < 2**64
        for state in batch["states"] + [a for a in batch["actions"] if isinstance(a, dict)]
        for value in state.values()
    )
    if not beyond_64_bits:
        assert lines.data == expected
    assert lines.ids == counted_ids(len(batch["states"]))
    assert lines.timestamp == NOW.isoformat()


@pytest.mark.parametrize("count", [2, LINES_ROWS])
def test_answers_put_together_from_a_template_are_the_json_of_their_dicts(tmp_path, count):
    model = tiny_model(tmp_path / "model.onnx")
    predictor = Predictor(model)
    names = ['50% "off"', "\u00e9\\n"]  # a quote, a backslash, a non-ASCII letter and a %
    predictor.actions = names
    predictor.action_index = {name: index for index, name in enumerate(names)}
    predictor.action_names = np.array(names, dtype=object)
    rows = [{"state_features": {"0": 0.5, "1": -1e-5}}, {"state_features": {"2": 3e20}}]
    rows = (rows * count)[:count]
    with TestClient(build_app(predictor, DecisionLog(tmp_path / "d.jsonl"))) as client:
        answer = client.post("/decisions", json={"rows": rows})
    assert answer.status_code == 200, answer.text
    decisions = answer.json()["decisions"]
    logged = read_decisions(tmp_path / "d.jsonl").rows
    scores = predictor.predict([row["state_features"] for row in rows]).scores.tolist()
    assert decisions == [
        {
            "decision_id": row["decision_id"],
            "action": row["action"],
            "action_probability": row["action_probability"],
            "timestamp": row["timestamp"],
            "scores": dict(zip(names, row_scores, strict=True)),
        }
        for row, row_scores in zip(logged, scores, strict=True)
    ]
    assert [row["possible_actions"] for row in logged] == [names] * count
