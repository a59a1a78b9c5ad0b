"""What an online run reports: its evaluations, its counts, and the ``-r`` reward history."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from horizon_engine import HorizonError, atomic_output

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

    def report(self, greedy_episodes: int, files: Iterable[Path | None] = ()) -> list[str]:
        """The lines ``horizon gym train`` ends with: counts, the best and last evaluations
        (each the mean of ``greedy_episodes``), the score bar, warnings, and the files written
        (the run folder's, then ``files`` such as the ``-f`` and ``-r`` files)."""
        lines = [
            f"{self.env}: {self.episodes} episodes, {self.steps} steps, {self.updates} updates, "
            f"{len(self.evaluations)} evaluations, {self.seconds:.1f} s"
        ]
        best, last = self.best, self.last
        if best is not None and last is not None:
            lines.append(
                f"mean return over {greedy_episodes} greedy episodes: "
                f"best {best.mean_return:.1f} (step {best.timestep}, episode {best.episode}), "
                f"last {last.mean_return:.1f} (step {last.timestep}, episode {last.episode})"
            )
        if self.score_bar is not None:
            lines.append(
                f"score bar {self.score_bar:g}: {'reached' if self.reached else 'not reached'}"
            )
        lines += [f"  warning: {warning}" for warning in self.warnings]
        written = [self.output_dir / output for output in self.outputs]
        lines += [f"wrote {path}" for path in (*written, *files) if path is not None]
        return lines


class ExportAfterTrainingError(HorizonError):
    """Training finished and its record stands (checkpoints, ``-r`` history, the manifest's
    ``result``), but the export at the end of ``horizon gym train`` failed.

    The message is the training's report, then the export's error, so that the command line,
    which prints a ``HorizonError``'s message, still shows what training achieved.
    """

    def __init__(self, result: GymTrainingResult, report: list[str], error: str) -> None:
        self.result = result
        self.error = error
        super().__init__("\n".join(["training finished, then the export failed:", *report, error]))


def write_reward_history(path: Path, evaluations: list[Evaluation]) -> None:
    """The ``-r`` CSV, written atomically: ``timestep,episode,mean_return`` per evaluation."""
    with atomic_output(Path(path)) as temporary, temporary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REWARD_HISTORY_COLUMNS)
        for evaluation in evaluations:
            writer.writerow([evaluation.timestep, evaluation.episode, evaluation.mean_return])
