"""The core's pipeline stages, registered through ``horizon_register_stages`` as a plugin's are.

A core module, not a built-in plugin: the stages' run functions are the core's own machinery
(``pipeline``, ``evaluation_stage``), so the plugin manager loads this module by name
(``plugins.DEFAULT_PLUGINS``) and the built-in plugins stay held to the public API.

Source, timeline, normalization, train, evaluation, export and report: each with the section that
configures it, how that section picks its component, what it reads and what it writes (the
run folder's names, ``RunFolder``). The run order is not written here: it follows from the
reads (``horizon_engine.stages.order_stages``), ties in this order.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon_engine import RunFolder, SectionRule, Stage, hookimpl
from horizon_engine.evaluation_stage import run_evaluation_stage
from horizon_engine.export_stage import export_problems
from horizon_engine.pipeline import (
    run_export_stage,
    run_normalization_stage,
    run_source_stage,
    run_timeline_stage,
    run_train_stage,
)
from horizon_engine.report import ReportConfig, run_report_stage

CORE_STAGES: tuple[Stage, ...] = (
    Stage(
        "source",
        "source",
        SectionRule("data_sources"),
        reads=(),
        claims=(RunFolder.SOURCE_ROWS, RunFolder.SOURCE_QUARANTINE),
        run=run_source_stage,
    ),
    Stage(
        "timeline",
        "timeline",
        SectionRule("timeline_engines", "engine", default_selector="local"),
        reads=(RunFolder.SOURCE_ROWS,),
        claims=(
            *RunFolder.TIMELINE_SPLITS,
            RunFolder.TIMELINE_INFO,
            RunFolder.TIMELINE_QUARANTINE,
        ),
        run=run_timeline_stage,
    ),
    Stage(
        "normalization",
        "normalization",
        SectionRule("normalization_engines", "engine", default_selector="local"),
        reads=(RunFolder.TIMELINE_INFO,),
        claims=(RunFolder.NORMALIZATION,),
        run=run_normalization_stage,
    ),
    Stage(
        "train",
        "trainer",
        SectionRule("trainers"),
        reads=(RunFolder.TIMELINE_INFO, RunFolder.NORMALIZATION),
        claims=(
            RunFolder.LATEST_CHECKPOINT,
            RunFolder.EPOCH_CHECKPOINTS,
            RunFolder.PROBLEM,
            RunFolder.CHECK_ROWS,
            RunFolder.CPE_EPOCHS,
            RunFolder.TRAINING_EPOCHS,
            RunFolder.TENSORBOARD_EVENTS,
        ),
        run=run_train_stage,
        resumes_from=(
            RunFolder.LATEST_CHECKPOINT,
            RunFolder.EPOCH_CHECKPOINTS,
            RunFolder.TENSORBOARD_EVENTS,
        ),
    ),
    Stage(
        "evaluation",
        "evaluation",
        SectionRule("estimators", many=True),
        reads=(RunFolder.TIMELINE_INFO, RunFolder.NORMALIZATION, RunFolder.LATEST_CHECKPOINT),
        claims=(RunFolder.CPE,),
        run=run_evaluation_stage,
    ),
    Stage(
        "export",
        "export",
        SectionRule("exporters"),
        reads=(
            RunFolder.LATEST_CHECKPOINT,
            RunFolder.PROBLEM,
            RunFolder.CHECK_ROWS,
            RunFolder.NORMALIZATION,
        ),
        claims=(RunFolder.MODEL,),
        run=run_export_stage,
        reads_when_written=(RunFolder.CPE,),
        check=export_problems,
    ),
    Stage(
        "report",
        "report",
        SectionRule(None, options=ReportConfig),
        reads=(),
        claims=(RunFolder.REPORT,),
        run=run_report_stage,
        reads_all=True,
    ),
)
"""The core's stages, in registration order."""


@hookimpl
def horizon_register_stages(register: Callable[[Stage], None]) -> None:
    for stage in CORE_STAGES:
        register(stage)
