"""Counterfactual policy evaluation: DM, IPS, SNIPS, DR, sequential DR, weighted DR and MAGIC.

Registered through the ``horizon`` entry point like any third-party plugin: the estimators
(``horizon_plugins_cpe.estimators``, one ``[[evaluation]] kind`` each) over the formulas
(``formulas``) and the models they need (``models``), and the ``horizon evaluate`` command
(``commands``). numpy, scipy and torch are imported when an estimate is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from horizon_engine import hookimpl
from horizon_plugins_cpe.estimators import ESTIMATORS, CpeConfig, CpeEstimator

if TYPE_CHECKING:
    import click

__all__ = ["ESTIMATORS", "CpeConfig", "CpeEstimator"]


@hookimpl
def horizon_register_estimators(register: Callable[[type], None]) -> None:
    for estimator in ESTIMATORS:
        register(estimator)


@hookimpl
def horizon_register_commands(cli: click.Group) -> None:
    from horizon_plugins_cpe.commands import evaluate_command

    cli.add_command(evaluate_command)
