"""The world model's network and the losses of its three predictions.

From a (state, action) input the network predicts, for each next-state column, a mixture of
``num_gaussians`` Gaussians (its own weights, means and standard deviations: a per-dimension,
diagonal mixture density), the reward and the logit of the episode ending. Per dimension, so
that a transition's negative log-likelihood is a sum over next-state columns and each
feature's share of it can be read off: what lets the checks ask which features the action
moves. The MLP maps rows ``[..., inputs]``; the recurrent model maps episodes
``[episodes, steps, inputs]``, each step seeing the steps before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from horizon_engine import HorizonError

MIN_STD = 0.05
"""The narrowest Gaussian of a mixture, in normalized units (a twentieth of a feature's
spread): deterministic dynamics would otherwise drive the likelihood to infinity, and a
narrower floor let a few mispredicted rows of nearly deterministic logs (Horizon's CartPole,
where a floor of 0.01 made the action's effect 0.2 nats with an interval from -0.9 to 1.4)
swamp every mean (0.05: 1.1 nats, 0.86 to 1.28)."""
MAX_STD = 10.0
"""The widest, in normalized units."""

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Prediction:
    """The network's output for ``[..., W]`` next-state columns and ``K`` Gaussians."""

    means: torch.Tensor
    """``[..., W, K]``"""
    log_stds: torch.Tensor
    """``[..., W, K]``"""
    logits: torch.Tensor
    """``[..., W, K]``: the mixture weights before the softmax."""
    reward: torch.Tensor
    """``[...]``"""
    termination_logit: torch.Tensor
    """``[...]``"""


class WorldModelNetwork(nn.Module):
    """(state, action) -> ``Prediction``: an MLP, or a GRU over each episode's steps."""

    def __init__(
        self,
        state_width: int,
        action_width: int,
        layers: list[int],
        num_gaussians: int,
        recurrent: bool = False,
    ) -> None:
        super().__init__()
        self.state_width = state_width
        self.num_gaussians = num_gaussians
        widths = [state_width + action_width, *layers]
        body: list[nn.Module] = []
        hidden = layers if not recurrent else layers[:1]
        for width_in, width_out in zip(widths, hidden, strict=False):
            body += [nn.Linear(width_in, width_out), nn.ReLU()]
        self.body = nn.Sequential(*body)
        self.gru = nn.GRU(layers[0], layers[-1], batch_first=True) if recurrent else None
        out = layers[-1]
        self.mixture = nn.Linear(out, state_width * num_gaussians * 3)
        self.reward = nn.Linear(out, 1)
        self.termination = nn.Linear(out, 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> Prediction:
        hidden = self.body(torch.cat([state, action], dim=-1))
        if self.gru is not None:
            hidden, _ = self.gru(hidden)
        shape = (*hidden.shape[:-1], self.state_width, self.num_gaussians, 3)
        means, raw_stds, logits = self.mixture(hidden).reshape(shape).unbind(-1)
        log_stds = raw_stds.clamp(math.log(MIN_STD), math.log(MAX_STD))
        return Prediction(
            means,
            log_stds,
            logits,
            self.reward(hidden).squeeze(-1),
            self.termination(hidden).squeeze(-1),
        )


class NotAPolicy(nn.Module):
    """What ``WorldModelTrainer.policy`` returns: the world model's network (its parameters
    are counted as a policy's are), which refuses to be called as a policy: a model of the
    environment scores no action, so exporting it or evaluating it as a policy is a mistake
    to name, not a shape error to meet later."""

    def __init__(self, network: WorldModelNetwork) -> None:
        super().__init__()
        self.network = network

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise HorizonError(
            "[trainer] kind = 'world_model' learns a model of the environment, not a policy: "
            "it cannot be exported, evaluated or played; check the data with it "
            "([analysis], horizon check-mdp), and train a policy with another trainer"
        )


def mixture_nll(prediction: Prediction, target: torch.Tensor) -> torch.Tensor:
    """``[..., W]``: each column's negative log-likelihood under its mixture, in nats
    (log-sum-exp over the Gaussians, so that no density is formed outside the log)."""
    z = (target.unsqueeze(-1) - prediction.means) * torch.exp(-prediction.log_stds)
    log_density = -0.5 * z * z - prediction.log_stds - _LOG_SQRT_2PI
    log_weights = torch.log_softmax(prediction.logits, dim=-1)
    return -torch.logsumexp(log_weights + log_density, dim=-1)


def termination_nll(prediction: Prediction, terminal: torch.Tensor) -> torch.Tensor:
    """``[...]``: the binary cross-entropy of the episode ending (1) or going on (0), in nats."""
    return nn.functional.binary_cross_entropy_with_logits(
        prediction.termination_logit, terminal, reduction="none"
    )


def mean_losses(
    prediction: Prediction,
    next_state: torch.Tensor,
    next_mask: torch.Tensor,
    reward: torch.Tensor,
    terminal: torch.Tensor,
    weight: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The ``weight``-ed means over rows of the three losses a world model learns from: the
    next state's negative log-likelihood (summed over the columns ``next_mask`` keeps), the
    episode's end's, and the reward's squared error (in whatever units ``reward`` is given)."""
    total = weight.sum().clamp(min=1.0)
    next_nll = (mixture_nll(prediction, next_state) * next_mask).sum(-1)
    return {
        "next_state_nll": (next_nll * weight).sum() / total,
        "termination_nll": (termination_nll(prediction, terminal) * weight).sum() / total,
        "reward_mse": (((prediction.reward - reward) ** 2) * weight).sum() / total,
    }
