"""Charts for people, drawn by matplotlib: the report page's and ``horizon check-mdp``'s.

Every chart is a PNG made without a display (matplotlib's Agg canvas on a ``Figure`` object,
not pyplot: no global figure state, nothing left open between charts), returned as a ``Chart``
that a page inlines as a ``data:`` URI, so a page opens from disk with no other file. PNG
rather than SVG: a histogram's SVG grows with its bars' paths, a PNG with its pixels only, so
a page with many small charts stays small.

The functions take plain numbers (lists or numpy arrays) and draw what is finite: a run folder
copied from elsewhere may hold NaN or infinity, which a chart leaves out and says so in its
title rather than failing. Importing this module does not import matplotlib (``horizon
plugins`` imports the engine's public names); the first chart does.
"""

from __future__ import annotations

import base64
import functools
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 80
"""Pixels per inch of every chart: a 6-inch chart is 480 pixels wide, sharp enough on a page
and a few tens of kilobytes as PNG."""
COLORS = ("#4a78b0", "#d9822b", "#3f9b5a", "#b54a4a", "#7d5ba6", "#8c6d31", "#5aa5b5", "#999999")
"""The series' colours, in order (colour-blind-safe enough for two to four series)."""
STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "text.parse_math": False,
}
"""Applied to the whole of every chart's drawing (``_styled``). ``text.parse_math`` off: names
come from the data (a feature called ``$\\frac{1}{$``), and matplotlib would read text between
dollar signs as math and fail on it; every label is drawn as plain text."""


@dataclass(frozen=True)
class Chart:
    """One drawn chart: its PNG bytes, size in pixels, and the text a page gives as ``alt``."""

    png: bytes
    width: int
    height: int
    alt: str

    def html(self) -> str:
        """An ``<img>`` holding the PNG itself (a ``data:`` URI)."""
        data = base64.b64encode(self.png).decode("ascii")
        return (
            f'<img src="data:image/png;base64,{data}" width="{self.width}" '
            f'height="{self.height}" alt="{escape(self.alt)}">'
        )


def _styled(draw: Callable[..., Chart]) -> Callable[..., Chart]:
    """``draw`` run whole under ``STYLE``: text objects read the style when they are made (a
    title, a legend, a tick label made at drawing time), so creating the figure under it is
    not enough."""

    @functools.wraps(draw)
    def styled(*args: Any, **kwargs: Any) -> Chart:
        import matplotlib

        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return styled


Interval = tuple[float, float, float]
"""A value and its interval: ``(value, low, high)``."""


@_styled
def count_bars(labels: Sequence[str], counts: Sequence[float], *, title: str) -> Chart:
    """Horizontal bars, one per label, top to bottom, each with its count written beside it
    (the row funnel: rows in, each reason rows were dropped for, the splits)."""
    left = _label_inches(_short(label, 48) for label in labels)
    figure, grid = _grid(6.0, 0.8 + 0.25 * max(len(labels), 1), left=left)
    axes = grid[0][0]
    values = [_finite_or_zero(count) for count in counts]
    positions = list(range(len(labels)))[::-1]
    axes.barh(positions, values, color=COLORS[0], height=0.6)
    axes.set_yticks(positions, [_short(label, 48) for label in labels])
    axes.grid(axis="y", visible=False)
    largest = max(values, default=0.0) or 1.0
    for position, value in zip(positions, values, strict=True):
        axes.text(value + largest * 0.01, position, f"{value:,.0f}", va="center", fontsize=8)
    axes.set_xlim(0, largest * 1.15)
    axes.set_title(title, loc="left")
    return _chart(figure, title)


@_styled
def interval_bars(
    labels: Sequence[str], panels: Mapping[str, Sequence[Interval | None]], *, title: str
) -> Chart:
    """Horizontal bars with interval whiskers, one panel per entry of ``panels`` side by side,
    sharing the labels (first on top); a None value leaves its bar out (not applicable)."""
    rows = max(len(labels), 1)
    left = _label_inches(_short(label, 32) for label in labels)
    width = left + 3.2 * max(len(panels), 1)
    figure, grids = _grid(width, 1.0 + 0.25 * rows, 1, max(len(panels), 1), left=left, sharey=True)
    grid = grids[0]
    positions = list(range(len(labels)))[::-1]
    for number, (axes, (name, values)) in enumerate(zip(grid, panels.items(), strict=False)):
        shown = [
            (position, value)
            for position, value in zip(positions, values, strict=True)
            if value is not None and all(math.isfinite(part) for part in value)
        ]
        if shown:
            where = [position for position, _ in shown]
            middle = [value[0] for _, value in shown]
            low = [value[0] - value[1] for _, value in shown]
            high = [value[2] - value[0] for _, value in shown]
            axes.barh(where, middle, color=COLORS[number % len(COLORS)], height=0.6)
            axes.errorbar(middle, where, xerr=[low, high], fmt="none", ecolor="black", lw=1)
        else:
            axes.text(0.5, 0.5, "not applicable", transform=axes.transAxes, ha="center")
        axes.axvline(0.0, color="black", lw=0.8)
        axes.set_title(name, loc="left")
        axes.grid(axis="y", visible=False)
    grid[0].set_yticks(positions, [_short(label, 32) for label in labels])
    figure.suptitle(title, x=0.01, ha="left", fontsize=10)
    return _chart(figure, title)


@dataclass(frozen=True)
class Series:
    """One line of a panel: its values over the chart's x, and optionally the low and high of
    a band around it (an estimate's interval). None or a non-finite value leaves a gap."""

    name: str
    values: Sequence[float | None]
    low: Sequence[float | None] | None = None
    high: Sequence[float | None] | None = None


@_styled
def small_multiples(
    x: Sequence[float],
    panels: Mapping[str, Sequence[Series]],
    *,
    title: str,
    xlabel: str,
    reference: tuple[float, str] | None = None,
    columns: int = 3,
) -> Chart:
    """One small line chart per panel, on a grid of ``columns`` (each panel its own y scale:
    a TD loss and a Monte Carlo loss differ a hundredfold), one figure for all of them. A
    panel's series share it, each with its band where it has one; ``reference`` is a dashed
    horizontal line in every panel (its value and label: the logged policy's 1.0)."""
    count = max(len(panels), 1)
    columns = min(columns, count)
    rows = -(-count // columns)
    figure, grid = _grid(3.3 * columns, 0.5 + 2.1 * rows, rows, columns, bottom=0.5, hgap=0.75)
    dropped = 0
    for axes, (name, lines) in zip(grid.flat, panels.items(), strict=False):
        for number, line in enumerate(lines):
            color = COLORS[number % len(COLORS)]
            points = [_finite_or_nan(value) for value in line.values]
            dropped += sum(1 for value in line.values if _is_bad(value))
            marker = "." if len(x) < 30 else ""
            axes.plot(x, points, color=color, lw=1.4, label=line.name, marker=marker)
            if line.low is not None and line.high is not None:
                low = [_finite_or_nan(value) for value in line.low]
                high = [_finite_or_nan(value) for value in line.high]
                axes.fill_between(x, low, high, color=color, alpha=0.18, lw=0)
        if reference is not None:
            axes.axhline(reference[0], color="black", lw=0.8, ls="--", label=reference[1])
        axes.set_title(_short(name, 40), loc="left", fontsize=9)
        axes.tick_params(labelsize=7)
        axes.set_xlabel(xlabel, fontsize=8)
        if len(lines) > 1 or reference is not None:
            axes.legend(loc="best", fontsize=7)
    for axes in list(grid.flat)[len(panels) :]:
        axes.set_visible(False)
    _title(figure, _noted(title, dropped))
    return _chart(figure, _noted(title, dropped))


@_styled
def grouped_bars(
    categories: Sequence[str], groups: Mapping[str, Sequence[float]], *, title: str, ylabel: str
) -> Chart:
    """Vertical bars per category, one bar per group side by side (the logged policy's share
    of each action beside the trained policy's)."""
    width = min(10.0, 3.0 + 0.45 * len(categories) * max(len(groups), 1))
    figure, grid = _grid(width, 2.8, left=0.7, bottom=0.9 if len(categories) > 8 else 0.5)
    axes = grid[0][0]
    count = max(len(groups), 1)
    bar = 0.8 / count
    for number, (name, values) in enumerate(groups.items()):
        offsets = [index - 0.4 + bar * (number + 0.5) for index in range(len(categories))]
        axes.bar(
            offsets,
            [_finite_or_zero(value) for value in values],
            width=bar,
            color=COLORS[number % len(COLORS)],
            label=name,
        )
    axes.set_xticks(range(len(categories)), [_short(name, 16) for name in categories])
    if len(categories) > 8:
        axes.tick_params(axis="x", labelrotation=45)
    axes.set_ylabel(ylabel)
    axes.grid(axis="x", visible=False)
    axes.legend(loc="best")
    return _chart(figure, title, axes)


@_styled
def histograms(
    samples: Mapping[str, Sequence[float]], *, title: str, xlabel: str, bins: int = 30
) -> Chart:
    """The samples' histograms overlaid on shared bins, as densities (samples of different
    sizes compare), outlines only so that each stays visible."""
    import numpy as np

    figure, grid = _grid(4.2, 2.4, left=0.6, bottom=0.55)
    axes = grid[0][0]
    finite = {name: _finite_array(values) for name, values in samples.items()}
    pooled = np.concatenate([values for values in finite.values()] or [np.zeros(0)])
    dropped = sum(len(samples[name]) - len(values) for name, values in finite.items())
    if len(pooled):
        edges = np.histogram_bin_edges(pooled, bins=bins)
        for number, (name, values) in enumerate(finite.items()):
            if len(values):
                axes.hist(
                    values,
                    bins=edges,
                    density=True,
                    histtype="step",
                    lw=1.5,
                    color=COLORS[number % len(COLORS)],
                    label=name,
                )
        axes.legend(loc="best")
    else:
        axes.text(0.5, 0.5, "no finite values", transform=axes.transAxes, ha="center")
    axes.set_xlabel(xlabel)
    return _chart(figure, _noted(title, dropped), axes)


@_styled
def histogram_pairs(
    pairs: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str
) -> Chart:
    """Two small histograms per entry, one row each: a feature's sample as logged and as the
    network sees it after its normalization (the entry's name says which feature and type)."""
    import numpy as np

    rows = max(len(pairs), 1)
    figure, grid = _grid(6.4, 0.5 + 1.25 * rows, rows, 2, left=0.2, bottom=0.3, hgap=0.55)
    for row, (name, sides) in zip(grid, pairs.items(), strict=False):
        for axes, values, side in zip(row, sides, ("logged", "normalized"), strict=True):
            finite = _finite_array(values)
            if len(finite):
                bins = min(30, max(len(np.unique(finite)), 1))
                # One polygon per histogram, not a rectangle per bin: the bins' artists took
                # 0.3 s of a normalization section's 1.25.
                color = COLORS[0 if side == "logged" else 1]
                axes.hist(finite, bins=bins, color=color, histtype="stepfilled")
            else:
                axes.text(0.5, 0.5, "no values", transform=axes.transAxes, ha="center")
            axes.set_title(f"{_short(name, 44)}: {side}", loc="left", fontsize=8)
            axes.tick_params(labelsize=7)
            axes.set_yticks([])
            axes.grid(False)
    _title(figure, title)
    return _chart(figure, title)


def _grid(
    width: float,
    height: float,
    rows: int = 1,
    columns: int = 1,
    *,
    left: float = 0.55,
    right: float = 0.2,
    top: float = 0.45,
    bottom: float = 0.45,
    wgap: float = 0.5,
    hgap: float = 0.6,
    sharey: bool = False,
) -> tuple[Figure, Any]:
    """A figure of ``width`` x ``height`` inches with a ``rows`` x ``columns`` grid of axes,
    its margins and gaps given in inches. Fixed margins rather than matplotlib's constrained
    layout, which measured every label's box again for each chart and took over half of a
    chart's time (0.13 against 0.09 s for a two-panel chart; 1.0 of 1.7 s for twelve)."""
    from matplotlib.figure import Figure

    cell_width = max((width - left - right - wgap * (columns - 1)) / columns, 0.1)
    cell_height = max((height - top - bottom - hgap * (rows - 1)) / rows, 0.1)
    spacing = {
        "left": left / width,
        "right": 1 - right / width,
        "top": 1 - top / height,
        "bottom": bottom / height,
        "wspace": wgap / cell_width,
        "hspace": hgap / cell_height,
    }
    figure = Figure(figsize=(width, height), dpi=DPI)
    grid = figure.subplots(rows, columns, squeeze=False, sharey=sharey, gridspec_kw=spacing)
    return figure, grid


def _title(figure: Figure, title: str) -> None:
    """A figure's title, at its top left."""
    figure.suptitle(title, x=0.01, y=0.99, ha="left", va="top", fontsize=10)


def _label_inches(labels: Any) -> float:
    """The left margin that fits the longest tick label (about 0.07 inch a character at the
    charts' font size)."""
    return 0.3 + 0.07 * max((len(label) for label in labels), default=1)


def _chart(figure: Figure, title: str, axes: Axes | None = None) -> Chart:
    """The figure as PNG; ``axes`` given, its title is ``title`` (else the caller set one)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if axes is not None:
        axes.set_title(title, loc="left")
    canvas = FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    width, height = (round(size) for size in figure.get_size_inches() * figure.dpi)
    return Chart(buffer.getvalue(), width, height, title)


def _noted(title: str, dropped: int) -> str:
    return f"{title} ({dropped} non-finite values left out)" if dropped else title


def _as_float(value: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _is_bad(value: float | None) -> bool:
    """A value given (not None) that is not a finite number."""
    return value is not None and not math.isfinite(_as_float(value))


def _finite_or_nan(value: float | None) -> float:
    number = math.nan if value is None else _as_float(value)
    return number if math.isfinite(number) else math.nan


def _finite_or_zero(value: float) -> float:
    number = _as_float(value)
    return number if math.isfinite(number) else 0.0


def _finite_array(values: Sequence[float]) -> Any:
    import numpy as np

    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]


def _short(text: str, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
