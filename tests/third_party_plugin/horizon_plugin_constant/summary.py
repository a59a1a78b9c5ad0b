"""A third party's pipeline stage: ``row_summary``, a short account of the timeline's rows.

Registered with ``horizon_register_stages``. Its section, ``[row_summary]``, selects no
component: the stage owns its options. It reads the timeline stage's ``timeline.json``, so it
runs after the timeline, and writes ``row_summary/rows.json`` (whole or not at all), which the
manifest records as its output like any built-in stage's.
"""

from __future__ import annotations

import json

from horizon_engine import (
    Choice,
    ComponentConfig,
    RunContext,
    RunFolder,
    SectionRule,
    Stage,
    StageReport,
    atomic_output,
)

TIMELINE_INFO = RunFolder.TIMELINE_INFO
SUMMARY_FILE = "row_summary/rows.json"


class RowSummaryConfig(ComponentConfig):
    """Options of ``[row_summary]``."""

    label: str = "rows"
    """A name for the summary, written into it."""


def summarize_rows(run: RunContext, choice: Choice) -> StageReport:
    """Count the timeline's train and eval rows into ``row_summary/rows.json``; ``choice``
    is the section's, its ``config`` the validated ``[row_summary]``."""
    config: RowSummaryConfig = choice.config
    info = RunFolder(run.output_dir).timeline_info()
    train_rows, eval_rows = info.train_rows, info.eval_rows
    summary = {"label": config.label, "train_rows": train_rows, "eval_rows": eval_rows}
    with atomic_output(run.output_dir / SUMMARY_FILE) as temporary:
        temporary.write_text(json.dumps(summary) + "\n", encoding="utf-8")
    return StageReport(
        "row_summary",
        rows_in=train_rows + eval_rows,
        rows_out=train_rows + eval_rows,
        outputs=[SUMMARY_FILE],
        details=summary,
    )


ROW_SUMMARY = Stage(
    "row_summary",
    "row_summary",
    SectionRule(None, options=RowSummaryConfig),
    reads=(TIMELINE_INFO,),
    claims=(SUMMARY_FILE,),
    run=summarize_rows,
)
"""The stage as registered: configured by ``[row_summary]``, run after the timeline."""
