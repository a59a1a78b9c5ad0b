"""A trainer's optional capabilities, each a small protocol the core checks with ``isinstance``.

``TrainerBase`` is what every trainer must do; these are what some trainers can also do. A
trainer has a capability by implementing its method (subclassing the protocol too says so to a
reader and a type checker), and the core asks ``isinstance(trainer, Capability)`` (or
``issubclass`` of the class, before one is built) where it would use it:

- ``AnalyzesData``: ``analyze``, the ``analysis`` stage's work (``[analysis] kind`` must name a
  trainer with it, checked when the pipeline is validated);
- ``ExploresOnline``: ``exploration_policy``, continuous actions explored by the trainer's own
  noise (``horizon gym train`` on a Box action space needs it);
- ``OffersEvaluationModels``: ``evaluation_models``, models trained beside the policy for the
  counterfactual estimators, as an ``EvaluationModels`` value;
- ``Discounts``: ``discount``, the trainer's gamma, which declares its policy's scores
  Q-values of the reward under it;
- ``InvertiblePreprocessing``: a preprocessor with ``inverse`` (action features normalized as
  ``continuous_action``), which an actor needs to act in the user's units.

Protocols rather than methods with defaults on ``TrainerBase``: a capability is there or not,
never a default that raises or returns an empty dict, and what it offers is a typed value both
sides read by attribute rather than by a name they agree on by convention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.run_context import RunContext, StageReport
    from horizon_engine.training import TrainingProblem

StateFeatures = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""Raw state ``(values, presence)`` ``[N, F]`` each -> features ``[N, H]``."""


@dataclass(frozen=True)
class EvaluationModels:
    """What a trainer offers the counterfactual estimators besides its policy.

    ``q_features``: its Q-network's last hidden layer on raw states; the sequential estimators
    fit the evaluated policy's Q linearly on it (``q_model = "network_fqe"``) rather than on
    the state features. None: not offered, and they fall back as their ``q_model`` says."""

    q_features: StateFeatures | None = None


NO_EVALUATION_MODELS = EvaluationModels()
"""What estimators get from a trainer without ``OffersEvaluationModels``."""


@runtime_checkable
class AnalyzesData(Protocol):
    """A trainer that models the data rather than (or besides) a policy, such as
    ``world_model``'s MDP check: it can be an ``[analysis]`` kind."""

    def analyze(
        self, run: RunContext, problem: TrainingProblem, splits: list[TimelineTensors]
    ) -> StageReport:
        """The ``analysis`` stage's work: called once set up, with the timeline's train and
        eval splits (with the state preprocessor's output); writes its files under
        ``analysis/`` and returns the stage's report."""
        ...


@runtime_checkable
class ExploresOnline(Protocol):
    """A trainer that explores continuous actions online with its own noise."""

    def exploration_policy(self) -> torch.nn.Module:
        """A module raw ``(values, presence)`` -> action ``[B, D]`` in the user's units, drawn
        with the trainer's exploration noise (SAC samples its Gaussian; TD3 and DDPG add
        Gaussian or Ornstein-Uhlenbeck noise), inside the action bounds; when the module has a
        ``reset()`` method the gym runner calls it at every episode start.

        ``horizon gym train`` asks for a fresh module every ``[gym] policy_refresh_ts`` steps,
        as it copies ``policy()`` for discrete actions, and acts with it under
        ``torch.no_grad()``; noise that carries state from step to step (Ornstein-Uhlenbeck)
        should keep it where successive modules share it (the trainer), or a refresh restarts
        it."""
        ...


@runtime_checkable
class OffersEvaluationModels(Protocol):
    """A trainer that trains models beside its policy for the estimators."""

    def evaluation_models(self) -> EvaluationModels:
        """The models, frozen copies the estimators may call as they are."""
        ...


@runtime_checkable
class Discounts(Protocol):
    """A trainer with a notion of discount; its policy's scores are Q-values of the reward
    under it (a Q-learner's are), so the sequential estimators may take them as the evaluated
    policy's Q."""

    def discount(self) -> float:
        """What a reward one step later is worth now (gamma); sequential estimators discount
        with it unless told otherwise."""
        ...


@runtime_checkable
class InvertiblePreprocessing(Protocol):
    """A preprocessor that maps its output back to raw values: how an actor's normalized
    action goes back to the user's units."""

    def inverse(self, out: torch.Tensor) -> torch.Tensor:
        """The raw values ``[B, F]`` that the preprocessor maps to ``out``."""
        ...
