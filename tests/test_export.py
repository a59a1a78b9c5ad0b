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


def test_export_reads_only_the_run_folders_own_files_not_the_timeline(trainer_host, tmp_path):
    """The training kept what export checks (``problem.json``, ``check_rows.pt``): with the
    timeline gone, the export is the same model checked on the same first eval rows."""
    import shutil

    def metadata() -> dict[str, str]:
        model = onnx.load(str(tmp_path / "model.onnx"))
        return {entry.key: entry.value for entry in model.metadata_props if entry.key != "run_id"}

    engine = Engine(plugins=trainer_host, show_progress=False)
    config = pipeline(tmp_path)
    first = engine.run(config)["stages"]["export"]
    written = metadata()
    shutil.rmtree(tmp_path / "timeline")
    again = engine.run(config, stages=["export"])["stages"]["export"]
    assert 0 < first["details"]["verified_rows"] <= 1024
    assert again["details"] == first["details"]
    assert metadata() == written


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


# --- the check against PyTorch: float32 tolerance, ties, output shapes ---------------------------

FLOAT32_STEP = 2.0**-23
"""float32's epsilon: one rounding step relative to a value."""


class DriftingScores(torch.nn.Module):
    """Scores ``scale * (features @ weight.T + bias)``; while exported to ONNX, each action's
    score is also multiplied by its ``drift``: onnxruntime's float32 arithmetic, made to differ
    from PyTorch's by a known number of rounding steps (real runs differ by a few, depending on
    the machine; here they differ the same way everywhere)."""

    def __init__(self, weight, bias, scale=1.0, drift=None):
        super().__init__()
        self.layer = torch.nn.Linear(len(weight[0]), len(weight))
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor(weight))
            self.layer.bias.copy_(torch.tensor(bias))
        self.scale = scale
        self.register_buffer("drift", torch.tensor(drift or [1.0] * len(weight)))

    def forward(self, values, presence):
        scores = self.layer(values * presence) * self.scale
        if torch.onnx.is_in_onnx_export():
            scores = scores * self.drift
        return scores


def export_bundle(output, model, values, candidates=None, **policy):
    from types import SimpleNamespace

    from horizon_engine.builtin.onnx_export import OnnxExporter
    from horizon_engine.export import ExportConfig, PolicyBundle

    bundle = PolicyBundle(
        model=model.eval(),
        feature_ids=[str(i) for i in range(values.shape[1])],
        actions=[] if candidates else ["0", "1"],
        normalization={},
        sample_values=values,
        sample_presence=torch.ones_like(values),
        run_id="check",
        action_feature_ids=["a", "b"] if candidates else [],
        sample_candidates=candidates,
    )
    exporter = OnnxExporter(ExportConfig(**policy))
    exporter.export(SimpleNamespace(output_dir=output), bundle)
    return exporter.details


def test_large_q_values_export_when_onnxruntime_differs_by_float32_rounding(tmp_path):
    """Q-values near 10^2-10^3, as offline CartPole's, with onnxruntime 8 rounding steps off
    (about 3e-4 at 300): within float32's tolerance for a network of one layer, where the
    absolute 1e-5 this check used to apply failed the export."""
    features = torch.rand(64, 4, generator=torch.Generator().manual_seed(0))
    weight = [[3.0, -1.0, 2.0, 0.5], [1.0, 2.0, -0.5, 3.0]]
    drift = [1.0 + 8 * FLOAT32_STEP] * 2
    model = DriftingScores(weight, [1.0, 2.0], scale=100.0, drift=drift)
    details = export_bundle(tmp_path, model, features)
    with torch.no_grad():
        largest = float(model(features, torch.ones_like(features)).abs().max())
    assert 100 < largest < 1000
    # One layer plus the normalization's: rtol = 16 steps per layer * 2 layers.
    assert details["score_tolerance"]["rtol"] == pytest.approx(32 * FLOAT32_STEP)
    assert details["score_tolerance"]["atol"] == pytest.approx(32 * FLOAT32_STEP * largest)
    # The drift's 8 steps, and the rounding of the drifted score: 9 at most.
    assert 1e-5 < details["max_abs_difference"] <= 9 * FLOAT32_STEP * largest
    assert details["verified_rows"] == 64
    assert (tmp_path / "model.onnx").exists()


def tied_rows_features() -> torch.Tensor:
    """Score 0 is 1 + x0, score 1 adds x1: 8 rows tie exactly (x1 = 0), 4 nearly (x1 = +-1e-5,
    below the 3.9e-5 the two scores may move apart), 20 are decided (x1 = +-1)."""
    features = torch.zeros(32, 2)
    features[:, 0] = torch.rand(32, generator=torch.Generator().manual_seed(1))
    features[8:12, 1] = torch.tensor([1e-5, -1e-5, 1e-5, -1e-5])
    features[12:, 1] = torch.tensor([1.0, -1.0] * 10)
    return features


@pytest.mark.parametrize(
    "policy",
    [{"policy": "greedy"}, {"policy": "epsilon_greedy", "epsilon": 0.1}, {"policy": "softmax"}],
)
def test_tied_scores_may_rank_the_other_way_and_are_counted(tmp_path, policy):
    """onnxruntime's score 1 is 4 rounding steps higher than PyTorch's: on the exactly tied rows
    it chooses action 1 where PyTorch takes the first of the tie, 0. Those rows (and the near
    ties) are not compared for the choice; every other row is."""
    model = DriftingScores(
        [[1.0, 0.0], [1.0, 1.0]], [1.0, 1.0], drift=[1.0, 1.0 + 4 * FLOAT32_STEP]
    )
    details = export_bundle(tmp_path, model, tied_rows_features(), **policy)
    assert details["tied_rows"] == 12
    assert details["compared_action_rows"] == 20
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    features = tied_rows_features()[:8].numpy()
    _, _, action = session.run(None, {"features": features, "presence": np.ones_like(features)})
    assert action.tolist() == [1] * 8  # PyTorch: 0, the first of equal scores


def test_a_row_without_recorded_candidates_ties_its_padding_slots(tmp_path):
    """The failure on Horizon's parametric CartPole data: a row listing no possible action
    counts every slot as possible, and its padding slots, all features absent, score exactly
    alike in PyTorch; onnxruntime may rank them either way."""

    class Parametric(torch.nn.Module):
        """Score = state sum + candidate features . (1, 2); the second slot drifts on export."""

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1, bias=False)
            with torch.no_grad():
                self.layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
            self.register_buffer("drift", torch.tensor([1.0, 1.0 + 4 * FLOAT32_STEP]))

        def forward(self, values, presence, candidates, candidate_presence):
            state = (values * presence).sum(dim=1, keepdim=True) + 1.0
            scores = state + self.layer(candidates * candidate_presence).squeeze(2)
            if torch.onnx.is_in_onnx_export():
                scores = scores * self.drift
            return scores

    rows = 6
    values = torch.rand(rows, 3, generator=torch.Generator().manual_seed(2))
    offered = torch.tensor([[1.0, 0.0], [0.0, 1.0]]).expand(rows, -1, -1).clone()
    mask = torch.ones(rows, 2)
    offered[-2:] = 0.0  # the last two rows recorded no candidates: padding only
    mask[-2:] = 0.0
    details = export_bundle(tmp_path, Parametric(), values, (offered, offered.clone(), mask))
    assert details["tied_rows"] == 2 and details["compared_action_rows"] == 4


def test_a_model_onnx_computes_differently_still_fails_and_leaves_no_file(tmp_path):
    """A thousandth off is no rounding: the export fails naming the place and the tolerance."""
    features = torch.rand(16, 4, generator=torch.Generator().manual_seed(3))
    weight = [[3.0, -1.0, 2.0, 0.5], [1.0, 2.0, -0.5, 3.0]]
    model = DriftingScores(weight, [1.0, 2.0], scale=100.0, drift=[1.0, 1.001])
    with pytest.raises(HorizonError, match=r"'scores' differs from PyTorch's by .* at \(\d+, 1\)"):
        export_bundle(tmp_path, model, features)
    assert not (tmp_path / "model.onnx").exists()


def test_a_model_whose_onnx_graph_swaps_the_actions_fails(tmp_path):
    """An exported model that scores the actions in the other order (here on purpose) would
    choose the worse action on every decided row: its scores are far outside the tolerance."""

    class Swapped(DriftingScores):
        def forward(self, values, presence):
            scores = super().forward(values, presence)
            if torch.onnx.is_in_onnx_export():
                return scores.flip(dims=[1])
            return scores

    model = Swapped([[1.0, 0.0], [1.0, 1.0]], [1.0, 1.0])
    with pytest.raises(
        HorizonError, match=r"'scores' differs from PyTorch's by 1 at \(\d+, [01]\)"
    ):
        export_bundle(tmp_path, model, tied_rows_features())


def test_outputs_declare_the_actions_or_the_candidates_axis(trainer_host, tmp_path):
    """``probabilities`` is [batch, 2] for the two actions, as ``scores`` (it was declared
    [batch, batch]); a parametric model's are [batch, candidates]."""

    def shapes(path):
        model = onnx.load(str(path))
        return {
            output.name: [
                dim.dim_param or dim.dim_value for dim in output.type.tensor_type.shape.dim
            ]
            for output in model.graph.output
        }

    Engine(plugins=trainer_host, show_progress=False).run(pipeline(tmp_path / "discrete"))
    assert shapes(tmp_path / "discrete" / "model.onnx") == {
        "scores": ["batch", 2],
        "probabilities": ["batch", 2],
        "action": ["batch"],
    }
    values = torch.rand(4, 3, generator=torch.Generator().manual_seed(4))
    offered = torch.eye(2).expand(4, -1, -1).clone()

    class Parametric(torch.nn.Module):
        def forward(self, values, presence, candidates, candidate_presence):
            state = (values * presence).sum(dim=1, keepdim=True)
            return state + (candidates * candidate_presence)[:, :, 0]

    export_bundle(tmp_path, Parametric(), values, (offered, offered.clone(), torch.ones(4, 2)))
    assert shapes(tmp_path / "model.onnx") == {
        "scores": ["batch", "candidates"],
        "probabilities": ["batch", "candidates"],
        "action": ["batch"],
    }
