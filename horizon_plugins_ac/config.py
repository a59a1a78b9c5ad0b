"""The ``[trainer]`` options of the actor-critic trainers (no torch: ``horizon plugins`` lists
them).

``sac``, ``td3`` and ``ddpg`` share the options of ``ActorCriticConfig``; each adds its own. The
defaults are the ones measured on Horizon's logged Pendulum rows (docs/measurements.md,
"Actor-critic trainers"; tests/test_ac_reference.py holds them to it): a user who names only
the trainer learns from logs, so the actor is kept near the logged actions (``bc_weight``)
unless told otherwise.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from horizon_engine import LearningRate, TrainerConfig


class ActorCriticConfig(TrainerConfig):
    """Options every actor-critic trainer of this plugin accepts."""

    DEFAULT_PASSES: ClassVar[int] = 100
    """100 passes rather than the core's 20 for ``epochs = "auto"``: an actor-critic needs
    thousands of updates, and more sank td3 below random play on a mediocre logger's rows
    (measured: docs/measurements.md#ac_default_passes)."""
    minibatch_size: int = Field(default=256, ge=1)
    """Rows per update (256, as the SAC and TD3 papers)."""
    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """Discount factor of future rewards."""
    n_step: int = Field(default=1, ge=0)
    """Steps of the multi-step return: 1 (the default) bootstraps from the next state, as the
    papers do (an n-step return of logged rewards follows the logging policy, not the actor);
    > 1 needs a timeline built with this same n_step; 0 takes the timeline's window."""
    layers: list[int] = Field(default_factory=lambda: [256, 256], min_length=1)
    """Widths of the hidden layers (relu) of the actor and of each critic."""
    actor_learning_rate: LearningRate = 3e-4
    """Adam's step size for the actor."""
    critic_learning_rate: LearningRate = 3e-4
    """Adam's step size for the critics."""
    target_update_rate: float = Field(default=0.005, gt=0.0, le=1.0)
    """Soft target update: target <- rate * trained + (1 - rate) * target (tau)."""
    LOGGED_BC_WEIGHT: ClassVar[float] = 0.2
    """``bc_weight = "auto"`` when the trainer learns from logs."""
    bc_weight: float | str = "auto"
    """Behaviour cloning weight, for learning from logs (TD3+BC, Fujimoto and Gu 2021): the
    actor minimizes ``-Q(s, pi(s)) / mean|Q| + bc_weight * mean((pi(s) - a_logged)^2)``, actions
    normalized to (-1, 1). The paper writes it ``-lambda Q + (pi(s) - a)^2`` with
    ``lambda = alpha / mean|Q|``: the same loss scaled by 1 / alpha, so ``bc_weight = 1 / alpha``
    (the paper's alpha = 2.5 is 0.4). 0 switches it off (the plain actor loss, unnormalized):
    what online training, where the agent tries its own actions, wants. "auto": 0 online
    (``horizon gym train``) and ``LOGGED_BC_WEIGHT`` from logs: 0.2 (alpha = 5) for td3 and
    ddpg, the weight td3 learned best with from Horizon's logged Pendulum rows; sac's is 0
    (measured: docs/measurements.md#bc_weight)."""
    cql_alpha: float = Field(default=0.0, ge=0.0)
    """Conservative critic (CQL(H), Kumar et al. 2020): adds ``cql_alpha * (logsumexp over
    sampled actions of Q(s, a) - Q(s, a_logged))`` to each critic's loss, the samples uniform
    and the actor's own, importance-weighted by their densities. 0 (off) by default: on
    Horizon's logged Pendulum rows it made td3 and sac worse, and an update costs about 8 times
    as much with 10 samples (measured: docs/measurements.md#ac_cql_alpha)."""
    cql_samples: int = Field(default=10, ge=1)
    """Actions of each kind (uniform, the actor's) sampled per state for ``cql_alpha``."""

    @field_validator("bc_weight", mode="before")
    @classmethod
    def _weight_or_auto(cls, weight: Any) -> Any:
        """A weight of 0 or more, or "auto" (checked before the type, as ``epochs``)."""
        number = isinstance(weight, int | float) and not isinstance(weight, bool)
        if weight != "auto" and not (number and weight >= 0):
            raise ValueError(f'bc_weight = {weight!r}: give a weight of 0 or more, or "auto"')
        return weight


class SacConfig(ActorCriticConfig):
    """Options of the ``sac`` trainer (``[trainer]`` with ``kind = "sac"``)."""

    LOGGED_BC_WEIGHT: ClassVar[float] = 0.0
    bc_weight: float | str = "auto"
    """Behaviour cloning weight (see td3's): the entropy-regularized actor loss
    ``(alpha log pi(a|s) - Q(s, a)) / mean|Q| + bc_weight * mean((a - a_logged)^2)`` with ``a``
    drawn from the actor. "auto": 0 (off), from logs too: on Horizon's logged Pendulum rows
    plain SAC did better than with cloning (measured: docs/measurements.md#sac_bc_weight)."""
    alpha: float = Field(default=1.0, gt=0.0)
    """The entropy temperature to start from (or to keep, with ``learn_alpha = false``)."""
    learn_alpha: bool = True
    """Automatic entropy tuning: learn the temperature so that the policy's entropy stays near
    ``target_entropy``."""
    target_entropy: float | str = "auto"
    """The entropy automatic tuning aims at; "auto": minus the number of action dimensions."""
    alpha_learning_rate: LearningRate = 3e-4
    """Adam's step size for the temperature."""

    @field_validator("target_entropy", mode="before")
    @classmethod
    def _entropy_or_auto(cls, entropy: Any) -> Any:
        """A number of nats, or "auto" (checked before the type, as ``epochs``)."""
        number = isinstance(entropy, int | float) and not isinstance(entropy, bool)
        if entropy != "auto" and not number:
            raise ValueError(f'target_entropy = {entropy!r}: give a number of nats or "auto"')
        return entropy


class DeterministicActorConfig(ActorCriticConfig):
    """Options of the deterministic actors (``td3``, ``ddpg``): how they explore online."""

    exploration_noise: float = Field(default=0.1, ge=0.0)
    """Standard deviation of the noise added to the actor's action when acting online, in the
    normalized action's units (the action range is (-1, 1), so 0.1 is 5% of it)."""
    noise: Literal["gaussian", "ou"] = "gaussian"
    """Online exploration noise: independent Gaussian draws, or an Ornstein-Uhlenbeck process
    (theta 0.15, sigma ``exploration_noise``, restarted at 0 every episode)."""


class Td3Config(DeterministicActorConfig):
    """Options of the ``td3`` trainer (``[trainer]`` with ``kind = "td3"``)."""

    target_noise: float = Field(default=0.2, ge=0.0)
    """Target policy smoothing: standard deviation of the noise on the target actor's next
    action (normalized units)."""
    target_noise_clip: float = Field(default=0.5, ge=0.0)
    """The smoothing noise is clipped to +- this."""
    policy_delay: int = Field(default=2, ge=1)
    """The actor and the target networks are updated once every ``policy_delay`` critic
    updates."""


class DdpgConfig(DeterministicActorConfig):
    """Options of the ``ddpg`` trainer (``[trainer]`` with ``kind = "ddpg"``)."""
