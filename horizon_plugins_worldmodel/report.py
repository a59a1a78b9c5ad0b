"""The analysis for people: a text report with a table, and a bar chart of feature importance.

``report_text`` is what ``horizon check-mdp`` prints: each check's question, verdict and the
numbers behind it, then the features ranked by how much the held-out losses grow when each is
replaced by its mean. ``importance_chart`` draws the same ranking as bars with their
intervals, with the engine's charts (matplotlib), and ``mdp_section`` is the analysis's
section of the run's report page (``horizon report``).
"""

from __future__ import annotations

import json
from typing import Any

from horizon_engine import (
    Chart,
    ReportSection,
    RunFolder,
    html_paragraph,
    html_table,
    interval_bars,
)

RESULT_FILE = f"{RunFolder.ANALYSIS}/mdp_check.json"
"""Every number behind every verdict, as the analysis stage writes it."""
VERDICT_MARKS = {"yes": "ok", "none": "ok", "no": "FLAG", "some": "FLAG"}
"""How a verdict is marked in the text report; one not listed (unclear, not assessed) is "?"."""


def _interval(value: dict[str, float] | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value['value']:.{digits}f} [{value['low']:.{digits}f}, {value['high']:.{digits}f}]"


def report_text(result: dict[str, Any]) -> str:
    """The report: data, checks with their findings, then the importance table."""
    data = result["data"]
    lines = [
        f"MDP check on {data['rows']} rows in {data['episodes']} episodes "
        f"({data['folds']} folds of episodes, {data['confidence']:.0%} intervals over "
        f"{data['num_bootstrap']} resamples of episodes)",
        f"Held-out negative log-likelihood of a transition: "
        f"{_interval(result['held_out_loss']['transition_nll'])} nats",
        "",
    ]
    for number, check in enumerate(result["checks"], start=1):
        mark = VERDICT_MARKS.get(check["verdict"], "?")
        lines.append(f"{number}. [{mark}] {check['question']} {check['verdict']}")
        lines.append(f"   {check['finding']}")
    moves = [
        f"{source} -> {', '.join(targets)}"
        for source, targets in result["influence"].items()
        if targets
    ]
    lines += [
        "",
        "What predicts which next feature (beyond noise): " + ("; ".join(moves) or "nothing"),
        "",
        "Feature importance: held-out loss increase when the feature is replaced by its mean",
    ]
    header = ("feature", "transition (nats)", "reward (share of variance)")
    rows = [
        (row["feature"], _interval(row["transition"]), _interval(row["reward"]))
        for row in result["feature_importance"]
    ]
    widths = [max(len(text) for text in column) for column in zip(header, *rows, strict=True)]
    for cells in (header, tuple("-" * width for width in widths), *rows):
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        )
    return "\n".join(lines)


def importance_chart(result: dict[str, Any]) -> Chart:
    """Two bar charts side by side: each feature's importance for the transition (nats) and
    for the reward (share of its variance), with their intervals, most important on top."""
    rows = result["feature_importance"]
    panels = {
        "next state and end (nats)": [_bar(row["transition"]) for row in rows],
        "reward (share of variance)": [_bar(row["reward"]) for row in rows],
    }
    return interval_bars(
        [str(row["feature"]) for row in rows],
        panels,
        title="Held-out loss increase when a feature is replaced by its mean",
    )


def _bar(value: dict[str, float] | None) -> tuple[float, float, float] | None:
    return None if value is None else (value["value"], value["low"], value["high"])


def mdp_section(folder: RunFolder) -> ReportSection:
    """The report page's section: each check's verdict and finding, and the importance chart;
    absent, with how to run it, where the run has no analysis."""
    key, title = "mdp_check", "Is the problem an MDP? (world model)"
    path = folder.file(RESULT_FILE)
    if not path.is_file():
        return ReportSection(
            key,
            title,
            absent="the run has no analysis stage (add [analysis] to the pipeline, or run "
            "horizon check-mdp on it)",
        )
    result = json.loads(path.read_text(encoding="utf-8"))
    data = result["data"]
    intro = html_paragraph(
        f"On {data['rows']} rows in {data['episodes']} episodes, {data['folds']} folds of "
        f"episodes, {data['confidence']:.0%} intervals over {data['num_bootstrap']} resamples."
    )
    checks = html_table(
        ("check", "question", "verdict", "finding"),
        [
            (
                check["name"],
                check["question"],
                f"{check['verdict']} ({VERDICT_MARKS.get(check['verdict'], '?')})",
                check["finding"],
            )
            for check in result["checks"]
        ],
    )
    return ReportSection(key, title, intro + checks + importance_chart(result).html())
