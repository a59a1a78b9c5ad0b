"""``horizon report`` and the report stage: one self-contained HTML page per run, or runs side
by side.

The page answers what a user checks before shipping a policy, each question a section
(``report_sections``): first the verdict, where the run recorded one (is the trained policy
better than the logged one, and the estimates behind the answer), then the run, the rows,
normalization, training, counterfactual evaluation, the actions, the export, and what plugins
add (``horizon_report_sections``: the world model's MDP check). With several runs (yesterday's
and today's retraining, a closed loop's rounds), every section shows them side by side, and a
last section evaluates each earlier run's policy on the last run's eval data with that run's
estimators (``evaluate_run``), where the runs' problems allow it.

``horizon run`` writes the page as its last stage (``report``: it reads every other stage's
outputs) into ``report.html`` and prints where; ``[report] enabled = false`` leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from horizon_engine.components import ComponentConfig
from horizon_engine.errors import HorizonError
from horizon_engine.files import atomic_output
from horizon_engine.report_page import (
    GENERATOR,
    MAX_PAGE_BYTES,
    ReportSection,
    html_heading,
    html_paragraph,
    html_table,
    page,
)
from horizon_engine.report_sections import (
    ESTIMATORS_TITLE,
    VERDICT_TITLE,
    actions_section,
    cpe_section,
    estimators_section,
    export_section,
    guarded,
    interval_text,
    normalization_section,
    rows_section,
    run_section,
    training_section,
    verdict_section,
)
from horizon_engine.run_context import StageReport
from horizon_engine.run_folder import RunFolder

if TYPE_CHECKING:
    from horizon_engine.config import Choice
    from horizon_engine.plugins import PluginHost
    from horizon_engine.run_context import StageRun


class ReportConfig(ComponentConfig):
    """``[report]``: the page ``horizon run`` writes as its last stage."""

    enabled: bool = True
    """Write ``report.html`` at the end of every run: about a second, the charts (measured:
    docs/measurements.md#report_stage_cost)."""
    title: str | None = Field(default=None, max_length=200)
    """The page's title; the run's ``[pipeline] name`` or its folder's name by default."""


def run_sections(
    folder: RunFolder, plugins: PluginHost, *, written_by_run: bool = False
) -> list[ReportSection]:
    """Every section for one run folder, in page order, each shown or absent with why; the
    verdict's two first, and only where the manifest records a verdict (an older run's page,
    or one of a run that trained no policy, is as it was before verdicts)."""
    try:
        manifest = folder.manifest()
    except HorizonError as exc:
        return [ReportSection("run", "The run", absent=str(exc))]
    if written_by_run:
        manifest = {**manifest, "status": "finishing (this page is the run's last stage)"}
    verdict = [
        ("verdict", VERDICT_TITLE, lambda: verdict_section(manifest)),
        ("estimators", ESTIMATORS_TITLE, lambda: estimators_section(manifest)),
    ]
    builders = [
        *(verdict if manifest.get("verdict") is not None else []),
        ("run", "The run", lambda: run_section(folder, manifest)),
        ("rows", "Rows", lambda: rows_section(manifest)),
        (
            "normalization",
            "Normalization",
            lambda: normalization_section(folder, manifest, plugins),
        ),
        ("training", "Training", lambda: training_section(folder, manifest)),
        ("cpe", "Counterfactual evaluation", lambda: cpe_section(folder)),
        ("actions", "Actions", lambda: actions_section(folder, plugins)),
        ("export", "Export", lambda: export_section(folder, manifest)),
    ]
    sections = [guarded(key, title, build, folder) for key, title, build in builders]
    return [*sections, *plugins.report_sections(folder)]


def build_report(
    run_dirs: Sequence[Path],
    plugins: PluginHost,
    title: str | None = None,
    *,
    written_by_run: bool = False,
) -> str:
    """The page for ``run_dirs`` (one run, or several side by side, the last the newest)."""
    if not run_dirs:
        raise HorizonError("horizon report needs at least one run folder")
    for path in run_dirs:
        if not Path(path).is_dir():
            raise HorizonError(f"{path}: no such run folder")
    folders = [RunFolder(path) for path in run_dirs]
    sections = _verdicts_first(
        [run_sections(folder, plugins, written_by_run=written_by_run) for folder in folders]
    )
    labels = _labels(folders)
    across = [_same_data_section(folders, labels, plugins)] if len(folders) > 1 else []
    name = title or (labels[0] if len(labels) == 1 else f"{len(labels)} runs side by side")
    subtitle = (
        f"Horizon Engine report of {labels[0]}"
        if len(labels) == 1
        else "Horizon Engine report of " + ", ".join(labels) + " (left to right)"
    )
    html = page(f"Run report: {name}", subtitle, labels, sections, across)
    size = len(html.encode("utf-8"))
    if size > MAX_PAGE_BYTES:
        raise HorizonError(
            f"the report would be {size:,} bytes, over its bound of {MAX_PAGE_BYTES:,}: a "
            "section draws more than it should (please report this)"
        )
    return html


REPORT_SUFFIXES = (".html", ".htm")
"""What a report page's name ends with: ``-o`` naming anything else (``manifest.json``, a
pipeline.toml) is a slip that would replace that file with a page."""

LEGACY_PAGE_START = (
    b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n<meta name="viewport" '
)
"""How a page written before ``GENERATOR`` was added begins, so that it may be replaced too."""


def check_report_output(output: Path) -> None:
    """Refuse (``HorizonError``), before the page is built, an ``-o`` that does not name an
    HTML page, or that names an existing file other than a page ``horizon report`` wrote: the
    page would replace it (``horizon report RUN -o RUN/manifest.json`` once did)."""
    if output.suffix.lower() not in REPORT_SUFFIXES:
        raise HorizonError(
            f"-o {output}: a report is an HTML page; name it with .html (nothing was written)"
        )
    if not (output.exists() or output.is_symlink()):
        return
    try:
        with open(output, "rb") as handle:
            start = handle.read(4096) if output.is_file() else b""
    except OSError:
        start = b""
    if GENERATOR.encode() not in start and not start.startswith(LEGACY_PAGE_START):
        raise HorizonError(
            f"-o {output}: there is a file there that horizon report did not write; nothing "
            "was written: move it, or name another page"
        )


def write_report(
    run_dirs: Sequence[Path],
    output: Path,
    plugins: PluginHost,
    title: str | None = None,
    *,
    written_by_run: bool = False,
) -> Path:
    """Build the page and write it to ``output``, whole or not at all."""
    html = build_report(run_dirs, plugins, title, written_by_run=written_by_run)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(output) as temporary:
        temporary.write_text(html, encoding="utf-8")
    return output


def run_report_stage(run: StageRun, choice: Choice) -> StageReport:
    """The report stage: ``report.html`` for the run, after every other stage."""
    config = choice.config
    title = config.title or run.spec.pipeline.name or None
    written = write_report(
        [run.output_dir],
        RunFolder(run.output_dir).file(RunFolder.REPORT),
        run.plugins,
        title,
        written_by_run=True,
    )
    return StageReport("report", outputs=[RunFolder.REPORT], details={"page": str(written)})


def _verdicts_first(sections: list[list[ReportSection]]) -> list[list[ReportSection]]:
    """Runs side by side where some recorded a verdict and others did not: the others get the
    verdict's sections too, absent with why, so that the page still opens with the verdicts
    (``page`` orders sections as the first run that has them lists them)."""
    if not any(section.key == "verdict" for run in sections for section in run):
        return sections
    missing = "the run recorded no verdict (made before verdicts, or it trained no policy)"
    return [
        run
        if any(section.key == "verdict" for section in run)
        else [
            ReportSection("verdict", VERDICT_TITLE, absent=missing),
            ReportSection("estimators", ESTIMATORS_TITLE, absent=missing),
            *run,
        ]
        for run in sections
    ]


def _labels(folders: Sequence[RunFolder]) -> list[str]:
    """Each run's name (``[pipeline] name``), or its folder's; with its parent folder where
    two would read alike (a closed loop's ``round-1/run``, ``round-2/run``)."""
    labels = [_label(folder) for folder in folders]
    if len(set(labels)) < len(labels):
        labels = [
            f"{folder.path.parent.name}/{label}"
            for folder, label in zip(folders, labels, strict=True)
        ]
    return labels


def _label(folder: RunFolder) -> str:
    try:
        name = folder.manifest().get("name")
    except HorizonError:
        name = None
    return str(name) if name else folder.path.name or str(folder.path)


def _same_data_section(
    folders: Sequence[RunFolder], labels: Sequence[str], plugins: PluginHost
) -> ReportSection:
    """Every run's policy on the last run's eval data, by each run's own estimators."""
    from horizon_engine.evaluation_stage import evaluate_run

    key, title = "same_data", "On the same eval data"
    target = folders[-1]
    body = [
        html_paragraph(
            f"Each run's trained policy evaluated on {labels[-1]}'s eval split by its own "
            "[[evaluation]] estimators, so that the figures compare."
        )
    ]
    rows = []
    for folder, label in zip(folders, labels, strict=True):
        data = None if folder is target else target.path
        try:
            found = evaluate_run(folder.path, data=data, plugins=plugins)
        except HorizonError as exc:
            body.append(html_paragraph(f"{label}: not evaluated: {exc}", "absent"))
            continue
        for estimator, estimates in found["final"].items():
            for metric, value in estimates.items():
                if isinstance(value, dict):
                    interval = interval_text(value, "relative")
                    rows.append((label, estimator, metric, interval, value.get("value")))
    if rows:
        body.append(html_heading("Relative to the logged policy"))
        header = ("run", "estimator", "metric", "relative [interval]", "value")
        body.append(html_table(header, rows))
    return ReportSection(key, title, "".join(body))
