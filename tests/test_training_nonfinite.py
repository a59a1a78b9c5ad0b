"""A training whose figures stop being finite stops with an error naming the epoch and the
metric (or the parameters), recorded as the failed train stage, whichever trainer it is: the
training driver checks every update's metrics and, at each epoch's end, the parameters. The
export check refuses a model whose outputs are not finite, and a softmax policy's
probabilities are finite at any temperature (tests/test_policy_parity.py holds the exported
model, serving and CPE together at the same extremes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from pydantic import ValidationError
from test_training import pipeline

from horizon_engine import Exploration
from horizon_engine.builtin.onnx_export import _check_close
from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.policies import ExplorationConfig, action_probabilities


def failed_training(engine: Engine, config: dict[str, Any], **run: Any) -> tuple[str, dict]:
    """The error of a run whose training fails, and the manifest it left."""
    with pytest.raises(HorizonError) as failed:
        engine.run(config, **run)
    manifest = json.loads((Path(config["pipeline"]["output_dir"]) / "manifest.json").read_text())
    return str(failed.value), manifest


def test_an_update_whose_loss_overflows_stops_the_training_naming_epoch_update_and_metric(
    trainer_host, tmp_path
):
    """``mean_reward`` learns the mean reward, 2, by SGD on one weight ``w`` from 0, one update
    an epoch (the 142 train rows fit one minibatch): ``w <- w - lr * 2 * (w - 2)``. With the
    largest learning rate an option takes, 1e9, ``w`` is 4e9 after the first update and -8e18
    after the second (whose loss was 1.6e19); the third's loss, the mean of 142 rows of
    ``(2 + 8e18)^2 = 6.4e37``, overflows float32 (3.4e38) in their sum: inf."""
    config = pipeline(tmp_path / "run", learning_rate=1e9, minibatch_size=100_000, epochs=4)
    engine = Engine(plugins=trainer_host, show_progress=False)
    message, manifest = failed_training(engine, config)
    assert message == (
        "training stopped at epoch 3 (update 3): the training metric 'loss' is inf; the updates "
        "diverged: lower the trainer's learning rate, or bring the rewards to a smaller scale"
    )
    assert manifest["status"] == "failed" and manifest["failed_stage"] == "train"
    assert manifest["error"].endswith(message)
    # The finite epochs are kept; nothing of the diverged one was written.
    checkpoints = sorted(path.name for path in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["epoch-0001.pt", "epoch-0002.pt", "latest.pt"]


def test_parameters_that_stop_being_finite_stop_the_training_at_the_epochs_end(
    trainer_host, tmp_path, monkeypatch
):
    """A trainer whose second update leaves its weight NaN while the loss it reports is
    finite: the epoch's end finds it, before writing that epoch's checkpoint."""
    import horizon_plugin_mean_reward as plugin

    original = plugin.MeanReward.train_step

    def train_step(trainer, batch):
        metrics = original(trainer, batch)
        if trainer.steps == 2:
            with torch.no_grad():
                trainer.weight.fill_(torch.nan)
        return metrics

    monkeypatch.setattr(plugin.MeanReward, "train_step", train_step)
    config = pipeline(tmp_path / "run", minibatch_size=100_000, epochs=3)
    engine = Engine(plugins=trainer_host, show_progress=False)
    message, manifest = failed_training(engine, config)
    assert message.startswith(
        "training stopped at epoch 2: the parameters of weight are not finite; the updates diverged"
    )
    assert manifest["failed_stage"] == "train"
    checkpoints = sorted(path.name for path in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["epoch-0001.pt", "latest.pt"]


DISCRETE = {"kind": "gym", "env": "CartPole-v1", "episodes": 6}
TRAINERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "dqn": (DISCRETE, {"layers": [8]}),
    "parametric_dqn": ({**DISCRETE, "parametric_actions": True}, {"layers": [8]}),
    "sac": ({"kind": "gym", "env": "Pendulum-v1", "episodes": 1}, {"layers": [8]}),
    "td3": ({"kind": "gym", "env": "Pendulum-v1", "episodes": 1}, {"layers": [8]}),
    "ddpg": ({"kind": "gym", "env": "Pendulum-v1", "episodes": 1}, {"layers": [8]}),
    "world_model": (DISCRETE, {}),
}
"""Each trainer's data (small) and options."""


def with_infinite_rewards(split: Path) -> None:
    """Rewrite a timeline split's rewards (``reward`` and ``next_n_rewards``) as inf: data a
    trainer cannot learn from, which the config's reward weights can no longer make."""
    for path in split.glob("*.parquet"):
        table = pq.read_table(path)
        for name in ("reward", "next_n_rewards"):
            column = table[name]
            if name == "reward":
                values = pa.array(np.full(len(table), np.inf), column.type)
            else:
                rows = [[np.inf] * len(row) for row in column.to_pylist()]
                values = pa.array(rows, column.type)
            index = table.schema.get_field_index(name)
            table = table.set_column(index, table.schema.field(name), values)
        pq.write_table(table, path)


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_every_trainer_stops_on_rewards_that_are_not_finite(kind, tmp_path):
    source, options = TRAINERS[kind]
    config: dict[str, Any] = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "source": source,
        "timeline": {"reward": {"reward": 1.0}},
        "normalization": {},
        "trainer": {"kind": kind, "epochs": 1, "minibatch_size": 64, "threads": 1, **options},
    }
    if source is DISCRETE:
        config["timeline"]["actions"] = ["0", "1"]
    engine = Engine(show_progress=False)
    engine.run(config, stages=["source", "timeline", "normalization"])
    with_infinite_rewards(tmp_path / "run" / "timeline" / "train")
    message, manifest = failed_training(engine, config, stages=["train"])
    assert message.startswith("training stopped at epoch 1 (update 1): the training metric ")
    assert "holds values that are not finite: check the logged rewards" in message
    assert manifest["failed_stage"] == "train"


def test_the_export_check_refuses_outputs_that_are_not_finite():
    """NaN equals NaN between PyTorch and onnxruntime, but a model scoring NaN is none."""
    ours = np.array([[1.0, np.nan], [0.5, 0.25]], dtype=np.float32)
    with pytest.raises(HorizonError) as refused:
        _check_close("scores", ours, ours.copy(), np.zeros(1), "rtol 0")
    assert str(refused.value) == (
        "[export] the model's 'scores' is not finite in 1 of the 4 values checked, first at "
        "(0, 1): nan in PyTorch, nan in ONNX; the trained policy gives no usable scores (was "
        "its training finite?)"
    )
    ours[0, 1] = np.inf
    with pytest.raises(HorizonError, match="first at \\(0, 1\\): inf in PyTorch"):
        _check_close("scores", ours, ours.copy(), np.zeros(1), "rtol 0")
    assert _check_close("scores", ours[1:], ours[1:], np.zeros(1), "rtol 0") == 0.0


def test_a_model_with_non_finite_weights_is_not_exported(trainer_host, tmp_path):
    """The trained weight made NaN in the checkpoint: the export names the output and leaves
    no model file."""
    config = pipeline(tmp_path / "run", epochs=1)
    engine = Engine(plugins=trainer_host, show_progress=False)
    engine.run(config)
    latest = tmp_path / "run" / "checkpoints" / "latest.pt"
    checkpoint = torch.load(latest, weights_only=True)
    checkpoint["trainer"]["weight"] = torch.full((1,), torch.nan)
    torch.save(checkpoint, latest)
    config["export"] = {"kind": "onnx"}
    # Every score of every check row is NaN: two actions a row.
    values = 2 * len(torch.load(tmp_path / "run" / "check_rows.pt", weights_only=True)["state"])
    with pytest.raises(HorizonError) as refused:
        engine.run(config, stages=["export"])
    assert (
        f"the model's 'scores' is not finite in {values} of the {values} values checked, "
        "first at (0, 0)" in str(refused.value)
    )
    assert not (tmp_path / "run" / "model.onnx").exists()


SCORES = [[2.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 3.0, 3.0]]
"""A clear best, a three-way tie, and a tie whose second action is impossible (``POSSIBLE``)."""
POSSIBLE = [[True, True, True], [True, True, True], [True, True, False]]
GREEDY_TIES_SHARED = [[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 1.0, 0.0]]
UNIFORM = [[1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]]


@pytest.mark.parametrize(
    ("temperature", "expected"),
    [
        # 1e-300 rounds to 0 in float32, 1e-45 is its smallest (subnormal) number, 1e-38 about
        # its smallest normal one: scores 1 apart are 1e38 or more apart divided, exp gives 0.
        (1e-300, GREEDY_TIES_SHARED),
        (1e-45, GREEDY_TIES_SHARED),
        (1e-38, GREEDY_TIES_SHARED),
        # scores 3 apart are 3e-30 apart divided: exp gives 1 for each, in float32 and float64.
        (1e30, UNIFORM),
    ],
)
def test_softmax_gives_probabilities_at_any_temperature(temperature, expected):
    """Once NaN in torch (and the exported model) below float32's smallest number."""
    scores = torch.tensor(SCORES)
    possible = torch.tensor(POSSIBLE)
    in_torch = action_probabilities(scores, possible.float(), "softmax", temperature=temperature)
    in_numpy = Exploration("softmax", temperature=temperature).probabilities(
        scores.numpy(), possible.numpy()
    )
    np.testing.assert_allclose(in_torch.double().numpy(), expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(in_numpy, expected, rtol=0, atol=1e-7)


def test_a_temperature_that_is_not_a_finite_number_above_0_is_refused():
    for temperature in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValidationError):
            ExplorationConfig(policy="softmax", temperature=temperature)
        with pytest.raises(HorizonError, match="expected a finite number above 0"):
            Exploration("softmax", temperature=temperature)
