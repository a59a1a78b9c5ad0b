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

No nonlinear expansion of the features: of squares and products and random Fourier features,
only 128 Fourier features made FQE on CartPole better both near and far from the logger, at 15
to 30 times the fit time, past the per-epoch budget (measured:
docs/measurements.md#cpe_feature_map). The state features the timeline gives are what the
models see, unless a trainer offers better ones.

A trainer's hidden layer (``q_model = "network_fqe"``, the default where the trainer offers
``q_features``, as dqn does): the same cross-fitted FQE, with ``x(s)`` the first
``NETWORK_COMPONENTS`` principal components of the standardized last hidden layer of the
trained Q-network (a representation learned for this task's values, which the state's few
features are not), and the next states' values clipped to the returns the rewards allow
(``fit_bounded_fqe``), as are the values it predicts. On the CartPole example it came
within 1% of the truth where the DQN's own scores and FQE on the state features were 3 to 8
times too small; it ranks a run's epochs less well than the scores, costs milliseconds a fit,
and needs the BLAS thread limit (``horizon_engine.evaluation``) on a busy machine (measured:
docs/measurements.md#network_fqe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

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

FEATURE_RIDGE = 1e-3
"""The ridge penalty per row of bounded FQE on a network's hidden layer. Chosen in a
prototype on the example's 64 raw hidden units (cross-fitted weighted DR's relative value
4.70 at 1e-5, 3.73 at 1e-3, 4.28 at 1e-2; truth 3.6 to 4.2), not tuned for the
components."""

NETWORK_COMPONENTS = 8
"""Bounded FQE on a network's hidden layer fits its first this many principal components
(``D = (A + 1) x 9``: a few milliseconds a fit, where all 64 units cost 5 to 20 times that
and were no closer to the truth on CartPole; see the module's docstring)."""

BOUNDED_MAX_STEPS = 5
"""Active-set steps of bounded FQE before it falls back to iterating the clipped map."""

BOUNDED_MAX_ITERATIONS = 2000
BOUNDED_SWEEP = 10
"""Where the active sets cycle, bounded FQE iterates the clipped map, trying an active-set
step every ``BOUNDED_SWEEP`` iterations; past ``BOUNDED_MAX_ITERATIONS`` it keeps the last
iterate, with a note."""

CHUNK_ROWS = 65536
"""Rows per block when accumulating the Gram matrices (bounds the memory of the design)."""

REFIT_ENTRIES = 1 << 24
"""The reward model is refit inside the bootstrap's resamples (``RidgeRefit``) only while its
per-(episode, action) Gram pieces hold at most this many numbers (128 MB of float64): 10,000
episodes of 2 actions and 8 features take 0.9 million; a bandit log of 1,000,000 one-row
episodes with 3 features takes 10 million, with 8 features 45 million (past it, the interval
holds the model fixed, with a note)."""

REFIT_WIDTH = 256
"""And only while the model's width ``D = (actions + 1) x (features + 1)`` is at most this:
the refit solves ``2 x num_bootstrap`` systems of ``D x D``, a quarter of a second at 256
(measured: docs/measurements.md#refit_cost); many actions (candidate slots) of many features
would take seconds."""


# --- the feature map -------------------------------------------------------------------------


def checked_features(inputs: CpeInputs, features: np.ndarray | None = None) -> np.ndarray:
    """``[N, F]`` float64: the features a model is fitted on (``inputs.features`` unless
    others are given, such as a network's hidden layer on the same rows), one row per eval
    row and every value finite, else ``CpeInputError`` naming the first bad row."""
    if features is None:
        features = inputs.features
    features = np.asarray(features, dtype=np.float64)
    if features.ndim != 2 or len(features) != inputs.num_rows:
        raise CpeInputError(f"features has shape {features.shape}; expected ({inputs.num_rows}, F)")
    finite = np.isfinite(features).all(axis=1)
    if not finite.all():
        row = int(np.argmin(finite))
        raise CpeInputError(f"{inputs.describe_row(row)}: features hold {features[row]!r}")
    return features


def state_basis(inputs: CpeInputs, features: np.ndarray | None = None) -> np.ndarray:
    """``[N, 1 + F]``: an intercept and the features (``checked_features``) standardized over
    the eval rows (a constant column becomes 0). No reward enters, so cross-fitting is not
    affected."""
    features = checked_features(inputs, features)
    mean = features.mean(axis=0)
    std = features.std(axis=0)
    std[std == 0] = 1.0
    return np.concatenate([np.ones((len(features), 1)), (features - mean) / std], axis=1)


def principal_features(features: np.ndarray, components: int) -> np.ndarray:
    """``[N, k]``: ``features`` standardized (constant columns left out) and projected on
    their first ``k <= components`` principal components over the rows. No reward enters."""
    features = np.asarray(features, dtype=np.float64)
    std = features.std(axis=0)
    live = std > 0
    centered = (features[:, live] - features[:, live].mean(axis=0)) / std[live]
    if centered.shape[1] <= components:
        return centered
    # The eigenvectors of the [H, H] scatter matrix are the SVD's directions, at a sixth of
    # its time for a few thousand rows (0.7 against 4.8 ms on 2,200 rows of 64 units).
    _, directions = np.linalg.eigh(centered.T @ centered)
    return centered @ directions[:, ::-1][:, :components]


def design(basis: np.ndarray, action: np.ndarray, num_actions: int) -> np.ndarray:
    """``[n, (A + 1) d]``: ``phi(s, a)`` of each row's logged action."""
    n, d = basis.shape
    phi = np.zeros((n, num_actions + 1, d))
    phi[:, 0] = basis
    phi[np.arange(n), 1 + action] = basis
    return phi.reshape(n, (num_actions + 1) * d)


def expected_design(basis: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
    """``[n, (A + 1) d]``: ``sum_a pi(a|s) phi(s, a)``."""
    n, d = basis.shape
    phi = np.empty((n, probabilities.shape[1] + 1, d))
    phi[:, 0] = probabilities.sum(axis=1)[:, None] * basis
    phi[:, 1:] = probabilities[:, :, None] * basis[:, None, :]
    return phi.reshape(n, (probabilities.shape[1] + 1) * d)


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


def return_bounds(rewards: np.ndarray, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """``[M]`` each: the least and the most a state can be worth under any policy, given the
    rewards' range ``[r_min, r_max]`` per metric: a return is a sum of at least one reward
    (``r_min`` when the episode may end at once) and of up to ``1 / (1 - gamma)`` discounted
    ones, so ``[min(r_min, r_min / (1 - gamma)), max(r_max, r_max / (1 - gamma))]`` (an
    unbounded side at ``gamma = 1``)."""
    smallest, largest = rewards.min(axis=0), rewards.max(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        horizon = 1.0 / (1.0 - gamma) if gamma < 1 else np.inf
        low = np.where(smallest < 0, smallest * horizon, smallest)
        high = np.where(largest > 0, largest * horizon, largest)
    return low, high


def fit_bounded_fqe(
    basis: np.ndarray,
    action: np.ndarray,
    rewards: np.ndarray,
    num_actions: int,
    next_basis: np.ndarray,
    next_probabilities: np.ndarray,
    gamma: float,
    low: np.ndarray,
    high: np.ndarray,
) -> tuple[np.ndarray, str | None]:
    """``W [(A + 1) d, M]`` of linear fitted-Q evaluation whose targets bootstrap from the
    next state's value clipped to ``[low, high]`` (``return_bounds``): the fixed point of
    ``W = A^-1 Phi^T (r + gamma clip(Psi W))``, ``Psi`` the next rows' policy-weighted
    features (0 on terminal rows, whose next value stays 0).

    Off-policy linear FQE need not contract (on CartPole, with a network's hidden layer as
    features, its map had a spectral radius of 1.02; with random Fourier features the
    unclipped values reached the thousands); the clip keeps every target feasible. The fixed
    point is found by active sets (semismooth Newton), one ``D x D`` solve per metric and
    step: with the rows whose next value is clipped held at their bound, the rest is linear,
    ``(A - gamma Phi^T F Psi) W = Phi^T (r + gamma c)`` (``F`` the free rows, ``c`` the
    bounds of the clipped ones), and a solution whose next values clip exactly those rows is
    the fixed point. The steps start from none clipped (where the unclipped fixed point is
    feasible, that is the answer), each from the set the last one's values clip; where the
    sets cycle (``BOUNDED_MAX_STEPS``), the clipped map is iterated, with a step from the set
    it reaches every ``BOUNDED_SWEEP`` iterations. The map need not have one fixed point:
    which one is found depends on this search, deterministically. Past
    ``BOUNDED_MAX_ITERATIONS`` the last iterate is kept, with a note."""
    phi = design(basis, action, num_actions)  # [n, D]
    psi = expected_design(next_basis, next_probabilities)  # [n, D]
    terminal = ~next_probabilities.any(axis=1)
    gram, _, _ = _gram(basis, action, rewards, num_actions)
    regularized = gram + FEATURE_RIDGE * len(basis) * np.eye(len(gram))
    weights = np.empty((len(gram), rewards.shape[1]))
    notes = []
    for metric in range(rewards.shape[1]):
        bounds = (float(low[metric]), float(high[metric]))
        weights[:, metric], note = bounded_fqe_metric(
            regularized, phi, psi, terminal, rewards[:, metric], gamma, bounds
        )
        if note:
            notes.append(note)
    return weights, "; ".join(notes) or None


def bounded_fqe_metric(
    regularized: np.ndarray,
    phi: np.ndarray,
    psi: np.ndarray,
    terminal: np.ndarray,
    rewards: np.ndarray,
    gamma: float,
    bounds: tuple[float, float],
) -> tuple[np.ndarray, str | None]:
    """``fit_bounded_fqe`` for one metric: ``W [D]``, and a note where it did not settle.

    Active-set steps from none clipped; where the sets cycle, ``BOUNDED_SWEEP`` iterations of
    the clipped map (on the next values ``[n]``) and a step from the set they reach, until a
    step's solution reproduces its set or ``BOUNDED_MAX_ITERATIONS`` iterations have run."""
    low, high = bounds

    def clipped_at(values: np.ndarray) -> np.ndarray:
        """-1 / +1 where a next value is below / above its bounds, 0 where free."""
        return np.where(terminal, 0, np.where(values < low, -1, np.where(values > high, 1, 0)))

    def newton(active: np.ndarray) -> np.ndarray | None:
        """The weights whose free rows' next values are linear, the others at their bound."""
        free = (active == 0) & ~terminal
        fixed = np.where(active < 0, low, np.where(active > 0, high, 0.0))
        system = regularized - gamma * phi.T @ (free[:, None] * psi)
        try:
            return np.linalg.solve(system, phi.T @ (rewards + gamma * fixed))
        except np.linalg.LinAlgError:
            return None

    active = np.zeros(len(rewards), dtype=np.int64)
    seen = set()
    weights = None
    for _ in range(BOUNDED_MAX_STEPS):
        weights = newton(active)
        if weights is None:
            break
        updated = clipped_at(psi @ weights)
        if np.array_equal(updated, active):
            return weights, None
        if updated.tobytes() in seen:
            break
        seen.add(updated.tobytes())
        active = updated
    # The sets cycled (or a system was singular): iterate the clipped map.
    solve = np.linalg.solve(regularized, phi.T)  # [D, n]
    if weights is None:
        weights = solve @ rewards
    values = psi @ weights
    reward_weights = solve @ rewards
    discounted = gamma * solve * ~terminal  # terminal rows bootstrap from 0
    for iteration in range(1, BOUNDED_MAX_ITERATIONS + 1):
        previous = values
        values = psi @ (reward_weights + discounted @ np.clip(values, low, high))
        if iteration % BOUNDED_SWEEP == 0:
            active = clipped_at(values)
            candidate = newton(active)
            if candidate is not None and np.array_equal(clipped_at(psi @ candidate), active):
                return candidate, None
    change = float(np.abs(values - previous).max()) if len(values) else 0.0
    following = np.where(terminal, 0.0, np.clip(values, low, high))
    return solve @ (rewards + gamma * following), (
        f"bounded fitted-Q evaluation did not settle (last change {change:.3g} after "
        f"{BOUNDED_MAX_ITERATIONS} iterations): the sequential estimates lean on Q_hat as it "
        "stands"
    )


# --- the values the estimators read ----------------------------------------------------------


def _cross_fitted(
    inputs: CpeInputs,
    options: CpeOptions,
    fit,
    features: np.ndarray | None = None,
    bounds: tuple[np.ndarray, np.ndarray] | None = None,
) -> ModelValues:
    """Fit on each fold with ``fit(rows) -> (W, note)``, predict the other fold's rows (each
    value clipped to ``bounds`` ``([M], [M])`` when given)."""
    check_inputs(inputs)
    basis = state_basis(inputs, features)
    starts = np.asarray(inputs.episode_starts)
    num_actions = inputs.target_probabilities.shape[1]
    num_episodes = inputs.num_episodes
    fold_of_row = np.repeat(episode_folds(num_episodes, options.seed), np.diff(starts))
    probabilities = np.asarray(inputs.target_probabilities, dtype=np.float64)
    logged = np.empty(inputs.rewards.shape)
    expected = np.empty(inputs.rewards.shape)
    notes = []
    folds = ((0, 1), (1, 0)) if num_episodes > 1 else ((1, 1),)  # a lone episode is fold 1
    if num_episodes == 1:
        notes.append("one episode: the models are fitted on the rows they evaluate")
    for fit_fold, predict_fold in folds:
        weights, note = fit(basis, fold_of_row == fit_fold, num_actions)
        if note:
            notes.append(note)
        rows = fold_of_row == predict_fold
        values = all_action_values(basis[rows], weights, num_actions)  # [n, A, M]
        if bounds is not None:
            values = np.clip(values, *bounds)
        action = inputs.action[rows]
        logged[rows] = values[np.arange(len(action)), action]
        expected[rows] = np.einsum("na,nam->nm", probabilities[rows], values)
    return ModelValues(logged=logged, expected=expected, note="; ".join(notes) or None)


def reward_model_values(inputs: CpeInputs, options: CpeOptions) -> ModelValues:
    """Cross-fitted ridge ``r_hat(s, a)``: ``logged`` of the logged action, ``expected`` under
    the evaluated policy, per row and metric; ``refit`` refits the same model inside each
    bootstrap resample (``RidgeRefit``, built when an interval first asks for it), so that
    ``dm``'s interval includes the model's own estimation error."""
    rewards = np.asarray(inputs.rewards, dtype=np.float64)

    def fit(basis, rows, num_actions):
        return fit_reward_model(basis[rows], inputs.action[rows], rewards[rows], num_actions), None

    values = _cross_fitted(inputs, options, fit)
    return ModelValues(
        values.logged, values.expected, values.note, refit=RidgeRefit(inputs, options.seed)
    )


def q_model_values(
    inputs: CpeInputs, options: CpeOptions, features: np.ndarray | None = None
) -> ModelValues:
    """Cross-fitted fitted-Q evaluation ``Q_hat^pi(s, a)`` at discount ``options.gamma``:
    ``logged`` of the logged action, ``expected`` = ``V_hat^pi(s)``, per row and metric.

    Linear in the state features by default. Given ``features`` ``[N, H]`` (a trained
    network's last hidden layer on the rows' states, ``q_features``), linear in those, with
    the next states' values bounded to the returns the rewards allow (``fit_bounded_fqe``).

    Undiscounted (``gamma = 1``) on multi-step episodes, the finite-horizon FQE of
    ``horizon_fqe`` instead: ``Q`` depends on the steps to go, and its ``start_refit`` gives
    ``fqe`` an interval with the model refit per resample."""
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    starts = np.asarray(inputs.episode_starts)
    if float(options.gamma) == 1.0 and (np.diff(starts) > 1).any():
        from horizon_plugins_cpe.horizon_fqe import finite_horizon_values

        return finite_horizon_values(inputs, options, features)
    probabilities = np.asarray(inputs.target_probabilities, dtype=np.float64)
    bounded = features is not None
    if bounded:
        features = principal_features(features, NETWORK_COMPONENTS)
    low, high = return_bounds(rewards, float(options.gamma))

    def fit(basis, rows, num_actions):
        terminal = np.zeros(len(basis), dtype=bool)
        terminal[starts[1:] - 1] = True
        next_basis = np.zeros_like(basis)
        next_basis[:-1] = basis[1:]
        next_basis[terminal] = 0.0
        next_probabilities = np.zeros_like(probabilities)
        next_probabilities[:-1] = probabilities[1:]
        next_probabilities[terminal] = 0.0
        arguments = (
            basis[rows],
            inputs.action[rows],
            rewards[rows],
            num_actions,
            next_basis[rows],
            next_probabilities[rows],
            float(options.gamma),
        )
        if bounded:
            return fit_bounded_fqe(*arguments, low, high)
        return fit_fqe(*arguments)

    return _cross_fitted(inputs, options, fit, features, (low, high) if bounded else None)


# --- the reward model refit per bootstrap resample -------------------------------------------


@dataclass(frozen=True, eq=False)
class RidgeRefit:
    """``reward_model_values``' cross-fitted ridge model refit inside bootstrap resamples.

    A resample that draws episode ``e`` ``c_e`` times refits each fold's model on its
    resampled episodes: ``W_b = (sum_e c_e G_e + lambda_b I)^-1 sum_e c_e g_e`` over the fold's
    episodes, with ``G_e = sum_i phi_i phi_i^T`` and ``g_e = sum_i phi_i r_i^T`` (every metric)
    per episode, and ``lambda_b = RIDGE x`` the resampled fold's rows, exactly what
    ``fit_reward_model`` gives on the resampled rows. The episodes keep their folds and the
    basis its standardization (a fixed map of the states, not a fit to the rewards). The
    values the estimators sum are linear in ``W_b``: a resample's ``sum_i sum_a pi(a|s_i)
    r_hat(s_i, a)`` is ``sum_e c_e Psi_e W_b`` with ``Psi_e = sum_{i in e} sum_a pi(a|s_i)
    phi(s_i, a)``, and ``dr``'s weighted logged values likewise with ``sum_{i in e} w_i
    phi(s_i, a_i)``. So no ``[B, N]`` array is built: per block of resamples, the counts times
    the per-episode pieces, and ``2 B`` solves of ``D x D``.

    ``G_e`` touches only the shared block and the blocks of the actions taken (the map's
    structure, as in ``_gram``), so it is kept per (episode, action) pair present, as the
    upper triangle of ``X^T X`` (``d (d + 1) / 2`` numbers, ``d`` the basis width). Holding
    the model fixed instead (the data's cross-fitted values in every resample) leaves that
    error out, and ``dm``'s interval too narrow (measured: docs/measurements.md#refit_kinds).

    A resample that draws no episode of a fold (likely only with a handful of episodes) keeps
    the data's fit for that fold. The pieces are computed on first use and kept.

    Cost: every block of resamples reads the pieces once, so a log of many short episodes,
    whose blocks hold few resamples (``formulas.BOOTSTRAP_ENTRIES``), costs most (``dm`` only,
    by ``formulas.REFIT_KINDS``; measured: docs/measurements.md#refit_cost)."""

    inputs: CpeInputs
    seed: int
    """The folds' seed (``options.seed`` of the fit: the folds must be the fit's own)."""

    @property
    def unavailable(self) -> str | None:
        """Why these data are not refit per resample (None when they are)."""
        inputs = self.inputs
        d = 1 + inputs.features.shape[1]
        num_actions = inputs.target_probabilities.shape[1]
        cells = min(inputs.num_rows, inputs.num_episodes * num_actions)
        why = None
        if cells * d * (d + 1) // 2 > REFIT_ENTRIES:
            why = f"{cells:,} episode-action pairs of {d} features are too many"
        elif (num_actions + 1) * d > REFIT_WIDTH:
            why = f"its {(num_actions + 1) * d} coefficients are too many"
        if why is None:
            return None
        return (
            f"the reward model is held fixed in the bootstrap ({why} to refit it per "
            "resample), so the interval leaves out the model's own estimation error"
        )

    @cached_property
    def _pieces(self) -> dict:
        """The folds and, per fold, the per-(episode, action) Gram and moment sums (grouped
        by action) and the per-episode ``Psi``: all a resample reads (nothing per row)."""
        inputs = self.inputs
        basis = state_basis(inputs)
        d = basis.shape[1]
        num_actions = inputs.target_probabilities.shape[1]
        starts = np.asarray(inputs.episode_starts)
        lengths = np.diff(starts)
        episode = np.repeat(np.arange(inputs.num_episodes), lengths)
        rewards = np.asarray(inputs.rewards, dtype=np.float64)
        folds = episode_folds(inputs.num_episodes, self.seed)
        # (fold, action, episode) cells, their rows together
        key = (folds[episode] * num_actions + inputs.action) * inputs.num_episodes + episode
        order = np.argsort(key, kind="stable")
        first = np.r_[True, key[order][1:] != key[order][:-1]]
        cell_key = key[order][first]
        upper = np.triu_indices(d)

        def products(rows: slice) -> np.ndarray:
            x = basis[order[rows]]
            moments = x[:, :, None] * rewards[order[rows], None]
            # np.take: indexing columns with an index array is 8 times slower here
            triangle = np.take(x, upper[0], axis=1) * np.take(x, upper[1], axis=1)
            return np.concatenate([triangle, moments.reshape(len(x), -1)], axis=1)

        sums = _grouped_sums(np.cumsum(first) - 1, len(cell_key), products)
        group = cell_key // inputs.num_episodes  # fold * A + action
        bounds = np.searchsorted(group, np.arange(2 * num_actions + 1))
        packed = np.zeros((d, d), dtype=np.int64)  # the packed index of each (j, k)
        packed[upper] = np.arange(len(upper[0]))
        packed[upper[1], upper[0]] = np.arange(len(upper[0]))
        probabilities = np.asarray(inputs.target_probabilities, dtype=np.float64)
        return {
            "width": d,
            "lengths": lengths.astype(np.float64),
            "folds": folds,
            "cells": [  # per fold and action: (episodes, sums)
                [
                    (cell_key[lo:hi] % inputs.num_episodes, sums[lo:hi])
                    for lo, hi in zip(
                        bounds[f * num_actions : (f + 1) * num_actions],
                        bounds[f * num_actions + 1 : (f + 1) * num_actions + 1],
                        strict=True,
                    )
                ]
                for f in (0, 1)
            ],
            "unpack": packed.ravel(),
            "triangle": len(upper[0]),
            "expected": _grouped_sums(
                episode, inputs.num_episodes, lambda s: expected_design(basis[s], probabilities[s])
            ),
        }

    @cached_property
    def _data_weights(self) -> np.ndarray:
        """``[2, D, M]``: each fold's model fitted on the data themselves (every count 1)."""
        return self.weights(np.ones((1, self.inputs.num_episodes)))[:, 0]

    def weights(self, counts: np.ndarray) -> np.ndarray:
        """``[2, B, D, M]``: per fold ``f``, the model fitted on fold ``f``'s episodes as
        ``counts [B, E]`` draws them (the data's fit where a resample draws none of them;
        zeros for a fold without episodes, as one episode leaves)."""
        pieces = self._pieces
        d = pieces["width"]
        num_actions = self.inputs.target_probabilities.shape[1]
        metrics = self.inputs.rewards.shape[1]
        size = (num_actions + 1) * d
        b = len(counts)
        triangle = pieces["triangle"]
        gram = np.zeros((2, b, num_actions + 1, d, num_actions + 1, d))
        moment = np.zeros((2, b, num_actions + 1, d, metrics))
        for fold in (0, 1):
            for a, (episodes, sums) in enumerate(pieces["cells"][fold]):
                if not len(episodes):
                    continue
                drawn = np.take(counts, episodes, axis=1) @ sums  # [B, packed Gram + d M]
                block = np.take(drawn, pieces["unpack"], axis=1).reshape(b, d, d)
                gram[fold, :, 1 + a, :, 1 + a] = block
                gram[fold, :, 0, :, 1 + a] = block
                gram[fold, :, 1 + a, :, 0] = block
                gram[fold, :, 0, :, 0] += block
                moment[fold, :, 1 + a] = drawn[:, triangle:].reshape(b, d, metrics)
        moment[:, :, 0] = moment[:, :, 1:].sum(axis=2)
        rows = np.stack([counts @ (pieces["lengths"] * (pieces["folds"] == f)) for f in (0, 1)])
        gram = gram.reshape(2, b, size, size)
        diagonal = np.arange(size)
        gram[:, :, diagonal, diagonal] += np.where(rows > 0, RIDGE * rows, 1.0)[:, :, None]
        solved = np.linalg.solve(gram, moment.reshape(2, b, size, metrics))
        empty = (rows == 0) & (pieces["folds"] == np.array([[0], [1]])).any(axis=1)[:, None]
        if empty.any():
            data = self._data_weights
            for fold in (0, 1):
                solved[fold, empty[fold]] = data[fold]
        return solved

    def sums(self, weights: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray]:
        """A function of resamples ``counts [B, E]`` giving ``[B, M]``: ``sum_e c_e sum_{i in
        e} (expected_b(i) - w_i logged_b(i))`` (``w`` the importance ``weights [N]``, 0 when
        None), the values of the model refit on resample ``b``, each fold's rows valued by
        the other fold's model (one episode: by its own). Linear in the model, so a
        resample's sum is ``sum_e c_e F_e W_b`` with each episode's features ``F_e [D]``
        summed once here."""
        pieces = self._pieces
        inputs = self.inputs
        features = pieces["expected"]
        if weights is not None:
            # dr's features: sum_i [sum_a pi(a|s_i) phi(s_i, a) - w_i phi(s_i, a_i)]
            basis, action = state_basis(inputs), inputs.action  # not kept: N x d
            num_actions = inputs.target_probabilities.shape[1]
            episode = np.repeat(np.arange(inputs.num_episodes), np.diff(inputs.episode_starts))
            logged = _grouped_sums(
                episode,
                inputs.num_episodes,
                lambda s: design(basis[s], action[s], num_actions) * weights[s, None],
            )
            features = features - logged
        predicted = [np.flatnonzero(pieces["folds"] == fold) for fold in (0, 1)]
        fitted_on = (0, 1) if inputs.num_episodes == 1 else (1, 0)

        def resampled(counts: np.ndarray) -> np.ndarray:
            models = self.weights(counts)
            total = np.zeros((len(counts), inputs.rewards.shape[1]))
            for fold in (0, 1):
                if len(predicted[fold]):
                    drawn = np.take(counts, predicted[fold], axis=1) @ features[predicted[fold]]
                    total += np.einsum("bp,bpm->bm", drawn, models[fitted_on[fold]])
            return total

        return resampled


def _grouped_sums(
    group: np.ndarray, count: int, values: Callable[[slice], np.ndarray]
) -> np.ndarray:
    """``[count, K]``: the sums of ``values(rows) [n, K]`` over the rows of each group, for
    ``group [N]`` nondecreasing; rows are taken in blocks of ``CHUNK_ROWS`` to bound the
    memory of the values."""
    found = None
    for start in range(0, len(group), CHUNK_ROWS):
        rows = slice(start, min(start + CHUNK_ROWS, len(group)))
        ids = group[rows]
        firsts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        block = np.add.reduceat(values(rows), firsts, axis=0)
        if found is None:
            found = np.zeros((count, block.shape[1]))
        found[ids[firsts]] += block
    return found
