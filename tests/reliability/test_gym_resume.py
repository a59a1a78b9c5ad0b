"""``horizon gym train --resume``: an online run stopped after its second evaluation ends with
the uninterrupted run's result.

A tiny CartPole ``dqn`` run (and a Pendulum ``td3`` run with Ornstein-Uhlenbeck noise) is
crashed mid-episode after its second evaluation (an injected exception), killed for real
(SIGKILL of a ``horizon gym train`` process paused there) or stopped by Ctrl-C (a
``KeyboardInterrupt`` there), then resumed:
every checkpoint, the normalization, the check rows, the ``-f`` rows and ``-r`` history are
byte-identical to the uninterrupted run's, the final tensors equal, the manifest's evaluations
equal, and the exported model the same with the same outputs. The buffer is smaller than the
run (its ring wraps) and the acting policy is refreshed off the evaluation steps, so a resume
that lost either would differ. A changed config, another -f file and a finished run are
refused with the reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from horizon_engine.builtin.gym.config import load_gym_spec
from horizon_engine.builtin.gym.runner import OnlineRun, train_gym
from horizon_engine.cli import main
from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import NothingToResume
from horizon_engine.plugins import PluginHost
from tests.reliability.conftest import assert_same_result, start_paused, toml_text
from tests.test_training import scalars

pytestmark = pytest.mark.reliability

STEPS_AFTER_SECOND_EVALUATION = 5
"""Where the crash lands: mid-episode, between two evaluations, after the second one."""


def gym_config(output_dir: Path, kind: str = "dqn") -> dict[str, Any]:
    """A few evaluations of a 16-unit network on one thread: CartPole for dqn, Pendulum (with
    Ornstein-Uhlenbeck exploration noise) for td3; a 150-transition buffer that wraps."""
    gym = {
        "seed": 0,
        "train_after_ts": 50,
        "test_every_ts": 45,
        "avg_over_num_episodes": 2,
        "replay_buffer_size": 150,
        "policy_refresh_ts": 20,
        "epsilon_start": 0.2,
        "epsilon_decay_steps": 100,
        "n_step": 2,
        "output_dir": str(output_dir),
    }
    trainer: dict[str, Any] = {"kind": kind, "layers": [16], "minibatch_size": 16, "threads": 1}
    if kind == "dqn":
        gym |= {"env": "CartPole-v1", "episodes": 13, "max_steps": 40}
        trainer |= {"activations": ["relu"], "n_step": 2}
    else:
        gym |= {"env": "Pendulum-v1", "episodes": 6, "max_steps": 30}
        trainer |= {"noise": "ou", "n_step": 2}
    return {"gym": gym, "trainer": trainer, "export": {"kind": "onnx"}}


def train(config: dict[str, Any], files: Path, resume: bool = False) -> None:
    spec = load_gym_spec(config, PluginHost())
    train_gym(spec, rows=files / "rows.jsonl", reward_history=files / "history.csv", resume=resume)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """The folder holding trainer ``kind``'s uninterrupted run (``run/``, ``rows.jsonl``,
    ``history.csv``), made on first use."""
    made: dict[str, Path] = {}

    def folder(kind: str) -> Path:
        if kind not in made:
            files = tmp_path_factory.mktemp(f"uninterrupted-{kind}")
            train(gym_config(files / "run", kind), files)
            made[kind] = files
        return made[kind]

    return folder


class InjectedCrash(BaseException):
    """A crash at a chosen step: a BaseException, as a kill is nothing the runner catches."""


def crash_after_second_evaluation(
    patch: pytest.MonkeyPatch, crash: type[BaseException] = InjectedCrash
) -> None:
    """Make the runner raise ``crash`` a few training steps after its second evaluation."""
    original = OnlineRun._train

    def crashing(run: OnlineRun) -> None:
        evaluations = run.evaluations
        if len(evaluations) == 2 and run.steps == evaluations[1].timestep + (
            STEPS_AFTER_SECOND_EVALUATION
        ):
            raise crash
        original(run)

    patch.setattr(OnlineRun, "_train", crashing)


def crash_instead(run: OnlineRun) -> None:
    raise InjectedCrash


def assert_same_online_result(expected: Path, found: Path) -> None:
    """``found`` holds the uninterrupted run's result: the run folders' files (checkpoints,
    normalization, check rows) byte-identical, the final tensors equal, the same model and
    outputs, the same -f rows and -r history, the manifest's evaluations and TensorBoard's
    scalars (each evaluation's are in the event file before its checkpoint is written, so a
    kill loses none)."""
    assert_same_result(expected / "run", found / "run")
    for name in ("rows.jsonl", "history.csv"):
        assert (found / name).read_bytes() == (expected / name).read_bytes(), name
    want, got = (
        json.loads((folder / "run" / "manifest.json").read_text())
        for folder in (
            expected,
            found,
        )
    )
    assert got["status"] == "succeeded"
    assert got["result"] == want["result"]
    assert got["outputs"] == want["outputs"]
    assert not list((found / "run" / "checkpoints").glob("online-*.pt"))
    assert evaluation_scalars(found / "run") == evaluation_scalars(expected / "run")


def evaluation_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """TensorBoard's scalars over every event file of the run (the interrupted run's too),
    by tag and evaluation; an evaluation told twice must have the same figures."""
    found: dict[str, dict[int, float]] = {}
    for tag, points in scalars(run_dir / "tensorboard").items():
        for step, value in points:
            assert found.setdefault(tag, {}).setdefault(step, value) == value
    return found


@pytest.mark.parametrize("kind", ["dqn", "td3"])
def test_a_run_crashed_after_its_second_evaluation_resumes_to_the_uninterrupted_result(
    kind, tmp_path, uninterrupted, monkeypatch
):
    config = gym_config(tmp_path / "run", kind)
    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        crash_after_second_evaluation(patch)
        train(config, tmp_path)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest["failed_stage"]) == ("failed", "training")
    assert sorted(path.name for path in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "epoch-0001.pt",
        "epoch-0002.pt",
        "latest.pt",
        "online-0002.pt",
    ]
    assert not (tmp_path / "rows.jsonl").exists()  # the rows so far wait in the partial file

    train(config, tmp_path, resume=True)

    resumed = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert resumed["continued_runs"] == [manifest["run_id"]]
    assert resumed["resumed_after_evaluation"] == 2
    assert_same_online_result(uninterrupted(kind), tmp_path)


def test_a_run_stopped_after_its_last_evaluation_resumes_to_the_same_export(
    tmp_path, uninterrupted, monkeypatch
):
    config = gym_config(tmp_path / "run")
    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        patch.setattr(OnlineRun, "_save_check_rows", crash_instead)
        train(config, tmp_path)

    train(config, tmp_path, resume=True)

    assert_same_online_result(uninterrupted("dqn"), tmp_path)


PAUSED_RUN = """
import pathlib, sys, time
from horizon_engine.builtin.gym.runner import OnlineRun
from horizon_engine.cli import main

marker, arguments = pathlib.Path(sys.argv[1]), sys.argv[2:]
original = OnlineRun._train

def paused(run):
    if len(run.evaluations) == 2 and run.steps == run.evaluations[1].timestep + 5:
        marker.write_text("paused")
        time.sleep(600)
    original(run)

OnlineRun._train = paused
main(arguments, prog_name="horizon")
"""
"""``horizon gym train`` in a process of its own that pauses a few steps after its second
evaluation (after writing the marker file named first): a signal then lands mid-episode."""


def paused_run(tmp_path: Path) -> tuple[subprocess.Popen, list[str]]:
    """A ``horizon gym train`` of the dqn config (from a gym.toml) paused after its second
    evaluation, and its command line arguments."""
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(toml_text(gym_config(tmp_path / "run")), encoding="utf-8")
    arguments = ["gym", "train", str(gym_toml), "-r", str(tmp_path / "history.csv")]
    arguments += ["-f", str(tmp_path / "rows.jsonl")]
    process = start_paused(PAUSED_RUN, tmp_path / "paused", arguments, "its second evaluation")
    return process, arguments


def test_a_sigkilled_horizon_gym_train_resumes_to_the_uninterrupted_result(tmp_path, uninterrupted):
    process, arguments = paused_run(tmp_path)
    process.kill()
    process.communicate()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "running"

    result = CliRunner().invoke(main, [*arguments, "--resume"])

    assert result.exit_code == 0, result.output
    assert_same_online_result(uninterrupted("dqn"), tmp_path)
    again = CliRunner().invoke(main, [*arguments, "--resume"])
    assert (again.exit_code, again.output.startswith("nothing to resume")) == (0, True)


def test_ctrl_c_stops_cleanly_and_prints_the_command_that_resumes(
    tmp_path, uninterrupted, monkeypatch
):
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(toml_text(gym_config(tmp_path / "run")), encoding="utf-8")
    arguments = ["gym", "train", str(gym_toml), "-r", str(tmp_path / "history.csv")]
    arguments += ["-f", str(tmp_path / "rows.jsonl")]
    with monkeypatch.context() as patch:
        crash_after_second_evaluation(patch, KeyboardInterrupt)
        result = CliRunner().invoke(main, arguments)

    assert result.exit_code == 130
    assert f"continue this run with: horizon {' '.join(arguments)} --resume" in result.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert (manifest["status"], manifest["failed_stage"]) == ("interrupted", "training")
    assert manifest["error"].endswith("continue it with --resume")

    resumed = CliRunner().invoke(main, [*arguments, "--resume"])

    assert resumed.exit_code == 0, resumed.output
    assert_same_online_result(uninterrupted("dqn"), tmp_path)


def test_a_run_stopped_in_its_warm_up_starts_over_to_the_same_result(
    tmp_path, uninterrupted, monkeypatch
):
    config = gym_config(tmp_path / "run")
    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        patch.setattr(OnlineRun, "_set_up", crash_instead)
        train(config, tmp_path)
    assert (tmp_path / ".rows.jsonl.partial").stat().st_size > 0

    train(config, tmp_path, resume=True)

    assert_same_online_result(uninterrupted("dqn"), tmp_path)


def test_a_changed_config_another_rows_file_or_a_crafted_state_is_refused(tmp_path, monkeypatch):
    config = gym_config(tmp_path / "run")
    with monkeypatch.context() as patch, pytest.raises(InjectedCrash):
        crash_after_second_evaluation(patch)
        train(config, tmp_path)
    changed = json.loads(json.dumps(config))
    changed["trainer"]["minibatch_size"] = 8
    changed["gym"]["test_every_ts"] = 50
    with pytest.raises(HorizonError, match=r"in gym\.test_every_ts, trainer\.minibatch_size;"):
        train(changed, tmp_path, resume=True)
    spec = load_gym_spec(config, PluginHost())
    with pytest.raises(HorizonError, match=r"wrote its -f rows to .*rows\.jsonl; resume with"):
        train_gym(spec, rows=tmp_path / "other.jsonl", resume=True)
    state = tmp_path / "run" / "checkpoints" / "online-0002.pt"
    torch.save({"position": {}, "rows_file": str((tmp_path / "rows.jsonl").resolve())}, state)
    with pytest.raises(HorizonError, match=r"online-0002\.pt does not hold the runner state"):
        train(config, tmp_path, resume=True)


def test_nothing_to_resume_in_a_finished_run_or_an_empty_folder(tmp_path, uninterrupted):
    finished = uninterrupted("dqn")
    spec = load_gym_spec(gym_config(finished / "run"), PluginHost())
    with pytest.raises(NothingToResume, match="finished its training"):
        train_gym(spec, rows=finished / "rows.jsonl", resume=True)
    empty = load_gym_spec(gym_config(tmp_path / "empty"), PluginHost())
    with pytest.raises(HorizonError, match="holds no run to resume"):
        train_gym(empty, resume=True)
