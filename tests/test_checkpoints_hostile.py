"""Crafted checkpoints: every read of one (export, evaluation, warm start, ``--resume``) goes
through ``horizon_engine.training``'s checked reader and stops with the file and the field
named, never a traceback, a bare ``Aborted!`` or hours of looping; ``--resume`` takes only a
checkpoint of its own training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_training import pipeline

from horizon_engine.cli import main
from horizon_engine.driver import TrainingDriver
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.pipeline import Engine


def dqn_pipeline(output: Path) -> dict:
    """A small DQN run on CartPole: one epoch of a network of 8 units, an eval split, export."""
    return {
        "pipeline": {"output_dir": str(output), "seed": 1},
        "source": {"kind": "gym", "episodes": 10},
        "timeline": {"actions": ["0", "1"], "reward": {"reward": 1.0}, "eval_fraction": 0.5},
        "normalization": {},
        "trainer": {"kind": "dqn", "epochs": 1, "minibatch_size": 64, "layers": [8]},
        "export": {"kind": "onnx"},
    }


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished DQN run, trained once for the module; each test copies it."""
    output = tmp_path_factory.mktemp("dqn") / "run"
    Engine(show_progress=False).run(dqn_pipeline(output))
    return output


def zip_like_garbage() -> bytes:
    """A zip's magic number and then nothing torch wrote."""
    return b"PK\x03\x04" + bytes(range(256)) * 4


TRAINER_MISMATCH = "field 'trainer': the checkpoint does not fit this [trainer]"
"""The DQN trainer's own error for a state of another network, prefixed with the field."""

CRAFTED = {
    "an empty mapping": (lambda _: {}, "field 'epoch' is not an epoch number (1 or more)"),
    "a bare tensor": (lambda _: torch.zeros(3), "holds a Tensor, not a checkpoint"),
    "a negative epoch": (lambda state: {"epoch": -1, "trainer": state}, "found -1"),
    "an epoch of text": (lambda state: {"epoch": "1", "trainer": state}, "found '1'"),
    "a trainer that is a list": (
        lambda _: {"epoch": 1, "trainer": [1]},
        "field 'trainer' is not a trainer's state (a mapping by name); found list",
    ),
    "an empty trainer state": (lambda _: {"epoch": 1, "trainer": {}}, TRAINER_MISMATCH),
    "weights of another shape": (
        lambda _: {"epoch": 1, "trainer": {"q_network": {"layers.0.weight": torch.zeros(1)}}},
        TRAINER_MISMATCH,
    ),
    "an optimizer that is text": (
        lambda state: {"epoch": 1, "trainer": {**state, "optimizer": "adam"}},
        "field 'trainer' does not fit the [trainer] set up here (TypeError",
    ),
    "an empty file": (lambda _: b"", "is not a file torch saved"),
    "zip-like garbage": (lambda _: zip_like_garbage(), "is not a file torch saved"),
}
"""Checkpoint files that torch loads safely, or not at all, made from the trained state:
each with what the error says of it."""


def write_crafted(path: Path, crafted: object) -> None:
    """``crafted`` as a checkpoint file: bytes as they are, anything else saved by torch."""
    if isinstance(crafted, bytes):
        path.write_bytes(crafted)
    else:
        torch.save(crafted, path)


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_latest_checkpoint_stops_export_and_evaluate_naming_file_and_field(
    dqn_run, tmp_path, case
):
    run = tmp_path / "run"
    shutil.copytree(dqn_run, run)
    latest = run / "checkpoints" / "latest.pt"
    craft, why = CRAFTED[case]
    write_crafted(latest, craft(torch.load(latest, weights_only=True)["trainer"]))
    for command in (["export", str(run)], ["evaluate", str(run)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and "Aborted!" not in result.output
        purpose = {"export": "export", "evaluate": "evaluation"}[command[0]]
        assert f"error: {purpose} of {run}: {latest}" in result.output
        assert why in result.output


def test_a_crafted_warm_start_checkpoint_fails_validate_or_before_training(dqn_run, tmp_path):
    """A checkpoint whose structure is wrong fails validate (``preflight``), before anything
    is written; one whose state does not fit the trainer can be known only once the trainer
    is set up, and fails the train stage before its first update."""
    earlier = tmp_path / "earlier"
    shutil.copytree(dqn_run, earlier)
    latest = earlier / "checkpoints" / "latest.pt"
    trained = torch.load(latest, weights_only=True)["trainer"]
    for number, (craft, why) in enumerate(CRAFTED.values()):
        output = tmp_path / f"run-{number}"
        config = dqn_pipeline(output)
        config["trainer"]["warm_start_from"] = str(earlier)
        write_crafted(latest, craft(trained))
        with pytest.raises(HorizonError) as refused:
            Engine(show_progress=False).run(config)
        where = f"[trainer] warm_start_from = {str(earlier)!r}: {latest}"
        assert where in str(refused.value) and why in str(refused.value)
        if "does not fit" in why:
            manifest = json.loads((output / "manifest.json").read_text())
            assert manifest["failed_stage"] == "train"
            assert not (output / "checkpoints").exists()
        else:
            assert isinstance(refused.value, ConfigError)
            assert not output.exists()


class InjectedCrash(BaseException):
    """A crash in the second epoch: a BaseException, as a kill is nothing a stage catches."""


def crashed_run(trainer_host, output: Path, monkeypatch: pytest.MonkeyPatch, **trainer) -> dict:
    """A ``mean_reward`` run of 3 epochs that crashed in its second: ``epoch-0001.pt`` is
    its last complete epoch. Returns its config."""
    config = pipeline(output, **trainer)
    original = TrainingDriver.train_batch

    def train_batch(driver: TrainingDriver, batch) -> None:
        if driver.epoch == 1:
            raise InjectedCrash
        original(driver, batch)

    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        patch.setattr(TrainingDriver, "train_batch", train_batch)
        Engine(plugins=trainer_host, show_progress=False).run(config)
    assert sorted(path.name for path in (output / "checkpoints").iterdir()) == [
        "epoch-0001.pt",
        "latest.pt",
    ]
    return config


def test_resume_refuses_a_checkpoint_whose_epoch_is_not_its_own(
    trainer_host, tmp_path, monkeypatch
):
    """An epoch of 10^9 once made --resume loop over every epoch for hours."""
    config = crashed_run(trainer_host, tmp_path / "run", monkeypatch)
    engine = Engine(plugins=trainer_host, show_progress=False)
    checkpoints = tmp_path / "run" / "checkpoints"
    first = checkpoints / "epoch-0001.pt"
    good = torch.load(first, weights_only=True)
    crafted = [
        ({**good, "epoch": 10**9}, "field 'epoch' is 1000000000, not the epoch its name gives"),
        ({**good, "epoch": -1}, "field 'epoch' is not an epoch number (1 or more); found -1"),
        ({**good, "epoch": 1.0}, "field 'epoch' is not an epoch number (1 or more); found 1.0"),
        ({**good, "resume": {**good["resume"], "torch_rng": "seeded"}}, "'resume.torch_rng'"),
        ({**good, "resume": {**good["resume"], "updates": -3}}, "field 'resume.updates'"),
        ({**good, "resume": {**good["resume"], "history": "[]"}}, "field 'resume.history'"),
    ]
    for checkpoint, why in crafted:
        torch.save(checkpoint, first)
        with pytest.raises(HorizonError) as refused:
            engine.run(config, resume=True)
        assert str(refused.value).startswith(f"--resume: {first}") and why in str(refused.value)
    first.unlink()
    # The last epoch's file beyond the run's 3 epochs, its epoch the one its name gives.
    beyond = checkpoints / "epoch-9999.pt"
    torch.save({**good, "epoch": 9999}, beyond)
    with pytest.raises(HorizonError, match="field 'epoch' is 9999, beyond the 3 epochs"):
        engine.run(config, resume=True)
    beyond.unlink()
    torch.save(good, first)
    resumed = engine.run(config, resume=True)
    assert resumed["stages"]["train"]["details"]["resumed_after_epoch"] == 1


def test_resume_refuses_a_checkpoint_copied_from_another_run(trainer_host, tmp_path, monkeypatch):
    config = crashed_run(trainer_host, tmp_path / "run", monkeypatch)
    crashed_run(trainer_host, tmp_path / "other", monkeypatch, learning_rate=0.5)
    own, other = (tmp_path / name / "checkpoints" / "epoch-0001.pt" for name in ("run", "other"))
    ours = torch.load(own, weights_only=True)["resume"]
    theirs = torch.load(other, weights_only=True)["resume"]
    assert ours["training"] != theirs["training"]
    shutil.copyfile(other, own)
    with pytest.raises(HorizonError) as refused:
        Engine(plugins=trainer_host, show_progress=False).run(config, resume=True)
    message = str(refused.value)
    assert message.startswith(
        f"--resume: {own} belongs to another training: its field 'resume.training' is "
        f"{theirs['training']!r}, this run's training is {ours['training']!r}"
    )
