"""``train_epochs`` ends its epochs beside the next epoch's updates (``horizon_engine.epoch_ends``):
the figures, the checkpoints and the hook's epochs are those of ending each epoch in line
(``TrainingDriver.end_epoch``, the gym runner's way); a part that draws from torch's generator
stays in line; an error on the background thread is raised by the training, the same error."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from horizon_engine.config import build_spec
from horizon_engine.driver import TrainingDriver, load_split, timeline_problem
from horizon_engine.errors import HorizonError
from horizon_engine.evaluation import EpisodeEvaluation, read_metrics
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import PluginHost, get_plugin_host
from horizon_engine.run_context import StageRun
from horizon_engine.run_folder import RunFolder

EPOCHS = 3


def dqn_pipeline(output: Path) -> dict[str, Any]:
    """A small CartPole run of the dqn trainer with three per-epoch estimators."""
    return {
        "pipeline": {"output_dir": str(output), "seed": 3},
        "source": {"kind": "gym", "episodes": 40, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.3},
        "normalization": {},
        "trainer": {"kind": "dqn", "epochs": EPOCHS, "layers": [16], "minibatch_size": 64},
        "evaluation": [
            {"kind": "logged_value"},
            {"kind": "weighted_dr", "num_bootstrap": 20},
            {"kind": "fqe", "num_bootstrap": 20},
        ],
    }


def mean_reward_pipeline(output: Path) -> dict[str, Any]:
    return {
        "pipeline": {"output_dir": str(output), "seed": 1},
        "source": {"kind": "gym", "episodes": 10, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "eval_fraction": 0.5},
        "normalization": {},
        "trainer": {"kind": "mean_reward", "epochs": EPOCHS, "minibatch_size": 16},
    }


class Training:
    """A driver for a run folder whose timeline and normalization are built, its splits, and
    its per-epoch estimators (when the pipeline has any)."""

    def __init__(self, config: dict[str, Any], plugins: PluginHost) -> None:
        run = StageRun.start(build_spec(config, plugins), plugins, "epoch-ends")
        description, normalization = timeline_problem(run)
        choice = run.spec.sections["trainer"]
        self.driver = TrainingDriver(run, choice, description, normalization, plugins=plugins)
        device = self.driver.device
        self.train = load_split(run, description, "train", device)
        self.eval = load_split(run, description, "eval", device)
        self.estimators = None
        if run.spec.evaluation:
            metrics = read_metrics(RunFolder(run.output_dir).split("eval"))
            self.estimators = EpisodeEvaluation(
                run.spec.evaluation, description.action_type, self.eval, metrics, run.seed
            )

    def beside(self) -> list[dict[str, float]]:
        return self.driver.train_epochs(self.train, self.eval, self.estimators)

    def in_line(self) -> list[dict[str, float]]:
        """The same epochs, each ended in line by ``end_epoch``."""
        driver = self.driver
        with driver.torch_threads():
            data = driver.prepare(self.train)
            for _ in range(EPOCHS):
                for batch in data.minibatches(driver.config.minibatch_size, driver.data_order):
                    driver.train_batch(batch)
                driver.end_epoch(eval_data=self.eval, estimators=self.estimators)
        return driver.history


def checkpoints(folder: Path) -> list[dict[str, Any]]:
    return [
        torch.load(RunFolder(folder).checkpoint_path(epoch), weights_only=True)
        for epoch in range(1, EPOCHS + 1)
    ]


def assert_same(one: Any, other: Any) -> None:
    """Equal to the bit: tensors by value, containers item by item."""
    if isinstance(one, torch.Tensor):
        assert torch.equal(one, other)
    elif isinstance(one, dict):
        assert list(one) == list(other)
        for key in one:
            assert_same(one[key], other[key])
    elif isinstance(one, list | tuple):
        assert len(one) == len(other)
        for item, other_item in zip(one, other, strict=True):
            assert_same(item, other_item)
    else:
        assert one == other


def threads_of(owner: Any, method: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads ``owner.method`` is called on, call by call."""
    names: list[str] = []
    original = getattr(owner, method)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        names.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, method, recorded)
    return names


def test_dqn_epochs_ended_beside_training_are_those_ended_in_line(tmp_path, monkeypatch):
    """The evaluation and the estimators between the first epoch and the last run on the
    background thread on a copy of the trainer's state; every epoch's figures, the estimators'
    record and every checkpoint (weights, optimizer, generators, history) equal those of
    ending in line."""
    config = dqn_pipeline(tmp_path)
    plugins = get_plugin_host()
    engine = Engine(plugins=plugins, show_progress=False)
    engine.run(config, stages=["source", "timeline", "normalization"])
    in_line = Training(config, plugins)
    expected = in_line.in_line()
    expected_checkpoints = checkpoints(tmp_path)
    beside = Training(config, plugins)
    threads = threads_of(EpisodeEvaluation, "epoch_metrics", monkeypatch)
    found = beside.beside()
    assert threads[0] == threads[-1] == "MainThread" and len(threads) == EPOCHS
    assert all(name.startswith("horizon-epoch-end") for name in threads[1:-1])
    assert_same(found, expected)
    assert "Evaluation/mc_loss" in found[-1] and "CPE/reward/weighted_dr" in found[-1]
    assert beside.estimators.epochs == in_line.estimators.epochs
    assert_same(checkpoints(tmp_path), expected_checkpoints)
    assert json.loads(expected_checkpoints[-1]["resume"]["history"]) == expected


def drawing(trainer_class: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainer_class``'s updates add noise from torch's generator, and its evaluation
    draws from it too (as SAC's and TD3's sample actions)."""
    train_step, evaluate = trainer_class.train_step, trainer_class.evaluate

    def noisy_step(self: Any, batch: Any) -> dict[str, float]:
        with torch.no_grad():
            self.weight.add_(0.01 * torch.randn(1))
        return train_step(self, batch)

    def drawing_evaluate(self: Any, data: Any) -> dict[str, float]:
        return {**evaluate(self, data), "draw": float(torch.rand(1))}

    monkeypatch.setattr(trainer_class, "train_step", noisy_step)
    monkeypatch.setattr(trainer_class, "evaluate", drawing_evaluate)


def test_an_evaluation_that_draws_from_torchs_generator_stays_in_line(
    trainer_host, tmp_path, monkeypatch
):
    """Its draws then come between the same updates as in line: the same figures."""
    config = mean_reward_pipeline(tmp_path)
    Engine(plugins=trainer_host, show_progress=False).run(
        config, stages=["source", "timeline", "normalization"]
    )
    in_line = Training(config, trainer_host)
    drawing(type(in_line.driver.trainer), monkeypatch)
    expected = in_line.in_line()
    expected_checkpoints = checkpoints(tmp_path)
    beside = Training(config, trainer_host)
    threads = threads_of(type(beside.driver.trainer), "evaluate", monkeypatch)
    assert_same(beside.beside(), expected)
    assert threads == ["MainThread"] * EPOCHS
    assert_same(checkpoints(tmp_path), expected_checkpoints)


def test_an_error_beside_training_is_raised_by_the_training(trainer_host, tmp_path, monkeypatch):
    """The second epoch's evaluation (on the background thread) fails: the training raises
    that error, with the first epoch recorded and checkpointed and nothing of the second; a
    slow epoch's end still reaches the hook before the next one's."""
    config = mean_reward_pipeline(tmp_path)
    Engine(plugins=trainer_host, show_progress=False).run(
        config, stages=["source", "timeline", "normalization"]
    )
    training = Training(config, trainer_host)
    trainer_class = type(training.driver.trainer)
    evaluate = trainer_class.evaluate
    calls = []

    def failing(self: Any, data: Any) -> dict[str, float]:
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            raise HorizonError("evaluation broke on purpose")
        return evaluate(self, data)

    monkeypatch.setattr(trainer_class, "evaluate", failing)
    with pytest.raises(HorizonError, match="evaluation broke on purpose"):
        training.beside()
    assert calls[0] == "MainThread" and calls[1].startswith("horizon-epoch-end")
    assert len(training.driver.history) == 1
    names = sorted(path.name for path in RunFolder(tmp_path).checkpoints.iterdir())
    assert names == ["epoch-0001.pt", "latest.pt"]
    assert torch.load(RunFolder(tmp_path).latest_checkpoint, weights_only=True)["epoch"] == 1


def test_epochs_reach_the_hook_in_order_when_their_ends_are_slow(
    trainer_host, tmp_path, monkeypatch
):
    """Each epoch's end waits for the one before; training returns once the last epoch's
    checkpoint is written."""
    config = mean_reward_pipeline(tmp_path)
    Engine(plugins=trainer_host, show_progress=False).run(
        config, stages=["source", "timeline", "normalization"]
    )
    training = Training(config, trainer_host)
    trainer_class = type(training.driver.trainer)
    evaluate = trainer_class.evaluate
    release = threading.Event()

    def slow(self: Any, data: Any) -> dict[str, float]:
        if threading.current_thread().name != "MainThread":
            release.wait(timeout=0.2)
        return evaluate(self, data)

    monkeypatch.setattr(trainer_class, "evaluate", slow)
    reported = []
    monkeypatch.setattr(
        training.driver.run, "emit_epoch_metrics", lambda epoch, metrics: reported.append(epoch)
    )
    history = training.beside()
    assert reported == list(range(1, EPOCHS + 1)) and len(history) == EPOCHS
    latest = torch.load(RunFolder(tmp_path).latest_checkpoint, weights_only=True)
    assert latest["epoch"] == EPOCHS
    assert json.loads(latest["resume"]["history"]) == history
