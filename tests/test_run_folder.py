"""A run's output folder: what a new run may replace, what --stages carries over, and what an
interrupted run leaves behind (``horizon_engine.run_folder``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_training import pipeline

from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import Engine


@pytest.fixture
def engine(trainer_host) -> Engine:
    return Engine(plugins=trainer_host, show_progress=False)


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_a_new_run_refuses_a_folder_holding_another_runs_outputs(engine, tmp_path):
    run = tmp_path / "run"
    first = engine.run(pipeline(run))
    (run / "notes.txt").write_text("mine")
    (run / "source" / "my_logs.jsonl").write_text("{}\n")
    with pytest.raises(HorizonError, match="--overwrite") as refused:
        engine.run(pipeline(run))
    assert f"outputs of an earlier run (run {first['run_id']} (started" in str(refused.value)
    assert manifest_of(run)["run_id"] == first["run_id"]
    second = engine.run(pipeline(run), overwrite=True)
    assert second["warnings"] == [
        f"--overwrite: replaced the outputs of an earlier run (run {first['run_id']} (started "
        f"{first['started_at']}) last wrote manifest.json)"
    ]
    assert (run / "notes.txt").read_text() == "mine"
    assert (run / "source" / "my_logs.jsonl").read_text() == "{}\n"
    assert manifest_of(run)["run_id"] == second["run_id"]


def test_a_file_no_run_wrote_is_never_replaced(engine, tmp_path):
    run = tmp_path / "run"
    (run / "source").mkdir(parents=True)
    (run / "source" / "rows.parquet").write_text("the user's own")
    for overwrite in (False, True):
        with pytest.raises(HorizonError, match=r"holds source/rows\.parquet, which this run"):
            engine.run(pipeline(run), overwrite=overwrite)
    assert (run / "source" / "rows.parquet").read_text() == "the user's own"
    assert not (run / "manifest.json").exists()


def test_a_stage_run_again_replaces_its_own_checkpoints_and_event_files(engine, tmp_path):
    run = tmp_path / "run"
    engine.run(pipeline(run))
    again = engine.run(pipeline(run, epochs=1), stages=["train"])
    checkpoints = sorted(path.name for path in (run / "checkpoints").iterdir())
    assert checkpoints == ["epoch-0001.pt", "latest.pt"]
    events = sorted(path.name for path in (run / "tensorboard").iterdir())
    assert len(events) == 1
    assert events[0].endswith(f".{again['run_id']}")
    assert f"tensorboard/{events[0]}" in again["stages"]["train"]["outputs"]


def test_the_manifest_says_which_stages_ran_and_which_outputs_are_stale(engine, tmp_path):
    run = tmp_path / "run"
    first = engine.run(pipeline(run))
    again = engine.run(pipeline(run), stages=["source"])
    assert again["executed"] == ["source"]
    stages = again["stages"]
    assert stages["source"]["run_id"] == again["run_id"]
    assert stages["source"].get("stale") is None
    for name in ("timeline", "normalization", "train"):
        assert stages[name]["run_id"] == first["run_id"]
        assert stages[name]["stale"] == (
            f"written by run {first['run_id']} from the outputs of stage 'source' that run "
            f"{again['run_id']} has since replaced"
        )
    third = engine.run(pipeline(run), stages=["timeline", "normalization"])
    assert third["executed"] == ["timeline", "normalization"]
    assert third["stages"]["timeline"].get("stale") is None
    assert third["stages"]["source"]["run_id"] == again["run_id"]
    assert third["stages"]["train"]["stale"].startswith(f"written by run {first['run_id']}")
    assert third["warnings"] == []
    fourth = engine.run(pipeline(run), stages=["normalization"])
    assert fourth["warnings"] == []
    engine.run(pipeline(run), stages=["source"])
    reading_stale = engine.run(pipeline(run), stages=["normalization"])
    assert reading_stale["warnings"] == [
        "stage 'normalization' reads timeline/timeline.json, which is stale: "
        + reading_stale["stages"]["timeline"]["stale"]
    ]


def test_a_new_export_makes_no_stage_stale_that_does_not_read_it(trainer_host, tmp_path):
    """Staleness follows what a stage reads, not the run order: the analysis after the export
    reads the data stages' outputs only, and a new export leaves it current; a new training
    makes stale the export that read its checkpoint, and not the analysis either."""
    from horizon_engine.plugins import PluginHost

    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "mean_reward,worldmodel"})
    engine = Engine(plugins=host, show_progress=False)
    run = tmp_path / "run"
    config = {
        **pipeline(run, epochs=1),
        "export": {"kind": "onnx"},
        "analysis": {
            "kind": "world_model",
            "epochs": 1,
            "min_updates": 1,
            "folds": 2,
            "num_bootstrap": 10,
            "layers": [8],
            "num_gaussians": 1,
        },
    }
    first = engine.run(config)
    assert first["executed"][-3:] == ["export", "analysis", "report"]

    exported = engine.run(config, stages=["export"])

    assert exported["stages"]["analysis"]["run_id"] == first["run_id"]
    assert exported["stages"]["analysis"].get("stale") is None
    # The page reads every stage's outputs: a new export leaves it out of date.
    assert exported["stages"]["report"]["stale"]
    trained = engine.run(config, stages=["train"])
    assert trained["stages"]["export"]["stale"].startswith(f"written by run {exported['run_id']}")
    assert trained["stages"]["analysis"].get("stale") is None


def test_a_gym_run_still_writing_to_the_folder_is_not_resumed(tmp_path):
    """A gym run's manifest records its process and host as a pipeline run's does (one
    ``RunFolder.start_manifest``), so ``--resume`` refuses while that process still runs."""
    from horizon_engine.builtin.gym.config import load_gym_spec
    from horizon_engine.builtin.gym.resume import check_resumable
    from horizon_engine.builtin.gym.runner import GYM_COMMAND
    from horizon_engine.plugins import get_plugin_host

    spec = load_gym_spec(
        {"gym": {"output_dir": str(tmp_path)}, "trainer": {"kind": "dqn"}}, get_plugin_host()
    )
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        manifest = {"run_id": "abc", "status": "running", "command": GYM_COMMAND}
        manifest |= {"pid": sleeper.pid, "host": os.uname().nodename, "config": {}}
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(HorizonError, match=r"run abc is still running \(process"):
            check_resumable(spec)
    finally:
        sleeper.kill()


KILLED_RUN = """
import json, sys
from horizon_engine import Engine
Engine(show_progress=False).run(json.loads(sys.argv[1]))
"""


def dqn_pipeline(folder: Path, epochs: int) -> dict:
    return {
        "pipeline": {"output_dir": str(folder), "seed": 0},
        "source": {"kind": "gym", "env": "CartPole-v1", "episodes": 20, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"], "n_step": 1},
        "normalization": {},
        "trainer": {"kind": "dqn", "n_step": 1, "epochs": epochs, "minibatch_size": 32},
        "export": {"kind": "onnx"},
    }


def test_a_killed_run_is_recognised_its_leftovers_removed_and_its_checkpoint_not_exported(
    tmp_path,
):
    """SIGKILL during training: the manifest still says running and the checkpoints stop at
    some epoch. Export refuses that half-trained checkpoint; a later run reports the
    interruption, removes the killed process's temporary files, and trains again."""
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUN, json.dumps(dqn_pipeline(run, epochs=10_000))]
    )
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "epoch-0002.pt").exists():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    killed = manifest_of(run)
    assert killed["status"] == "running"
    assert killed["running_stage"] == "train"
    assert killed["pid"] == process.pid
    # What a kill in the middle of writing a checkpoint leaves: a temporary file of its pid.
    # The kill itself may also have landed mid-write and left one of its own.
    leftover = run / "checkpoints" / f".latest.pt.tmp-{process.pid}"
    leftover.write_bytes(b"")
    leftovers = sorted(
        str(path.relative_to(run))
        for pattern in (".*.tmp-", ".*.old-", "*/.*.tmp-", "*/.*.old-")
        for path in run.glob(f"{pattern}{process.pid}")
    )
    engine = Engine(show_progress=False)
    with pytest.raises(HorizonError, match=r"incomplete: run .* was interrupted during it"):
        engine.run(dqn_pipeline(run, epochs=2), stages=["export"])
    refused = manifest_of(run)
    assert refused["warnings"] == [
        f"run {killed['run_id']} (started {killed['started_at']}) was interrupted during "
        f"stage 'train'; removed its temporary files {leftovers}"
    ]
    assert not any((run / name).exists() for name in leftovers)
    assert not (run / "model.onnx").exists()
    # The refusal is remembered: the checkpoints are still the killed run's.
    assert refused["incomplete_stages"] == {
        "train": f"run {killed['run_id']} (started {killed['started_at']}) was interrupted "
        "during it"
    }
    again = engine.run(dqn_pipeline(run, epochs=2), stages=["train", "export"])
    assert again["status"] == "succeeded"
    assert again["incomplete_stages"] == {}
    checkpoints = sorted(path.name for path in (run / "checkpoints").iterdir())
    assert checkpoints == ["epoch-0001.pt", "epoch-0002.pt", "latest.pt"]
    assert (run / "model.onnx").is_file()


def test_a_run_still_writing_to_the_folder_is_not_disturbed(engine, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        manifest = {"run_id": "abc", "status": "running", "pid": sleeper.pid}
        manifest["host"] = os.uname().nodename
        (run / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(HorizonError, match=r"run abc is still running \(process"):
            engine.run(pipeline(run))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert manifest_of(run)["run_id"] == "abc"


def test_horizon_run_refuses_names_overwrite_and_shows_carried_stages(tmp_path):
    from click.testing import CliRunner

    from horizon_engine.cli import main

    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n'
        '[source]\nkind = "gym"\nepisodes = 3\nds = "2019-01-01"\n\n'
        '[timeline]\nactions = ["0", "1"]\n'
    )
    runner = CliRunner()
    first = runner.invoke(main, ["run", str(pipeline_file)])
    assert first.exit_code == 0, first.output
    refused = runner.invoke(main, ["run", str(pipeline_file)])
    assert refused.exit_code == 1
    assert "Run with --overwrite to replace them" in refused.output
    source_only = runner.invoke(main, ["run", str(pipeline_file), "--stages", "source"])
    assert source_only.exit_code == 0, source_only.output
    first_id = first.output.split("run ")[-1].split()[0]
    assert f"timeline: not run, outputs of run {first_id}, stale: written by run" in (
        source_only.output
    )
    replaced = runner.invoke(main, ["run", str(pipeline_file), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert "warning: --overwrite: replaced the outputs of an earlier run" in replaced.output
    assert "not run" not in replaced.output


def test_a_stage_that_failed_midway_is_incomplete_until_run_again(engine, tmp_path):
    run = tmp_path / "run"
    engine.run(pipeline(run, epochs=1))

    def failing_epoch_end(run_context, epoch, metrics):
        if epoch == 2:
            raise RuntimeError("disk full")

    engine.plugins.on_epoch_end = failing_epoch_end
    with pytest.raises(RuntimeError, match="disk full"):
        engine.run(pipeline(run, epochs=3), stages=["train"])
    failed = manifest_of(run)
    assert failed["failed_stage"] == "train"
    assert failed["incomplete_stages"] == {"train": f"run {failed['run_id']} failed during it"}
    assert "train" not in failed["stages"]
    del engine.plugins.on_epoch_end
    # Its checkpoints are the failed run's, so no run recorded them; running it again may
    # replace them all the same.
    again = engine.run(pipeline(run, epochs=1), stages=["train"])
    assert again["incomplete_stages"] == {}
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "epoch-0001.pt",
        "latest.pt",
    ]


def test_a_stage_whose_input_no_stage_wrote_names_the_stage_to_run_first(engine, tmp_path):
    from horizon_engine.errors import StageInputError

    run = tmp_path / "run"
    with pytest.raises(StageInputError) as caught:
        engine.run(pipeline(run), stages=["normalization"])
    assert str(caught.value) == (
        f"stage 'normalization' reads {run / 'timeline' / 'timeline.json'}, which stage "
        "'timeline' writes; run that stage first (or include it in --stages)"
    )
