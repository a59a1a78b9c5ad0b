"""Data understanding with a learned world model: is the problem really an MDP?

Registered through the ``horizon`` entry point like any third-party plugin: the
``world_model`` trainer (``trainer``: a mixture-density model of the next state, the reward
and the episode's end), which ``[analysis]`` also selects to check the problem's formulation
(``checks``, with held-out losses over folds of episodes and intervals from ``statistics``),
and the ``horizon check-mdp`` command (``commands``), which prints the report (``report``).
torch is imported when a model is built, so ``horizon plugins`` lists the options without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from horizon_engine import hookimpl
from horizon_plugins_worldmodel.config import WorldModelConfig
from horizon_plugins_worldmodel.trainer import WorldModelTrainer

if TYPE_CHECKING:
    import click

__all__ = ["WorldModelConfig", "WorldModelTrainer"]


@hookimpl
def horizon_register_trainers(register: Callable[[type], None]) -> None:
    register(WorldModelTrainer)


@hookimpl
def horizon_register_commands(cli: click.Group) -> None:
    from horizon_plugins_worldmodel.commands import check_mdp_command

    cli.add_command(check_mdp_command)
