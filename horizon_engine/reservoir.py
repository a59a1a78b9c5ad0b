"""A seeded uniform sample of a stream of Arrow tables, holding one batch and the sample.

Stages that sample (normalization from ``timeline/train``, the local timeline's bucket bounds
from ``source/rows.parquet``) read their input a row group at a time, so that data larger than
memory can be sampled, and the same seed draws the same sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


class Reservoir:
    """At most ``size`` rows drawn uniformly without replacement from every row added.

    Each row gets a random priority, and the sample is the rows of the smallest priorities
    (bottom-k sampling): every subset of ``size`` rows is equally likely, a batch is compared
    with the sample's largest priority at once rather than row by row as in Vitter's algorithm
    R, and a row that cannot enter is never copied. While fewer than ``size`` rows have been
    added, the sample is all of them. Rows are kept in the order they were added.
    """

    def __init__(self, size: int, seed: int) -> None:
        import numpy as np

        self.size = size
        self.rng = np.random.default_rng(seed)
        self.rows: pa.Table | None = None
        self.priorities = np.zeros(0)
        self.seen = 0
        """Rows added so far."""

    def add(self, batch: pa.Table) -> None:
        """Offer every row of ``batch`` (the same columns each time) to the sample."""
        import numpy as np
        import pyarrow as pa

        priorities = self.rng.random(batch.num_rows)
        self.seen += batch.num_rows
        if len(self.priorities) >= self.size:
            entering = np.flatnonzero(priorities < self.priorities.max())
            batch, priorities = batch.take(pa.array(entering)), priorities[entering]
        rows = batch if self.rows is None else pa.concat_tables([self.rows, batch])
        priorities = np.concatenate([self.priorities, priorities])
        if len(priorities) > self.size:
            kept = np.sort(np.argpartition(priorities, self.size - 1)[: self.size])
            rows, priorities = rows.take(pa.array(kept)), priorities[kept]
        self.rows, self.priorities = rows, priorities

    def sample(self, schema: pa.Schema) -> pa.Table:
        """The rows drawn, in the order added (an empty table of ``schema`` if none were)."""
        return schema.empty_table() if self.rows is None else self.rows
