"""Horizon Engine: applied reinforcement learning from logged decisions.

The public face for users and plugin authors: ``horizon_engine`` is the one public module, and
the names below are its API (docs/plugins.md describes each contract). Everything under
``horizon_engine.<module>`` is internal and may change; the in-repo plugins import only these
names, and an import-linter contract run by ``make test`` holds them to it.

- every plugin: ``hookimpl``, ``Component``, ``ComponentConfig``, ``RunContext``,
  ``StageReport``, the errors, ``atomic_output``, and ``RunFolder``, the one owner of the
  run folder's file names (and of reading and writing the files the engine reads back);
- config models: ``ComponentConfig``, and the option types ``DistinctNames`` (a list that
  names each thing once), ``PathPatterns`` (a source's ``path``), ``LearningRate`` (an
  optimizer's step size) and ``MetricWeights`` (weights of logged metrics by name);
- data sources: ``DataSource``, ``SourceConfig``, ``SourceBatch``, the files a ``path``
  stands for (``expand_paths``, ``path_problems``), and the row schema (``RowLayout``,
  ``RowFormat``, ``RowShaper``, ``ActionType``, ``BadRow``, ``detect_layout``,
  ``majority_layout``, ``duplicate_key_rows``, ``rows_as_dicts``, ``INTEGER_ACTION_NOTE``);
- everything that reads rows from outside (sources, ``serve``, ``score``, ``join``): the one
  rule for a row's values (``ValueProblem``, ``number_problem``, ``integer_problem``,
  ``text_problem``, ``feature_map_problem``, ``invalid_text_rows``, ``shown_value``,
  ``FLOAT32_MAX``, ``MIN_PROPENSITY``) and the
  one JSON line parser and line reader (``parse_json_line``, ``BadLine``, ``strip_bom``,
  ``read_lines``, ``LongLine``, ``MAX_LINE_BYTES``, ``line_prefix``);
- timeline engines: ``TimelineEngine``, ``TimelineConfig``, ``TimelineResult``,
  ``TimelineInfo`` (a built timeline's ``timeline.json``: ``RunFolder.timeline_info()``),
  ``timeline_schema``, ``FEATURES``, ``eval_split_value`` and ``eval_episodes``, and the rules
  and parts every engine shares: ``weighted_reward``, ``sort_episodes``, ``write_split``;
- normalization engines: ``NormalizationEngine``, ``NormalizationConfig``,
  ``group_map_values``, ``Reservoir`` (a seeded sample of a stream of row groups); feature
  types: ``FeatureType``, ``FeatureParameters`` (what a type's
  own parameters model subclasses), ``NormalizationParameters`` (the built-in types', Horizon's
  fields), ``feature_module`` (the three have a register hook each; ``TimelineTransform``,
  ``NormalizationTransform`` and ``FeatureTransform``, of the deprecated transforms hook,
  still import, with a ``DeprecationWarning``);
- trainers: ``TrainerBase``, ``TrainerConfig``, ``TrainingProblem``, the optional
  capabilities a trainer implements (``AnalyzesData``, ``ExploresOnline``,
  ``OffersEvaluationModels`` with ``EvaluationModels``, ``Discounts``) and
  ``InvertiblePreprocessing``, the batch schema
  (``BATCH_SCHEMA``, ``BatchField``, ``batch_fields``, ``check_batch``), ``TimelineTensors``,
  the policy helpers (``masked_scores``, ``action_probabilities``), and optimizers that do not
  import ``torch._dynamo`` (``ForeachAdam``, ``ForeachSgd``, ``ForeachOptimizer``);
- the policy-output type every consumer of a policy reads: ``PolicyOutput``,
  ``policy_output``, ``ExplorationConfig``; and ``Exploration``, the numpy policy (action
  probabilities and draws) everything that acts outside torch uses;
- estimators: ``EstimatorBase``, ``EstimatorConfig``, ``EvaluationEpisodes``, ``Estimate``,
  ``NotApplicable``, and the verdict's bar on eval episodes every estimator checks itself
  against (``MIN_VERDICT_EPISODES``, ``few_episodes_warning``); and for commands that evaluate a
  finished run: ``evaluate_run``, ``estimates_table``, ``verdict_lines``;
- exporters: ``ExporterBase``, ``ExportConfig``, ``PolicyBundle``, ``write_model_card``, and
  for checking an exported model's choices, ``recorded_possible`` and ``top_two_gap``; for
  everything that loads an exported model, its checked metadata: ``ModelCard``
  (``ActionBounds``), ``read_model_card``, ``model_card_from_metadata``,
  ``model_card_of_session``, ``card_if_exported``, ``ModelCardError``; and the model's
  input and output names, which the exporter writes and its users feed and fetch by:
  ``ModelInputs``, ``ModelOutputs``;
- stages (``horizon_register_stages``): ``Stage``, ``SectionRule``, and ``Choice``, the
  section's choice a stage's run is handed with the run's ``RunContext``; ``PipelineSpec``,
  the validated pipeline a stage's ``check`` is handed (and ``Engine.validate`` returns); and
  for a stage whose trainer analyses the timeline's data, its run and check:
  ``analyze_timeline``, ``analysis_problems``;
- hosts that drive a trainer with their own data (as the gym runner plays for it):
  ``TrainingDriver``, ``ProblemDescription``, ``SampledData``, ``export_policy``,
  ``record_failure`` (what a failed run's manifest records), ``Normalization`` (what a
  driver is set up with) and ``identify_feature_sets`` (fit it from samples as the
  normalization stage does), the plugins (``PluginHost``, ``get_plugin_host``), a config file
  of the host's own (``load_config_sections``, ``ConfigSections``), and for ``--resume``:
  ``EarlierRun`` (``RunFolder.earlier_run``), ``NothingToResume``, ``read_checkpoint``; and
  for files a host writes itself: ``remove_path``, ``WRITE_REFUSED``;
- commands: ``command``, which builds a ``horizon`` command (a click command) run under the
  error-to-exit wrapper every ``horizon`` command runs under; for a command that runs long,
  ``sigterm_as_interrupt``, ``INTERRUPTED_EXIT_STATUS`` and ``progress_bar``;
- report sections (``horizon_report_sections``): ``ReportSection``, the HTML helpers
  ``html_table``, ``html_paragraph``, ``html_heading``, ``html_folded``, and the charts,
  drawn by matplotlib (``Chart``, ``Series``, ``count_bars``, ``interval_bars``,
  ``grouped_bars``, ``histograms``, ``histogram_pairs``, ``small_multiples``);
- users: ``Engine`` and ``run_pipeline`` (imported on first use), and ``write_report``, the
  page of one run or several side by side (``horizon report``).

``import horizon_engine`` stays cheap for the command line: torch is imported only where a
tensor is made.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from horizon_engine import arrow_memory  # noqa: F401  (first: it picks Arrow's allocator)
from horizon_engine.analysis_stage import analysis_problems, analyze_timeline
from horizon_engine.batch_schema import BATCH_SCHEMA, BatchField, batch_fields, check_batch
from horizon_engine.capabilities import (
    AnalyzesData,
    Discounts,
    EvaluationModels,
    ExploresOnline,
    InvertiblePreprocessing,
    OffersEvaluationModels,
)
from horizon_engine.command_errors import INTERRUPTED_EXIT_STATUS, command, sigterm_as_interrupt
from horizon_engine.components import (
    Component,
    ComponentConfig,
    DataSource,
    DistinctNames,
    Estimator,
    Exporter,
    LearningRate,
    MetricWeights,
    PathPatterns,
    SourceBatch,
    SourceConfig,
    Trainer,
)
from horizon_engine.config import Choice, ConfigSections, PipelineSpec, load_config_sections
from horizon_engine.dataset import TimelineTensors
from horizon_engine.driver import (
    Normalization,
    ProblemDescription,
    SampledData,
    TrainingDriver,
)
from horizon_engine.errors import (
    BAD_ROWS_SHOWN,
    ConfigError,
    HorizonError,
    NothingToResume,
)
from horizon_engine.estimation import (
    MIN_VERDICT_EPISODES,
    Estimate,
    EstimatorBase,
    EstimatorConfig,
    EvaluationEpisodes,
    NotApplicable,
    few_episodes_warning,
)
from horizon_engine.evaluation import estimates_table
from horizon_engine.evaluation_stage import evaluate_run
from horizon_engine.exploration import Exploration
from horizon_engine.export import ExportConfig, ExporterBase, PolicyBundle
from horizon_engine.export_stage import export_policy
from horizon_engine.figures import (
    Chart,
    Series,
    count_bars,
    grouped_bars,
    histogram_pairs,
    histograms,
    interval_bars,
    small_multiples,
)
from horizon_engine.files import WRITE_REFUSED, append_output, atomic_output, remove_path
from horizon_engine.hookspecs import hookimpl
from horizon_engine.json_lines import (
    MAX_LINE_BYTES,
    BadLine,
    LongLine,
    line_prefix,
    parse_json_line,
    read_lines,
    read_past_line,
    strip_bom,
)
from horizon_engine.model_card import (
    ActionBounds,
    ModelCard,
    ModelCardError,
    ModelInputs,
    ModelOutputs,
    card_if_exported,
    model_card_from_metadata,
    model_card_of_session,
    read_model_card,
    write_model_card,
)
from horizon_engine.normalization import (
    FeatureParameters,
    NormalizationConfig,
    NormalizationEngine,
    NormalizationParameters,
    group_map_values,
)
from horizon_engine.optimizers import ForeachAdam, ForeachOptimizer, ForeachSgd
from horizon_engine.output_paths import refuse_output_over_inputs
from horizon_engine.plugins import PluginHost, get_plugin_host
from horizon_engine.policies import (
    ExplorationConfig,
    PolicyOutput,
    action_probabilities,
    masked_scores,
    policy_output,
    recorded_possible,
    top_two_gap,
)
from horizon_engine.preprocessor import FeatureType, feature_module
from horizon_engine.progress import progress_bar
from horizon_engine.report import write_report
from horizon_engine.report_page import (
    ReportSection,
    html_folded,
    html_heading,
    html_paragraph,
    html_table,
)
from horizon_engine.reservoir import Reservoir
from horizon_engine.row_values import (
    FLOAT32_MAX,
    MIN_PROPENSITY,
    ValueProblem,
    feature_map_problem,
    integer_problem,
    invalid_text_rows,
    number_problem,
    shown_value,
    text_problem,
)
from horizon_engine.run_context import RunContext, StageReport
from horizon_engine.run_folder import EarlierRun, RunFolder, record_failure
from horizon_engine.schema import (
    FEATURES,
    INTEGER_ACTION_NOTE,
    ActionType,
    BadRow,
    RowFormat,
    RowLayout,
    RowShaper,
    detect_layout,
    duplicate_key_rows,
    majority_layout,
    rows_as_dicts,
)
from horizon_engine.source_paths import expand_paths, path_problems
from horizon_engine.stages import SectionRule, Stage
from horizon_engine.streamed import memory_budget
from horizon_engine.timeline import (
    TimelineConfig,
    TimelineEngine,
    TimelineInfo,
    TimelineResult,
    eval_episodes,
    eval_split_value,
    sort_episodes,
    timeline_schema,
    weighted_reward,
    write_split,
)
from horizon_engine.training import (
    TrainerBase,
    TrainerConfig,
    TrainingProblem,
    read_checkpoint,
)
from horizon_engine.verdict import verdict_lines

if TYPE_CHECKING:
    from horizon_engine.pipeline import Engine, identify_feature_sets, run_pipeline

__version__ = "0.1.0"

__all__ = [
    "BAD_ROWS_SHOWN",
    "BATCH_SCHEMA",
    "FEATURES",
    "FLOAT32_MAX",
    "INTEGER_ACTION_NOTE",
    "INTERRUPTED_EXIT_STATUS",
    "MAX_LINE_BYTES",
    "MIN_PROPENSITY",
    "MIN_VERDICT_EPISODES",
    "WRITE_REFUSED",
    "ActionBounds",
    "ActionType",
    "AnalyzesData",
    "BadLine",
    "BadRow",
    "BatchField",
    "Chart",
    "Choice",
    "Component",
    "ComponentConfig",
    "ConfigError",
    "ConfigSections",
    "DataSource",
    "Discounts",
    "DistinctNames",
    "EarlierRun",
    "Engine",
    "Estimate",
    "Estimator",
    "EstimatorBase",
    "EstimatorConfig",
    "EvaluationEpisodes",
    "EvaluationModels",
    "Exploration",
    "ExplorationConfig",
    "ExploresOnline",
    "ExportConfig",
    "Exporter",
    "ExporterBase",
    "FeatureParameters",
    "FeatureType",
    "ForeachAdam",
    "ForeachOptimizer",
    "ForeachSgd",
    "HorizonError",
    "InvertiblePreprocessing",
    "LearningRate",
    "LongLine",
    "MetricWeights",
    "ModelCard",
    "ModelCardError",
    "ModelInputs",
    "ModelOutputs",
    "Normalization",
    "NormalizationConfig",
    "NormalizationEngine",
    "NormalizationParameters",
    "NotApplicable",
    "NothingToResume",
    "OffersEvaluationModels",
    "PathPatterns",
    "PipelineSpec",
    "PluginHost",
    "PolicyBundle",
    "PolicyOutput",
    "ProblemDescription",
    "ReportSection",
    "Reservoir",
    "RowFormat",
    "RowLayout",
    "RowShaper",
    "RunContext",
    "RunFolder",
    "SampledData",
    "SectionRule",
    "Series",
    "SourceBatch",
    "SourceConfig",
    "Stage",
    "StageReport",
    "TimelineConfig",
    "TimelineEngine",
    "TimelineInfo",
    "TimelineResult",
    "TimelineTensors",
    "Trainer",
    "TrainerBase",
    "TrainerConfig",
    "TrainingDriver",
    "TrainingProblem",
    "ValueProblem",
    "__version__",
    "action_probabilities",
    "analysis_problems",
    "analyze_timeline",
    "append_output",
    "atomic_output",
    "batch_fields",
    "card_if_exported",
    "check_batch",
    "command",
    "count_bars",
    "detect_layout",
    "duplicate_key_rows",
    "estimates_table",
    "eval_episodes",
    "eval_split_value",
    "evaluate_run",
    "expand_paths",
    "export_policy",
    "feature_map_problem",
    "feature_module",
    "few_episodes_warning",
    "get_plugin_host",
    "group_map_values",
    "grouped_bars",
    "histogram_pairs",
    "histograms",
    "hookimpl",
    "html_folded",
    "html_heading",
    "html_paragraph",
    "html_table",
    "identify_feature_sets",
    "integer_problem",
    "interval_bars",
    "invalid_text_rows",
    "line_prefix",
    "load_config_sections",
    "majority_layout",
    "masked_scores",
    "memory_budget",
    "model_card_from_metadata",
    "model_card_of_session",
    "number_problem",
    "parse_json_line",
    "path_problems",
    "policy_output",
    "progress_bar",
    "read_checkpoint",
    "read_lines",
    "read_model_card",
    "read_past_line",
    "record_failure",
    "recorded_possible",
    "refuse_output_over_inputs",
    "remove_path",
    "rows_as_dicts",
    "run_pipeline",
    "shown_value",
    "sigterm_as_interrupt",
    "small_multiples",
    "sort_episodes",
    "strip_bom",
    "text_problem",
    "timeline_schema",
    "top_two_gap",
    "verdict_lines",
    "weighted_reward",
    "write_model_card",
    "write_report",
    "write_split",
]

_LAZY = {"Engine", "run_pipeline", "identify_feature_sets"}
_DEPRECATED_BASES = {"TimelineTransform", "NormalizationTransform", "FeatureTransform"}
"""The base classes of the deprecated transforms hook (``legacy_transforms``), importable with
a ``DeprecationWarning``."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from horizon_engine import pipeline

        return getattr(pipeline, name)
    if name in _DEPRECATED_BASES:
        from horizon_engine import legacy_transforms

        replacement = legacy_transforms.DEPRECATED_BASES[name]
        warnings.warn(
            f"horizon_engine.{name} is deprecated: subclass horizon_engine.{replacement} and "
            "register it with its family's hook (docs/plugins.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        # Kept, so that the warning is given once: ``from horizon_engine import name`` looks
        # the name up twice.
        globals()[name] = getattr(legacy_transforms, name)
        return globals()[name]
    raise AttributeError(f"module 'horizon_engine' has no attribute {name!r}")
