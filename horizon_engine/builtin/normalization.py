"""The local normalization engine: a uniform sample of the timeline's rows, in-process.

Only the sampling is the engine's; identification is the core's, so the Spark engine, sampling
on its executors, picks the same types from the same kind of sample.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from horizon_engine import (
    NormalizationConfig,
    NormalizationEngine,
    group_map_values,
    hookimpl,
)

if TYPE_CHECKING:
    import numpy as np

    from horizon_engine import RunContext


class LocalNormalization(NormalizationEngine):
    """Samples feature values from the timeline in-process (the default engine)."""

    name = "local"
    Config = NormalizationConfig

    def sample(
        self, run: RunContext, train: Path, column: str, num_samples: int
    ) -> dict[str, np.ndarray]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        values = pq.read_table(train, columns=[column])[column].combine_chunks()
        if len(values) > num_samples:
            rng = np.random.default_rng(run.seed)
            chosen = np.sort(rng.choice(len(values), size=num_samples, replace=False))
            values = values.take(pa.array(chosen))
        return group_map_values(values)


@hookimpl
def horizon_register_normalization_engines(register: Callable[[type], None]) -> None:
    register(LocalNormalization)
