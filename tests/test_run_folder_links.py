"""A run holds its folder: a folder of the run replaced by a link while it runs (in a shared
output folder anyone may write in) is never written or emptied through
(``horizon_engine.files.held_folder``). And the rest of issue 33's run-folder input: a
manifest's process id, a manifest's temporary names and outputs, and ``output_dir`` values
that pass as paths but cannot be a run's folder."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
from test_run_folder_hostile import crafted_run, unused_pid
from test_training import pipeline

from horizon_engine import HorizonError, files, training
from horizon_engine.files import UnsafePathError, atomic_output, held_folder, remove_path
from horizon_engine.pipeline import Engine
from horizon_engine.run_folder import (
    MAX_RECORDED_OUTPUTS,
    EarlierRun,
    leftovers,
    output_dir_problem,
    read_earlier_run,
)
from horizon_engine.timeline import TimelineInfo


@pytest.fixture
def engine(trainer_host) -> Engine:
    return Engine(plugins=trainer_host, show_progress=False)


SENTINELS = {
    "source": {"rows.parquet": "someone else's rows"},
    "timeline": {
        "train/part-0.parquet": "theirs",
        "eval/part-0.parquet": "theirs",
        "timeline.json": "{}",
    },
    "checkpoints": {"latest.pt": "someone else's", "epoch-0001.pt": "someone else's"},
}
"""What the folder a link is swapped in for leads to holds: names the stage would write."""


def sentinel(tmp_path: Path, folder: str) -> Path:
    """A folder outside the run (inside ``tmp_path``) holding ``SENTINELS[folder]``."""
    place = tmp_path / "sentinel"
    for name, text in SENTINELS[folder].items():
        (place / name).parent.mkdir(parents=True, exist_ok=True)
        (place / name).write_text(text)
    return place


def contents(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def swap_for_link(run: Path, folder: str, target: Path) -> None:
    """What someone who can write in the run folder does: move the run's folder away and
    put a link to ``target`` in its place."""
    os.rename(run / folder, run / f"{folder}-moved")
    os.symlink(target, run / folder)


@pytest.mark.parametrize(
    ("stage", "folder"), [("source", "source"), ("timeline", "timeline"), ("train", "checkpoints")]
)
def test_a_folder_swapped_for_a_link_as_its_stage_starts_is_not_written_through(
    engine, tmp_path, monkeypatch, stage, folder
):
    """The swap comes after the run checked its folder (``take_over``) and removed the
    stage's earlier outputs: before the fix the stage wrote its outputs through the link,
    replacing the sentinel's ``train/``, ``eval/``, ``timeline.json``, ``latest.pt``."""
    run = tmp_path / "run"
    engine.run(pipeline(run))
    target = sentinel(tmp_path, folder)
    before = contents(target)
    started = engine.plugins.on_stage_start

    def swap_then_start(context, name):
        if name == stage:
            swap_for_link(run, folder, target)
        started(context, name)

    monkeypatch.setattr(engine.plugins, "on_stage_start", swap_then_start)
    link = re.escape(f"{run / folder} is a link to {target}, which this run did not make")
    with pytest.raises(UnsafePathError, match=link):
        engine.run(pipeline(run), stages=[stage])
    assert contents(target) == before
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_stage"] == stage


def test_a_timeline_folder_swapped_between_writing_and_renaming_receives_nothing(
    engine, tmp_path, monkeypatch
):
    """The splits are written in the staging folder, then the folder is swapped: nothing is
    renamed into place (neither through the link nor into the folder moved away)."""
    run = tmp_path / "run"
    engine.run(pipeline(run), stages=["source", "timeline"])
    target = sentinel(tmp_path, "timeline")
    before = contents(target)
    assert (run / "timeline" / "timeline.json").is_file()
    write = TimelineInfo.write

    def write_then_swap(info, folder):
        write(info, folder)
        swap_for_link(run, "timeline", target)

    monkeypatch.setattr(TimelineInfo, "write", write_then_swap)
    with pytest.raises(UnsafePathError, match=re.escape(f"{run / 'timeline'} is a link to")):
        engine.run(pipeline(run), stages=["timeline"])
    assert contents(target) == before
    # The stage's earlier outputs were removed before it ran; its new ones were not moved in,
    # and its staging folder is gone.
    assert os.listdir(run / "timeline-moved") == []


def test_a_checkpoints_folder_swapped_between_epochs_receives_nothing(
    engine, tmp_path, monkeypatch
):
    """Epoch 1's checkpoint is written, then ``checkpoints/`` becomes a link: epoch 2's
    checkpoint stops the run. Before the fix it replaced the sentinel's ``latest.pt``."""
    run = tmp_path / "run"
    target = sentinel(tmp_path, "checkpoints")
    before = contents(target)
    save = training.save_checkpoint

    def save_then_swap(folder, epoch, state):
        written = save(folder, epoch, state)
        if epoch == 1:
            swap_for_link(run, "checkpoints", target)
        return written

    monkeypatch.setattr(training, "save_checkpoint", save_then_swap)
    with pytest.raises(UnsafePathError, match=re.escape(f"{run / 'checkpoints'} is a link to")):
        engine.run(pipeline(run))
    assert contents(target) == before
    assert sorted(os.listdir(run / "checkpoints-moved")) == ["epoch-0001.pt", "latest.pt"]


def test_a_tensorboard_folder_swapped_before_its_first_event_receives_nothing(
    engine, tmp_path, monkeypatch
):
    """The event file is opened at the first epoch's end (``append_output``): a link swapped
    in for ``tensorboard/`` as the train stage starts stops the run there, and nothing is
    written where it leads. Before, the event file was opened through the link."""
    run = tmp_path / "run"
    engine.run(pipeline(run), stages=["source", "timeline", "normalization"])
    target = tmp_path / "sentinel"
    target.mkdir()
    (target / "theirs.txt").write_text("someone else's")
    started = engine.plugins.on_stage_start

    def swap_then_start(context, name):
        if name == "train":
            (run / "tensorboard").symlink_to(target)
        started(context, name)

    monkeypatch.setattr(engine.plugins, "on_stage_start", swap_then_start)
    link = re.escape(f"{run / 'tensorboard'} is a link to {target}")
    with pytest.raises(UnsafePathError, match=link):
        engine.run(pipeline(run), stages=["train"])
    assert contents(target) == {"theirs.txt": b"someone else's"}


def test_a_held_folder_removes_and_writes_nothing_through_a_link(tmp_path):
    run, target = tmp_path / "run", sentinel(tmp_path, "timeline")
    before = contents(target)
    with held_folder(run):
        (run / "timeline").symlink_to(target)
        with pytest.raises(UnsafePathError, match="is a link to"):
            remove_path(run / "timeline" / "train")
        with (
            pytest.raises(UnsafePathError, match="is a link to"),
            atomic_output(run / "timeline" / "timeline.json") as temporary,
        ):
            temporary.write_text("overwritten")
        with (
            pytest.raises(UnsafePathError, match="is a link to"),
            files.staged_outputs(run / "timeline"),
        ):
            pass
        remove_path(run / "timeline")  # the link itself, never what it leads to
    assert not (run / "timeline").is_symlink()
    assert contents(target) == before


def test_a_writer_is_handed_a_path_that_a_swapped_folder_cannot_redirect(tmp_path):
    """The temporary path names the held folder itself: after its folder is swapped for a
    link, what is written there still lands in the run's own (moved) folder."""
    run, target = tmp_path / "run", sentinel(tmp_path, "checkpoints")
    before = contents(target)
    (run / "checkpoints").mkdir(parents=True)
    with (
        held_folder(run),
        pytest.raises(UnsafePathError, match="is a link to"),
        atomic_output(run / "checkpoints" / "latest.pt") as temporary,
    ):
        swap_for_link(run, "checkpoints", target)
        temporary.write_text("the run's")
        assert (run / "checkpoints-moved" / temporary.name).read_text() == "the run's"
    assert contents(target) == before
    assert os.listdir(run / "checkpoints-moved") == []


def test_an_error_under_a_held_folder_names_the_users_path(tmp_path):
    run = tmp_path / "run"
    with (
        held_folder(run),
        pytest.raises(FileNotFoundError) as raised,
        files.staged_outputs(run / "timeline") as staging,
    ):
        (staging / "missing" / "x").write_text("")
    assert raised.value.filename == str(
        run / "timeline" / files.temporary_name(files.STAGING) / "missing" / "x"
    )


# --- B: a manifest's process id -------------------------------------------------------------


@pytest.mark.parametrize("pid", [2**70, -(2**70), -1, 0, True, 2**31, "123", 1.5])
def test_a_recorded_pid_that_is_no_process_id_is_not_running(tmp_path, pid):
    """Before the fix 2**70 raised OverflowError in os.kill, and -1 and 0 (a whole process
    group) were "still running" for ever."""
    earlier = EarlierRun({"status": "running", "pid": pid, "host": socket.gethostname()})
    assert not earlier.still_running()
    (tmp_path / f".manifest.json.tmp-{pid}").write_text("")
    assert leftovers(tmp_path, pid, ["timeline/train"]) == []


def test_a_run_after_one_recorded_with_a_huge_pid_goes_ahead(engine, tmp_path):
    run = tmp_path / "run"
    crafted_run(run, {}, status="running", pid=2**70, host=socket.gethostname())
    manifest = engine.run(pipeline(run), stages=["source"])
    assert manifest["status"] == "succeeded"
    assert manifest["warnings"][0].startswith("run crafted was interrupted")


# --- C and D: output_dir values that cannot be a run's folder --------------------------------


def test_an_output_dir_component_longer_than_the_filesystem_allows_is_refused(tmp_path):
    name = "a" * 300
    problem = output_dir_problem(tmp_path / name / "run", "pipeline.toml")
    assert problem is not None
    assert f"has a component of 300 bytes ('{'a' * 40}...'), longer than the 255" in problem


def test_an_output_dir_too_long_for_the_run_s_paths_is_refused(tmp_path):
    """4096 bytes is Linux's PATH_MAX; the run needs 256 more for its own names."""
    path = tmp_path.joinpath(*["b" * 200] * 20)
    problem = output_dir_problem(path, "pipeline.toml")
    assert problem is not None
    size = len(os.fsencode(path))
    assert f"is {size} bytes long: with the 256 bytes" in problem
    assert "longer than the 4096 a path may have there" in problem


@pytest.mark.parametrize("output_dir", ["~", "~/runs/pipeline", "~root/runs"])
def test_an_output_dir_starting_with_a_tilde_is_refused(output_dir):
    problem = output_dir_problem(Path(output_dir), "pipeline.toml")
    assert problem is not None and "starts with '~', which Horizon does not expand" in problem


def test_a_tilde_folder_is_written_where_it_is_named_never_under_home(tmp_path, monkeypatch):
    """Arrow reads a path starting with ``~`` as the home folder: before the fix a file
    written by ``atomic_output(Path("~/rows.parquet"))`` went there (and the rename failed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    with atomic_output(Path("~") / "rows.parquet") as temporary:
        pq.write_table(pa.table({"x": [1]}), temporary)
    assert pq.read_table(tmp_path / "~" / "rows.parquet").num_rows == 1
    assert list(home.iterdir()) == []


def test_a_git_checkout_and_its_git_folder_are_refused_whatever_they_hold(tmp_path):
    checkout = tmp_path / "project"
    (checkout / ".git" / "objects").mkdir(parents=True)
    for folder in (checkout, checkout / ".git"):
        (folder / "manifest.json").write_text(json.dumps({"config": {}, "stages": {}}))
    top = output_dir_problem(checkout, "pipeline.toml")
    assert top is not None and "is the top of a git work tree" in top
    for inside in (checkout / ".git", checkout / ".git" / "objects", checkout / ".git" / "new"):
        problem = output_dir_problem(inside, "pipeline.toml")
        assert problem is not None and "is in a .git folder" in problem
    assert output_dir_problem(checkout / "runs" / "one", "pipeline.toml") is None


# --- E: a manifest's temporary names and outputs --------------------------------------------


def test_only_the_temporary_names_horizon_writes_are_removed_as_leftovers(engine, tmp_path):
    dead = unused_pid()
    run = tmp_path / "run"
    crafted_run(run, {}, status="running", pid=dead, host=socket.gethostname())
    horizons = [
        f".timeline.tmp-{dead}",
        f"timeline/.staging.tmp-{dead}",
        f"checkpoints/.epoch-0003.pt.tmp-{dead}",
        f"checkpoints/.latest.pt.tmp-{dead}",
        f".manifest.json.tmp-{dead}",
    ]
    users = [f".x.tmp-{dead}", f".x.old-{dead}", f"checkpoints/.notes.tmp-{dead}"]
    for name in (*horizons, *users):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("")
    manifest = engine.run(pipeline(run), stages=["source"])
    assert f"removed its temporary files {sorted(horizons)}" in manifest["warnings"][0]
    assert all((run / name).exists() for name in users)
    assert not any((run / name).exists() for name in horizons)


def test_overwrite_removes_only_recorded_outputs_that_their_stage_claims(engine, tmp_path):
    """A manifest listing a user's file among the source stage's outputs: before the fix
    ``--overwrite`` (and ``--stages source``) deleted it."""
    run = tmp_path / "run"
    engine.run(pipeline(run), stages=["source"])
    users = ("notes.txt", "source/notes.txt")
    for name in users:
        (run / name).write_text("mine")
    for how in ({"stages": ["source"]}, {"overwrite": True}):
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["stages"]["source"]["outputs"] += users
        (run / "manifest.json").write_text(json.dumps(manifest))
        engine.run(pipeline(run), **how)
        assert all((run / name).read_text() == "mine" for name in users), how


def test_a_recorded_output_is_a_path_never_a_pattern(engine, tmp_path):
    """A manifest listing ``source/*`` does not make a user's ``source/rows.parquet`` the
    run's to write over."""
    run = tmp_path / "run"
    crafted_run(run, {"source": ["source/*"]})
    (run / "source").mkdir()
    (run / "source" / "rows.parquet").write_text("mine")
    with pytest.raises(HorizonError, match="no run recorded"):
        engine.run(pipeline(run), overwrite=True)
    assert (run / "source" / "rows.parquet").read_text() == "mine"


def test_a_manifest_listing_more_outputs_than_a_run_writes_is_refused(tmp_path):
    """Checking entries is linear and cheap now (1,000,000 took 68 s to refuse before the fix,
    one ``resolve()`` each); past ``MAX_RECORDED_OUTPUTS`` a manifest is refused before any
    entry is checked."""
    run = tmp_path / "run"
    outputs = [f"checkpoints/epoch-{epoch:07d}.pt" for epoch in range(MAX_RECORDED_OUTPUTS + 1)]
    crafted_run(run, {"train": outputs})
    with pytest.raises(UnsafePathError, match=f"lists {MAX_RECORDED_OUTPUTS + 1} outputs, more"):
        read_earlier_run(run)
    crafted_run(run, {"train": outputs[:-1]})
    earlier = read_earlier_run(run)
    assert earlier is not None and len(earlier.outputs()) == MAX_RECORDED_OUTPUTS
