"""The ``world_model`` options, for ``[trainer]`` and ``[analysis]`` alike (no torch here:
``horizon plugins`` lists them).

The model's options say what is fitted; the analysis options say how the checks judge it: how
many folds of episodes the held-out losses come from, how many bootstrap resamples of episodes
make each interval, and how large an effect must be before a verdict calls it one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from horizon_engine import LearningRate, TrainerConfig


class WorldModelConfig(TrainerConfig):
    """A probabilistic model of the environment learned from the logged transitions, and the
    checks of the problem's formulation made with it."""

    minibatch_size: int = Field(default=256, ge=1)
    """Rows (episodes, for the recurrent model) per update."""
    epochs: int = Field(default=40, ge=1)
    """Passes over the rows a model is fitted on."""
    min_updates: int = Field(default=1000, ge=1)
    """[analysis]: more passes than epochs when these make fewer updates: a few thousand
    rows need them to learn rare events such as an episode's end (Horizon's 3,470 CartPole
    rows: 40 passes, 360 updates, learned nothing of when the pole falls; 100 passes did)."""
    num_gaussians: int = Field(default=5, ge=1)
    """Gaussians of each next-state feature's mixture density."""
    layers: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    """Widths of the hidden layers (the recurrent model: its input layer, then one GRU layer
    as wide as the last)."""
    model: Literal["mlp", "gru"] = "mlp"
    """"mlp": each transition from its own (state, action); "gru": a recurrent model over the
    episode, each step also seeing the steps before it (Horizon's MDN-RNN)."""
    learning_rate: LearningRate = 3e-3
    """Adam's learning rate."""
    folds: int = Field(default=3, ge=2)
    """[analysis]: episodes are split into this many folds; each fold's held-out losses come
    from models fitted on the other folds, so every row's loss is a held-out one."""
    num_bootstrap: int = Field(default=400, ge=10, le=100_000)
    """[analysis]: resamples of episodes behind every interval; at most 100,000, as the
    estimators' (an interval has settled long before; time and memory grow with it)."""
    confidence: float = Field(default=0.95, gt=0.0, lt=1.0)
    """[analysis]: coverage of every interval."""
    min_information: float = Field(default=0.02, gt=0.0)
    """[analysis]: the smallest held-out log-likelihood gain, in nats per transition, that a
    verdict counts as an effect: a check says yes when its interval lies above it, no when it
    lies below it, and that the data cannot tell otherwise."""
    min_share: float = Field(default=0.05, gt=0.0, lt=1.0)
    """[analysis]: the same for the reward and the episode's end: the smallest share of the
    reward's variance, or of the information in whether an episode ends (the entropy of the
    share of rows that end one), that counts. A feature that explains less than a twentieth of
    either leaves the problem what it is without it."""
