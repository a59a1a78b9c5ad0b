"""Horizon Engine: applied reinforcement learning from logged decisions.

The public face for users and plugin authors: ``horizon_engine`` is the one public module, and
the names below are its API (docs/plugins.md describes each contract). Everything under
``horizon_engine.<module>`` is internal and may change; the in-repo plugins import only these
names, and an import-linter contract run by ``make test`` holds them to it.

- every plugin: ``hookimpl``, ``Component``, ``ComponentConfig``, ``RunContext``,
  ``StageReport``, the errors, ``atomic_output``;
- config models: ``ComponentConfig``, and the option types ``DistinctNames`` (a list that
  names each thing once) and ``PathPatterns`` (a source's ``path``);
- data sources: ``DataSource``, ``SourceConfig``, ``SourceBatch``, and the row schema
  (``RowLayout``, ``RowFormat``, ``RowShaper``, ``ActionType``, ``BadRow``, ``detect_layout``);
- everything that reads rows from outside (sources, ``serve``, ``score``, ``join``): the one
  rule for a row's values (``ValueProblem``, ``number_problem``, ``integer_problem``,
  ``text_problem``, ``feature_map_problem``, ``json_text_problem``, ``invalid_text_rows``,
  ``FLOAT32_MAX``) and the
  one JSON line parser (``parse_json_line``, ``BadLine``, ``strip_bom``);
- timeline engines: ``TimelineTransform``, ``TimelineConfig``, ``TimelineResult``,
  ``timeline_schema``, ``eval_split_value``;
- normalization engines: ``NormalizationTransform``, ``NormalizationConfig``,
  ``group_map_values``; feature types: ``FeatureTransform``, ``NormalizationParameters``,
  ``feature_module``;
- trainers: ``TrainerBase``, ``TrainerConfig``, ``TrainingProblem``, the batch schema
  (``BATCH_SCHEMA``, ``BatchField``, ``batch_fields``, ``check_batch``), ``TimelineTensors``,
  the policy helpers (``masked_scores``, ``action_probabilities``), and optimizers that do not
  import ``torch._dynamo`` (``ForeachAdam``, ``ForeachSgd``, ``ForeachOptimizer``);
- the policy-output type every consumer of a policy reads: ``PolicyOutput``,
  ``policy_output``, ``ExplorationConfig``; and ``Exploration``, the numpy policy (action
  probabilities and draws) everything that acts outside torch uses;
- estimators: ``EstimatorBase``, ``EstimatorConfig``, ``EvaluationEpisodes``, ``Estimate``,
  ``NotApplicable``; and for commands that evaluate a finished run: ``evaluate_run``,
  ``estimates_table``;
- exporters: ``ExporterBase``, ``ExportConfig``, ``PolicyBundle``; and for everything that
  loads an exported model, its checked metadata: ``ModelCard`` (``ActionBounds``),
  ``read_model_card``, ``model_card_from_metadata``, ``ModelCardError``;
- commands: ``user_errors``, the error-to-exit wrapper every ``horizon`` command runs under;
- users: ``Engine`` and ``run_pipeline`` (imported on first use).

``import horizon_engine`` stays cheap for the command line: torch is imported only where a
tensor is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from horizon_engine.batch_schema import BATCH_SCHEMA, BatchField, batch_fields, check_batch
from horizon_engine.command_errors import user_errors
from horizon_engine.components import (
    Component,
    ComponentConfig,
    DataSource,
    DistinctNames,
    Estimator,
    Exporter,
    PathPatterns,
    SourceBatch,
    SourceConfig,
    Trainer,
    Transform,
)
from horizon_engine.dataset import TimelineTensors
from horizon_engine.errors import (
    BAD_ROWS_SHOWN,
    ConfigError,
    HorizonError,
    PluginError,
    StageInputError,
)
from horizon_engine.estimation import (
    Estimate,
    EstimatorBase,
    EstimatorConfig,
    EvaluationEpisodes,
    NotApplicable,
)
from horizon_engine.evaluation import estimates_table, evaluate_run
from horizon_engine.exploration import Exploration
from horizon_engine.export import ExportConfig, ExporterBase, PolicyBundle
from horizon_engine.files import atomic_output
from horizon_engine.hookspecs import hookimpl
from horizon_engine.json_lines import BadLine, parse_json_line, strip_bom
from horizon_engine.model_card import (
    ActionBounds,
    ModelCard,
    ModelCardError,
    model_card_from_metadata,
    read_model_card,
)
from horizon_engine.normalization import (
    NormalizationConfig,
    NormalizationParameters,
    NormalizationTransform,
    group_map_values,
)
from horizon_engine.optimizers import ForeachAdam, ForeachOptimizer, ForeachSgd
from horizon_engine.policies import (
    ExplorationConfig,
    PolicyOutput,
    action_probabilities,
    masked_scores,
    policy_output,
)
from horizon_engine.preprocessor import FeatureTransform, feature_module
from horizon_engine.row_values import (
    FLOAT32_MAX,
    ValueProblem,
    feature_map_problem,
    integer_problem,
    invalid_text_rows,
    json_text_problem,
    number_problem,
    text_problem,
)
from horizon_engine.run_context import RunContext, StageReport
from horizon_engine.schema import ActionType, BadRow, RowFormat, RowLayout, RowShaper, detect_layout
from horizon_engine.timeline import (
    TimelineConfig,
    TimelineResult,
    TimelineTransform,
    eval_split_value,
    timeline_schema,
)
from horizon_engine.training import TrainerBase, TrainerConfig, TrainingProblem

if TYPE_CHECKING:
    from horizon_engine.pipeline import Engine, run_pipeline

__version__ = "0.1.0"

__all__ = [
    "BAD_ROWS_SHOWN",
    "BATCH_SCHEMA",
    "FLOAT32_MAX",
    "ActionBounds",
    "ActionType",
    "BadLine",
    "BadRow",
    "BatchField",
    "Component",
    "ComponentConfig",
    "ConfigError",
    "DataSource",
    "DistinctNames",
    "Engine",
    "Estimate",
    "Estimator",
    "EstimatorBase",
    "EstimatorConfig",
    "EvaluationEpisodes",
    "Exploration",
    "ExplorationConfig",
    "ExportConfig",
    "Exporter",
    "ExporterBase",
    "FeatureTransform",
    "ForeachAdam",
    "ForeachOptimizer",
    "ForeachSgd",
    "HorizonError",
    "ModelCard",
    "ModelCardError",
    "NormalizationConfig",
    "NormalizationParameters",
    "NormalizationTransform",
    "NotApplicable",
    "PathPatterns",
    "PluginError",
    "PolicyBundle",
    "PolicyOutput",
    "RowFormat",
    "RowLayout",
    "RowShaper",
    "RunContext",
    "SourceBatch",
    "SourceConfig",
    "StageInputError",
    "StageReport",
    "TimelineConfig",
    "TimelineResult",
    "TimelineTensors",
    "TimelineTransform",
    "Trainer",
    "TrainerBase",
    "TrainerConfig",
    "TrainingProblem",
    "Transform",
    "ValueProblem",
    "__version__",
    "action_probabilities",
    "atomic_output",
    "batch_fields",
    "check_batch",
    "detect_layout",
    "estimates_table",
    "eval_split_value",
    "evaluate_run",
    "feature_map_problem",
    "feature_module",
    "group_map_values",
    "hookimpl",
    "integer_problem",
    "invalid_text_rows",
    "json_text_problem",
    "masked_scores",
    "model_card_from_metadata",
    "number_problem",
    "parse_json_line",
    "policy_output",
    "read_model_card",
    "run_pipeline",
    "strip_bom",
    "text_problem",
    "timeline_schema",
    "user_errors",
]

_LAZY = {"Engine", "run_pipeline"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from horizon_engine import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'horizon_engine' has no attribute {name!r}")
