"""The analysis for people: a text report with a table, and a bar chart of feature importance.

``report_text`` is what ``horizon check-mdp`` prints: each check's question, verdict and the
numbers behind it, then the features ranked by how much the held-out losses grow when each is
replaced by its mean. ``importance_svg`` draws the same ranking as bars with their intervals,
written by hand as SVG (a few rectangles and lines need no plotting library).
"""

from __future__ import annotations

from html import escape
from typing import Any

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


BAR_HEIGHT = 18
LABEL_WIDTH = 90
PLOT_WIDTH = 300
GAP = 40


def importance_svg(result: dict[str, Any]) -> str:
    """Two bar charts side by side: each feature's importance for the transition (nats) and
    for the reward (share of its variance), with interval whiskers, most important on top."""
    rows = result["feature_importance"]
    panels = [("transition", "next state and end (nats)"), ("reward", "reward (share of variance)")]
    height = 40 + BAR_HEIGHT * len(rows) + 30
    width = LABEL_WIDTH + len(panels) * (PLOT_WIDTH + GAP)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for index, row in enumerate(rows):
        y = 40 + index * BAR_HEIGHT + BAR_HEIGHT * 0.7
        parts.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{y:.1f}" text-anchor="end">'
            f"{escape(str(row['feature']))}</text>"
        )
    for number, (key, title) in enumerate(panels):
        left = LABEL_WIDTH + number * (PLOT_WIDTH + GAP)
        parts += _panel(rows, key, title, left, height)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _panel(rows: list[dict[str, Any]], key: str, title: str, left: float, height: int) -> list[str]:
    """One chart: bars from zero, whiskers over the intervals, the axis's range written below."""
    values = [row[key] for row in rows if row[key] is not None]
    parts = [f'<text x="{left}" y="20" font-weight="bold">{escape(title)}</text>']
    if not values:
        parts.append(f'<text x="{left}" y="45">not applicable (constant reward)</text>')
        return parts
    low = min(0.0, *(value["low"] for value in values))
    high = max(0.0, *(value["high"] for value in values))
    span = (high - low) or 1.0

    def x(value: float) -> float:
        return left + (value - low) / span * PLOT_WIDTH

    zero = x(0.0)
    bottom = height - 25
    parts.append(f'<line x1="{zero:.1f}" y1="30" x2="{zero:.1f}" y2="{bottom}" stroke="black"/>')
    for index, row in enumerate(rows):
        value = row[key]
        if value is None:
            continue
        top = 40 + index * BAR_HEIGHT + 2
        start, end = sorted((zero, x(value["value"])))
        parts.append(
            f'<rect x="{start:.1f}" y="{top}" width="{end - start:.1f}" '
            f'height="{BAR_HEIGHT - 4}" fill="#4a78b0"/>'
        )
        middle = top + (BAR_HEIGHT - 4) / 2
        parts.append(
            f'<line x1="{x(value["low"]):.1f}" y1="{middle}" x2="{x(value["high"]):.1f}" '
            f'y2="{middle}" stroke="black"/>'
        )
    parts.append(f'<text x="{left}" y="{height - 8}">{low:.3g}</text>')
    parts.append(
        f'<text x="{left + PLOT_WIDTH}" y="{height - 8}" text-anchor="end">{high:.3g}</text>'
    )
    return parts
