"""Horizon Engine on Spark: the ``spark_table`` source, the timeline and normalization sampling.

Registered through the ``horizon`` entry point like any third-party plugin, and importing only
Horizon Engine's public API. pyspark is imported where it is used, so listing the plugins
does not start (or even load) Spark.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon_engine import hookimpl
from horizon_plugins_spark.normalization import SparkNormalization, SparkNormalizationConfig
from horizon_plugins_spark.session import SparkOptions, spark_session
from horizon_plugins_spark.source import SparkTableConfig, SparkTableSource
from horizon_plugins_spark.timeline import SparkTimeline, SparkTimelineConfig

__all__ = [
    "SparkNormalization",
    "SparkNormalizationConfig",
    "SparkOptions",
    "SparkTableConfig",
    "SparkTableSource",
    "SparkTimeline",
    "SparkTimelineConfig",
    "spark_session",
]


@hookimpl
def horizon_register_data_sources(register: Callable[[type], None]) -> None:
    register(SparkTableSource)


@hookimpl
def horizon_register_timeline_engines(register: Callable[[type], None]) -> None:
    register(SparkTimeline)


@hookimpl
def horizon_register_normalization_engines(register: Callable[[type], None]) -> None:
    register(SparkNormalization)
