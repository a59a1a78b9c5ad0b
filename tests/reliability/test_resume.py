"""``horizon run --resume``: a training killed mid-epoch ends with the uninterrupted result.

Every trainer is failed in the middle of its second epoch (an injected crash at a chosen
batch), then resumed from its first epoch's checkpoint, and must end bit-identical to its
uninterrupted run (``conftest.assert_same_result``): checkpoints, per-epoch estimates,
cpe.json, the model and its outputs, and TensorBoard's scalars. A real SIGKILL and a real
Ctrl-C of a ``horizon run`` process, paused at a batch of the second epoch, are resumed the
same way. A changed config, a finished run and a warm start from the run's own folder are
refused with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.driver import TrainingDriver
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.pipeline import Engine, NothingToResume
from tests.reliability.conftest import TRAINERS, start_paused
from tests.test_training import scalars

pytestmark = pytest.mark.reliability


class InjectedCrash(BaseException):
    """A crash at a chosen batch: a BaseException, as a kill is nothing a stage catches."""


def crash_in_second_epoch(patch: pytest.MonkeyPatch) -> None:
    """Make the training driver crash at the second batch of its second epoch."""
    original = TrainingDriver.train_batch
    seen: list[int] = []

    def train_batch(driver: TrainingDriver, batch) -> None:
        if driver.epoch == 1:
            seen.append(1)
            if len(seen) == 2:
                raise InjectedCrash
        original(driver, batch)

    patch.setattr(TrainingDriver, "train_batch", train_batch)


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_a_training_crashed_mid_epoch_resumes_to_the_uninterrupted_result(
    kind, tmp_path, resume_config, uninterrupted, same_result, monkeypatch
):
    output_dir = tmp_path / kind
    config = resume_config(output_dir, kind)
    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        crash_in_second_epoch(patch)
        Engine(show_progress=False).run(config)
    manifest = json.loads((output_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert sorted(path.name for path in (output_dir / "checkpoints").iterdir()) == [
        "epoch-0001.pt",
        "latest.pt",
    ]

    resumed = Engine(show_progress=False).run(config, resume=True)

    assert resumed["executed"][0] == "train"
    assert resumed["stages"]["train"]["details"]["resumed_after_epoch"] == 1
    assert resumed["stages"]["source"]["run_id"] == manifest["run_id"]
    same_result(uninterrupted(kind), output_dir)
    assert _scalars(output_dir) == _scalars(uninterrupted(kind))
    # Every event file, the crashed run's included, is the train stage's recorded output.
    events = {f"tensorboard/{path.name}" for path in (output_dir / "tensorboard").iterdir()}
    assert len(events) == 2
    assert events <= set(resumed["stages"]["train"]["outputs"])


def _scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """TensorBoard's scalars over every event file of the run, by tag and epoch."""
    found: dict[str, dict[int, float]] = {}
    for tag, points in scalars(run_dir / "tensorboard").items():
        for step, value in points:
            assert found.setdefault(tag, {}).setdefault(step, value) == value
    return found


PAUSED_RUN = """
import pathlib, signal, sys, time
from horizon_engine.cli import main

signal.signal(signal.SIGINT, signal.default_int_handler)
from horizon_engine.driver import TrainingDriver

marker, arguments = pathlib.Path(sys.argv[1]), sys.argv[2:]
original = TrainingDriver.train_batch
seen = []

def train_batch(driver, batch):
    if driver.epoch == 1:
        seen.append(1)
        if len(seen) == 2:
            marker.write_text("paused")
            time.sleep(600)
    original(driver, batch)

TrainingDriver.train_batch = train_batch
main(arguments, prog_name="horizon")
"""
"""``horizon run`` in a process of its own that pauses at the second batch of the second
epoch (after writing the marker file named first): a signal then lands mid-epoch. Ctrl-C
raises KeyboardInterrupt there as in a terminal, whatever the suite was started from (a
shell's background job ignores SIGINT, and its children inherit that)."""


def paused_run(tmp_path: Path, config: dict, pipeline_toml) -> tuple[subprocess.Popen, Path]:
    """A ``horizon run`` of ``config`` (from a pipeline.toml) paused mid-epoch."""
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(pipeline_toml(config), encoding="utf-8")
    arguments = ["run", str(pipeline)]
    process = start_paused(PAUSED_RUN, tmp_path / "paused", arguments, "its second epoch")
    return process, pipeline


def test_a_sigkilled_training_resumes_to_the_uninterrupted_result(
    tmp_path, resume_config, pipeline_toml, uninterrupted, same_result
):
    config = resume_config(tmp_path / "run")
    process, _ = paused_run(tmp_path, config, pipeline_toml)
    process.kill()
    process.communicate()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest["running_stage"]) == ("running", "train")

    resumed = Engine(show_progress=False).run(config, resume=True)

    assert f"run {manifest['run_id']}" in resumed["warnings"][0]  # reported as interrupted
    assert resumed["stages"]["train"]["details"]["resumed_after_epoch"] == 1
    same_result(uninterrupted("dqn"), tmp_path / "run")


def test_ctrl_c_stops_cleanly_and_prints_the_command_that_resumes(
    tmp_path, resume_config, pipeline_toml, uninterrupted, same_result
):
    config = resume_config(tmp_path / "run")
    process, pipeline = paused_run(tmp_path, config, pipeline_toml)
    os.kill(process.pid, signal.SIGINT)
    _, stderr = process.communicate()

    assert process.returncode == 130
    assert "Traceback" not in stderr
    assert f"continue this run with: horizon run {pipeline} --resume" in stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert "train" in manifest["incomplete_stages"]

    result = CliRunner().invoke(main, ["run", str(pipeline), "--resume"])
    assert result.exit_code == 0, result.output
    same_result(uninterrupted("dqn"), tmp_path / "run")

    again = CliRunner().invoke(main, ["run", str(pipeline), "--resume"])
    assert again.exit_code == 0
    assert "nothing to resume" in again.output


def test_a_changed_config_is_refused_naming_the_keys(tmp_path, resume_config, monkeypatch):
    config = resume_config(tmp_path / "run")
    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        crash_in_second_epoch(patch)
        Engine(show_progress=False).run(config)
    config["trainer"]["minibatch_size"] = 32
    config["timeline"]["eval_fraction"] = 0.2
    config["pipeline"]["name"] = "renamed"  # changes no result: allowed
    with pytest.raises(HorizonError, match=r"timeline\.eval_fraction, trainer\.minibatch_size;"):
        Engine(show_progress=False).run(config, resume=True)


def test_nothing_to_resume_in_a_finished_run_or_an_empty_folder(
    tmp_path, resume_config, uninterrupted
):
    finished = resume_config(uninterrupted("dqn"))
    with pytest.raises(NothingToResume, match="completed every stage"):
        Engine(show_progress=False).run(finished, resume=True)
    with pytest.raises(HorizonError, match="holds no run to resume"):
        Engine(show_progress=False).run(resume_config(tmp_path / "empty"), resume=True)


def test_a_warm_start_from_the_runs_own_folder_is_refused_by_validate(tmp_path, resume_config):
    config = resume_config(tmp_path / "run")
    config["trainer"]["warm_start_from"] = str(tmp_path / "run" / ".")
    with pytest.raises(ConfigError, match=r"is this run's own output_dir.*--resume"):
        Engine(show_progress=False).validate(config)
