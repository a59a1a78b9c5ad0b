"""The torch modules of the actor-critic trainers: actors, critics, and the policy and
exploration modules handed out by ``policy()`` and ``exploration_policy()``.

Inside, actions are normalized to (-1, 1) by the problem's action preprocessor (the
``continuous_action`` type). The networks take the preprocessed state; the policy modules put
the state preprocessor in front and the action preprocessor's inverse behind, so what is
exported takes raw features, as logged, and returns actions in the user's units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
"""Bounds of the Gaussian actor's log standard deviation (before the tanh squash)."""

OU_THETA = 0.15
"""Ornstein-Uhlenbeck noise's pull back towards 0, per step."""

_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


def mlp(inputs: int, layers: Sequence[int], outputs: int) -> nn.Sequential:
    """``Linear -> ReLU`` hidden layers of the given widths, then a linear head."""
    modules: list[nn.Module] = []
    for width in layers:
        modules += [nn.Linear(inputs, width), nn.ReLU()]
        inputs = width
    modules.append(nn.Linear(inputs, outputs))
    return nn.Sequential(*modules)


class Critic(nn.Module):
    """Q of a preprocessed state ``[B, W]`` and a normalized action ``[B, D]`` -> ``[B]``."""

    def __init__(self, state_width: int, action_width: int, layers: Sequence[int]) -> None:
        super().__init__()
        self.network = mlp(state_width + action_width, layers, 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.network(torch.cat([state, action], dim=-1)).squeeze(-1)


class DeterministicActor(nn.Module):
    """Preprocessed state ``[B, W]`` -> normalized action ``tanh(.)`` ``[B, D]`` (DDPG, TD3)."""

    def __init__(self, state_width: int, action_width: int, layers: Sequence[int]) -> None:
        super().__init__()
        self.network = mlp(state_width, layers, action_width)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.network(state))


def squashed_log_density(
    pre_tanh: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """``[B]``: log-density of ``tanh(pre_tanh)`` when ``pre_tanh ~ N(mean, exp(log_std)^2)``,
    per dimension independently: the Gaussian's log-density minus ``log(1 - tanh(u)^2)``
    (the squash's Jacobian), written ``2 (log 2 - u - softplus(-2u))`` so that it stays finite
    where tanh saturates."""
    z = (pre_tanh - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z * z - log_std - _HALF_LOG_TWO_PI
    jacobian = 2.0 * (math.log(2.0) - pre_tanh - nn.functional.softplus(-2.0 * pre_tanh))
    return (gaussian - jacobian).sum(dim=-1)


class GaussianActor(nn.Module):
    """SAC's actor: preprocessed state -> a Gaussian over the pre-squash action (mean and log
    standard deviation per dimension), squashed by tanh into (-1, 1)."""

    def __init__(self, state_width: int, action_width: int, layers: Sequence[int]) -> None:
        super().__init__()
        self.network = mlp(state_width, layers, 2 * action_width)
        self.action_width = action_width

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, log_std)`` of the pre-squash Gaussian, each ``[B, D]``."""
        out = self.network(state)
        mean, log_std = out[:, : self.action_width], out[:, self.action_width :]
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized draw ``tanh(mean + std * eps)`` ``[B, D]`` and its log-density."""
        mean, log_std = self(state)
        pre_tanh = mean + torch.exp(log_std) * torch.randn_like(mean)
        return torch.tanh(pre_tanh), squashed_log_density(pre_tanh, mean, log_std)

    def mean_action(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The deterministic action ``tanh(mean)`` and its log-density under the policy."""
        mean, log_std = self(state)
        return torch.tanh(mean), squashed_log_density(mean, mean, log_std)


class ActionSampler(nn.Module):
    """An actor's ``sample`` as a module's ``forward``: what data-parallel training wraps, as
    ``DistributedDataParallel`` synchronises the gradients of ``forward`` alone."""

    def __init__(self, actor: GaussianActor) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor.sample(state)


class Temperature(nn.Module):
    """SAC's temperature, learned as ``log_alpha``: a module of its own so that data-parallel
    training averages its gradient over the processes as it does the networks'."""

    def __init__(self, alpha: float, learned: bool) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)), requires_grad=learned)

    def forward(self, entropy_gap: torch.Tensor) -> torch.Tensor:
        """The temperature's loss: ``-log_alpha * gap`` (``gap``: mean log-density plus the
        target entropy, without gradient)."""
        return -self.log_alpha * entropy_gap


def action_log_scale(action_preprocessor: nn.Module, action_width: int) -> torch.Tensor:
    """``sum_d log(d user_action_d / d normalized_action_d)``: what a density over normalized
    actions loses to become one over the user's units (the inverse is linear per dimension)."""
    with torch.no_grad():
        device = next(iter(action_preprocessor.buffers())).device
        half = torch.full((1, action_width), 0.5, device=device)
        slope = action_preprocessor.inverse(half) - action_preprocessor.inverse(-half)
        return torch.log(slope.abs().clamp(min=1e-12)).sum()


class DeterministicPolicy(nn.Module):
    """``policy()`` of ``td3`` and ``ddpg``: raw ``(values, presence)`` of the state features
    -> the actor's action ``[B, D]`` in the user's units (the action features' order)."""

    def __init__(
        self, preprocessor: nn.Module, actor: nn.Module, action_preprocessor: nn.Module
    ) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.actor = actor
        self.action_preprocessor = action_preprocessor

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return self.action_preprocessor.inverse(self.actor(self.preprocessor(values, presence)))


class SacPolicy(nn.Module):
    """``policy()`` of ``sac``: raw ``(values, presence)`` -> ``(action, log_density)``: the
    mean action ``tanh(mean)`` in the user's units ``[B, D]`` and its log-density ``[B]`` under
    the trained (stochastic) policy, as a density over the user's units."""

    def __init__(
        self,
        preprocessor: nn.Module,
        actor: GaussianActor,
        action_preprocessor: nn.Module,
        log_scale: torch.Tensor,
    ) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.actor = actor
        self.action_preprocessor = action_preprocessor
        self.register_buffer("log_scale", log_scale.detach().clone())

    def forward(
        self, values: torch.Tensor, presence: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        action, log_density = self.actor.mean_action(self.preprocessor(values, presence))
        return self.action_preprocessor.inverse(action), log_density - self.log_scale


class SacExploration(SacPolicy):
    """``exploration_policy()`` of ``sac``: a draw from the trained policy, in the user's
    units ``[B, D]`` (the action preprocessor's inverse keeps it within the logged bounds)."""

    def forward(  # type: ignore[override]
        self, values: torch.Tensor, presence: torch.Tensor
    ) -> torch.Tensor:
        action, _ = self.actor.sample(self.preprocessor(values, presence))
        return self.action_preprocessor.inverse(action)


class NoiseState:
    """The Ornstein-Uhlenbeck process's current value, held by the trainer and shared by every
    exploration module it hands out: the gym runner takes a fresh module every so many steps,
    and the process must run on across them within an episode."""

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


class NoisyPolicy(DeterministicPolicy):
    """``exploration_policy()`` of ``td3`` and ``ddpg``: the actor's action plus noise of
    standard deviation ``sigma`` (normalized units), clipped to (-1, 1) and so to the action
    bounds, in the user's units ``[B, D]``. With an Ornstein-Uhlenbeck ``process`` the noise is
    ``x <- x - OU_THETA x + sigma eps`` (per row and dimension), which ``reset()`` restarts at
    0 (the gym runner calls it at every episode start); without, independent draws."""

    def __init__(
        self,
        preprocessor: nn.Module,
        actor: nn.Module,
        action_preprocessor: nn.Module,
        sigma: float,
        process: NoiseState | None,
    ) -> None:
        super().__init__(preprocessor, actor, action_preprocessor)
        self.sigma = sigma
        self.process = process

    def reset(self) -> None:
        """Restart the Ornstein-Uhlenbeck process at 0 (nothing to do for Gaussian noise)."""
        if self.process is not None:
            self.process.value = None

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        action = self.actor(self.preprocessor(values, presence))
        draw = self.sigma * torch.randn_like(action)
        process = self.process
        if process is not None:
            if process.value is None or process.value.shape != action.shape:
                process.value = torch.zeros_like(action)
            process.value = process.value - OU_THETA * process.value + draw
            draw = process.value
        return self.action_preprocessor.inverse((action + draw).clamp(-1.0, 1.0))
