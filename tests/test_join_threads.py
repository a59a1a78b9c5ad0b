"""``horizon join``'s threads of its own (the rewards' reading, the Parquet row groups'
writing) run only where the process may use three cores or more (``threads_help``); without
them the join writes the same bytes and the same report, and names the same first bad row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from horizon_plugins_serving import join, join_writer
from tests.test_join_speed_parity import READ_TWICE, generated_files, parquet_log, run_join


def with_threads(monkeypatch: pytest.MonkeyPatch, threaded: bool) -> None:
    """The join's threads on or off, whatever this machine's cores; off, none may start."""
    monkeypatch.setattr(join, "threads_help", lambda: threaded)
    monkeypatch.setattr(join_writer, "threads_help", lambda: threaded)
    if not threaded:

        def no_thread(*arguments: object, **options: object) -> None:
            raise AssertionError("a thread started where threads do not help")

        monkeypatch.setattr(join, "ThreadPoolExecutor", no_thread)
        monkeypatch.setattr(join_writer, "ThreadPoolExecutor", no_thread)


@pytest.mark.parametrize(("cores", "threaded"), [(1, False), (2, False), (3, True), (16, True)])
def test_threads_help_from_three_cores(monkeypatch, cores, threaded):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert join_writer.threads_help() is threaded


def written_files(output: Path) -> dict[str, bytes]:
    """JOINED's bytes by file name (a Parquet folder's parts), and its report's counts."""
    files = sorted(output.iterdir()) if output.is_dir() else [output]
    written = {path.name: path.read_bytes() for path in files}
    report = json.loads((output.parent / f"_{output.name}.report.json").read_text())
    return written | {"report": json.dumps(report, sort_keys=True).encode()}


@pytest.mark.parametrize(
    ("log_form", "output_name", "options"),
    [
        ("jsonl", "joined.jsonl", ()),
        ("jsonl", "joined.parquet", ()),
        ("parquet", "joined.parquet", ()),
        ("parquet", "joined.jsonl", ()),
        ("jsonl", "joined.parquet", tuple(READ_TWICE)),
        ("parquet", "joined.parquet", tuple(READ_TWICE)),
    ],
)
def test_the_join_writes_the_same_bytes_with_and_without_its_threads(
    tmp_path, monkeypatch, log_form, output_name, options
):
    """A log with repeated ids, bad rows on both sides and a torn last line, in chunks of 40
    rows and row groups of 30 (several handed to the writing thread), read once or twice."""
    from horizon_plugins_serving.join_readers import DecisionLogReader

    monkeypatch.setattr(DecisionLogReader.__init__, "__defaults__", (40,))
    monkeypatch.setattr(join_writer, "ROW_GROUP_ROWS", 30)
    log, rewards = generated_files(tmp_path)
    if log_form == "parquet":
        log = parquet_log(tmp_path)
    written = {}
    for threaded in (True, False):
        with monkeypatch.context() as patched:
            with_threads(patched, threaded)
            output = tmp_path / str(threaded) / output_name
            output.parent.mkdir()
            code, printed = run_join(log, rewards, output, *options)
            assert code == 0, printed
            written[threaded] = written_files(output)
    assert written[True] == written[False]
    assert b'"rewards_attached": 0' not in written[False]["report"]
