"""A third party's Horizon Engine plugin: a data source of constant rows, and a run recorder.

It imports only Horizon Engine's public API (the names ``horizon_engine`` exports), as any
plugin published on its own must. The recorder keeps every
lifecycle hook call in ``CALLS`` so that tests can see what a plugin observes of a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import Field

from horizon_engine import (
    ActionType,
    ComponentConfig,
    DataSource,
    RowFormat,
    RowLayout,
    RowShaper,
    SourceBatch,
    hookimpl,
)

if TYPE_CHECKING:
    from horizon_engine import RunContext, StageReport

CALLS: list[tuple[str, dict[str, Any]]] = []
"""Every lifecycle hook call seen, as (hook name, its arguments), oldest first."""


class ConstantRowsConfig(ComponentConfig):
    """Options of ``[source] kind = "constant_rows"``."""

    episodes: int = Field(2, ge=0)
    """How many episodes to write; with 0 the source yields nothing."""
    steps: int = Field(3, ge=1)
    """How many rows (decisions) each episode has."""
    reward: float = 1.0
    """The reward of every row."""


class ConstantRows(DataSource):
    """Writes one discrete pre-timeline row, the same each step, for every step of every episode."""

    name = "constant_rows"
    Config = ConstantRowsConfig
    config: ConstantRowsConfig

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        """Yield one batch per episode, shaped by Horizon's own row shaper."""
        layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
        shaper = RowShaper(layout)
        for episode in range(self.config.episodes):
            rows = [
                (f"episode {episode} step {step}", self._row(episode, step))
                for step in range(self.config.steps)
            ]
            shaped = shaper.shape(rows)
            yield SourceBatch(
                shaped.table, layout, shaped.locations, shaped.bad_rows, shaped.ignored_fields
            )

    def _row(self, episode: int, step: int) -> dict[str, Any]:
        return {
            "ds": "2024-01-01",
            "mdp_id": f"episode-{episode}",
            "sequence_number": step,
            "state_features": {"0": 1.0},
            "action": "stay",
            "reward": self.config.reward,
            "action_probability": 1.0,
            "possible_actions": ["stay"],
            "metrics": {"reward": self.config.reward},
        }


@hookimpl
def horizon_register_data_sources(register: Callable[[type], None]) -> None:
    register(ConstantRows)


@hookimpl
def horizon_on_stage_start(run: RunContext, stage: str) -> None:
    CALLS.append(("horizon_on_stage_start", {"run": run, "stage": stage}))


@hookimpl
def horizon_on_stage_end(run: RunContext, stage: str, report: StageReport) -> None:
    CALLS.append(("horizon_on_stage_end", {"run": run, "stage": stage, "report": report}))


@hookimpl
def horizon_on_epoch_end(run: RunContext, epoch: int, metrics: dict[str, float]) -> None:
    CALLS.append(("horizon_on_epoch_end", {"run": run, "epoch": epoch, "metrics": metrics}))


@hookimpl
def horizon_on_run_end(run: RunContext, manifest: dict[str, Any]) -> None:
    CALLS.append(("horizon_on_run_end", {"run": run, "manifest": manifest}))
