"""Charts draw names from the data as plain text: matplotlib reads text between dollar signs
as math, and a feature or action named like broken math once made the report leave out its
normalization, training and actions sections."""

from __future__ import annotations

import pytest

from horizon_engine import (
    Series,
    count_bars,
    grouped_bars,
    histogram_pairs,
    histograms,
    interval_bars,
    small_multiples,
)

BROKEN_MATH = r"$\frac{1}{$"
"""A name matplotlib's math parser refuses (an unfinished fraction between dollar signs)."""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

CHARTS = {
    "count_bars": lambda name: count_bars([name, "rows in"], [3, 4], title=name),
    "interval_bars": lambda name: interval_bars([name], {name: [(1.0, 0.5, 1.5)]}, title=name),
    "small_multiples": lambda name: small_multiples(
        [0, 1],
        {name: [Series(name, [1.0, 2.0])]},
        title=name,
        xlabel=name,
        reference=(1.0, name),
    ),
    "grouped_bars": lambda name: grouped_bars(
        [name, "b"], {name: [0.4, 0.6], "trained": [0.5, 0.5]}, title=name, ylabel=name
    ),
    "histograms": lambda name: histograms({name: [0.0, 1.0, 2.0]}, title=name, xlabel=name),
    "histogram_pairs": lambda name: histogram_pairs({name: ([0.0, 1.0], [0.5, 1.5])}, title=name),
}


@pytest.mark.parametrize("kind", sorted(CHARTS))
def test_names_that_read_as_broken_math_are_drawn_as_text(kind: str) -> None:
    chart = CHARTS[kind](BROKEN_MATH)
    assert chart.png.startswith(PNG_SIGNATURE)
    assert chart.alt.startswith(BROKEN_MATH)
