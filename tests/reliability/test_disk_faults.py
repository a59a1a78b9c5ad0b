"""A full or unwritable output folder: one clear line, and no work lost.

A stage writes its outputs aside and moves them into place once whole, so a disk that fills
up during a stage must leave the stages that finished as they were (outputs and manifest
records), record the failing one as failed, leave nothing half-written that looks whole, and
let ``horizon run ... --resume`` continue once there is room again, to the same outputs as a
run that never met the fault.

A real full disk needs a small file system: a tmpfs of a few MiB, mounted where this process
may mount (root, as in the project's containers; skipped elsewhere). A full disk as Arrow
reports it (``OSError`` with errno ENOSPC and no file name) is also injected in-process, which
runs everywhere.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from horizon_engine.cli import main

pytestmark = pytest.mark.reliability

DATA_STAGES = "timeline,normalization"


def write_rows(path: Path) -> None:
    """800 logged decisions: 40 episodes of 20 steps, two features, two actions."""
    chosen = random.Random(0)
    with path.open("w", encoding="utf-8") as handle:
        for episode in range(40):
            for step in range(20):
                row = {
                    "mdp_id": f"episode{episode}",
                    "sequence_number": step,
                    "state_features": {"0": chosen.random(), "1": chosen.random()},
                    "action": chosen.choice(["0", "1"]),
                    "reward": chosen.random(),
                    "action_probability": 0.5,
                    "possible_actions": ["0", "1"],
                    "metrics": {"reward": 1.0},
                }
                handle.write(json.dumps(row) + "\n")


def pipeline_file(folder: Path, output_dir: Path) -> Path:
    rows = folder / "rows.jsonl"
    if not rows.exists():
        write_rows(rows)
    pipeline = folder / f"{output_dir.name}.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{output_dir}"\n'
        f'[source]\nkind = "jsonl"\npath = "{rows}"\n'
        '[timeline]\nactions = ["0", "1"]\n'
        "[normalization]\n",
        encoding="utf-8",
    )
    return pipeline


def horizon_run(pipeline: Path, *arguments: str) -> Result:
    return CliRunner().invoke(main, ["run", str(pipeline), *arguments])


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too), by relative path, with its bytes."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def outputs_of(run: Path) -> dict[str, object]:
    """What the data stages wrote, comparable across runs: the timeline's rows and the
    normalization parameters."""
    keys = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
    tables = {
        split: pq.read_table(run / "timeline" / split).sort_by(keys).to_pylist()
        for split in ("train", "eval")
    }
    return {**tables, "normalization": (run / "normalization.json").read_text()}


def assert_one_line_error(result: Result, *expected: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for text in expected:
        assert text in lines[0], result.output


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The data stages' outputs of a run that met no fault."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    pipeline = pipeline_file(folder, folder / "run")
    assert horizon_run(pipeline).exit_code == 0
    return outputs_of(folder / "run")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test, unmounted after it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    # Lazily: a table read from the disk may still map its file until collected.
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """A file taking all of ``disk``'s free space but ``leave`` bytes; remove it to free them."""
    ballast = disk / "ballast"
    free = shutil.disk_usage(disk).free - leave
    with ballast.open("wb") as handle:
        try:
            handle.write(bytes(free))
            handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC and leave == 0
    return ballast


def test_full_disk_during_a_stage_keeps_finished_stages_and_continues(
    tmp_path, small_disk, uninterrupted
):
    run = small_disk / "run"
    pipeline = pipeline_file(tmp_path, run)
    assert horizon_run(pipeline, "--stages", "source").exit_code == 0
    source_stage = json.loads((run / "manifest.json").read_text())["stages"]["source"]
    source_rows = (run / "source" / "rows.parquet").read_bytes()
    ballast = fill(small_disk, leave=8192)

    failed = horizon_run(pipeline, "--stages", DATA_STAGES)

    assert_one_line_error(failed, f"{run / 'timeline'}: No space left on device", "--resume")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["failed_stage"] == "timeline"
    assert "timeline" in manifest["incomplete_stages"]
    assert manifest["stages"] == {"source": source_stage}
    # Nothing of the failed stage is left, whole-looking or not, and the finished one is intact.
    assert set(files_of(run)) == {"manifest.json", "source/rows.parquet"}
    assert (run / "source" / "rows.parquet").read_bytes() == source_rows

    ballast.unlink()
    continued = horizon_run(pipeline, "--resume")
    assert continued.exit_code == 0, continued.output
    assert "source: not run" in continued.output
    assert outputs_of(run) == uninterrupted


def test_disk_without_a_byte_left_changes_nothing_in_the_run_folder(
    tmp_path, small_disk, uninterrupted
):
    run = small_disk / "run"
    pipeline = pipeline_file(tmp_path, run)
    assert horizon_run(pipeline, "--stages", "source").exit_code == 0
    before = files_of(run)
    ballast = fill(small_disk, leave=0)

    failed = horizon_run(pipeline, "--stages", DATA_STAGES)

    # The first write is the manifest's: refused, and the one before it stays as it was.
    assert_one_line_error(failed, f"{run / 'manifest.json'}: No space left on device")
    assert files_of(run) == before
    ballast.unlink()
    resumed = horizon_run(pipeline, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "source: not run" in resumed.output
    assert outputs_of(run) == uninterrupted


def test_read_only_output_folder_is_one_line_and_changes_nothing(
    tmp_path, small_disk, uninterrupted
):
    run = small_disk / "run"
    pipeline = pipeline_file(tmp_path, run)
    assert horizon_run(pipeline, "--stages", "source").exit_code == 0
    before = files_of(run)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        failed = horizon_run(pipeline, "--stages", DATA_STAGES)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)

    assert_one_line_error(failed, f"{run / 'manifest.json'}: Read-only file system")
    assert "make it writable" in failed.output
    assert files_of(run) == before
    assert horizon_run(pipeline, "--resume").exit_code == 0
    assert outputs_of(run) == uninterrupted


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a folder whatever its mode says")
def test_output_folder_without_write_permission_is_one_line(tmp_path):
    run = tmp_path / "run"
    pipeline = pipeline_file(tmp_path, run)
    assert horizon_run(pipeline, "--stages", "source").exit_code == 0
    before = files_of(run)
    run.chmod(0o555)
    try:
        failed = horizon_run(pipeline, "--stages", DATA_STAGES)
    finally:
        run.chmod(0o755)
    assert_one_line_error(failed, "Permission denied", "make it writable")
    assert files_of(run) == before


def test_full_disk_as_arrow_reports_it_keeps_finished_stages(tmp_path, monkeypatch, uninterrupted):
    """Arrow's error for a full disk names no file: the message still says where."""
    run = tmp_path / "run"
    pipeline = pipeline_file(tmp_path, run)
    assert horizon_run(pipeline, "--stages", "source").exit_code == 0
    before = files_of(run)

    def disk_full(*arguments: object, **options: object) -> None:
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28]")

    with monkeypatch.context() as patch:
        patch.setattr(pq.ParquetWriter, "write_table", disk_full)
        failed = horizon_run(pipeline, "--stages", DATA_STAGES)

    assert_one_line_error(failed, f"{run / 'timeline'}: No space left on device")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["failed_stage"] == "timeline"
    assert {name: data for name, data in files_of(run).items() if name != "manifest.json"} == {
        name: data for name, data in before.items() if name != "manifest.json"
    }
    assert horizon_run(pipeline, "--resume").exit_code == 0
    assert outputs_of(run) == uninterrupted
