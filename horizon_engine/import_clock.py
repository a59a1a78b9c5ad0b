"""How much of a stage's time went to importing modules, reported apart from its compute.

A stage's first use of torch, scipy or onnx costs seconds of imports that a long-running job
pays once and a benchmark must not charge to the algorithm. ``import_clock`` times every
``import`` statement executed while it is active, counting only the outermost one of nested
imports, so the total is wall time spent importing (modules already imported cost next to
nothing and are counted as such).
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class ImportTime:
    """Seconds spent in import statements while the clock ran."""

    seconds: float = 0.0


@contextmanager
def import_clock() -> Iterator[ImportTime]:
    """Time the imports made inside the ``with`` block (``builtins.__import__`` is wrapped for
    its duration and restored after, also on error) by the thread that entered it: another
    thread's imports (the train stage's epoch ends run on one) overlap its time, and counting
    them would race on the nesting depth."""
    measured = ImportTime()
    original = builtins.__import__
    depth = 0
    owner = threading.get_ident()

    def timed_import(*args: Any, **kwargs: Any) -> Any:
        nonlocal depth
        if depth or threading.get_ident() != owner:
            return original(*args, **kwargs)
        depth += 1
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            measured.seconds += time.perf_counter() - started
            depth -= 1

    builtins.__import__ = timed_import
    try:
        yield measured
    finally:
        builtins.__import__ = original
