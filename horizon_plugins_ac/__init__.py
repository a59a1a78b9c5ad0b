"""Actor-critic trainers for continuous actions: ``sac``, ``td3`` and ``ddpg``.

Registered through the ``horizon`` entry point like any third-party plugin. torch is imported
by the trainers' methods, not here, so ``horizon plugins`` lists the options without loading
it.
"""

from __future__ import annotations

from collections.abc import Callable

from horizon_engine import hookimpl
from horizon_plugins_ac.config import DdpgConfig, SacConfig, Td3Config
from horizon_plugins_ac.trainer import DdpgTrainer, SacTrainer, Td3Trainer

__all__ = ["DdpgConfig", "DdpgTrainer", "SacConfig", "SacTrainer", "Td3Config", "Td3Trainer"]


@hookimpl
def horizon_register_trainers(register: Callable[[type], None]) -> None:
    register(SacTrainer)
    register(Td3Trainer)
    register(DdpgTrainer)
