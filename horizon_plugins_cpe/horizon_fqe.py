"""Finite-horizon, undiscounted ("time-aware") fitted-Q evaluation, refit per resample.

At ``gamma = 1`` the value a user counts is the return per episode, and a single stationary
``Q`` cannot hold it (an undiscounted sum has no fixed point short of a terminal state: the
discounted models saturate near ``1 / (1 - gamma)`` instead). The evaluated policy's value
therefore depends on the steps to go: ``Q_h(s, a)`` for ``h = 1 .. H``, ``H`` the longest
logged episode's row count (``CpeInputs.return_horizon``: the train split's episodes count,
as the eval split's few may all end sooner; nothing past what was logged can be known), by
backward recursion

    Q_1(s, a) = r,   Q_h(s, a) = r + V_{h-1}(s'),   V_h(s) = sum_a pi(a|s) Q_h(s, a)

with ``V`` 0 after an episode's last row (terminal, as ``models`` treats it). A row at step
``t`` of its episode is valued with ``h = H - t``: its ``logged`` is ``Q_{H-t}(s_t, a_t)`` and
its ``expected`` ``V_{H-t}(s_t)``, so ``fqe`` (``V_H(s_0)``), ``sequential_dr``,
``weighted_dr`` and ``magic`` become undiscounted finite-horizon estimators without changing
their formulas.

Each ``Q_h`` is the ridge regression of its targets on the same feature map as ``models``
(``state_basis``, or the first ``NETWORK_COMPONENTS`` principal components of a network's
hidden layer), cross-fitted over the same two episode folds. The design does not change with
``h``, only the targets, so each fold's Gram matrix is inverted once and every step is a
matrix product. Every ``Q_h`` is bounded to the returns ``h`` rewards allow per metric
(``horizon_bounds``), both where it bootstraps the next step's target and where it is read:
off-policy linear FQE need not contract, and unbounded its values grow with ``h``.

The direct method's interval (``fqe``): ``StartValueRefit`` refits the whole recursion inside
each bootstrap resample of episodes (count-weighted Grams and targets, the resamples batched as
matrix columns), so that the interval includes the model's own estimation error; where that
work passes ``REFIT_WORK`` it refits fewer resamples, or, below ``MIN_REFIT_RESAMPLES``, holds
the model fixed, and the estimate's note says which.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from horizon_plugins_cpe.formulas import CpeInputs, CpeOptions, ModelValues, check_inputs
from horizon_plugins_cpe.models import (
    FEATURE_RIDGE,
    NETWORK_COMPONENTS,
    RIDGE,
    design,
    episode_folds,
    principal_features,
    state_basis,
)

REFIT_WORK = 2e9
"""The most multiply-adds the refit of ``fqe``'s interval may take (``H x N x (2 A + 1) x d x
M`` per resample: every step's values of every action and its moments, over every row; 2e9
take about half a second on one core). Past it, the first ``REFIT_WORK / cost`` resamples are
refit and the rest dropped."""

MIN_REFIT_RESAMPLES = 50
"""Fewer refit resamples than this make too rough a percentile interval: the model is held
fixed instead (``formulas.FIXED_MODEL``), with a note saying why."""

BATCH_ENTRIES = 1 << 22
"""The most values (rows x actions x resamples x metrics) one step of the refit holds at once
(32 MB of float64); more resamples are refit in turns."""


@cache
def _numpy_blas():
    """threadpoolctl's controller of the BLAS libraries loaded with numpy (found once: 2 ms)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's BLAS on one thread inside. Each step of the recursion is a product of a thin
    matrix (``d`` columns, tens) with a few hundred columns of targets, where BLAS threads
    only add synchronization, and on a busy machine ruinously: on 2 cores under load, one
    ``[9, 1500] x [1500, 128]`` product took 48 ms on OpenBLAS's 2 threads and 0.26 ms on one,
    and the refit of the CartPole example's interval 15.8 s against 0.66 s."""
    with _numpy_blas().limit(limits=1, user_api="blas"):
        yield


def horizon_bounds(rewards: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[len(steps), M]`` each: the least and the most a return of at most ``h`` rewards can
    be, per metric, for each ``h`` of ``steps``: an episode may end after one reward, so
    ``[min(r_min, h r_min), max(r_max, h r_max)]`` (CartPole's reward 1: ``[1, h]``)."""
    smallest, largest = rewards.min(axis=0), rewards.max(axis=0)
    h = np.asarray(steps, dtype=np.float64)[:, None]
    return np.minimum(smallest, h * smallest), np.maximum(largest, h * largest)


@dataclass(frozen=True, eq=False)
class _Fold:
    """One fold's rows in episode order, and what every step of the recursion reads."""

    basis: np.ndarray
    """``[n, d]``."""
    rewards: np.ndarray
    """``[n, M]``."""
    probabilities: np.ndarray
    """``[n, A]``: the evaluated policy's."""
    design: np.ndarray
    """``[n, D]``: ``phi(s, a)`` of each row's logged action (``models.design``)."""
    last: np.ndarray
    """``[n]`` bool: an episode's last row (terminal: nothing follows it)."""
    by_action: list[np.ndarray]
    """Per action, the indices of its rows."""
    episode: np.ndarray
    """``[n]``: each row's episode (its index among all the eval split's)."""
    episodes: np.ndarray
    """The fold's episodes (indices into the eval split's)."""
    rows: np.ndarray
    """The fold's rows (indices into the eval split's)."""


class FiniteHorizonFqe:
    """The cross-fitted finite-horizon FQE of ``inputs`` (see the module's docstring)."""

    def __init__(
        self, inputs: CpeInputs, options: CpeOptions, features: np.ndarray | None = None
    ) -> None:
        check_inputs(inputs)
        self.inputs = inputs
        self.ridge = RIDGE if features is None else FEATURE_RIDGE
        if features is not None:
            features = principal_features(features, NETWORK_COMPONENTS)
        self.basis = state_basis(inputs, features)
        self.rewards = np.asarray(inputs.rewards, dtype=np.float64)
        self.probabilities = np.asarray(inputs.target_probabilities, dtype=np.float64)
        self.num_actions = self.probabilities.shape[1]
        starts = np.asarray(inputs.episode_starts)
        self.starts = starts
        lengths = np.diff(starts)
        self.horizon = inputs.return_horizon
        self.episode = np.repeat(np.arange(inputs.num_episodes), lengths)
        self.step = np.arange(inputs.num_rows) - np.repeat(starts[:-1], lengths)
        self.low, self.high = horizon_bounds(self.rewards, np.arange(self.horizon + 1))
        self.folds = episode_folds(inputs.num_episodes, options.seed)
        single = inputs.num_episodes == 1
        # (fit fold, predicted fold): a lone episode is fold 1, fitted on itself
        self.pairs = ((1, 1),) if single else ((0, 1), (1, 0))

    def fold(self, which: int) -> _Fold:
        """The rows of the episodes in fold ``which``."""
        return self._folds[which]

    @cached_property
    def _folds(self) -> dict[int, _Fold]:
        found = {}
        last = np.zeros(self.inputs.num_rows, dtype=bool)
        last[self.starts[1:] - 1] = True
        for which in sorted({fold for pair in self.pairs for fold in pair}):
            rows = np.flatnonzero(self.folds[self.episode] == which)
            action = self.inputs.action[rows]
            found[which] = _Fold(
                basis=self.basis[rows],
                rewards=self.rewards[rows],
                probabilities=self.probabilities[rows],
                design=design(self.basis[rows], action, self.num_actions),
                last=last[rows],
                by_action=[np.flatnonzero(action == a) for a in range(self.num_actions)],
                episode=self.episode[rows],
                episodes=np.flatnonzero(self.folds == which),
                rows=rows,
            )
        return found

    def _inverse_grams(self, fold: _Fold, row_counts: np.ndarray) -> np.ndarray:
        """``[B, D, D]``: ``(Phi^T C_b Phi + lambda_b I)^-1`` per resample, ``C_b`` the rows'
        counts ``row_counts [n, B]`` and ``lambda_b`` the ridge times the rows drawn. From the
        map's block structure (as ``models._gram``): action ``a``'s rows touch only the shared
        block and block ``a``."""
        d = fold.basis.shape[1]
        a_count = self.num_actions
        b = row_counts.shape[1]
        gram = np.zeros((b, a_count + 1, d, a_count + 1, d))
        for a, rows in enumerate(fold.by_action):
            x = fold.basis[rows]
            counted = row_counts[rows]
            block = np.stack([(x * counted[:, j, None]).T @ x for j in range(b)])
            gram[:, 1 + a, :, 1 + a] = block
            gram[:, 0, :, 1 + a] = block
            gram[:, 1 + a, :, 0] = block
            gram[:, 0, :, 0] += block
        size = (a_count + 1) * d
        gram = gram.reshape(b, size, size)
        drawn = row_counts.sum(axis=0)
        diagonal = np.arange(size)
        gram[:, diagonal, diagonal] += np.where(drawn > 0, self.ridge * drawn, 1.0)[:, None]
        return np.linalg.inv(gram)

    def action_values(self, basis: np.ndarray, weights: np.ndarray, h: int) -> np.ndarray:
        """``[n, A, B, M]``: ``Q_h`` of every action for ``weights [B, D, M]``, bounded."""
        b, _, m = weights.shape
        d = basis.shape[1]
        blocks = weights.reshape(b, self.num_actions + 1, d, m)
        combined = blocks[:, :1] + blocks[:, 1:]  # [B, A, d, M]
        matrix = combined.transpose(2, 1, 0, 3).reshape(d, -1)  # [d, A B M]
        values = (basis @ matrix).reshape(len(basis), self.num_actions, b, m)
        return np.clip(values, self.low[h], self.high[h], out=values)

    @staticmethod
    def state_values(probabilities: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``[n, B, M]``: ``sum_a pi(a|s) Q(s, a)`` of ``values [n, A, B, M]``."""
        total = probabilities[:, 0, None, None] * values[:, 0]
        for a in range(1, values.shape[1]):
            total += probabilities[:, a, None, None] * values[:, a]
        return total

    def recursion(
        self, fold: _Fold, row_counts: np.ndarray, keep: bool
    ) -> list[np.ndarray] | np.ndarray:
        """``W_h [B, D, M]`` of ``Q_h`` fitted on ``fold``'s rows counted ``row_counts [n,
        B]``: every ``h = 1 .. H`` in a list when ``keep``, else ``W_H`` alone."""
        inverse = self._inverse_grams(fold, row_counts)  # [B, D, D]
        n, m = fold.rewards.shape
        b = row_counts.shape[1]
        a_count, d = self.num_actions, fold.basis.shape[1]
        counted_rewards = (fold.rewards[:, None, :] * row_counts[:, :, None]).reshape(n, b * m)
        reward_moment = fold.design.T @ counted_rewards  # [D, B M]
        # Per row, its count in its logged action's column (0 on an episode's last row, which
        # nothing follows): what the value of the row after it is weighted with in each
        # action's block of the moments; the shared block is their sum.
        taken = np.zeros((n, a_count))
        taken[np.arange(n), self.inputs.action[fold.rows]] = 1.0
        next_weights = (taken[:, :, None] * np.where(fold.last, 0.0, row_counts.T).T[:, None])[
            :-1, :, :, None
        ]  # [n - 1, A, B, 1]
        current = fold.basis[:-1].T  # [d, n - 1]
        kept = []
        weights = None
        for h in range(1, self.horizon + 1):
            moment = reward_moment
            if weights is not None:
                values = self.action_values(fold.basis[1:], weights, h - 1)  # [n - 1, A, B, M]
                following = self.state_values(fold.probabilities[1:], values)  # [n - 1, B, M]
                blocks = current @ (next_weights * following[:, None]).reshape(n - 1, -1)
                blocks = blocks.reshape(d, a_count, b * m).transpose(1, 0, 2)  # [A, d, B M]
                moment = moment + np.concatenate([blocks.sum(axis=0)[None], blocks]).reshape(
                    -1, b * m
                )
            weights = inverse @ moment.reshape(-1, b, m).transpose(1, 0, 2)  # [B, D, M]
            if keep:
                kept.append(weights)
        return kept if keep else weights

    def model_values(self) -> ModelValues:
        """Each row's ``Q_{H-t}(s_t, a_t)`` and ``V_{H-t}(s_t)``, by the other fold's model."""
        with one_blas_thread():
            return self._model_values()

    def _model_values(self) -> ModelValues:
        m = self.rewards.shape[1]
        logged = np.empty((self.inputs.num_rows, m))
        expected = np.empty((self.inputs.num_rows, m))
        notes = []
        if self.inputs.num_episodes == 1:
            notes.append("one episode: the models are fitted on the rows they evaluate")
        for fit_fold, predict_fold in self.pairs:
            fold = self.fold(fit_fold)
            weights = self.recursion(fold, np.ones((len(fold.basis), 1)), keep=True)
            rows = np.flatnonzero(self.folds[self.episode] == predict_fold)
            horizon = self.horizon - self.step[rows]
            for h in np.unique(horizon):
                at = rows[horizon == h]
                values = self.action_values(self.basis[at], weights[h - 1], h)[:, :, 0]  # [n, A, M]
                logged[at] = values[np.arange(len(at)), self.inputs.action[at]]
                expected[at] = self.state_values(self.probabilities[at], values[:, :, None])[:, 0]
        notes.append(
            f"finite-horizon fitted-Q evaluation, undiscounted over H = {self.horizon} steps "
            "(the longest logged episode): a row at step t is valued over its H - t steps to go"
        )
        return ModelValues(logged, expected, "; ".join(notes), start_refit=StartValueRefit(self))


@dataclass(frozen=True, eq=False)
class StartValueRefit:
    """``fqe``'s ``V_H(s_0)`` with the finite-horizon model refit inside bootstrap resamples.

    A resample that draws episode ``e`` ``c_e`` times refits each fold's recursion on its
    resampled episodes (each row counted ``c_e``: a count-weighted Gram, inverted once per
    resample, and count-weighted targets ``[n, B]`` per step), and values the other fold's
    first states with it. The episodes keep their folds and the basis its standardization. A
    resample that draws none of a fold's episodes keeps the data's fit for that fold."""

    model: FiniteHorizonFqe

    @property
    def cost(self) -> float:
        """Multiply-adds of one resample's refit."""
        model = self.model
        d = model.basis.shape[1]
        m = model.rewards.shape[1]
        per_row = (2 * model.num_actions + 1) * d * m  # the values, then the moments
        return float(model.horizon) * model.inputs.num_rows * per_row

    def plan(self, num_bootstrap: int) -> tuple[int, str]:
        """How many of the first ``num_bootstrap`` resamples are refit (0: none, the model
        held fixed) and the note that says so."""
        affordable = int(REFIT_WORK // max(self.cost, 1.0))
        if affordable >= num_bootstrap:
            return num_bootstrap, (
                "the interval refits the finite-horizon Q model in every bootstrap resample"
            )
        work = f"{self.cost * num_bootstrap:.2g} multiply-adds for {num_bootstrap} resamples"
        if affordable >= MIN_REFIT_RESAMPLES:
            return affordable, (
                f"the interval refits the finite-horizon Q model in the first {affordable} "
                f"of {num_bootstrap} bootstrap resamples ({work} is past the budget of "
                f"{REFIT_WORK:.2g})"
            )
        return 0, (
            "the interval holds the finite-horizon Q model fixed across resamples (refitting "
            f"it would take {work}, past the budget of {REFIT_WORK:.2g}), so it leaves out "
            "the model's own estimation error (narrower than it should be)"
        )

    @cached_property
    def _data_start_weights(self) -> dict[int, np.ndarray]:
        """Each fold's ``W_H`` fitted on the data themselves ``[1, D, M]``."""
        model = self.model
        return {
            fit: model.recursion(
                model.fold(fit), np.ones((len(model.fold(fit).basis), 1)), keep=False
            )
            for fit, _ in model.pairs
        }

    def totals(self, counts: np.ndarray) -> np.ndarray:
        """``[B, M]``: ``sum_e c_e V_H^b(s_0^e)`` for resamples ``counts [B, E]``, each
        episode's first state valued by the model refit on resample ``b``'s draws of the other
        fold (one episode: of its own)."""
        with one_blas_thread():
            return self._totals(counts)

    def _totals(self, counts: np.ndarray) -> np.ndarray:
        model = self.model
        m = model.rewards.shape[1]
        total = np.zeros((len(counts), m))
        widest = max(len(model.fold(fit).basis) for fit, _ in model.pairs)
        batch = max(1, BATCH_ENTRIES // max(widest * (model.num_actions + 1) * m, 1))
        for start in range(0, len(counts), batch):
            part = counts[start : start + batch]
            for fit, predict in model.pairs:
                fold = model.fold(fit)
                row_counts = part[:, fold.episode].T  # [n, B]
                weights = model.recursion(fold, row_counts, keep=False)
                none_drawn = row_counts.sum(axis=0) == 0
                if none_drawn.any():
                    weights[none_drawn] = self._data_start_weights[fit][0]
                episodes = model.fold(predict).episodes
                first = model.starts[episodes]
                values = model.action_values(model.basis[first], weights, model.horizon)
                start_values = model.state_values(model.probabilities[first], values)
                total[start : start + batch] += np.einsum(
                    "be,ebm->bm", part[:, episodes], start_values
                )
        return total


def finite_horizon_values(
    inputs: CpeInputs, options: CpeOptions, features: np.ndarray | None = None
) -> ModelValues:
    """``models.q_model_values`` at ``gamma = 1`` on multi-step episodes: the cross-fitted
    finite-horizon FQE's ``Q_{H-t}(s_t, a_t)`` and ``V_{H-t}(s_t)`` per row and metric, with
    ``start_refit`` for ``fqe``'s interval."""
    return FiniteHorizonFqe(inputs, options, features).model_values()
