"""Normalization on Spark: the feature sample is drawn on the executors.

Only the sample (``num_samples`` rows, 100,000 by default) comes to the driver, as Arrow; the
core identifies and fits the features from it exactly as it does for the local engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine import NormalizationConfig, NormalizationEngine, group_map_values
from horizon_plugins_spark.session import SparkOptions, hadoop_path, spark_session

if TYPE_CHECKING:
    import numpy as np

    from horizon_engine import RunContext

OVERSAMPLING = 1.2
"""Bernoulli sampling draws about fraction * rows; asking for a little more makes it rare to
fall short of ``num_samples``, and the excess is trimmed by a seeded random order."""


class SparkNormalizationConfig(NormalizationConfig):
    """The ``[normalization]`` section with ``engine = "spark"``."""

    spark: SparkOptions = Field(default_factory=SparkOptions)
    """``[normalization.spark]``: the session to start when none is active."""


class SparkNormalization(NormalizationEngine):
    """Samples feature values from the timeline on a SparkSession's executors."""

    name = "spark"
    Config = SparkNormalizationConfig
    config: SparkNormalizationConfig

    def sample(
        self, run: RunContext, train: Path, column: str, num_samples: int
    ) -> dict[str, np.ndarray]:
        from pyspark.sql import functions as F

        spark = spark_session(self.config.spark)
        frame = spark.read.parquet(hadoop_path(train, reading=True)).select(column)
        rows = frame.count()
        if rows > num_samples:
            fraction = min(1.0, num_samples / rows * OVERSAMPLING)
            frame = (
                frame.sample(fraction=fraction, seed=run.seed)
                .orderBy(F.rand(run.seed))
                .limit(num_samples)
            )
        return group_map_values(frame.toArrow()[column].combine_chunks())
