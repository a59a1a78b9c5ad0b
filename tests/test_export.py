"""The export stage and the ONNX exporter: one model, normalization inside, checked by
onnxruntime against PyTorch, described by its metadata."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import Engine


def pipeline(output, **export):
    return {
        "pipeline": {"output_dir": str(output), "seed": 1},
        "source": {"kind": "gym", "episodes": 10, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.5},
        "normalization": {},
        "trainer": {"kind": "mean_reward", "epochs": 2, "minibatch_size": 64},
        "export": {"kind": "onnx", **export},
    }


def test_model_runs_in_onnxruntime_as_in_pytorch_with_its_metadata(trainer_host, tmp_path):
    manifest = Engine(plugins=trainer_host, show_progress=False).run(
        pipeline(tmp_path, policy="softmax", temperature=0.5)
    )
    stage = manifest["stages"]["export"]
    assert stage["outputs"] == ["model.onnx"]
    assert stage["details"]["max_abs_difference"] <= 1e-5
    model = onnx.load(str(tmp_path / "model.onnx"))
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    assert json.loads(metadata["feature_ids"]) == ["0", "1", "2", "3"]
    assert json.loads(metadata["actions"]) == ["0", "1"]
    assert json.loads(metadata["policy"]) == {
        "policy": "softmax",
        "epsilon": 0.0,
        "temperature": 0.5,
    }
    assert metadata["run_id"] == manifest["run_id"]
    normalization = json.loads((tmp_path / "normalization.json").read_text())
    assert json.loads(metadata["normalization"]) == normalization

    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["features", "presence"]
    features = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    presence = np.ones_like(features)
    presence[3, 2] = 0.0
    scores, probabilities, action = session.run(None, {"features": features, "presence": presence})
    assert scores.shape == (7, 2) and action.shape == (7,)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)
    expected = torch.softmax(torch.from_numpy(scores) / 0.5, dim=1).numpy()
    np.testing.assert_allclose(probabilities, expected, atol=1e-6)
    assert (action == probabilities.argmax(axis=1)).all()


def test_greedy_policy_puts_all_probability_on_the_best_action(trainer_host, tmp_path):
    Engine(plugins=trainer_host, show_progress=False).run(pipeline(tmp_path))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    features = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    scores, probabilities, action = session.run(
        None, {"features": features, "presence": np.ones_like(features)}
    )
    assert (probabilities.max(axis=1) == 1.0).all()
    assert (action == scores.argmax(axis=1)).all()


def test_export_alone_reads_the_earlier_stages_files(trainer_host, tmp_path):
    engine = Engine(plugins=trainer_host, show_progress=False)
    config = pipeline(tmp_path)
    engine.run(config, stages=["source", "timeline", "normalization", "train"])
    assert not (tmp_path / "model.onnx").exists()
    manifest = engine.run(config, stages=["export"])
    assert (tmp_path / "model.onnx").exists()
    assert set(manifest["stages"]) == {"source", "timeline", "normalization", "train", "export"}


def test_export_without_a_checkpoint_says_which_stage_writes_it(trainer_host, tmp_path):
    engine = Engine(plugins=trainer_host, show_progress=False)
    with pytest.raises(HorizonError, match="stage 'train' writes"):
        engine.run(pipeline(tmp_path), stages=["export"])


def test_horizon_export_command_exports_a_finished_run(trainer_host, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from horizon_engine import plugins
    from horizon_engine.cli import main

    config = pipeline(tmp_path)
    del config["export"]
    Engine(plugins=trainer_host, show_progress=False).run(config)
    monkeypatch.setattr(plugins, "_default_host", trainer_host)
    result = CliRunner().invoke(main, ["export", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'model.onnx'}" in result.output
    assert "largest difference from PyTorch" in result.output
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    assert [o.name for o in session.get_outputs()] == ["scores", "probabilities", "action"]


def test_horizon_export_of_a_folder_without_a_run_is_a_clear_error(tmp_path):
    from click.testing import CliRunner

    from horizon_engine.cli import main

    result = CliRunner().invoke(main, ["export", str(tmp_path)])
    assert result.exit_code == 1
    assert "manifest.json: not a run's manifest" in result.output


def test_exported_model_drives_the_gym_sources_epsilon_greedy_policy(trainer_host, tmp_path):
    """The loop closes: a model exported by one run logs the next run's decisions."""
    from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows

    Engine(plugins=trainer_host, show_progress=False).run(pipeline(tmp_path / "first"))
    config = GymSourceConfig(
        episodes=3,
        policy="epsilon_greedy",
        epsilon=0.1,
        model=str(tmp_path / "first" / "model.onnx"),
        ds="2019-01-02",
    )
    rows = [row for _, row in collect_rows(config, seed=5)]
    # Two actions: the greedy one is logged with 1 - 0.1 + 0.1 / 2, the other with 0.1 / 2.
    greedy, other = 1 - 0.1 + 0.1 / 2, 0.1 / 2
    assert {row["action_probability"] for row in rows} <= {greedy, other}
    assert sum(row["action_probability"] == greedy for row in rows) > len(rows) / 2
