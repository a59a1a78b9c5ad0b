"""The ``small_q`` trainer's torch modules, in a module of their own: the trainer imports it
when it sets up, so that loading the plugin (``horizon plugins``) does not import torch."""

from __future__ import annotations

import torch


def q_network(inputs: int, actions: int, hidden: int) -> torch.nn.Module:
    """Q-values ``[B, actions]`` of preprocessed states ``[B, inputs]``: one hidden ReLU layer
    of ``hidden`` units, or a linear map when ``hidden`` is 0."""
    if hidden == 0:
        return torch.nn.Linear(inputs, actions)
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, actions)
    )


class QPolicy(torch.nn.Module):
    """The policy as the trainer contract hands it out: raw ``(values, presence)`` of the
    state features -> Q-values ``[B, A]``, the normalization inside."""

    def __init__(self, preprocessor: torch.nn.Module, network: torch.nn.Module) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.network = network

    def forward(self, values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return self.network(self.preprocessor(values, presence))
