"""Data understanding with a learned world model: is the problem really an MDP?

Registered through the ``horizon`` entry point like any third-party plugin: the
``world_model`` trainer (``trainer``: a mixture-density model of the next state, the reward
and the episode's end); the ``analysis`` stage (``ANALYSIS_STAGE``), whose ``[analysis]``
section selects a trainer that analyses data, ``world_model`` by default, to check the
problem's formulation (``checks``, with held-out losses over folds of episodes and intervals
from ``statistics``); and the ``horizon check-mdp`` command (``commands``), which prints the
report (``report``) and adds that report to the run's page (``horizon report``).
torch is imported when a model is built, so ``horizon plugins`` lists the options without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from horizon_engine import (
    ReportSection,
    RunFolder,
    SectionRule,
    Stage,
    analysis_problems,
    analyze_timeline,
    hookimpl,
)
from horizon_plugins_worldmodel.config import WorldModelConfig
from horizon_plugins_worldmodel.trainer import WorldModelTrainer

if TYPE_CHECKING:
    import click

__all__ = ["WorldModelConfig", "WorldModelTrainer"]


@hookimpl
def horizon_register_trainers(register: Callable[[type], None]) -> None:
    register(WorldModelTrainer)


ANALYSIS_STAGE = Stage(
    "analysis",
    "analysis",
    SectionRule("trainers", default_selector=WorldModelTrainer.name),
    reads=(RunFolder.TIMELINE_INFO, RunFolder.NORMALIZATION),
    claims=(f"{RunFolder.ANALYSIS}/*",),
    run=analyze_timeline,
    check=analysis_problems,
)
"""The MDP check as a pipeline stage. It reads only the data stages' outputs, so running it
again makes no training stale; registered after the core's stages, it runs after them."""


@hookimpl
def horizon_register_stages(register: Callable[[Stage], None]) -> None:
    register(ANALYSIS_STAGE)


@hookimpl
def horizon_report_sections(folder: RunFolder) -> list[ReportSection]:
    from horizon_plugins_worldmodel.report import mdp_section

    return [mdp_section(folder)]


@hookimpl
def horizon_register_commands(cli: click.Group) -> None:
    from horizon_plugins_worldmodel.commands import check_mdp_command

    cli.add_command(check_mdp_command)
