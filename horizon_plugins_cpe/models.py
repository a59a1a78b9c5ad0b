"""The models the estimators need, fitted on the eval split itself in closed form.

A reward model ``r_hat(s, a)`` per metric (for ``dm`` and ``dr``) and the evaluated policy's
``Q_hat(s, a)`` per metric by fitted-Q evaluation (for the sequential kinds), both linear in
one feature map and fitted by ridge regression, every metric at once (one solve, ``M``
right-hand sides):

    phi(s, a) = [x(s), e_a (x) x(s)],   x(s) = [1, standardized state values and presence]

a shared copy of the state's features beside one copy per action (``e_a (x) x`` puts ``x`` in
action ``a``'s block, zeros elsewhere). The per-action copies make the model any per-action
linear function of the state; the shared copy, penalized like the rest, is what an action
with few or no rows in a fold falls back to (rather than 0). With one-hot states the map is
tabular, so the models are well specified on a gridworld.

Cross-fitting: the episodes are split in two folds by a seeded permutation; each fold's rows
get the values of the model fitted on the other fold, so the doubly robust corrections are
not fitted to the rows they correct.

Fitted-Q evaluation iterates ``Q <- r + gamma (1 - terminal) sum_a' pi(a'|s') Q(s', a')``
with the ridge solve (the last row of each episode terminal). For a linear ``Q = phi W`` the
iteration is ``W <- A^-1 (Phi^T r + gamma P W)`` with ``A = Phi^T Phi + lambda I`` and
``P = Phi^T Psi`` (``Psi`` the next rows' policy-weighted features): a fixed matrix map, so its
limit, when it has one, solves ``(A - gamma P) W = Phi^T r``. That one ``D x D`` solve (``D =
(actions + 1) x (features + 1)``) replaces hundreds of iterations (at ``gamma = 0.99`` the
iteration needs ~1,400 to reach 1e-6). The iteration converges exactly when the spectral
radius of ``gamma A^-1 P`` is below 1; where it is not, or barely (off-policy linear FQE can
diverge; data that never terminate at gamma 1 sit at 1), the capped iteration runs instead
and the values carry a note.

No nonlinear expansion of the features, on measurement. On CartPole (25,440 rows in 300
episodes logged epsilon-greedy at 0.6 around a pole-angle heuristic, gamma 0.99, truths from
400 rollouts each), the FQE model's own estimate (the mean ``V_hat`` of first states) was off
by -34% with these features for a target near the logger (epsilon 0.5), and by -5% / +2% /
+1% with squares and products / 32 / 128 random Fourier features; for a target far from it
(epsilon 0.1, episodes ten times longer) by -60% here, and +91% / +50% / -15% with them.
Only the 128 Fourier features helped in both, at 15 to 30 times the fit time (``D`` = 411),
past the per-epoch budget (20% of a 0.1 s epoch at 3,000 rows). The state features the
timeline gives are what the models see.
"""

from __future__ import annotations

import numpy as np

from horizon_plugins_cpe.formulas import (
    CpeInputError,
    CpeInputs,
    CpeOptions,
    ModelValues,
    check_inputs,
)

RIDGE = 1e-5
"""The ridge penalty per row: ``lambda = RIDGE x rows in the fold``. The features are
standardized, so a coefficient's data term grows like its rows; this shrinks an action seen
with probability ``p`` in a state by about ``RIDGE / p`` (2e-4 at ``p = 0.05``) while keeping
the collinear columns (one-hot states beside the intercept, constant presence) solvable."""

FQE_MAX_ITERATIONS = 200
FQE_TOLERANCE = 1e-6
"""Where FQE does not contract and is iterated: at most this many iterations, stopping when
the largest change is below this fraction of the largest value."""

CONTRACTION_LIMIT = 1.0 - 1e-4
"""FQE is solved at its fixed point when the spectral radius of its map is below this. The
value is a sum over about ``1 / (1 - radius)`` steps; past 10,000 of them the data do not
end the recursion (no terminal row reached, gamma 1) and only the ridge's shrinkage keeps the
fixed point finite, so the capped iteration runs instead, with a note."""

CHUNK_ROWS = 65536
"""Rows per block when accumulating the Gram matrices (bounds the memory of the design)."""


# --- the feature map -------------------------------------------------------------------------


def state_basis(inputs: CpeInputs) -> np.ndarray:
    """``[N, 1 + F]``: an intercept and the features standardized over the eval rows (a
    constant column becomes 0). No reward enters, so cross-fitting is not affected."""
    features = np.asarray(inputs.features, dtype=np.float64)
    if features.ndim != 2 or len(features) != inputs.num_rows:
        raise CpeInputError(f"features has shape {features.shape}; expected ({inputs.num_rows}, F)")
    finite = np.isfinite(features).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise CpeInputError(f"{inputs.describe_row(row)}: features hold {features[row]!r}")
    mean = features.mean(axis=0)
    std = features.std(axis=0)
    std[std == 0] = 1.0
    return np.concatenate([np.ones((len(features), 1)), (features - mean) / std], axis=1)


def design(basis: np.ndarray, action: np.ndarray, num_actions: int) -> np.ndarray:
    """``[n, (A + 1) d]``: ``phi(s, a)`` of each row's logged action."""
    n, d = basis.shape
    phi = np.zeros((n, num_actions + 1, d))
    phi[:, 0] = basis
    phi[np.arange(n), 1 + action] = basis
    return phi.reshape(n, -1)


def expected_design(basis: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """``[n, (A + 1) d]``: ``sum_a pi(a|s) phi(s, a)``."""
    n, d = basis.shape
    phi = np.empty((n, probabilities.shape[1] + 1, d))
    phi[:, 0] = probabilities.sum(axis=1)[:, None] * basis
    phi[:, 1:] = probabilities[:, :, None] * basis[:, None, :]
    return phi.reshape(n, -1)


def all_action_values(basis: np.ndarray, weights: np.ndarray, num_actions: int) -> np.ndarray:
    """``[n, A, M]``: the linear model ``phi(s, a) W`` for every action."""
    d = basis.shape[1]
    blocks = weights.reshape(num_actions + 1, d, -1)
    return np.einsum("nd,adm->nam", basis, blocks[0][None] + blocks[1:])


def episode_folds(num_episodes: int, seed: int) -> np.ndarray:
    """``[E]`` 0 or 1: half the episodes (a seeded permutation) in each fold."""
    order = np.random.default_rng(seed).permutation(num_episodes)
    folds = np.zeros(num_episodes, dtype=np.int64)
    folds[order[num_episodes // 2 :]] = 1
    return folds


# --- fitting ---------------------------------------------------------------------------------


def _gram(
    basis: np.ndarray,
    action: np.ndarray,
    targets: np.ndarray,
    num_actions: int,
    next_basis: np.ndarray | None = None,
    next_probabilities: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``Phi^T Phi``, ``Phi^T targets`` and, given the next rows (0 where terminal),
    ``Phi^T Psi``, from the map's block structure: the rows of action ``a`` touch only the
    shared block and block ``a``, so each block is ``X_a^T X_a`` (``X_a`` those rows' basis)
    and the shared block their sum. ``N d^2`` work instead of ``N (A + 1)^2 d^2`` for a
    dense design; rows are taken in blocks of ``CHUNK_ROWS`` to bound the memory."""
    d = basis.shape[1]
    size = (num_actions + 1) * d
    gram = np.zeros((num_actions + 1, d, num_actions + 1, d))
    moment = np.zeros((num_actions + 1, d, targets.shape[1]))
    cross = None if next_basis is None else np.zeros((num_actions + 1, d, size))
    order = np.argsort(action, kind="stable")
    bounds = np.searchsorted(action[order], np.arange(num_actions + 1))
    for a in range(num_actions):
        block_gram = np.zeros((d, d))
        for start in range(bounds[a], bounds[a + 1], CHUNK_ROWS):
            rows = order[start : min(start + CHUNK_ROWS, bounds[a + 1])]
            x = basis[rows]
            block_gram += x.T @ x
            moment[1 + a] += x.T @ targets[rows]
            if cross is not None:
                cross[1 + a] += x.T @ expected_design(next_basis[rows], next_probabilities[rows])
        gram[1 + a, :, 1 + a] = block_gram
        gram[0, :, 1 + a] = block_gram
        gram[1 + a, :, 0] = block_gram
        gram[0, :, 0] += block_gram
    moment[0] = moment[1:].sum(axis=0)
    if cross is not None:
        cross[0] = cross[1:].sum(axis=0)
        cross = cross.reshape(size, size)
    return gram.reshape(size, size), moment.reshape(size, -1), cross


def fit_reward_model(
    basis: np.ndarray, action: np.ndarray, rewards: np.ndarray, num_actions: int
) -> np.ndarray:
    """``W [(A + 1) d, M]`` of the ridge regression of ``rewards`` on ``phi(s, a)``."""
    gram, moment, _ = _gram(basis, action, rewards, num_actions)
    penalty = RIDGE * len(basis) * np.eye(len(gram))
    return np.linalg.solve(gram + penalty, moment)


def fit_fqe(
    basis: np.ndarray,
    action: np.ndarray,
    rewards: np.ndarray,
    num_actions: int,
    next_basis: np.ndarray,
    next_probabilities: np.ndarray,
    gamma: float,
) -> tuple[np.ndarray, str | None]:
    """``W [(A + 1) d, M]`` of linear fitted-Q evaluation (see the module's docstring);
    ``next_basis`` and ``next_probabilities`` are 0 on terminal rows. Returns a note when
    the iteration does not contract and was run capped instead of solved."""
    gram, moment, cross = _gram(basis, action, rewards, num_actions, next_basis, next_probabilities)
    regularized = gram + RIDGE * len(basis) * np.eye(len(gram))
    step = gamma * np.linalg.solve(regularized, cross)
    radius = float(np.abs(np.linalg.eigvals(step)).max()) if gamma > 0 else 0.0
    if radius < CONTRACTION_LIMIT:
        return np.linalg.solve(regularized - gamma * cross, moment), None
    start = np.linalg.solve(regularized, moment)
    weights = start
    iteration = 0
    while iteration < FQE_MAX_ITERATIONS:
        iteration += 1
        updated = start + step @ weights
        change = np.abs(updated - weights).max()
        weights = updated
        if change <= FQE_TOLERANCE * max(np.abs(weights).max(), 1e-300):
            break
    return weights, (
        f"fitted-Q evaluation does not contract on this data (spectral radius {radius:.3g}): "
        f"Q_hat is its {iteration}-iteration value, and the sequential estimates lean on it"
    )


# --- the values the estimators read ----------------------------------------------------------


def _cross_fitted(inputs: CpeInputs, options: CpeOptions, fit) -> ModelValues:
    """Fit on each fold with ``fit(rows) -> (W, note)``, predict the other fold's rows."""
    check_inputs(inputs)
    basis = state_basis(inputs)
    starts = np.asarray(inputs.episode_starts)
    num_actions = inputs.target_probabilities.shape[1]
    num_episodes = inputs.num_episodes
    fold_of_row = np.repeat(episode_folds(num_episodes, options.seed), np.diff(starts))
    probabilities = np.asarray(inputs.target_probabilities, dtype=np.float64)
    logged = np.empty(inputs.rewards.shape)
    expected = np.empty(inputs.rewards.shape)
    notes = []
    folds = ((0, 1), (1, 0)) if num_episodes > 1 else ((0, 0),)
    if num_episodes == 1:
        notes.append("one episode: the models are fitted on the rows they evaluate")
    for fit_fold, predict_fold in folds:
        weights, note = fit(basis, fold_of_row == fit_fold, num_actions)
        if note:
            notes.append(note)
        rows = fold_of_row == predict_fold
        values = all_action_values(basis[rows], weights, num_actions)  # [n, A, M]
        action = inputs.action[rows]
        logged[rows] = values[np.arange(len(action)), action]
        expected[rows] = np.einsum("na,nam->nm", probabilities[rows], values)
    return ModelValues(logged=logged, expected=expected, note="; ".join(notes) or None)


def reward_model_values(inputs: CpeInputs, options: CpeOptions) -> ModelValues:
    """Cross-fitted ridge ``r_hat(s, a)``: ``logged`` of the logged action, ``expected`` under
    the evaluated policy, per row and metric."""
    rewards = np.asarray(inputs.rewards, dtype=np.float64)

    def fit(basis, rows, num_actions):
        return fit_reward_model(basis[rows], inputs.action[rows], rewards[rows], num_actions), None

    return _cross_fitted(inputs, options, fit)


def q_model_values(inputs: CpeInputs, options: CpeOptions) -> ModelValues:
    """Cross-fitted fitted-Q evaluation ``Q_hat^pi(s, a)`` at discount ``options.gamma``:
    ``logged`` of the logged action, ``expected`` = ``V_hat^pi(s)``, per row and metric."""
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    starts = np.asarray(inputs.episode_starts)
    probabilities = np.asarray(inputs.target_probabilities, dtype=np.float64)

    def fit(basis, rows, num_actions):
        terminal = np.zeros(len(basis), dtype=bool)
        terminal[starts[1:] - 1] = True
        next_basis = np.zeros_like(basis)
        next_basis[:-1] = basis[1:]
        next_basis[terminal] = 0.0
        next_probabilities = np.zeros_like(probabilities)
        next_probabilities[:-1] = probabilities[1:]
        next_probabilities[terminal] = 0.0
        return fit_fqe(
            basis[rows],
            inputs.action[rows],
            rewards[rows],
            num_actions,
            next_basis[rows],
            next_probabilities[rows],
            float(options.gamma),
        )

    return _cross_fitted(inputs, options, fit)
