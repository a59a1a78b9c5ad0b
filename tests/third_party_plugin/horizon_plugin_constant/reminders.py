"""The ``reminder_rows`` data source: a day-by-day send-or-skip decision, logged at random.

A service decides each day whether to send a user a reminder. The one state feature is
``hours_away``, the hours since the user's last visit (exponential, mean 48 h: skewed, which is
what the ``log1p`` feature type is for). A reminder brings back a user who has been away more
than a day (reward 1) and annoys one who was here yesterday (reward -1); no reminder earns 0.
The logged policy flips a fair coin, so every row's propensity is 0.5 and a learner has both
actions to compare in every state. The best policy sends exactly when ``hours_away > 24``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
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
)

if TYPE_CHECKING:
    from horizon_engine import RunContext

ACTIONS = ["send", "skip"]
"""The decision's actions, in the order ``[timeline] actions`` numbers them."""
MEAN_HOURS_AWAY = 48.0
RETURN_AFTER_HOURS = 24.0
"""A user away longer than this comes back when reminded; a reminder sooner annoys."""
FIRST_DAY = dt.date(2024, 1, 1)


def reward(hours_away: float, action: str) -> float:
    """What one decision earns: +1 or -1 for a reminder (see the module docstring), 0 without."""
    if action == "skip":
        return 0.0
    return 1.0 if hours_away > RETURN_AFTER_HOURS else -1.0


class ReminderRowsConfig(ComponentConfig):
    """Options of ``[source] kind = "reminder_rows"``."""

    users: int = Field(200, ge=1)
    """How many users (episodes) to log."""
    days: int = Field(5, ge=1)
    """How many daily decisions each user has."""


def reminder_rows(users: int, days: int, seed: int) -> Iterator[dict[str, Any]]:
    """The logged decisions as pre-timeline rows, user by user and day by day; the same
    ``seed`` gives the same rows (``horizon reminder-rows`` writes these too)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for user in range(users):
        for day in range(days):
            hours_away = round(float(rng.exponential(MEAN_HOURS_AWAY)), 2)
            action = ACTIONS[int(rng.integers(len(ACTIONS)))]
            yield {
                "ds": (FIRST_DAY + dt.timedelta(days=day)).isoformat(),
                "mdp_id": f"user-{user}",
                "sequence_number": day,
                "state_features": {"hours_away": hours_away},
                "action": action,
                "action_probability": 1.0 / len(ACTIONS),
                "possible_actions": ACTIONS,
                "reward": reward(hours_away, action),
                "metrics": {"reminders": float(action == "send")},
            }


class ReminderRows(DataSource):
    """Daily send-or-skip reminder decisions, logged by a fair coin, as discrete rows."""

    name = "reminder_rows"
    Config = ReminderRowsConfig
    config: ReminderRowsConfig

    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        """Yield one batch per user, shaped by Horizon's own row shaper."""
        layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
        shaper = RowShaper(layout)
        rows = reminder_rows(self.config.users, self.config.days, run.seed)
        for user in range(self.config.users):
            located = [(f"user {user} day {day}", next(rows)) for day in range(self.config.days)]
            shaped = shaper.shape(located)
            yield SourceBatch(shaped.table, layout, shaped.locations, shaped.bad_rows)
