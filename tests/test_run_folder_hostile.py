"""A run folder is input: whatever its manifest lists and whatever links it holds, Horizon
removes and writes nothing outside it (``horizon_engine.run_folder.inside_path``)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_training import pipeline

from horizon_engine import HorizonError
from horizon_engine.cli import main
from horizon_engine.pipeline import Engine
from horizon_engine.run_folder import UnsafePathError, inside_path, leftovers


@pytest.fixture
def engine(trainer_host) -> Engine:
    return Engine(plugins=trainer_host, show_progress=False)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every run folder that nothing may remove."""
    path = tmp_path / "victim.txt"
    path.write_text("keep me")
    return path


def unused_pid() -> int:
    """A process id of this system that no process has now."""
    limit = int(Path("/proc/sys/kernel/pid_max").read_text()) if Path("/proc").is_dir() else 2**15
    for pid in range(limit - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("every process id is in use")


def crafted_run(folder: Path, outputs: dict[str, list], **manifest: object) -> Path:
    """A folder whose manifest records a finished run whose stages wrote ``outputs``."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "run_id": "crafted",
        "status": "succeeded",
        "config": pipeline(folder),
        "stages": {
            stage: {"outputs": paths, "run_id": "crafted"} for stage, paths in outputs.items()
        },
        **manifest,
    }
    (folder / "manifest.json").write_text(json.dumps(record))
    return folder / "manifest.json"


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("ABSOLUTE", "is an absolute path"),
        ("../victim.txt", "climbs out of the folder with '..'"),
        ("source/../../victim.txt", "climbs out of the folder with '..'"),
    ],
)
@pytest.mark.parametrize("how", [{"overwrite": True}, {"stages": ["source"]}])
def test_a_manifest_entry_outside_the_folder_stops_the_run(
    engine, tmp_path, victim, entry, why, how
):
    entry = str(victim) if entry == "ABSOLUTE" else entry
    run = tmp_path / "run"
    manifest = crafted_run(run, {"source": ["source/rows.parquet", entry]})
    with pytest.raises(UnsafePathError) as refused:
        engine.run(pipeline(run), **how)
    message = str(refused.value)
    assert f"{manifest}: stage 'source' lists {entry!r}, which {why}" in message
    assert victim.read_text() == "keep me"
    assert json.loads(manifest.read_text())["run_id"] == "crafted"


def test_a_linked_folder_leading_out_is_neither_emptied_nor_written(engine, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "latest.pt").write_text("someone else's")
    run = tmp_path / "run"
    manifest = crafted_run(run, {"train": ["checkpoints/latest.pt"]})
    (run / "checkpoints").symlink_to(elsewhere)
    for how in ({"overwrite": True}, {"stages": ["train"]}):
        with pytest.raises(UnsafePathError, match="through a link") as refused:
            engine.run(pipeline(run), **how)
        assert f"{manifest}: stage 'train' lists 'checkpoints/latest.pt'" in str(refused.value)
    assert (elsewhere / "latest.pt").read_text() == "someone else's"

    manifest.unlink()
    (elsewhere / "latest.pt").unlink()
    with pytest.raises(UnsafePathError, match="stage 'train', which writes checkpoints/"):
        engine.run(pipeline(run))
    assert list(elsewhere.iterdir()) == []


def test_a_linked_file_leading_out_is_refused(engine, tmp_path, victim):
    run = tmp_path / "run"
    manifest = crafted_run(run, {"source": ["source/rows.parquet"]})
    (run / "source").mkdir()
    (run / "source" / "rows.parquet").symlink_to(victim)
    with pytest.raises(UnsafePathError, match=f"leads to {victim} through a link"):
        engine.run(pipeline(run), overwrite=True)
    assert victim.read_text() == "keep me"
    assert json.loads(manifest.read_text())["run_id"] == "crafted"


@pytest.mark.parametrize(
    ("outputs", "why"),
    [
        (["."], "is the run folder itself"),
        ([""], "is not a run-relative path"),
        ([7], "is not a run-relative path"),
        (["a\x00b"], "holds a NUL byte"),
    ],
)
def test_an_entry_that_is_no_path_inside_is_refused(engine, tmp_path, outputs, why):
    run = tmp_path / "run"
    crafted_run(run, {"source": outputs})
    (run / "notes.txt").write_text("mine")
    with pytest.raises(UnsafePathError, match=why):
        engine.run(pipeline(run), overwrite=True)
    assert (run / "notes.txt").read_text() == "mine"


def test_outputs_that_are_not_a_list_are_refused(engine, tmp_path):
    """A relative name, never an absolute one: before the fix a string was read as a list of
    its characters, and an absolute path's first character, "/", was removed as a folder."""
    run = tmp_path / "run"
    crafted_run(run, {"source": "source"})
    with pytest.raises(UnsafePathError, match="lists outputs 'source', which is not a list"):
        engine.run(pipeline(run), overwrite=True)


def test_horizon_export_of_a_copied_folder_removes_nothing_outside(
    trainer_host, tmp_path, victim, monkeypatch
):
    """``horizon export`` of a pipeline's folder runs its export stage, which replaces what
    the manifest says the export wrote: a copied folder's entry must not reach outside."""
    from horizon_engine import plugins

    monkeypatch.setattr(plugins, "_default_host", trainer_host)
    run = tmp_path / "copied"
    manifest = crafted_run(run, {"export": ["../victim.txt"]})
    result = CliRunner().invoke(main, ["export", str(run)])
    assert result.exit_code == 1, result.output
    assert f"{manifest}: stage 'export' lists '../victim.txt'" in result.output
    assert "Traceback" not in result.output
    assert victim.read_text() == "keep me"


def test_a_real_runs_tampered_manifest_is_refused_by_a_stage_run(engine, tmp_path, victim):
    run = tmp_path / "run"
    engine.run(pipeline(run))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["stages"]["timeline"]["outputs"].append(str(victim))
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsafePathError, match="stage 'timeline' lists"):
        engine.run(pipeline(run), stages=["timeline"])
    assert victim.read_text() == "keep me"
    assert (run / "timeline" / "timeline.json").is_file()


def test_an_interrupted_runs_cleanup_stays_inside(engine, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dead = unused_pid()
    stranger = elsewhere / f".data.tmp-{dead}"
    stranger.write_text("not the run's")
    run = tmp_path / "run"
    crafted_run(run, {}, status="running", pid=dead, host=os.uname().nodename)
    (run / "linked").symlink_to(elsewhere)
    (run / ".x.tmp-1").write_text("a temporary name")
    assert leftovers(run, dead, ["linked/data"]) == []
    assert leftovers(run, ".*", ["x"]) == [] and leftovers(run, "1", ["x"]) == []
    engine.run(pipeline(run))
    assert stranger.read_text() == "not the run's"
    assert (run / ".x.tmp-1").exists()


def test_inside_path_accepts_paths_inside_and_links_that_stay_inside(tmp_path):
    (tmp_path / "timeline").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "timeline")
    assert inside_path(tmp_path, "timeline/train", "test") == tmp_path / "timeline" / "train"
    assert inside_path(tmp_path, "alias/train", "test") == tmp_path / "alias" / "train"
    assert inside_path(Path(os.path.relpath(tmp_path)), "./a/b", "test").name == "b"


def test_horizon_export_of_a_manifest_whose_pipeline_is_no_table(tmp_path):
    run = tmp_path / "copied"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"config": {"pipeline": "runs/x"}}))
    result = CliRunner().invoke(main, ["export", str(run)])
    assert result.exit_code == 1
    assert 'config.pipeline is "runs/x", not a table of options' in result.output
    assert "Traceback" not in result.output


def test_a_linked_tensorboard_folder_leading_out_is_refused(engine, tmp_path):
    """The TensorBoard reporter writes event files under the train stage's tensorboard/."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="stage 'train', which writes tensorboard/"):
        engine.run(pipeline(run))
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda info: info.pop("n_step"), "no 'n_step'"),
        (lambda info: info.update(train_rows="many"), "'train_rows' is not a count of rows"),
        (lambda info: info.update(action_type="mixed"), "'action_type' is not discrete, param"),
        (lambda info: info.update(actions=[0, 1]), "'actions' is not null or a list of action"),
        (lambda info: info.update(shards=4), "unknown field 'shards'"),
    ],
)
def test_a_tampered_timeline_description_is_refused_naming_the_file_and_field(
    engine, tmp_path, edit, why
):
    """``timeline/timeline.json`` is read back by the normalization and train stages (and any
    plugin stage, through ``RunFolder.timeline_info``): a copied folder's edited file stops
    the stage with the file and the field named, not a TypeError."""
    run = tmp_path / "run"
    engine.run(pipeline(run), stages=["source", "timeline"])
    described = run / "timeline" / "timeline.json"
    info = json.loads(described.read_text())
    edit(info)
    described.write_text(json.dumps(info))
    with pytest.raises(HorizonError, match=f"{re.escape(str(described))}: .*{why}"):
        engine.run(pipeline(run), stages=["normalization"])
