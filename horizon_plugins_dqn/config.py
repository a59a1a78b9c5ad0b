"""The ``[trainer]`` options of the Q-learning trainers (no torch: ``horizon plugins`` lists them).

``dqn`` and ``parametric_dqn`` share the Q-learning options (``QLearningConfig``); ``dqn`` adds
what needs named actions (``reward_boost``) or a behaviour model over them (``bcq_threshold``).
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from horizon_engine import LearningRate, TrainerConfig

Activation = Literal["relu", "leaky_relu", "elu", "selu", "gelu", "tanh", "sigmoid", "linear"]
"""The hidden-layer activations a network may use (``linear`` is none)."""


class QLearningConfig(TrainerConfig):
    """Options every Q-learning trainer of this plugin accepts.

    The defaults are the ones that learned best offline, from logged data alone, in
    benchmarks/defaults_sweep.py (README, "Defaults"; docs/measurements.md, "Q-learning"):
    a user who names only ``kind`` gets multi-step, conservative Q-learning in small batches.
    """

    minibatch_size: int = Field(default=256, ge=1)
    """Rows per update. 256 rather than the core's 1024: four times the updates per epoch, which
    the 20 default epochs need on datasets of a few thousand to tens of thousands of rows
    (measured: docs/measurements.md#dqn_minibatch_size)."""

    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """Discount factor of future rewards."""
    double_q: bool = True
    """Double Q-learning: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Separate value and advantage heads: Q = V(s) + A(s, a) - mean of A(s, .) (dqn), or
    V(s) + A(s, a) (parametric_dqn, whose candidate sets differ from row to row)."""
    n_step: int = Field(default=0, ge=0)
    """Steps of the multi-step return; > 1 needs a timeline built with this same n_step. 0 (the
    default) takes the timeline's window: 3 steps from the default [timeline] over logged
    decisions, one step from Horizon's timeline rows (which hold no windows), so a user who
    names only the trainer gets multi-step returns wherever the data allows them."""
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
    """One activation per hidden layer; without it, relu for each of the given layers."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer of the Q-network (and of dqn's behaviour model, with bcq_threshold > 0)."""
    learning_rate: LearningRate = 1e-3
    """Initial learning rate."""
    lr_decay: float = Field(default=1.0, gt=0.0, le=1.0)
    """Multiplies the learning rate every lr_decay_steps updates (1 = constant)."""
    lr_decay_steps: int = Field(default=1000, ge=1)
    """Updates between two lr_decay steps (the trainer is not told where epochs end)."""
    l2: float = Field(default=0.0, ge=0.0)
    """L2 penalty (the optimizer's weight decay)."""
    cql_alpha: float = Field(default=1.5, ge=0.0)
    """Conservative Q-learning (Kumar et al. 2020): the weight of
    ``logsumexp_a Q(s, a) - Q(s, logged a)`` where the logs cover the actions least (0 = off).
    Logs of a nearly greedy policy never show what the actions it rarely took would do, and
    Q-learning trusts its guesses for them; logs that show every action need no such guard,
    and it holds back a policy retrained on its own logs. So the weight that applies falls as
    the logged propensities show more even coverage (``cql_covered``); 1.5 gives
    epsilon-greedy logs with epsilon 0.1 the weight 1.0 (measured:
    docs/measurements.md#dqn_cql_alpha). Online, where the agent tries its own actions, 0
    learns faster."""
    cql_weighting: Literal["coverage", "constant"] = "coverage"
    """"coverage": the weight falls with the logs' coverage (``cql_covered``); "constant":
    ``cql_alpha`` applies whatever the logs cover (plain CQL)."""
    cql_covered: float = Field(default=0.3, gt=0.0, le=1.0)
    """The logged coverage from which no conservatism applies: the weight is
    ``cql_alpha * max(0, 1 - coverage / cql_covered)``, the coverage each batch's propensities
    give (``targets.logged_coverage``: 1 for uniformly random logging, 0.1 for epsilon-greedy
    logging with epsilon 0.1)."""

    @model_validator(mode="before")
    @classmethod
    def _relu_for_each_layer(cls, data: Any) -> Any:
        """``layers = [16]`` alone means one relu layer, not a mismatch with the default's two."""
        if isinstance(data, dict) and "activations" not in data and "layers" in data:
            layers = data["layers"]
            if isinstance(layers, list):
                return {**data, "activations": ["relu"] * len(layers)}
        return data

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
