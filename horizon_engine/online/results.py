"""What an online run reports: its evaluations, its counts, and the ``-r`` reward history."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from horizon_engine.files import atomic_output

REWARD_HISTORY_COLUMNS: tuple[str, ...] = ("timestep", "episode", "mean_return")
"""The columns of the ``-r`` CSV: one row per evaluation."""


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: its greedy episodes' returns, after ``timestep`` training steps, in
    training episode ``episode`` (1-based)."""

    timestep: int
    episode: int
    returns: list[float]

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))


@dataclass
class GymTrainingResult:
    """What ``train_gym`` did: counts, every evaluation, the files written."""

    env: str
    episodes: int
    """Training episodes played (the last may be cut short by reaching the score bar)."""
    steps: int
    updates: int
    """Calls of the trainer's ``train_step``."""
    evaluations: list[Evaluation]
    score_bar: float | None
    output_dir: Path
    outputs: list[str] = field(default_factory=list)
    """Files written in ``output_dir``, relative to it."""
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def best(self) -> Evaluation | None:
        """The evaluation with the highest mean return (the first of ties)."""
        if not self.evaluations:
            return None
        return max(self.evaluations, key=lambda evaluation: evaluation.mean_return)

    @property
    def last(self) -> Evaluation | None:
        return self.evaluations[-1] if self.evaluations else None

    @property
    def reached(self) -> bool:
        """Whether an evaluation's mean return reached the score bar."""
        best = self.best
        if self.score_bar is None or best is None:
            return False
        return best.mean_return >= self.score_bar

    def summary(self) -> dict[str, Any]:
        """The result as manifest.json records it."""
        best, last = self.best, self.last
        return {
            "env": self.env,
            "episodes": self.episodes,
            "steps": self.steps,
            "updates": self.updates,
            "score_bar": self.score_bar,
            "reached": self.reached,
            "best_mean_return": best.mean_return if best else None,
            "last_mean_return": last.mean_return if last else None,
            "evaluations": [
                {"timestep": e.timestep, "episode": e.episode, "mean_return": e.mean_return}
                for e in self.evaluations
            ],
        }


def write_reward_history(path: Path, evaluations: list[Evaluation]) -> None:
    """The ``-r`` CSV, written atomically: ``timestep,episode,mean_return`` per evaluation."""
    with atomic_output(Path(path)) as temporary, temporary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REWARD_HISTORY_COLUMNS)
        for evaluation in evaluations:
            writer.writerow([evaluation.timestep, evaluation.episode, evaluation.mean_return])
