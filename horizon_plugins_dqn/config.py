"""The ``[trainer]`` options of the Q-learning trainers (no torch: ``horizon plugins`` lists them).

``dqn`` and ``parametric_dqn`` share the Q-learning options (``QLearningConfig``); ``dqn`` adds
what needs named actions (``reward_boost``) or a behaviour model over them (``bcq_threshold``).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from horizon_engine.training import TrainerConfig

Activation = Literal["relu", "leaky_relu", "elu", "selu", "gelu", "tanh", "sigmoid", "linear"]
"""The hidden-layer activations a network may use (``linear`` is none)."""


class QLearningConfig(TrainerConfig):
    """Options every Q-learning trainer of this plugin accepts."""

    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """Discount factor of future rewards."""
    double_q: bool = True
    """Double Q-learning: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Separate value and advantage heads: Q = V(s) + A(s, a) - mean of A(s, .) (dqn), or
    V(s) + A(s, a) (parametric_dqn, whose candidate sets differ from row to row)."""
    n_step: int = Field(default=1, ge=1)
    """Steps of the multi-step return; > 1 needs a timeline built with this same n_step."""
    use_time_diff: bool = False
    """Discount a step by gamma ** time_diff (the logged gap between decisions) instead of gamma."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss between Q(s, a) and its target."""
    target_update_rate: float = Field(default=0.01, gt=0.0, le=1.0)
    """Soft target update after every step: target <- rate * online + (1 - rate) * target."""
    maxq_learning: bool = True
    """Q-learning (max over the possible next actions); false is SARSA on the logged next action."""
    layers: list[int] = Field(default_factory=lambda: [128, 64], min_length=1)
    """Widths of the hidden layers."""
    activations: list[Activation] = Field(default_factory=lambda: ["relu", "relu"], min_length=1)
    """One activation per hidden layer."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer of the Q-network (and of dqn's behaviour model, with bcq_threshold > 0)."""
    learning_rate: float = Field(default=1e-3, gt=0.0)
    """Initial learning rate."""
    lr_decay: float = Field(default=1.0, gt=0.0, le=1.0)
    """Multiplies the learning rate every lr_decay_steps updates (1 = constant)."""
    lr_decay_steps: int = Field(default=1000, ge=1)
    """Updates between two lr_decay steps (the trainer is not told where epochs end)."""
    l2: float = Field(default=0.0, ge=0.0)
    """L2 penalty (the optimizer's weight decay)."""
    cql_alpha: float = Field(default=0.0, ge=0.0)
    """Conservative Q-learning weight of logsumexp_a Q(s, a) - Q(s, logged a) (0 = off)."""

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(self.activations) != len(self.layers):
            raise ValueError(
                f"activations has {len(self.activations)} entries for {len(self.layers)} layers; "
                "give one activation per hidden layer"
            )
        if any(width < 1 for width in self.layers):
            raise ValueError(f"layers = {self.layers}: every width must be at least 1")
        if not self.maxq_learning and self.n_step > 1:
            raise ValueError(
                f"maxq_learning = false (SARSA) needs n_step = 1, not {self.n_step}: the "
                "timeline logs no action at the end of an n-step window"
            )
        return self


class DqnConfig(QLearningConfig):
    """Options of the ``dqn`` trainer (``[trainer]`` with ``kind = "dqn"``)."""

    reward_boost: dict[str, float] = Field(default_factory=dict)
    """Added to the reward of a row whose logged action is the key (Horizon's per-action boost)."""
    bcq_threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """Discrete BCQ: drop actions whose behaviour probability / the top one is below it (0 off)."""


class ParametricDqnConfig(QLearningConfig):
    """Options of the ``parametric_dqn`` trainer (``[trainer]`` with ``kind = "parametric_dqn"``).

    With ``dueling``, the state's value and the state-action advantage are separate heads on a
    shared state body, as in the Horizon paper's parametric adaptation (see its network).
    """
