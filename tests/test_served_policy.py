"""``horizon serve`` and ``horizon score`` apply the policy a model was exported with (its card's
``[export]`` policy), each of ``--policy``, ``--epsilon``, ``--temperature`` given overriding
it; they say which policy applies and where it came from, and each logged row records it, in a
field ``horizon join`` and the pipeline's sources read as the log's own.

Before, both commands applied greedy unless told otherwise: a model exported (and evaluated by
CPE) as epsilon_greedy was served greedily, its logged propensities those of another policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient
from test_join import horizon, read_joined, write_jsonl
from test_policy_parity import FEATURES, HandWeightedDqn, export
from test_sources import run_source

from horizon_engine import Exploration, ModelCard, ModelCardError, model_card_from_metadata
from horizon_plugins_serving.decision_log import DecisionLog, read_decisions
from horizon_plugins_serving.predictor import Predictor
from horizon_plugins_serving.served_policy import CARD, DEFAULT, PolicyFlags, served_policy
from horizon_plugins_serving.server import build_app

EPSILON_CARD = ModelCard(
    feature_ids=("f0",),
    actions=("0", "1"),
    policy={"policy": "epsilon_greedy", "epsilon": 0.2, "temperature": 1.0},
)
SOFTMAX_CARD = ModelCard(
    feature_ids=("f0",),
    actions=("0", "1"),
    policy={"policy": "softmax", "epsilon": 0.0, "temperature": 0.5},
)
NO_POLICY_CARD = ModelCard(feature_ids=("f0",), actions=("0", "1"))


@pytest.mark.parametrize(
    ("card", "flags", "label", "sources"),
    [
        (
            EPSILON_CARD,
            PolicyFlags(),
            "epsilon_greedy(epsilon=0.2)",
            {"policy": CARD, "epsilon": CARD},
        ),
        (
            EPSILON_CARD,
            PolicyFlags(epsilon=0.3),
            "epsilon_greedy(epsilon=0.3)",
            {"policy": CARD, "epsilon": "--epsilon"},
        ),
        (
            EPSILON_CARD,
            PolicyFlags(policy="softmax"),
            "softmax(temperature=1.0)",
            {"policy": "--policy", "temperature": DEFAULT},
        ),
        (EPSILON_CARD, PolicyFlags(policy="greedy", epsilon=0.5), "greedy", {"policy": "--policy"}),
        (
            SOFTMAX_CARD,
            PolicyFlags(policy="epsilon_greedy"),
            "epsilon_greedy(epsilon=0.1)",  # the card's epsilon is not softmax's: the default
            {"policy": "--policy", "epsilon": DEFAULT},
        ),
        (
            SOFTMAX_CARD,
            PolicyFlags(),
            "softmax(temperature=0.5)",
            {"policy": CARD, "temperature": CARD},
        ),
        (NO_POLICY_CARD, PolicyFlags(), "greedy", {"policy": DEFAULT}),
        (
            NO_POLICY_CARD,
            PolicyFlags(policy="epsilon_greedy"),
            "epsilon_greedy(epsilon=0.1)",
            {"policy": "--policy", "epsilon": DEFAULT},
        ),
    ],
)
def test_each_setting_comes_from_its_flag_else_the_card_else_the_default(
    card, flags, label, sources
):
    served = served_policy(card, flags)
    assert served.label == label and served.sources == sources


def test_a_continuous_actor_is_served_its_own_action_whatever_the_flags():
    card = ModelCard(
        feature_ids=("f0",),
        action_feature_ids=("a",),
        action_type="continuous",
        policy={"policy": "softmax", "epsilon": 0.0, "temperature": 0.5},
    )
    served = served_policy(card, PolicyFlags(policy="epsilon_greedy"))
    assert served.label == "actor" and "does not apply" in served.describe()


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        ('{"policy": "boltzmann"}', "expected one of"),
        ('{"policy": "epsilon_greedy", "epsilon": 2}', "epsilon 2"),
        ('{"policy": "softmax", "temperature": "hot"}', "not a number"),
        ('{"policy": ["greedy"]}', "not a name"),
    ],
)
def test_a_card_recording_a_policy_no_exploration_can_apply_is_refused(policy, why):
    metadata = {"feature_ids": '["f0"]', "actions": '["0"]', "policy": policy}
    with pytest.raises(ModelCardError, match=f"m.onnx: model metadata 'policy' .*{why}"):
        model_card_from_metadata(metadata, "m.onnx")


def score_rows(folder: Path) -> Path:
    rows = [{"state_features": {"f0": float(x0), "f1": float(x1)}} for x0, x1 in FEATURES]
    return write_jsonl(folder / "rows.jsonl", rows)


def test_horizon_score_applies_and_logs_the_policy_the_model_was_exported_with(tmp_path):
    export(tmp_path, HandWeightedDqn(), policy="epsilon_greedy", epsilon=0.5)
    model, rows, output = tmp_path / "model.onnx", score_rows(tmp_path), tmp_path / "d.jsonl"
    printed = horizon("score", model, rows, "-o", output)
    assert (
        "policy epsilon_greedy(epsilon=0.5) (policy from model card, epsilon from model card)"
        in printed
    )
    logged = read_decisions(output).rows
    assert {row["policy"] for row in logged} == {"epsilon_greedy(epsilon=0.5)"}
    scores = FEATURES @ np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]) + [0.0, 0.0, -1.0]
    want = Exploration("epsilon_greedy", 0.5).probabilities(scores)
    chosen = [int(row["action"]) for row in logged]
    got = [row["action_probability"] for row in logged]
    np.testing.assert_allclose(got, want[np.arange(len(chosen)), chosen], atol=1e-6)

    printed = horizon("score", model, rows, "-o", output, "--policy", "greedy")
    assert "policy greedy (policy from --policy)" in printed
    logged = read_decisions(output).rows
    assert {row["policy"] for row in logged} == {"greedy"}
    assert {row["action_probability"] for row in logged} == {1.0}


def test_health_says_which_policy_is_served_and_where_it_came_from(tmp_path):
    export(tmp_path, HandWeightedDqn(), policy="softmax", temperature=0.5)
    predictor = Predictor(tmp_path / "model.onnx", flags=PolicyFlags(temperature=2.0))
    log = tmp_path / "d.jsonl"
    with TestClient(build_app(predictor, DecisionLog(log))) as client:
        health = client.get("/health").json()
        assert health["policy"] == "softmax"
        assert health["served_policy"] == {
            "label": "softmax(temperature=2.0)",
            "from": {"policy": CARD, "temperature": "--temperature"},
        }
        answer = client.post("/decisions", json={"rows": [{"state_features": {"f0": 1.0}}]})
        assert answer.status_code == 200
    assert [row["policy"] for row in read_decisions(log).rows] == ["softmax(temperature=2.0)"]


@pytest.mark.parametrize("name", ["decisions.jsonl", "decisions.parquet"])
def test_the_logged_policy_is_read_by_join_and_the_sources_without_a_warning(tmp_path, name):
    export(tmp_path, HandWeightedDqn(), policy="epsilon_greedy", epsilon=0.5)
    decisions = tmp_path / name
    horizon("score", tmp_path / "model.onnx", score_rows(tmp_path), "-o", decisions)
    logged = read_decisions(decisions).rows
    rewards = [
        {"decision_id": row["decision_id"], "timestamp": row["timestamp"], "metrics": {"clicks": 1}}
        for row in logged
    ]
    rewards = write_jsonl(tmp_path / "rewards.jsonl", rewards)
    for joined in (tmp_path / "joined.jsonl", tmp_path / "joined.parquet"):
        horizon("join", decisions, rewards, "-o", joined, "--window", "1d")
        rows = read_joined(joined)
        assert {row["policy"] for row in rows} == {"epsilon_greedy(epsilon=0.5)"}
        manifest = run_source(tmp_path / f"run-{joined.suffix[1:]}", joined.suffix[1:], joined)
        assert manifest["stages"]["source"]["warnings"] == [], json.dumps(manifest)[:400]
