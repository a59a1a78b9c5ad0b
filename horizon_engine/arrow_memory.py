"""Where Arrow's memory comes from in a process that imports the engine.

pyarrow's default pool is mimalloc, which keeps what it freed in per-thread segments for reuse.
A streamed split's slices are decoded on the read-ahead thread and freed on the training thread,
and the conversions of a split loaded in memory leave large freed blocks behind. Measured on a
156,000-row CartPole split (test_streamed's memory bound), the streamed train stage's peak grew
by 55 to 83 MiB beside its buffer from one run of the same split to the next, and loading the
split in memory by about 285 MiB; with the C allocator's pool, by 28 to 30 MiB and 73 to 82 MiB.
What ``[trainer] max_memory_gb`` bounds must not depend on the threads' timing, and the example
pipeline ran no slower (6.3 to 6.9 s either way).

Arrow's C++ readers take the pool named by ``ARROW_DEFAULT_MEMORY_POOL`` when pyarrow loads;
``pyarrow.set_memory_pool`` later changes only the pool of pyarrow's Python calls (measured: the
streamed stage's growth stayed at 57 to 61 MiB). So the choice is made as the engine is imported,
before it imports pyarrow (``horizon_engine/__init__.py`` imports this module first), and only
where the user has not chosen a pool."""

from __future__ import annotations

import os
import sys

ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


def prefer_the_system_allocator_for_arrow() -> None:
    """Names the C allocator's pool for Arrow unless the environment names one. A program that
    imported pyarrow before the engine keeps its pool: set the variable before starting it."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault(ARROW_POOL_VARIABLE, "system")


prefer_the_system_allocator_for_arrow()
