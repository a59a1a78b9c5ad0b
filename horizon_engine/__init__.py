"""Horizon Engine: applied reinforcement learning from logged decisions.

The public face for users and plugin authors. A plugin needs ``hookimpl`` and the component
base classes; a user needs ``Engine`` (or ``run_pipeline``). Everything heavier is imported
lazily, so ``import horizon_engine`` stays cheap for the command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from horizon_engine.components import (
    ComponentConfig,
    DataSource,
    Estimator,
    Exporter,
    SourceBatch,
    SourceConfig,
    Trainer,
    Transform,
)
from horizon_engine.errors import HorizonError
from horizon_engine.export import ExporterBase, PolicyBundle
from horizon_engine.hookspecs import hookimpl
from horizon_engine.normalization import NormalizationParameters, NormalizationTransform
from horizon_engine.preprocessor import FeatureTransform, feature_module
from horizon_engine.run_context import RunContext, StageReport
from horizon_engine.timeline import TimelineTransform
from horizon_engine.training import TrainerBase, TrainerConfig, TrainingProblem

if TYPE_CHECKING:
    from horizon_engine.pipeline import Engine, run_pipeline

__version__ = "0.1.0"

__all__ = [
    "ComponentConfig",
    "DataSource",
    "Engine",
    "Estimator",
    "Exporter",
    "ExporterBase",
    "FeatureTransform",
    "HorizonError",
    "NormalizationParameters",
    "NormalizationTransform",
    "PolicyBundle",
    "RunContext",
    "SourceBatch",
    "SourceConfig",
    "StageReport",
    "TimelineTransform",
    "Trainer",
    "TrainerBase",
    "TrainerConfig",
    "TrainingProblem",
    "Transform",
    "__version__",
    "feature_module",
    "hookimpl",
    "run_pipeline",
]

_LAZY = {"Engine", "run_pipeline"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from horizon_engine import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'horizon_engine' has no attribute {name!r}")
