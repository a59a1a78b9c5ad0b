"""What the validated rows say about their actions and metrics, read before the timeline.

The timeline stage needs two things the config may not say or may say wrongly: the discrete
action names (Horizon's own timeline rows number their actions and say how many there are in
every ``possible_actions`` mask; logged decisions name theirs, and without an ``actions`` list
the names they log are numbered), and whether the metrics that ``[timeline] reward`` weights
are logged at all (a weight for a metric no row carries would train on rewards of zero without
a word). Both are read from ``source/rows.parquet``, one
column at a time, whatever engine builds the timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from horizon_engine.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa


def _column(rows: Path, name: str) -> pa.Array:
    import pyarrow.parquet as pq

    return pq.read_table(rows, columns=[name]).column(name).combine_chunks()


def mask_width(rows: Path) -> int | None:
    """How many actions the ``possible_actions`` masks of discrete timeline rows cover, or
    None when no row recorded a mask. Masks of different widths are an error."""
    import pyarrow.compute as pc

    if "possible_actions" not in _schema_names(rows):
        return None
    lengths = pc.list_value_length(_column(rows, "possible_actions"))
    widths = sorted({int(width) for width in pc.unique(lengths.drop_null()).to_pylist()} - {0})
    if len(widths) > 1:
        raise ConfigError(
            [
                f"{rows}: the rows' possible_actions masks have {' and '.join(map(str, widths))} "
                "entries; every mask must cover the same actions"
            ]
        )
    return widths[0] if widths else None


def _schema_names(rows: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(rows).names


def timeline_action_names(rows: Path, configured: list[str] | None, where: str) -> list[str]:
    """The action names of discrete timeline rows: ``configured`` when given (it must cover
    the masks' width), else "0", "1", ... for each entry of the masks."""
    width = mask_width(rows)
    if configured is not None:
        if width is not None and len(configured) != width:
            raise ConfigError(
                [
                    f"{where}: [timeline] actions names {len(configured)} actions, but the "
                    f"rows' possible_actions masks in {rows} cover {width}"
                ]
            )
        return configured
    if width is None:
        raise ConfigError(
            [
                f"{where}: [timeline] needs actions = [...]: the timeline rows number their "
                "actions but record no possible_actions masks that say how many there are"
            ]
        )
    return [str(index) for index in range(width)]


def logged_action_names(rows: Path) -> list[str]:
    """The distinct discrete action names the pre-timeline rows log, as actions or among
    their ``possible_actions``: the names a timeline without ``[timeline] actions`` numbers.
    Names that are whole numbers (a gym environment's "0", "1", ..., "10") come first, by
    value; other names follow in alphabetical order."""
    import pyarrow.compute as pc

    names = set(pc.unique(_column(rows, "action")).drop_null().to_pylist())
    if "possible_actions" in _schema_names(rows):
        listed = pc.list_flatten(_column(rows, "possible_actions"))
        names |= set(pc.unique(listed).drop_null().to_pylist())
    return sorted((str(name) for name in names), key=_by_value)


def _by_value(name: str) -> tuple[int, int, str]:
    return (0, int(name), name) if name.isdecimal() and name.isascii() else (1, 0, name)


@dataclass(frozen=True)
class MetricCoverage:
    """How many rows carry each weighted metric, and which metrics the rows carry at all."""

    rows: int
    carrying: dict[str, int]
    logged: list[str]

    def missing_everywhere(self) -> list[str]:
        return [name for name, count in self.carrying.items() if not count]

    def missing_somewhere(self) -> dict[str, int]:
        """Metric -> rows without it, for the metrics some rows carry and some do not."""
        return {
            name: self.rows - count
            for name, count in self.carrying.items()
            if 0 < count < self.rows
        }


def metric_coverage(rows: Path, names: list[str]) -> MetricCoverage:
    """Count, for each of ``names``, the rows whose ``metrics`` map holds it (a null value
    counts as absent: the reward computation reads it as 0)."""
    import numpy as np
    import pyarrow.compute as pc

    from horizon_engine.schema import map_entries

    metrics = _column(rows, "metrics")
    parents, keys, values = map_entries(metrics)
    present = ~values.is_null().to_numpy(zero_copy_only=False)
    keys = keys.filter(present)
    parents = parents[present]
    carrying = {}
    for name in names:
        chosen = pc.equal(keys, name).to_numpy(zero_copy_only=False)
        carrying[name] = len(np.unique(parents[chosen]))
    logged = sorted(pc.unique(keys).to_pylist())
    return MetricCoverage(len(metrics), carrying, logged)
