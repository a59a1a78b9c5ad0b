"""A third party's Horizon Engine plugin: one component of every family, and a run recorder.

- data sources: ``constant_rows`` (below: the same row over and over) and ``reminder_rows``
  (``reminders``: daily send-or-skip decisions logged at random);
- a timeline engine, ``[timeline] engine = "one_step"`` (``timeline``), and a feature type,
  ``log1p`` (``log1p``);
- a trainer, ``small_q`` (``trainer``: one-step Q-learning, offline and in ``horizon gym``);
- an estimator, ``one_step_ips`` (``estimator``: inverse propensity scoring);
- an exporter, ``torch_program`` (``exporter``: a ``torch.export`` program, ``policy.pt2``);
- a command, ``horizon reminder-rows`` (``commands``);
- a pipeline stage, ``row_summary`` (``summary``: configured by ``[row_summary]``, run after
  the timeline, whose output it reads).

Every module imports only Horizon Engine's public API (the names ``horizon_engine`` exports),
as any plugin published on its own must; docs/plugins.md shows each of them. The recorder
keeps every lifecycle hook call in ``CALLS`` so that tests can see what a plugin observes of a
run.
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
    Stage,
    hookimpl,
)
from horizon_plugin_constant.estimator import OneStepIps
from horizon_plugin_constant.exporter import TorchProgram
from horizon_plugin_constant.log1p import Log1p
from horizon_plugin_constant.reminders import ReminderRows
from horizon_plugin_constant.summary import ROW_SUMMARY
from horizon_plugin_constant.timeline import OneStepTimeline
from horizon_plugin_constant.trainer import SmallQ

if TYPE_CHECKING:
    import click

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
    register(ReminderRows)


@hookimpl
def horizon_register_timeline_engines(register: Callable[[type], None]) -> None:
    register(OneStepTimeline)


@hookimpl
def horizon_register_feature_types(register: Callable[[type], None]) -> None:
    register(Log1p)


@hookimpl
def horizon_register_trainers(register: Callable[[type], None]) -> None:
    register(SmallQ)


@hookimpl
def horizon_register_estimators(register: Callable[[type], None]) -> None:
    register(OneStepIps)


@hookimpl
def horizon_register_exporters(register: Callable[[type], None]) -> None:
    register(TorchProgram)


@hookimpl
def horizon_register_stages(register: Callable[[Stage], None]) -> None:
    register(ROW_SUMMARY)


@hookimpl
def horizon_register_commands(cli: click.Group) -> None:
    from horizon_plugin_constant.commands import reminder_rows_command

    cli.add_command(reminder_rows_command)


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
