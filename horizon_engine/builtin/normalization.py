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
    Reservoir,
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
        """A reservoir sample of the column, read a row group at a time: the split may be
        larger than memory. Every row when the split has at most ``num_samples``."""
        import pyarrow as pa
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        reservoir = Reservoir(num_samples, run.seed)
        split = ds.dataset(train, format="parquet")
        for path in split.files:
            for batch in pq.ParquetFile(path).iter_batches(columns=[column]):
                reservoir.add(pa.Table.from_batches([batch]))
        sample = reservoir.sample(pa.schema([split.schema.field(column)]))
        return group_map_values(sample[column].combine_chunks())


@hookimpl
def horizon_register_normalization_engines(register: Callable[[type], None]) -> None:
    register(LocalNormalization)
