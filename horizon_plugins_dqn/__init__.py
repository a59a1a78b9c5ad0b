"""DQN trainers: discrete DQN (double Q, dueling, n-step, SARSA, conservative Q-learning and
discrete BCQ) and parametric DQN (Q of state and action features together).

Registered through the ``horizon`` entry point like any third-party plugin. torch is imported
by the trainer's methods, not here, so ``horizon plugins`` lists the options without loading it.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon_engine import hookimpl
from horizon_plugins_dqn.config import DqnConfig, ParametricDqnConfig
from horizon_plugins_dqn.parametric import ParametricDqnTrainer
from horizon_plugins_dqn.trainer import DqnTrainer

__all__ = ["DqnConfig", "DqnTrainer", "ParametricDqnConfig", "ParametricDqnTrainer"]


@hookimpl
def horizon_register_trainers(register: Callable[[type], None]) -> None:
    register(DqnTrainer)
    register(ParametricDqnTrainer)
