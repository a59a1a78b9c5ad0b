"""Models of (state, action) for continuous actions: the direct method's only ingredient there.

A continuous policy gives a density over actions, not a probability of the logged action, and a
deterministic one (DDPG, TD3, SAC's mean) gives neither, so no importance weight can be formed
and the weighted estimators do not apply. What remains is what a model of the (state, action)
space says the policy's own action is worth:

- a reward model ``r_hat(s, a)``, for ``dm``: the value per decision, ``r_hat(s, pi(s))``;
- the evaluated policy's ``Q_hat(s, a)`` by fitted-Q evaluation, for ``fqe``: the discounted
  return per episode from its first state, ``Q_hat(s_0, pi(s_0))``.

Both are ridge regressions, linear in ``phi(s, a)``: the state basis of the discrete models
(1 and the standardized state values and presence), the standardized action, its square and
its products with the state (so the best action can depend on the state, and the value has a
peak in the action). FQE bootstraps from ``Q_hat(s', pi(s'))``, the policy's action on the
next row of the episode, clipped to the returns the rewards allow (``models.return_bounds``),
by the same active-set search as the discrete bounded FQE; each episode's last row ends it.
Both are cross-fitted over two folds of episodes, like the discrete models.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from horizon_plugins_cpe.formulas import CpeOptions, ModelValues
from horizon_plugins_cpe.models import (
    FEATURE_RIDGE,
    RIDGE,
    bounded_fqe_metric,
    episode_folds,
    return_bounds,
)


@dataclass(frozen=True, eq=False)
class ContinuousInputs:
    """The eval split's rows in episode and step order, for a continuous policy."""

    episode_starts: np.ndarray
    """``[E + 1]``: episode ``e`` is rows ``episode_starts[e]:episode_starts[e + 1]``."""
    rewards: np.ndarray
    """``[N, M]``: column ``m`` is ``metric_names[m]``'s value per row."""
    metric_names: tuple[str, ...]
    features: np.ndarray
    """``[N, F]``: the state values and their presence."""
    action: np.ndarray
    """``[N, D]``: the logged action, in the user's units."""
    policy_action: np.ndarray
    """``[N, D]``: the evaluated policy's action on each row's state, in the same units."""


def standardized(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``values`` centred and scaled by ``reference``'s columns (a constant column: by 1)."""
    spread = reference.std(axis=0)
    spread[spread == 0] = 1.0
    return (values - reference.mean(axis=0)) / spread


def action_design(state: np.ndarray, action: np.ndarray) -> np.ndarray:
    """``[N, (1 + F) + 2 D + F D]``: ``phi(s, a)`` from the standardized state ``[N, F]`` and
    action ``[N, D]``: 1, the state, the action, its square, and their products."""
    products = (state[:, :, None] * action[:, None, :]).reshape(len(state), -1)
    return np.concatenate([np.ones((len(state), 1)), state, action, action**2, products], axis=1)


def continuous_model_values(
    inputs: ContinuousInputs, options: CpeOptions, sequential: bool
) -> ModelValues:
    """Cross-fitted values of the logged action (``logged``) and of the policy's action
    (``expected``) per row and metric: of the reward model, or with ``sequential`` of the
    policy's Q by bounded fitted-Q evaluation discounted by ``options.gamma``."""
    starts = np.asarray(inputs.episode_starts)
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    state = standardized(inputs.features, inputs.features)
    logged_actions = np.asarray(inputs.action, dtype=np.float64)
    phi = action_design(state, standardized(logged_actions, logged_actions))
    own = action_design(state, standardized(inputs.policy_action, logged_actions))
    last = np.zeros(len(rewards), dtype=bool)
    last[starts[1:] - 1] = True
    following = np.zeros_like(own)
    following[:-1] = own[1:]
    following[last] = 0.0  # an episode's last row bootstraps from nothing
    num_episodes = len(starts) - 1
    fold_of_row = np.repeat(episode_folds(num_episodes, options.seed), np.diff(starts))
    folds = ((0, 1), (1, 0)) if num_episodes > 1 else ((1, 1),)  # a lone episode is fold 1
    notes = []
    if num_episodes == 1:
        notes.append("one episode: the models are fitted on the rows they evaluate")
    logged = np.empty(rewards.shape)
    expected = np.empty(rewards.shape)
    low, high = return_bounds(rewards, options.gamma)
    for fit_fold, predict_fold in folds:
        rows = fold_of_row == fit_fold
        gram = phi[rows].T @ phi[rows]
        if sequential:
            regularized = gram + FEATURE_RIDGE * int(rows.sum()) * np.eye(len(gram))
            weights = np.empty((phi.shape[1], rewards.shape[1]))
            for metric in range(rewards.shape[1]):
                weights[:, metric], note = bounded_fqe_metric(
                    regularized,
                    phi[rows],
                    following[rows],
                    last[rows],
                    rewards[rows, metric],
                    options.gamma,
                    (float(low[metric]), float(high[metric])),
                )
                if note:
                    notes.append(note)
        else:
            regularized = gram + RIDGE * int(rows.sum()) * np.eye(len(gram))
            weights = np.linalg.solve(regularized, phi[rows].T @ rewards[rows])
        target = fold_of_row == predict_fold
        bounds = (low, high) if sequential else (-np.inf, np.inf)
        logged[target] = np.clip(phi[target] @ weights, *bounds)
        expected[target] = np.clip(own[target] @ weights, *bounds)
    return ModelValues(logged=logged, expected=expected, note="; ".join(notes) or None)
