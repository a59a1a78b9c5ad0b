"""The report page's HTML: sections, tables and the page around them, one run or several side
by side.

A section is built for one run folder and is either shown (its body) or absent with the
reason (no eval split, no estimators, a file that could not be read): a page always has every
section, so a reader sees what is missing and why. Text from run folders (feature names,
config values, messages) is escaped here; bodies are assembled from these helpers and from
``figures.Chart.html``. The page is one file: styles inline, images as ``data:`` URIs, no
script and nothing fetched, so it opens from disk in any browser and can be mailed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

MAX_PAGE_BYTES = 8 * 1024 * 1024
"""The most a page may weigh: its charts are bounded in number (the normalization section
draws its worst-behaved features only and lists the rest), so a run with 1,000 features makes
a page of a few hundred kilobytes; this bound catches a section that stops being bounded."""

VERDICT_COLOURS = {
    "better": ("#e6f4ea", "#2e7d32"),
    "worse": ("#fdecea", "#c62828"),
    "unclear": ("#fff4d6", "#b7791f"),
    "unknown": ("#eeeeee", "#777777"),
}
"""Each decision's box on the page (background, border), its CSS class ``verdict-DECISION``:
green better, red worse, amber unclear, grey a decision the page does not know."""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1em 2em; max-width: 1600px;
  color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin: 0.8em 0 0.3em; }
table { border-collapse: collapse; margin: 0.4em 0 0.8em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
.absent { color: #777; font-style: italic; }
.warning { color: #8a5a00; }
.runs { display: grid; gap: 1.5em; }
.run { min-width: 0; overflow-x: auto; }
nav a { margin-right: 1em; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; height: auto; }
details { margin: 0.4em 0; }
.charts { display: flex; flex-wrap: wrap; gap: 0.8em; align-items: flex-start; }
.verdict { border-left: 6px solid; border-radius: 4px; padding: 0.4em 1.2em; margin: 0.6em 0;
  overflow-wrap: anywhere; }
.estimates { overflow-x: auto; }
.verdict .headline { font-size: 1.4em; font-weight: 600; margin: 0.3em 0; }
.verdict .figures { font-size: 1.1em; }
.verdict ul { margin: 0.3em 0; }
tr.recommended td { font-weight: 600; }
tr.untrusted td { color: #777; }
""" + "".join(
    f".verdict-{decision} {{ background: {background}; border-color: {border}; }}\n"
    for decision, (background, border) in VERDICT_COLOURS.items()
)


@dataclass(frozen=True)
class ReportSection:
    """One section of a run's page: ``key`` (its anchor and how a comparison lines sections
    up), ``title``, and ``body`` (HTML built with this module's helpers) or ``absent``, the
    reason it cannot be shown for this run."""

    key: str
    title: str
    body: str = ""
    absent: str | None = None

    def html(self) -> str:
        """The body, or the reason it is absent."""
        if self.absent is not None:
            return html_paragraph(f"Not shown: {self.absent}", "absent")
        return self.body


GENERATOR = '<meta name="generator" content="horizon report">'
"""The line of every report page's head that tells it from a user's own file: ``horizon
report -o`` replaces only a page that holds it (``report.check_report_output``)."""


def html_paragraph(text: str, css_class: str | None = None) -> str:
    """A paragraph of plain text (escaped)."""
    attribute = f' class="{css_class}"' if css_class else ""
    return f"<p{attribute}>{escape(text)}</p>"


def html_heading(text: str) -> str:
    """A sub-heading within a section."""
    return f"<h3>{escape(text)}</h3>"


def html_table(
    header: Sequence[str],
    rows: Iterable[Sequence[object]],
    row_classes: Sequence[str | None] = (),
) -> str:
    """A table of plain cells (escaped); numbers are right-aligned, floats shown to 4
    significant digits. A header of empty names is left out (a table of name and value).
    ``row_classes`` names a CSS class per row, in order (None for none: a row of an estimate
    that failed its checks is greyed)."""
    head = "".join(f"<th>{escape(str(cell))}</th>" for cell in header)
    head = f"<tr>{head}</tr>" if any(header) else ""
    body = []
    for index, row in enumerate(rows):
        css_class = row_classes[index] if index < len(row_classes) else None
        opening = f'<tr class="{escape(css_class)}">' if css_class else "<tr>"
        cells = []
        for cell in row:
            if isinstance(cell, bool) or not isinstance(cell, int | float):
                cells.append(f"<td>{escape('-' if cell is None else str(cell))}</td>")
            else:
                cells.append(f'<td class="number">{escape(number(cell))}</td>')
        body.append(f"{opening}{''.join(cells)}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def number(value: float | int | None) -> str:
    """A number as a table shows it: integers with thousands separators, floats to 4
    significant digits."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}"


def html_folded(summary: str, body: str) -> str:
    """``body`` under a summary line that unfolds it."""
    return f"<details><summary>{escape(summary)}</summary>{body}</details>"


def html_list(items: Iterable[str]) -> str:
    """A bulleted list of plain-text items (escaped)."""
    return "<ul>" + "".join(f"<li>{escape(item)}</li>" for item in items) + "</ul>"


def html_verdict_box(decision: str, body: str) -> str:
    """``body`` in the box of ``decision`` (a key of ``VERDICT_COLOURS``; any other reads as
    ``unknown``): the run's answer, set apart from the facts around it."""
    known = decision if decision in VERDICT_COLOURS else "unknown"
    return f'<div class="verdict verdict-{known}">{body}</div>'


def html_preformatted(text: str) -> str:
    """Text shown as written (a config)."""
    return f"<pre>{escape(text)}</pre>"


def html_charts(items: Iterable[str]) -> str:
    """Charts (their ``html()``) side by side, wrapping to the page's width."""
    return f'<div class="charts">{"".join(items)}</div>'


def page(
    title: str,
    subtitle: str,
    runs: Sequence[str],
    sections: Sequence[Sequence[ReportSection]],
    across: Sequence[ReportSection] = (),
) -> str:
    """The whole page: ``sections`` holds one list of sections per run in ``runs`` (the
    runs' labels), the same keys in the same order; with several runs each section shows
    them side by side. A key present for one run only shows "absent" for the others.
    ``across`` are sections about all the runs together, shown last, full width."""
    keys: list[tuple[str, str]] = []
    for run_sections in sections:
        for section in run_sections:
            if section.key not in (key for key, _ in keys):
                keys.append((section.key, section.title))
    by_run = [{section.key: section for section in run_sections} for run_sections in sections]
    keys += [(section.key, section.title) for section in across]
    nav = "".join(f'<a href="#{escape(key)}">{escape(name)}</a>' for key, name in keys)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        GENERATOR,
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        html_paragraph(subtitle),
        f"<nav>{nav}</nav>",
    ]
    for key, name in keys[: len(keys) - len(across)]:
        parts.append(f'<section id="{escape(key)}"><h2>{escape(name)}</h2>')
        shown = [
            run.get(key, ReportSection(key, name, absent="this run has no such section"))
            for run in by_run
        ]
        if len(runs) == 1:
            parts.append(shown[0].html())
        else:
            columns = f"grid-template-columns: repeat({len(runs)}, minmax(0, 1fr))"
            parts.append(f'<div class="runs" style="{columns}">')
            for label, section in zip(runs, shown, strict=True):
                parts.append(f'<div class="run">{html_heading(label)}{section.html()}</div>')
            parts.append("</div>")
        parts.append("</section>")
    for section in across:
        parts.append(f'<section id="{escape(section.key)}"><h2>{escape(section.title)}</h2>')
        parts.append(f"{section.html()}</section>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
