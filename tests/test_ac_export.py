"""The ONNX export of continuous policies: ``action`` (and ``log_density`` for a stochastic
policy) in the user's units, the normalization and the action mapping inside, metadata naming
the action features and their bounds, onnxruntime checked against PyTorch."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from horizon_engine.builtin.onnx_export import OnnxExporter
from horizon_engine.errors import HorizonError
from horizon_engine.export import ExportConfig, PolicyBundle
from horizon_engine.normalization import NormalizationParameters
from horizon_engine.preprocessor import build_preprocessor
from horizon_engine.run_folder import RunFolder
from horizon_engine.schema import ActionType

STATE_IDS = ["0", "1", "2"]
ACTION_IDS = ["3", "4"]
LOW, HIGH = -2.0, 2.0

NORMALIZATION = {
    "state_features": {
        feature: NormalizationParameters(feature_type="continuous", mean=0.5, stddev=2.0)
        for feature in STATE_IDS
    },
    "action_features": {
        feature: NormalizationParameters(
            feature_type="continuous_action", min_value=LOW, max_value=HIGH
        )
        for feature in ACTION_IDS
    },
}


class Actor(torch.nn.Module):
    """A hand-made continuous policy: normalized state -> linear -> tanh in (-1, 1) -> the
    ``continuous_action`` range [-2, 2] (its inverse, written out); with ``stochastic`` also
    the log-density of a tanh-squashed Gaussian at its mean. Large weights saturate the tanh on
    large inputs: the exported action must still stay inside [-2, 2]."""

    def __init__(self, stochastic: bool = False, scale: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.preprocessor = build_preprocessor(STATE_IDS, NORMALIZATION["state_features"])
        self.layer = torch.nn.Linear(len(STATE_IDS), len(ACTION_IDS))
        with torch.no_grad():
            self.layer.weight.mul_(scale)
        self.log_std = torch.nn.Parameter(torch.full((len(ACTION_IDS),), -0.5))
        self.stochastic = stochastic

    def forward(self, values: torch.Tensor, presence: torch.Tensor):
        mean = self.layer(self.preprocessor(values, presence))
        squashed = torch.tanh(mean)
        action = LOW + (squashed + 1.0) * 0.5 * (HIGH - LOW)
        if not self.stochastic:
            return action
        # The density of the pre-squash mean under N(mean, std), less the squash's Jacobian.
        gaussian = -self.log_std - 0.5 * math.log(2 * math.pi)
        jacobian = torch.log(1.0 - squashed.pow(2) + 1e-6)
        return action, (gaussian - jacobian).sum(dim=1)


class WrongWhenTraced(Actor):
    """Exports a different model than PyTorch runs: the check must catch it."""

    def forward(self, values: torch.Tensor, presence: torch.Tensor):
        action = super().forward(values, presence)
        return action * 0.99 if torch.jit.is_tracing() else action


def bundle(model: torch.nn.Module, rows: int = 256) -> PolicyBundle:
    values = torch.from_numpy(np.random.default_rng(0).normal(0.5, 3.0, (rows, 3)))
    normalization = {
        name: {feature: parameters.as_dict() for feature, parameters in features.items()}
        for name, features in NORMALIZATION.items()
    }
    return PolicyBundle(
        model=model.eval(),
        feature_ids=STATE_IDS,
        actions=[],
        normalization=normalization,
        sample_values=values.float(),
        sample_presence=torch.ones(rows, 3),
        run_id="run-1",
        action_feature_ids=ACTION_IDS,
        action_type=ActionType.CONTINUOUS,
    )


def export(tmp_path: Path, model: torch.nn.Module, **config) -> OnnxExporter:
    exporter = OnnxExporter(ExportConfig(**config))
    assert exporter.export(SimpleNamespace(output_dir=tmp_path), bundle(model)) == [RunFolder.MODEL]
    return exporter


def extreme_inputs() -> tuple[np.ndarray, np.ndarray]:
    """Random states over many scales, huge and tiny values, and missing features."""
    rng = np.random.default_rng(1)
    features = np.concatenate(
        [
            rng.normal(0.0, 1.0, (100, 3)),
            rng.normal(0.0, 1e3, (100, 3)),
            rng.uniform(-1e30, 1e30, (100, 3)),
            np.array([[1e38] * 3, [-1e38] * 3, [0.0] * 3, [1e-30] * 3]),
        ]
    ).astype(np.float32)
    presence = (rng.random(features.shape) > 0.2).astype(np.float32)
    presence[:4] = 1.0
    return features, presence


def test_a_deterministic_actor_exports_its_action_in_the_users_units(tmp_path):
    model = Actor(scale=50.0)
    exporter = export(tmp_path, model, policy="softmax")
    details = exporter.details
    assert details["policy"] == "deterministic" and details["outputs"] == ["action"]
    assert details["verified_rows"] == 256
    assert details["max_abs_difference"] <= details["action_tolerance"]["atol"] + 2 * 4e-6

    onnx_model = onnx.load(str(tmp_path / RunFolder.MODEL))
    metadata = {entry.key: entry.value for entry in onnx_model.metadata_props}
    assert metadata["action_type"] == "continuous"
    assert json.loads(metadata["feature_ids"]) == STATE_IDS
    assert json.loads(metadata["action_feature_ids"]) == ACTION_IDS
    assert json.loads(metadata["actions"]) == []
    assert json.loads(metadata["action_bounds"]) == {"low": [LOW, LOW], "high": [HIGH, HIGH]}
    outputs = {output.name: output for output in onnx_model.graph.output}
    assert list(outputs) == ["action"]
    dims = outputs["action"].type.tensor_type.shape.dim
    assert [dim.dim_param or dim.dim_value for dim in dims] == ["batch", 2]

    session = onnxruntime.InferenceSession(str(tmp_path / RunFolder.MODEL))
    features, presence = extreme_inputs()
    (action,) = session.run(None, {"features": features, "presence": presence})
    assert action.shape == (len(features), 2)
    assert np.isfinite(action).all()
    assert action.min() >= LOW and action.max() <= HIGH
    # The weights saturate the tanh: both bounds are reached, not only approached.
    assert action.min() == pytest.approx(LOW, abs=1e-5)
    assert action.max() == pytest.approx(HIGH, abs=1e-5)
    with torch.no_grad():
        expected = model(torch.from_numpy(features), torch.from_numpy(presence)).numpy()
    np.testing.assert_allclose(action, expected, atol=1e-5)


def test_a_stochastic_actor_exports_its_action_and_log_density(tmp_path):
    model = Actor(stochastic=True, scale=3.0)
    details = export(tmp_path, model).details
    assert details["policy"] == "stochastic"
    assert details["outputs"] == ["action", "log_density"]
    assert set(details) >= {"log_density_max_abs_difference", "log_density_tolerance"}

    session = onnxruntime.InferenceSession(str(tmp_path / RunFolder.MODEL))
    assert [output.name for output in session.get_outputs()] == ["action", "log_density"]
    features, presence = extreme_inputs()
    action, log_density = session.run(None, {"features": features, "presence": presence})
    assert action.shape == (len(features), 2) and log_density.shape == (len(features),)
    assert action.min() >= LOW and action.max() <= HIGH
    with torch.no_grad():
        want_action, want_density = model(torch.from_numpy(features), torch.from_numpy(presence))
    np.testing.assert_allclose(action, want_action.numpy(), atol=1e-5)
    # Where the tanh saturates, log(1 - tanh^2 + 1e-6) magnifies a rounding step of the
    # action near +-1 about a million times: compare the log-density where it does not.
    inside = (np.abs(want_action.numpy()) < 0.99 * HIGH).all(axis=1)
    assert inside.sum() > 50
    np.testing.assert_allclose(log_density[inside], want_density.numpy()[inside], rtol=1e-4)


def test_an_export_that_disagrees_with_pytorch_fails_and_leaves_no_model(tmp_path):
    with pytest.raises(HorizonError, match=r"ONNX model's 'action' differs from PyTorch's"):
        export(tmp_path, WrongWhenTraced())
    assert not (tmp_path / RunFolder.MODEL).exists()
    assert list(tmp_path.iterdir()) == []
