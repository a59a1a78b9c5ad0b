"""The import clock: a stage's imports, reported apart from its compute."""

from __future__ import annotations

import builtins
import sys
import threading
from types import SimpleNamespace

import pytest

from horizon_engine.import_clock import import_clock


def test_nested_imports_are_timed_once_by_the_outermost(tmp_path, monkeypatch):
    # A clock that moves one second per reading: each timed import reads it twice, so the total
    # is the number of outermost imports, whatever they import inside.
    ticks = iter(range(1000))
    monkeypatch.setattr(
        "horizon_engine.import_clock.time", SimpleNamespace(perf_counter=lambda: next(ticks))
    )
    (tmp_path / "clock_outer.py").write_text("import clock_inner\nimport json\n")
    (tmp_path / "clock_inner.py").write_text("import os\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with import_clock() as imports:
            import clock_outer  # noqa: F401

            assert imports.seconds == 1
            import clock_inner  # noqa: F401

        assert imports.seconds == 2
    finally:
        sys.modules.pop("clock_outer", None)
        sys.modules.pop("clock_inner", None)


def test_the_import_statement_is_restored_after_an_error():
    original = builtins.__import__
    with pytest.raises(RuntimeError), import_clock():
        assert builtins.__import__ is not original
        raise RuntimeError("a stage failed")
    assert builtins.__import__ is original


def test_a_failing_import_is_still_counted_and_still_fails():
    with import_clock() as imports, pytest.raises(ModuleNotFoundError):
        import horizon_no_such_module  # noqa: F401
    assert imports.seconds > 0


def test_another_threads_imports_are_not_counted(tmp_path, monkeypatch):
    """They overlap the stage's own time (the epochs' ends run on a thread of their own)."""
    (tmp_path / "clock_elsewhere.py").write_text("import json\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def import_elsewhere() -> None:
        import clock_elsewhere  # noqa: F401

    try:
        with import_clock() as imports:
            thread = threading.Thread(target=import_elsewhere)
            thread.start()
            thread.join()
        assert "clock_elsewhere" in sys.modules
        assert imports.seconds == 0
    finally:
        sys.modules.pop("clock_elsewhere", None)
