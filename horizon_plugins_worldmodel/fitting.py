"""Fitting a world model on some rows and reading its per-row losses on others.

A fit is given the rows to learn from and the input columns to hide: hidden columns hold their
mean over those rows, in training and in prediction alike, which is the model without them.
The same columns replaced by their mean only when predicting, in a model that learned with
them, is feature importance's mask. The reward is learned in units of its spread over the
training rows (any reward scale trains alike) and its squared error is reported in the reward's
own units. The recurrent model learns from whole episodes, padded to the longest of a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from horizon_engine import ForeachAdam
from horizon_plugins_worldmodel.config import WorldModelConfig
from horizon_plugins_worldmodel.data import Transitions
from horizon_plugins_worldmodel.networks import (
    Prediction,
    WorldModelNetwork,
    mean_losses,
    mixture_nll,
    termination_nll,
)

EpochCallback = Callable[[int, dict[str, float]], None]
"""Called after each epoch of a fit with its mean training losses."""

PREDICT_CHUNK = 16_384
"""Rows (or episodes) predicted at once."""


@dataclass
class RowLosses:
    """Held-out losses of one model, per row."""

    next_state: torch.Tensor
    """``[N, W]``: each next-state column's negative log-likelihood (0 where there is none)."""
    reward: torch.Tensor
    """``[N]``: squared error of the predicted reward, in the reward's units squared."""
    termination: torch.Tensor
    """``[N]``: the binary cross-entropy of the episode ending, in nats."""

    def transition(self) -> torch.Tensor:
        """``[N]``: the negative log-likelihood of what came next: the episode's end or not,
        and the next state when there is one."""
        return self.next_state.sum(dim=1) + self.termination


@dataclass
class FittedModel:
    """A fitted network with what it needs to predict: the values of its hidden columns and
    the reward's units."""

    network: WorldModelNetwork
    hidden: torch.Tensor
    """``[W + A]`` bool: the input columns it was fitted without."""
    fill: torch.Tensor
    """``[W + A]``: the mean of each input column over its training rows."""
    reward_mean: float
    reward_std: float


class ModelFitter:
    """Fits world models of ``config``'s shape on rows of ``data``."""

    def __init__(self, config: WorldModelConfig, data: Transitions) -> None:
        self.config = config
        self.data = data
        self.inputs = data.inputs()

    def new_network(self, seed: int) -> WorldModelNetwork:
        """A fresh network, its weights drawn from ``seed`` alone."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            network = WorldModelNetwork(
                self.data.state.shape[1],
                self.data.action.shape[1],
                self.config.layers,
                self.config.num_gaussians,
                recurrent=self.config.model == "gru",
            )
        return network.to(self.inputs.device)

    def fit(
        self,
        rows: torch.Tensor,
        hidden: torch.Tensor,
        seed: int,
        on_epoch: EpochCallback | None = None,
    ) -> FittedModel:
        """A model fitted on ``rows`` (indices) with the ``hidden`` input columns at their
        mean; ``on_epoch`` hears each epoch's training losses."""
        data = self.data
        reward = data.reward[rows]
        std = float(reward.std()) if len(rows) > 1 else 0.0
        model = FittedModel(
            self.new_network(seed),
            hidden,
            self.inputs[rows].mean(dim=0),
            float(reward.mean()),
            std if std > 1e-8 else 1.0,
        )
        optimizer = ForeachAdam(model.network.parameters(), lr=self.config.learning_rate)
        generator = torch.Generator().manual_seed(seed)
        units, weights = self._units(rows)
        for epoch in range(1, self.epochs(len(units)) + 1):
            sums: dict[str, float] = {}
            batches = 0
            for index, weight in self._batches(units, weights, generator):
                parts = self._loss_parts(model, index, weight)
                loss = parts["next_state_nll"] + parts["termination_nll"] + parts["reward_mse"]
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                for name, value in parts.items():
                    sums[name] = sums.get(name, 0.0) + float(value.detach())
                batches += 1
            if on_epoch is not None:
                on_epoch(epoch, {name: total / batches for name, total in sums.items()})
        model.network.eval()
        return model

    def epochs(self, units: int) -> int:
        """Passes over ``units`` rows (or episodes): ``epochs``, or enough for
        ``min_updates``."""
        batches = math.ceil(units / self.config.minibatch_size)
        return max(self.config.epochs, math.ceil(self.config.min_updates / max(batches, 1)))

    def _batches(
        self, units: torch.Tensor, weights: torch.Tensor, generator: torch.Generator
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of shuffled minibatches of ``_units``: row indices ``[B]`` (MLP) or
        episodes' row indices ``[B, T]`` (GRU), with their 1/0 weights."""
        order = torch.randperm(len(units), generator=generator).to(units.device)
        size = self.config.minibatch_size
        for start in range(0, len(units), size):
            chosen = order[start : start + size]
            yield units[chosen], weights[chosen]

    def _units(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a batch is made of: the rows, or for the recurrent model each episode's rows in
        step order, padded with row 0 (weight 0)."""
        if self.config.model == "mlp":
            return rows, torch.ones(len(rows), device=rows.device)
        return episode_layout(rows, self.data.episode[rows], self.data.step[rows])

    def _predict(
        self, model: FittedModel, index: torch.Tensor, mask_columns: torch.Tensor
    ) -> Prediction:
        inputs = self.inputs[index]
        inputs = torch.where(mask_columns, model.fill, inputs)
        width = self.data.state.shape[1]
        return model.network(inputs[..., :width], inputs[..., width:])

    def _loss_parts(
        self, model: FittedModel, index: torch.Tensor, weight: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The batch's mean losses, the reward's in its training units."""
        data = self.data
        prediction = self._predict(model, index, model.hidden)
        reward = (data.reward[index] - model.reward_mean) / model.reward_std
        return mean_losses(
            prediction,
            data.next_state[index],
            data.next_mask[index],
            reward,
            data.terminal[index],
            weight,
        )

    def losses(
        self, model: FittedModel, rows: torch.Tensor, masked: torch.Tensor | None = None
    ) -> RowLosses:
        """Per-row losses of ``model`` on ``rows``, the ``masked`` input columns (besides the
        ones it was fitted without) replaced by their mean."""
        data = self.data
        columns = model.hidden if masked is None else model.hidden | masked
        width = data.state.shape[1]
        result = RowLosses(
            torch.zeros(len(rows), width, device=rows.device),
            torch.zeros(len(rows), device=rows.device),
            torch.zeros(len(rows), device=rows.device),
        )
        local = torch.full((len(data),), -1, dtype=torch.long, device=rows.device)
        local[rows] = torch.arange(len(rows), device=rows.device)
        units, weights = self._units(rows)
        with torch.no_grad():
            for start in range(0, len(units), PREDICT_CHUNK):
                index = units[start : start + PREDICT_CHUNK]
                real = weights[start : start + PREDICT_CHUNK] > 0
                prediction = self._predict(model, index, columns)
                self._store(result, model, prediction, index, local[index[real]], real)
        return result

    def _store(
        self,
        result: RowLosses,
        model: FittedModel,
        prediction: Prediction,
        index: torch.Tensor,
        positions: torch.Tensor,
        real: torch.Tensor,
    ) -> None:
        """Write the losses of the real (not padding) entries of a chunk at their rows."""
        data = self.data
        next_nll = mixture_nll(prediction, data.next_state[index]) * data.next_mask[index]
        reward = prediction.reward * model.reward_std + model.reward_mean
        squared = (reward - data.reward[index]) ** 2
        ended = termination_nll(prediction, data.terminal[index])
        result.next_state[positions] = next_nll[real]
        result.reward[positions] = squared[real]
        result.termination[positions] = ended[real]


def episode_layout(
    rows: torch.Tensor, episode: torch.Tensor, step: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (with their ``episode`` and ``step``) as ``[E, T]`` row indices, each episode's
    rows in step order, padded with ``rows[0]``, and the ``[E, T]`` 1/0 mask of real rows."""
    by_step = torch.argsort(step, stable=True)
    order = by_step[torch.argsort(episode[by_step], stable=True)]
    _, lengths = torch.unique_consecutive(episode[order], return_counts=True)
    starts = torch.cumsum(lengths, 0) - lengths
    longest = int(lengths.max())
    offsets = torch.arange(longest, device=rows.device)
    real = offsets.unsqueeze(0) < lengths.unsqueeze(1)
    position = (starts.unsqueeze(1) + offsets.unsqueeze(0)).clamp(max=len(order) - 1)
    layout = torch.where(real, rows[order[position]], rows[order[0]])
    return layout, real.float()
