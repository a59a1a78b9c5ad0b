"""Marginalized importance sampling: the evaluated policy's return per episode weighted by the
ratio of the two policies' state distributions at each step, not by a product of per-step
ratios along the episode.

Per-decision importance sampling (``sequential_dr``, ``weighted_dr``, ``magic``) weighs step
``t`` by ``rho_t = prod_{k<=t} pi_k / mu_k``, whose variance grows exponentially with ``t``
(the "curse of horizon"): on long episodes logged by a nearly greedy logger almost every
episode's weight is 0 or huge. Finite-horizon MIS (Xie, Ma & Wang 2019; Liu et al. 2018 is
the infinite-horizon form) weighs step ``t`` by ``y_t = w_t(s_t) q_t``, with ``q_t =
pi(a_t|s_t) / mu(a_t|s_t)`` the step's own ratio and ``w_t(s) = d_t^pi(s) / d_t^mu(s)`` the
ratio of the probabilities of being in ``s`` at step ``t``, a function of the state alone,
estimated step by step:

    w_0 = 1;   w_{t+1}(s') = E_mu[w_t(s_t) q_t | s_{t+1} = s']

(the flow of probability through one transition), the conditional expectation taken by a
ridge regression of ``y_t`` on the next state's features over the episodes that reach step
``t + 1`` (``REGRESSION_RIDGE``): the slope on the features centered over those episodes,
the intercept unpenalized, so a constant target (the logger evaluating itself) is fitted
exactly. The fitted ratios are kept nonnegative (clipped at 0) and scaled back to the
targets' sum (what the regression's intercept preserves before the clip). Then

    value = sum_t gamma^t mean_e[y_t(e) r_t(e)]   (r the reward; 0 past an episode's end).

With one-hot state features the regression is tabular, and the estimator is Xie et al.'s
MIS with the empirical state distribution; with a trainer's hidden layer (``features``, as
``models.q_model_values`` takes them: its first ``NETWORK_COMPONENTS`` principal components)
it is the linear form of their estimator.

Episodes that end. An ended episode sits in an absorbing state where every policy agrees and
earns 0; the mass ``sum y_t`` of the episodes that end after step ``t`` flows into it and
stays there. At each step the state-action weights ``y_t`` are divided by their mean over
ALL episodes, the ended ones counting with the mass they carried in (as ``weighted_dr``
carries an ended episode's final weight): the total ``E_mu[y_t] = 1`` whatever the policy,
so the normalization removes the sampling noise of ``mean(q_t)`` (self-normalized, as
``snips``) and nothing else. Normalizing over the episodes still running instead would
estimate ``E_pi[. | alive at t]``: a policy that keeps the pole up longer than the logger
would get the logger's survival, and its value would be biased toward the logger's. A
one-row episode makes the estimator ``snips`` of the episodes' rewards.

The interval: a percentile bootstrap over episodes that REFITS every step's regression in
each resample (count-weighted Gram and moment sums, every resample of a block solved
together), paired with the logged value's resamples through ``formulas.finish``. The
effective sample size is that of every row's ``y_t``, ``(sum y)^2 / sum y^2``, scaled by
episodes per row: an episode count comparable to the sequential kinds' (at most ``E``).

Why this form (measured on the truth suite's CartPole runs and the tabular MDPs of
``tests/test_cpe_marginalized.py``): without the normalization the ratios' mass drifts as a
product of noisy steps, and trained policies on the nearly greedy logger's 500-step episodes
came out at 18 to 26 against a discounted truth of 99 (98.4 to 99.2 with it); a doubly robust
form (adding ``w_t V_hat(s_t) - y_t Q_hat(s_t, a_t)`` with the sequential kinds' Q) gave 700
to 3,300 there, the model's terms no longer cancelling where the ratios are poor, so there
is none. The ridge barely matters between 1e-3 and 1e-1; at 1e-5 one policy's estimate left
its own interval.

What it cannot do: see states the logger never reached. Where the evaluated policy goes
elsewhere (a policy that balances for 100 steps on random play's logs, which end by step
90; uniform play on a nearly greedy logger's logs, whose poles never fall), the ratios have
nothing to be fitted on and the estimate stays near the logger's value; the effective sample
size says so (2 to 8 episodes of 20 there). With few running episodes for the features
(late steps), the regression fits each episode's own weight and the estimate falls back to
per-decision weighting among them. And the step-by-step ratios carry a small-sample bias
(tabular, 200 episodes of 40 steps: -12%; 2,000 episodes: -5%).

``weight_clip`` clips each row's per-step ratio ``q_t`` (no product is formed to clip);
``propensity_floor`` raises the logged propensities as for every kind.

Cost: one pass over the steps per block of resamples, each step ``O(B n_t d^2)`` for its
``n_t`` running episodes and ``d`` features: ``O(B N d^2)`` in all. Measured on 2 busy
cores, 8 features: 1,000,000 rows in 10,000 episodes, 0.6 s for the estimate and 4.8 s
with 200 resamples (``weighted_dr`` with its Q fit: 1.9 s); 100,000 rows in 200 episodes of
500 steps, 0.6 s. The steps are a Python loop: one episode of a million steps would take
minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from horizon_plugins_cpe.formulas import (
    CpeInputs,
    CpeOptions,
    MetricEstimate,
    bootstrap_blocks,
    clip_weights,
    effective_sample_size,
    episode_sums,
    finish,
    logged_propensities,
    step_weights,
)

REGRESSION_RIDGE = 1e-3
"""The ridge penalty per resampled row of each step's ratio regression, on standardized
features: a one-hot feature seen in a share ``p`` of the step's states is shrunk by about
``REGRESSION_RIDGE / p`` toward the step's mean ratio (0.5% at ``p = 0.2``, so tabular data
stay tabular); it keeps a step with fewer running episodes than features solvable."""

NETWORK_COMPONENTS = 8
"""A trainer's hidden layer enters as its first this many principal components, as the Q
model's does (``models.NETWORK_COMPONENTS``)."""


@dataclass(frozen=True, eq=False)
class StepLayout:
    """The rows of every step, episodes sorted longest first so that the episodes running at
    step ``t`` are the first ``running[t]`` of ``order``."""

    order: np.ndarray
    """``[E]``: episodes by decreasing length (stable)."""
    running: np.ndarray
    """``[T + 1]``: how many episodes have a step ``t`` (0 at ``T``)."""
    rows: list[np.ndarray]
    """Per step ``t``: the rows of step ``t`` of ``order[:running[t]]``."""


def step_layout(starts: np.ndarray) -> StepLayout:
    """The layout of the episodes ``starts`` delimits (``formulas.CpeInputs``)."""
    lengths = np.diff(starts)
    order = np.argsort(-lengths, kind="stable")
    longest = int(lengths.max())
    running = len(lengths) - np.cumsum(np.bincount(lengths, minlength=longest + 1))
    first = starts[:-1][order]
    rows = [first[: running[t]] + t for t in range(longest)]
    return StepLayout(order, running, rows)


def ratio_features(inputs: CpeInputs) -> np.ndarray:
    """``[N, F]``: ``inputs.features`` standardized over the eval rows (constant columns
    dropped): what the ratio regressions see."""
    from horizon_plugins_cpe.models import checked_features

    features = checked_features(inputs)
    std = features.std(axis=0)
    live = std > 0
    return (features[:, live] - features[:, live].mean(axis=0)) / std[live]


def network_features(hidden: np.ndarray) -> np.ndarray:
    """A trainer's hidden layer ``[N, H]`` as the ratio regressions' features: its first
    ``NETWORK_COMPONENTS`` principal components (as the Q model takes it)."""
    from horizon_plugins_cpe.models import principal_features

    return principal_features(hidden, NETWORK_COMPONENTS)


def fit_ratios(
    counts: np.ndarray, targets: np.ndarray, features: np.ndarray, ridge: float
) -> np.ndarray:
    """``[B, n]``: per resample ``b``, the ridge regression of ``targets [B, n]`` on
    ``features [n, F]`` with each row counted ``counts [B, n]`` times, predicted at the same
    rows, clipped at 0 and scaled to the targets' counted sum. Slope on the features centered
    at their counted mean, intercept unpenalized; a resample that draws none of the rows
    gets zeros."""
    drawn = counts.sum(axis=1)  # [B]
    mass = (counts * targets).sum(axis=1)  # [B]
    safe = np.where(drawn > 0, drawn, 1.0)
    mean_target = mass / safe
    if features.shape[1] == 0:
        fitted = np.repeat(mean_target[:, None], features.shape[0], axis=1)
    else:
        f = features.shape[1]
        mean = (counts @ features) / safe[:, None]  # [B, F]
        upper = np.triu_indices(f)  # the Gram's upper triangle: half the products
        packed = counts @ (features[:, upper[0]] * features[:, upper[1]])
        gram = np.empty((len(counts), f, f))
        gram[:, upper[0], upper[1]] = packed
        gram[:, upper[1], upper[0]] = packed
        gram -= drawn[:, None, None] * (mean[:, :, None] * mean[:, None, :])
        moment = (counts * targets) @ features - mass[:, None] * mean
        diagonal = np.arange(f)
        gram[:, diagonal, diagonal] += ridge * safe[:, None]
        slope = np.linalg.solve(gram, moment[:, :, None])[:, :, 0]  # [B, F]
        fitted = mean_target[:, None] + (features @ slope.T).T - (mean * slope).sum(axis=1)[:, None]
    fitted = np.maximum(fitted, 0.0)
    fitted_mass = (counts * fitted).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(fitted_mass > 0, mass / fitted_mass, 0.0)
    flat = (fitted_mass <= 0) & (mass > 0)  # every fit clipped away: the mean ratio
    fitted = fitted * scale[:, None]
    if flat.any():
        fitted[flat] = mean_target[flat, None]
    return fitted


def marginal_values(
    counts: np.ndarray,
    layout: StepLayout,
    ratios: np.ndarray,
    terms: np.ndarray,
    features: np.ndarray,
    gamma: float,
    ridge: float,
    keep_weights: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``[B, K]``: the MIS estimate per resample ``counts [B, E]`` of each column of
    ``terms [N, K]`` (rewards), ``sum_t gamma^t sum_e c_e y_t(e) terms_t(e) / sum_e c_e``,
    with ``y_t`` the normalized state-action weights; ``ratios [N]`` the per-step ``pi /
    mu``; ``ridge`` the regressions' penalty per row. With ``keep_weights``, also every
    row's ``y_t`` ``[N]`` (for one resample)."""
    b = len(counts)
    sorted_counts = counts[:, layout.order]
    total = counts.sum(axis=1)  # [B]
    values = np.zeros((b, terms.shape[1]))
    kept = np.zeros(len(ratios)) if keep_weights else None
    ended = np.zeros(b)  # mass carried into the absorbing state, on the normalized scale
    weight = np.ones((b, layout.running[0]))  # w_0 = 1
    discount = 1.0
    for t, rows in enumerate(layout.rows):
        running, following = layout.running[t], layout.running[t + 1]
        c = sorted_counts[:, :running]
        y = weight * ratios[rows][None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(
                total > 0, total / (ended + (c * y).sum(axis=1)), 0.0
            )  # the normalizer: the mean of y over all episodes, ended ones carried
        scale = np.where(np.isfinite(scale), scale, 0.0)
        y = y * scale[:, None]
        ended = ended * scale
        values += discount * ((c * y) @ terms[rows])
        if kept is not None:
            kept[rows] = y[0]
        ended = ended + (c[:, following:] * y[:, following:]).sum(axis=1)
        if following:
            next_rows = layout.rows[t + 1]
            weight = fit_ratios(c[:, :following], y[:, :following], features[next_rows], ridge)
        discount *= gamma
    with np.errstate(divide="ignore", invalid="ignore"):
        values = values / np.where(total > 0, total, 1.0)[:, None]
    return values, kept


def state_coverage(inputs: CpeInputs, options: CpeOptions) -> float:
    """The effective sample size, in episodes, of the marginal state-action weights ``y_t``
    of the evaluated policy (``marginalized``'s, without its bootstrap): how many of the
    logged episodes' states the policy's own would be worth. Few means the policy goes where
    the logger rarely went, so a model of its value extrapolates there (the sequential kinds'
    check, ``diagnostics``); 0 when every weight is 0."""
    starts = np.asarray(inputs.episode_starts)
    mu, _ = logged_propensities(inputs, options)
    ratios, _ = clip_weights(step_weights(inputs, mu), options, "per-step ratios")
    zeros = np.zeros((inputs.num_rows, 0))
    _, weights = marginal_values(
        np.ones((1, inputs.num_episodes)),
        step_layout(starts),
        ratios,
        zeros,
        ratio_features(inputs),
        float(options.gamma),
        REGRESSION_RIDGE,
        keep_weights=True,
    )
    ess = effective_sample_size(weights)
    return 0.0 if ess is None else ess * inputs.num_episodes / len(weights)


def marginalized(inputs: CpeInputs, options: CpeOptions) -> dict[str, MetricEstimate]:
    """``mis``: the evaluated policy's discounted return per episode (at ``options.gamma``; 1
    gives the undiscounted return over the logged horizon) by marginalized importance
    sampling (see the module's docstring), with a bootstrap interval that refits the ratio
    regressions in every resample. The ratios are fitted on ``inputs.features`` (the
    estimator puts a trainer's hidden layer there)."""
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    starts = np.asarray(inputs.episode_starts)
    mu, notes = logged_propensities(inputs, options)
    ratios, clip_notes = clip_weights(step_weights(inputs, mu), options, "per-step ratios")
    notes += clip_notes
    basis = ratio_features(inputs)
    layout = step_layout(starts)
    num_episodes = inputs.num_episodes
    lengths = np.diff(starts)
    step = np.arange(len(rewards)) - np.repeat(starts[:-1], lengths)
    discount = np.power(float(options.gamma), step.astype(np.float64))
    returns = episode_sums(discount[:, None] * rewards, starts)  # [E, M]
    scale = episode_sums(discount[:, None] * np.abs(rewards), starts).mean(axis=0)
    logged = returns.mean(axis=0)
    gamma = float(options.gamma)

    def values(counts: np.ndarray, keep_weights: bool = False):
        return marginal_values(
            counts, layout, ratios, rewards, basis, gamma, REGRESSION_RIDGE, keep_weights
        )

    value, weights = values(np.ones((1, num_episodes)), keep_weights=True)
    ess = effective_sample_size(weights)
    if ess is not None:
        ess *= num_episodes / len(weights)
    else:
        notes.append("every marginal weight is 0: the evaluated policy never took a logged action")
    samples = logged_samples = None
    if options.num_bootstrap > 0:
        pieces, logged_pieces = [], []
        for counts in bootstrap_blocks(num_episodes, options):
            pieces.append(values(counts)[0])
            logged_pieces.append(counts @ returns / num_episodes)
        samples, logged_samples = np.concatenate(pieces), np.concatenate(logged_pieces)
    return finish(inputs, options, value[0], samples, logged, logged_samples, scale, ess, notes)
