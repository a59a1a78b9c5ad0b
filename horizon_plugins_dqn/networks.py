"""The torch modules of the ``dqn`` trainer: Q-network, behaviour model and the policy module.

The networks take the preprocessed state (the preprocessor's output); the policy module puts
the preprocessor in front, so what is exported takes raw features and their presence mask,
as logged, and normalization never has to be repeated by whoever serves the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from horizon_engine import masked_scores

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "selu": nn.SELU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "linear": nn.Identity,
}


def frozen_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` in eval mode without gradients: a snapshot that later updates of
    ``module`` leave as it is."""
    import copy

    return copy.deepcopy(module).eval().requires_grad_(False)


def mlp(inputs: int, layers: Sequence[int], activations: Sequence[str]) -> nn.Sequential:
    """Hidden layers ``Linear -> activation`` of the given widths (the head is added apart)."""
    modules: list[nn.Module] = []
    for width, activation in zip(layers, activations, strict=True):
        modules += [nn.Linear(inputs, width), _ACTIVATIONS[activation]()]
        inputs = width
    return nn.Sequential(*modules)


class QNetwork(nn.Module):
    """Preprocessed state ``[B, width]`` -> one Q-value per action ``[B, A]``.

    With ``dueling`` the last hidden layer feeds a value head and an advantage head, combined
    as ``V + A - mean(A)`` so that V and A are identifiable (Wang et al. 2016).
    """

    def __init__(
        self,
        state_width: int,
        actions: int,
        layers: Sequence[int],
        activations: Sequence[str],
        dueling: bool = False,
    ) -> None:
        super().__init__()
        self.body = mlp(state_width, layers, activations)
        self.dueling = dueling
        self.advantage = nn.Linear(layers[-1], actions)
        self.value = nn.Linear(layers[-1], 1) if dueling else None

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        hidden = self.body(state)
        advantage = self.advantage(hidden)
        if self.value is None:
            return advantage
        return self.value(hidden) + advantage - advantage.mean(dim=1, keepdim=True)


def bcq_allowed(logits: torch.Tensor, possible: torch.Tensor, threshold: float) -> torch.Tensor:
    """Discrete BCQ's filter: 1.0 where an action is possible and its behaviour probability is
    at least ``threshold`` times the largest one (Fujimoto et al. 2019), else 0.0.

    The probabilities are taken over the possible actions only, so the likeliest possible action
    always passes and a row with any possible action keeps at least one.
    """
    probabilities = torch.softmax(masked_scores(logits, possible), dim=1)
    ratio = probabilities / probabilities.max(dim=1, keepdim=True).values
    return ((ratio >= threshold) & (possible > 0)).to(logits.dtype)


class DqnPolicy(nn.Module):
    """The trained model: raw ``(values, presence)`` of the state features -> Q scores ``[B, A]``.

    With a behaviour model (discrete BCQ), actions it filters out score
    ``horizon_engine.policies.IMPOSSIBLE``, so that the greedy and softmax policies built on
    the scores leave them out as training did.
    """

    def __init__(
        self,
        preprocessor: nn.Module,
        q_network: QNetwork,
        behaviour: nn.Module | None = None,
        bcq_threshold: float = 0.0,
    ) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.q_network = q_network
        self.behaviour = behaviour
        self.bcq_threshold = bcq_threshold

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        state = self.preprocessor(values, presence)
        scores = self.q_network(state)
        if self.behaviour is None:
            return scores
        allowed = bcq_allowed(self.behaviour(state), torch.ones_like(scores), self.bcq_threshold)
        return masked_scores(scores, allowed)


class HiddenFeatures(nn.Module):
    """Raw ``(values, presence)`` of the state features -> the Q-network's last hidden layer
    ``[B, H]``: what the CPE estimators fit the evaluated policy's Q on (``q_features``)."""

    def __init__(self, preprocessor: nn.Module, body: nn.Module) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.body = body

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return self.body(self.preprocessor(values, presence))


def behaviour_model(
    state_width: int, actions: int, layers: Sequence[int], activations: Sequence[str]
) -> nn.Sequential:
    """Discrete BCQ's behaviour model: preprocessed state -> logits of the logging policy."""
    return nn.Sequential(mlp(state_width, layers, activations), nn.Linear(layers[-1], actions))


class ParametricQNetwork(nn.Module):
    """Preprocessed state ``[B, S]`` and candidate actions ``[B, K, W]`` -> Q ``[B, K]``.

    Without ``dueling``: one network on the concatenated state and action features. With it
    (the Horizon paper's adaptation): a shared body on the state alone (every hidden layer but
    the last) feeds a value head ``V(s)`` and, concatenated with the action's features, an
    advantage head ``A(s, a)``; ``Q = V + A``. The advantage is not centred on its mean over
    actions as the discrete head does: a row's candidate set varies (and may not be known), and
    centring would make an action's Q depend on which others were offered beside it.
    """

    def __init__(
        self,
        state_width: int,
        action_width: int,
        layers: Sequence[int],
        activations: Sequence[str],
        dueling: bool = False,
    ) -> None:
        super().__init__()
        self.dueling = dueling
        if not dueling:
            self.body = mlp(state_width + action_width, layers, activations)
            self.head = nn.Linear(layers[-1], 1)
            return
        self.body = mlp(state_width, layers[:-1], activations[:-1])
        shared = layers[-2] if len(layers) > 1 else state_width
        last = [layers[-1]], [activations[-1]]
        self.value = nn.Sequential(mlp(shared, *last), nn.Linear(layers[-1], 1))
        self.advantage = nn.Sequential(mlp(shared + action_width, *last), nn.Linear(layers[-1], 1))

    def forward(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        candidates = actions.shape[1]
        if not self.dueling:
            inputs = torch.cat([state.unsqueeze(1).expand(-1, candidates, -1), actions], dim=2)
            return self.head(self.body(inputs)).squeeze(2)
        hidden = self.body(state)
        paired = torch.cat([hidden.unsqueeze(1).expand(-1, candidates, -1), actions], dim=2)
        return self.value(hidden) + self.advantage(paired).squeeze(2)


class ParametricDqnPolicy(nn.Module):
    """The trained parametric model: raw state ``(values, presence)`` ``[B, F]`` and raw
    candidate actions ``(values, presence)`` ``[B, K, G]`` -> Q scores ``[B, K]``.

    Both preprocessors are inside, so a server passes features as logged.
    """

    def __init__(
        self,
        state_preprocessor: nn.Module,
        action_preprocessor: nn.Module,
        q_network: ParametricQNetwork,
    ) -> None:
        super().__init__()
        self.state_preprocessor = state_preprocessor
        self.action_preprocessor = action_preprocessor
        self.q_network = q_network

    def forward(
        self,
        values: torch.Tensor,
        presence: torch.Tensor,
        candidates: torch.Tensor,
        candidate_presence: torch.Tensor,
    ) -> torch.Tensor:
        state = self.state_preprocessor(values, presence)
        return self.q_network(
            state, preprocess_candidates(self.action_preprocessor, candidates, candidate_presence)
        )


def preprocess_candidates(
    preprocessor: nn.Module, candidates: torch.Tensor, presence: torch.Tensor
) -> torch.Tensor:
    """Raw candidate actions ``[B, K, G]`` -> preprocessed ``[B, K, W]``: the preprocessor
    takes rows, so the candidates are flattened into ``B * K`` rows and back."""
    count, width = candidates.shape[1], candidates.shape[2]
    flat = preprocessor(candidates.reshape(-1, width), presence.reshape(-1, width))
    return flat.reshape(-1, count, flat.shape[1])
