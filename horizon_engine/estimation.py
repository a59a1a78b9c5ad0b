"""The estimator contract: what a counterfactual estimator receives and returns.

An estimator answers "what would the trained policy have earned on the eval split's states,
had it made the decisions?" from logged data alone. It receives the eval split as episodes
(``EvaluationEpisodes``: the rows in episode and step order, with the logged propensities,
rewards and metrics, the evaluated policy's ``PolicyOutput`` on every row, and the models the
trainer trained beside the policy) and returns named estimates. The training driver runs the
``[[evaluation]]`` estimators after every epoch (``every_epoch``) and the evaluation stage runs
them once after training (``horizon_engine.evaluation``).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.components import ComponentConfig, Estimator
from horizon_engine.policies import ExplorationConfig

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.policies import PolicyOutput
    from horizon_engine.schema import ActionType


class EstimatorConfig(ExplorationConfig):
    """Options every ``[[evaluation]]`` entry accepts: the exploration under which the trained
    policy's action probabilities are computed, and when the estimator runs."""

    every_epoch: bool = True
    """Also run after every training epoch, on the eval split (TensorBoard ``CPE/...``)."""


@dataclass
class EvaluationEpisodes:
    """The eval split as episodes: rows sorted by episode, then by step.

    ``data`` holds the rows as the batch schema names them (``reward``, ``action``,
    ``action_probability`` the logged propensity, ``episode_id``, ``step``, ...);
    ``episode_starts`` ``[E + 1]`` are the offsets of each episode's first row (and the row
    count), so episode ``e`` is rows ``episode_starts[e]:episode_starts[e + 1]``.
    """

    action_type: ActionType
    data: TimelineTensors
    episode_starts: torch.Tensor
    policy: PolicyOutput
    """The evaluated policy on every row's state, under the entry's exploration."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Each logged metric's value per row (``[N]``, 0 where a row lacks it), when rows carry a
    ``metrics`` map; the reward is ``data.reward``."""
    models: dict[str, Any] = field(default_factory=dict)
    """What ``TrainerBase.evaluation_models()`` offers: reward and value models trained beside
    the policy, by name."""

    @property
    def episode_count(self) -> int:
        return len(self.episode_starts) - 1

    def episode_totals(self, values: torch.Tensor) -> torch.Tensor:
        """``[E]``: the sum of a per-row ``values`` ``[N]`` over each episode's rows."""
        import torch

        lengths = self.episode_starts.diff()
        episodes = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        totals = torch.zeros(len(lengths), dtype=torch.float64)
        return totals.index_add_(0, episodes, values.detach().cpu().double())


class EstimatorBase(Estimator):
    """An estimator the driver and the evaluation stage can run. Subclass it and register it
    as an estimator; ``[[evaluation]] kind`` selects it by ``name``."""

    Config: ClassVar[type[ComponentConfig]] = EstimatorConfig

    @abstractmethod
    def estimate(self, episodes: EvaluationEpisodes) -> dict[str, float]:
        """Named estimates for the evaluated policy (or the logged one) on ``episodes``; an
        estimate it cannot make is left out, not reported as a number it does not mean."""
