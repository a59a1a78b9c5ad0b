"""Serving real continuous actors: a SAC and a TD3 policy trained briefly on Pendulum-v1 and
exported by the pipeline's own exporter, scored by the ``Predictor`` and ``horizon score``.

The hand-built stand-in in test_serving.py pins the Predictor's reading of the exporter's
contract; this test holds it to the exporter itself, so a change on either side shows here."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest
from test_serving import horizon

from horizon_engine.builtin.gym.config import load_gym_spec
from horizon_engine.builtin.gym.runner import train_gym
from horizon_engine.plugins import PluginHost
from horizon_plugins_serving.decision_log import read_decisions
from horizon_plugins_serving.predictor import Predictor


def pendulum_actor(output, trainer: str):
    """A short Pendulum run: 100 uniform steps, then an update per step for 140 steps, the
    final actor exported to ``output/model.onnx``."""
    config = {
        "gym": {
            "env": "Pendulum-v1",
            "seed": 0,
            "episodes": 4,
            "max_steps": 60,
            "train_after_ts": 100,
            "test_every_ts": 240,
            "avg_over_num_episodes": 1,
            "output_dir": str(output),
            "ds": "2019-01-01",
        },
        "trainer": {"kind": trainer, "layers": [16], "minibatch_size": 16, "threads": 1},
        "export": {"kind": "onnx"},
    }
    host = PluginHost()
    train_gym(load_gym_spec(config, host), host)
    return output / "model.onnx"


@pytest.fixture(scope="module", params=["sac", "td3"])
def actor(request, tmp_path_factory):
    return request.param, pendulum_actor(tmp_path_factory.mktemp(request.param), request.param)


def test_the_predictor_gives_the_exported_actors_action_and_density(actor):
    trainer, model = actor
    predictor = Predictor(model)
    assert predictor.continuous and predictor.action_feature_ids == ["3"]
    assert predictor.stochastic == (trainer == "sac")
    assert predictor.action_bounds == {"low": [-2.0], "high": [2.0]}

    # Pendulum's observation: cos, sin and angular velocity; some rows far outside the
    # training range, where the actor saturates and the exported clamp holds the bounds.
    rng = np.random.default_rng(1)
    states = np.column_stack(
        [rng.uniform(-1, 1, 64), rng.uniform(-1, 1, 64), rng.normal(0.0, 20.0, 64)]
    )
    rows = [{str(i): float(value) for i, value in enumerate(state)} for state in states]
    result = predictor.predict(rows)

    session = onnxruntime.InferenceSession(str(model))
    features = states.astype(np.float32)
    outputs = session.run(None, {"features": features, "presence": np.ones_like(features)})
    named = dict(zip([output.name for output in session.get_outputs()], outputs, strict=True))
    np.testing.assert_allclose(np.array(result.actions), named["action"], rtol=1e-6)
    assert (np.abs(np.array(result.actions)) <= 2.0).all()
    if trainer == "sac":  # the propensity is the squashed Gaussian's density at its action
        np.testing.assert_allclose(
            result.propensities, np.exp(named["log_density"].astype(np.float64)), rtol=1e-5
        )
    else:  # a deterministic actor chooses its action with certainty
        assert list(result.propensities) == [1.0] * len(rows)


def test_horizon_score_logs_the_actors_action_as_a_feature_map(actor, tmp_path):
    _, model = actor
    source = tmp_path / "rows.jsonl"
    states = [{"0": 1.0, "1": 0.0, "2": 0.0}, {"0": -1.0, "1": 0.0, "2": 3.0}]
    source.write_text("".join(json.dumps({"state_features": s}) + "\n" for s in states))
    horizon("score", model, source, "-o", tmp_path / "decisions.jsonl")

    logged = read_decisions(tmp_path / "decisions.jsonl")
    assert not logged.torn_lines and len(logged.rows) == 2
    expected = Predictor(model).predict(states)
    for row, action, propensity in zip(
        logged.rows, expected.actions, expected.propensities, strict=True
    ):
        assert row["action"] == {"3": pytest.approx(float(action[0]))}
        assert row["action_probability"] == pytest.approx(float(propensity))
        assert "possible_actions" not in row and row["state_features"] in states
