"""The counterfactual estimators as numpy formulas on the eval split's arrays.

Everything here is float64 numpy, vectorized over rows, episodes and metrics (the only Python
loops run over bootstrap blocks, MAGIC's metrics, or a handful of actions), so that the whole
evaluation of 1,000,000 rows in 10,000 episodes takes well under two seconds per estimator
(measured: docs/measurements.md#cpe_cost).

Notation: row ``i`` of episode ``e`` at step ``t`` (0-based) has the logged action ``a``, its
logged propensity ``mu = mu(a|s)``, the evaluated policy's probability ``pi = pi(a|s)``, the
importance weight ``w = pi / mu`` and, per metric, the reward ``r``. ``ModelValues`` gives per
row and metric the model's value of the logged action (``logged``: ``r_hat(s, a)`` or
``Q_hat(s, a)``) and its expectation under the evaluated policy (``expected``:
``sum_a' pi(a'|s) model(s, a')``, ``V_hat(s)`` for a Q model).

One-step kinds (every row one decision; the value of a row):

- ``dm``    = mean(expected)
- ``ips``   = mean(w r)
- ``snips`` = sum(w r) / sum(w)
- ``dr``    = mean(expected + w (r - logged))

Sequential kinds (per episode, cumulative weights ``rho_t = prod_{k<=t} w_k``, ``rho_-1 = 1``;
Jiang & Li 2016, Thomas & Brunskill 2016):

- ``sequential_dr`` = mean over episodes of
  ``sum_t gamma^t [rho_t r_t - (rho_t Q_hat(s_t, a_t) - rho_{t-1} V_hat(s_t))]``
- ``weighted_dr``: the same with ``rho_t`` divided by its mean over episodes at step ``t``
  (``rho_-1`` stays 1). An episode that ended before step ``t`` counts in that mean with its
  final weight carried (it sits in an absorbing state where every policy agrees, earning 0):
  this keeps the normalizer an estimate of ``E_mu[rho_t] = 1``. Counting only the episodes
  still running (Horizon's padding did, with weight 0) estimates ``P_pi(alive at t)`` instead,
  and biases the estimate wherever episode length depends on the policy.
- ``magic``: the ``j``-step weighted DR returns ``g_j`` (importance sampling up to step ``j``,
  the model after it; ``g_-1`` is the model alone, ``g_{L-1}`` is ``weighted_dr``) blended with
  weights ``x`` minimising ``x^T (Omega + b b^T) x`` under ``sum x = 1, x >= 0``: ``Omega`` is
  the covariance of the per-episode ``j``-step returns divided by the number of episodes (the
  covariance of the ``g_j``), ``b_j`` the distance from ``g_j`` to the bootstrap interval of
  ``weighted_dr`` at ``confidence`` (the normal-theory one when ``num_bootstrap`` is 0).
  Horizon's code used ``b * b`` elementwise and an unscaled covariance.

Marginalized importance sampling, no product of weights along an episode (its own module):

- ``mis`` = ``sum_t gamma^t mean_e[w_t(s_t) w r_t]``, ``w_t(s)`` the ratio of the two policies'
  state distributions at step ``t``, fitted step by step (``horizon_plugins_cpe.marginalized``).

The direct method over episodes, no importance weight (any policy, continuous ones included):

- ``fqe`` = mean over episodes of ``V_hat(s_0)``, the model's value of the first state
  (``direct_per_episode``; ``direct_per_decision`` is ``dm`` for a continuous policy).

Intervals: a percentile bootstrap over EPISODES (the rows of an episode are not independent):
``num_bootstrap`` resamples of the ``E`` episodes with replacement, drawn as a ``[B, E]`` count
matrix, each estimate recomputed from count-weighted per-episode (or per-step) sums. The
logged value and the relative value come from the same resamples. MAGIC's interval holds the
blend's weights at their full-data values (re-solving the blend per resample would need each
resample's covariance: ``B`` times the work for a second-order effect). ``dm`` refits its
reward model inside every resample where the model can (``ModelValues.refit``: the ridge
model of ``reward_model_values``, refit from per-episode Gram pieces, linear in the counts):
held fixed, ``dm``'s interval showed the states' sampling spread but not the model's own
estimation error, and covered the truth far less often than its 95% (measured:
docs/measurements.md#refit_kinds). ``dm`` values given without a refit (arrays) are held
fixed, and the estimate's note says so. ``dr`` holds its cross-fitted model fixed on purpose
(the model's error reaches it only at second order; ``REFIT_KINDS``), as the sequential
kinds hold their Q models. ``fqe`` refits its Q model per resample where the model offers it
(``ModelValues.start_refit``: the finite-horizon FQE at gamma 1, ``horizon_fqe``, within a
work budget that its note states); otherwise it holds it fixed, and says so.

Options: ``propensity_floor`` raises logged propensities below it (a zero, negative or NaN
propensity of a taken action is always an error, named by its row); ``weight_clip`` clips
each row's weight (one-step) or the cumulative weight (sequential). Either, when on, is said
in every estimate's note with the number of rows it changed.

Cost: a fraction of a second per kind on 1,000,000 rows in 10,000 episodes; the bootstrap
draws ``B x E`` episode indices, so a bandit log of as many one-row episodes takes seconds
(measured: docs/measurements.md#cpe_cost).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from horizon_engine import MIN_PROPENSITY, HorizonError

ONE_STEP_KINDS = ("dm", "ips", "snips", "dr")
SEQUENTIAL_KINDS = ("sequential_dr", "weighted_dr", "magic")
DIRECT_KINDS = ("fqe",)
"""Kinds that use no importance weight: the model's value of each episode's first state."""
MARGINALIZED_KINDS = ("mis",)
"""Kinds that weigh each step by the ratio of the policies' state distributions there, no
product along the episode (``horizon_plugins_cpe.marginalized``); they use no model."""
KINDS = ONE_STEP_KINDS + SEQUENTIAL_KINDS + DIRECT_KINDS + MARGINALIZED_KINDS

NEAR_ZERO = 1e-6
"""The logged value is "near zero" (no relative value is reported) when its magnitude is at
most this fraction of the rewards' own scale (mean ``|r|`` per row, or mean discounted
``sum |r|`` per episode): scale-free, where Horizon compared the mean reward with 1e-6."""

DENSE_STEP_LIMIT = 4
"""Per-step bootstrap sums use a dense ``[episodes, steps]`` layout when it holds at most this
many times the rows (BLAS matrix products), and a sparse one otherwise (one very long episode
among short ones)."""

BOOTSTRAP_BLOCK = 64
"""At most this many resamples are computed together."""

BOOTSTRAP_ENTRIES = 1 << 22
"""And at most this many count entries (or per-step sums) per block, 32 MB of float64: one-row
episodes of a bandit log make ``E`` the row count, and a ``[200, 1,000,000]`` count matrix
would take 1.6 GB at once. The blocks draw the same numbers as one matrix would."""


class CpeInputError(HorizonError):
    """The eval split cannot be evaluated as given (a bad logged propensity, a malformed
    episode layout, non-finite values); the message names the row and the value."""


@dataclass(frozen=True)
class CpeOptions:
    gamma: float = 1.0
    """Discount of the sequential estimators (and of the logged value they compare with)."""
    num_bootstrap: int = 200
    """Bootstrap resamples of episodes; 0 = no interval."""
    confidence: float = 0.95
    weight_clip: float | None = None
    """Clip importance weights at this value: each row's ``w`` for one-step kinds, the
    cumulative ``rho_t`` for sequential kinds."""
    propensity_floor: float | None = None
    """Logged propensities below it (but above 0) are raised to it."""
    seed: int = 0
    """The bootstrap's generator (and the models' episode folds)."""
    magic_j_steps: int = 25
    """How many ``j``-step returns MAGIC blends: ``j = -1`` and up to this many minus one steps
    spread evenly over ``0 .. L - 1`` (``L`` the longest episode), as Horizon's grid."""


@dataclass(frozen=True, eq=False)
class CpeInputs:
    """The eval split's rows in episode and step order, as numpy. Compared and hashed by
    identity (``eq=False``): field-wise equality of arrays has no single truth value."""

    episode_starts: np.ndarray
    """``[E + 1]`` int64: episode ``e`` is rows ``episode_starts[e]:episode_starts[e + 1]``."""
    rewards: np.ndarray
    """``[N, M]`` float64: column ``m`` is ``metric_names[m]``'s value per row."""
    metric_names: tuple[str, ...]
    """``("reward", *logged metrics)``."""
    action: np.ndarray
    """``[N]`` int64: the logged action's index (discrete action, or candidate slot)."""
    logged_propensity: np.ndarray
    """``[N]``: the logging policy's probability of that action (``action_probability``)."""
    target_probabilities: np.ndarray
    """``[N, A]``: the evaluated policy's probability of every action (0 where impossible)."""
    possible: np.ndarray
    """``[N, A]`` bool: the actions possible in that row."""
    features: np.ndarray
    """``[N, F]`` float64: state values (and presence columns), for the models."""
    row_label: Callable[[int], str] | None = None
    """Names row ``i`` in error messages (e.g. its ``mdp_id`` and ``sequence_number``);
    without it, the row is named by its index in the eval split, episode and step."""
    horizon: int | None = None
    """The most rows any logged episode has (``EvaluationEpisodes.horizon``): the
    undiscounted return is counted over that many steps, which the eval split's own longest
    episode may fall short of; None: the eval split's longest (``return_horizon``)."""

    @property
    def num_rows(self) -> int:
        return len(self.action)

    @property
    def num_episodes(self) -> int:
        return len(self.episode_starts) - 1

    @property
    def return_horizon(self) -> int:
        """The steps an undiscounted return is counted over: ``horizon``, and at least the
        eval split's longest episode."""
        longest = int(np.diff(np.asarray(self.episode_starts)).max())
        return max(longest, self.horizon or 0)

    def describe_row(self, row: int) -> str:
        starts = np.asarray(self.episode_starts)
        episode = int(np.searchsorted(starts, row, side="right")) - 1
        where = f"eval row {row} (episode {episode}, step {row - int(starts[episode])})"
        if self.row_label is not None:
            where += f" [{self.row_label(row)}]"
        return where


@dataclass(frozen=True, eq=False)
class ModelValues:
    """What the models say, per row and metric: the DM/DR/sequential-DR ingredients."""

    logged: np.ndarray
    """``[N, M]``: model value of the logged action (``r_hat(s, a)`` for one-step kinds,
    ``Q_hat(s, a)`` for sequential kinds)."""
    expected: np.ndarray
    """``[N, M]``: ``sum_a pi(a|s) model(s, a)``."""
    note: str | None = None
    """Anything the fit wants reported beside the estimates (e.g. FQE did not contract)."""
    refit: ResampledModel | None = None
    """The model refit inside each bootstrap resample (``reward_model_values`` gives one), so
    that ``dm``'s interval includes the model's own estimation error (``REFIT_KINDS``);
    without it (values given as arrays) that interval holds the model fixed, and says so."""
    start_refit: ResampledStartValues | None = None
    """``fqe``'s Q model refit inside each bootstrap resample (the finite-horizon FQE of
    ``horizon_fqe`` gives one), so that its interval includes the model's own estimation
    error; without it the interval holds the model fixed, and says so."""


class ResampledStartValues(Protocol):
    """A Q model whose first-state values are refit per bootstrap resample
    (``horizon_fqe.StartValueRefit``)."""

    def plan(self, num_bootstrap: int) -> tuple[int, str]:
        """How many of the first ``num_bootstrap`` resamples it refits (0: it holds the
        model fixed) and the note that says so."""

    def totals(self, counts: np.ndarray) -> np.ndarray:
        """``[B, M]``: ``sum_e c_e V_hat_b(s_0^e)`` for resamples ``counts [B, E]``."""


class ResampledModel(Protocol):
    """A one-step model that can be refit per bootstrap resample (``models.RidgeRefit``)."""

    @property
    def unavailable(self) -> str | None:
        """Why it cannot be refit on these data (the note then said), else None."""

    def sums(self, weights: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray]:
        """A function of resamples ``counts [B, E]`` giving ``[B, M]``: ``sum_e c_e sum_{i in
        e} (expected_b(i) - w_i logged_b(i))``, the model refit on resample ``b``; ``w`` the
        importance ``weights [N]`` (0 when None)."""


FIXED_MODEL = (
    "the interval holds the model's given values fixed across resamples, so it leaves out "
    "the model's own estimation error (narrower than it should be)"
)

REFIT_KINDS = ("dm",)
"""The kinds whose interval refits the model per resample (``ModelValues.refit``). ``dm``'s
value is the model's, so its error enters at first order: held fixed, the interval is too
narrow. ``dr``'s value moves with the model's error only at second order (the model
cross-fitted, the logged propensities known: its correction has mean zero for any fixed
model), so refitting it changes its coverage not at all and costs time every epoch (measured:
docs/measurements.md#refit_kinds). Its refit is exact and tested
(``tests/test_cpe_refit.py``): adding ``"dr"`` here turns it on."""


@dataclass(frozen=True)
class MetricEstimate:
    value: float
    low: float | None
    high: float | None
    """Interval at ``confidence`` (None when ``num_bootstrap = 0``)."""
    logged_value: float
    """The logged policy's value on the same data and scale: one-step, the mean reward per
    row; sequential, the mean discounted return per episode."""
    relative: float | None
    relative_low: float | None
    relative_high: float | None
    """``value / logged_value`` and its interval from the same resamples; None when the
    logged value is near zero (see ``note``)."""
    effective_sample_size: float | None
    """``(sum w)^2 / sum w^2`` of the importance weights the estimator uses: per row for
    one-step kinds, the episodes' final cumulative weights for sequential kinds."""
    note: str | None = None
    j_steps: tuple[int, ...] | None = None
    """MAGIC only: the ``j`` of each blended return (-1 = the model alone)."""
    magic_weights: tuple[float, ...] | None = None
    """MAGIC only: the blend's weight of each ``j``-step return."""
    difference_low: float | None = None
    difference_high: float | None = None
    """The interval of ``value - logged_value`` from the same resamples (None without one)."""


# --- checks and weights ----------------------------------------------------------------------


def check_inputs(inputs: CpeInputs) -> None:
    """Raise ``CpeInputError`` naming the first bad row for what no estimator can use."""
    starts = np.asarray(inputs.episode_starts)
    n = inputs.num_rows
    if starts.ndim != 1 or len(starts) < 2 or starts[0] != 0 or starts[-1] != n:
        raise CpeInputError(
            f"episode_starts must run from 0 to the row count {n} with one entry per episode "
            f"and one more; found {len(starts)} entries from "
            f"{starts[0] if len(starts) else None} to {starts[-1] if len(starts) else None}"
        )
    lengths = np.diff(starts)
    if (lengths <= 0).any():
        episode = int(np.argmax(lengths <= 0))
        raise CpeInputError(
            f"episode {episode} of the eval split has no rows (episode_starts[{episode}] = "
            f"{starts[episode]}, episode_starts[{episode + 1}] = {starts[episode + 1]})"
        )
    rewards, target = inputs.rewards, inputs.target_probabilities
    if rewards.shape != (n, len(inputs.metric_names)):
        raise CpeInputError(
            f"rewards has shape {rewards.shape}; expected ({n}, {len(inputs.metric_names)}) "
            f"for the metrics {inputs.metric_names}"
        )
    if target.ndim != 2 or target.shape[0] != n:
        raise CpeInputError(f"target_probabilities has shape {target.shape}; expected ({n}, A)")
    action = inputs.action
    bad = (action < 0) | (action >= target.shape[1])
    if bad.any():
        row = int(np.argmax(bad))
        raise CpeInputError(
            f"{inputs.describe_row(row)}: logged action index {int(action[row])} is outside "
            f"the {target.shape[1]} actions"
        )
    propensity = inputs.logged_propensity
    # The sources' floor (``MIN_PROPENSITY``): a row below it never reaches an eval split.
    bad = ~(propensity >= MIN_PROPENSITY) | ~np.isfinite(propensity)
    if bad.any():
        row = int(np.argmax(bad))
        raise CpeInputError(
            f"{inputs.describe_row(row)}: logged propensity {float(propensity[row])!r} for the "
            f"action taken (action {int(action[row])}); a taken action must have a finite "
            f"probability of at least {MIN_PROPENSITY:.4g} under the logging policy "
            f"({int(bad.sum())} such rows)"
        )
    for name, values in (("rewards", rewards), ("target_probabilities", target)):
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():
            row = int(np.argmin(finite))
            raise CpeInputError(f"{inputs.describe_row(row)}: {name} holds {values[row]!r}")
    if (target < 0).any():
        row = int(np.argmax((target < 0).any(axis=1)))
        raise CpeInputError(
            f"{inputs.describe_row(row)}: negative target probability in {target[row]!r}"
        )


def logged_propensities(inputs: CpeInputs, options: CpeOptions) -> tuple[np.ndarray, list[str]]:
    """``mu`` per row after the floor, and the note saying how many rows it raised."""
    mu = np.asarray(inputs.logged_propensity, dtype=np.float64)
    notes = []
    if options.propensity_floor is not None:
        raised = mu < options.propensity_floor
        count = int(raised.sum())
        mu = np.maximum(mu, options.propensity_floor)
        notes.append(f"propensity floor {options.propensity_floor:g} applied to {count} rows")
    return mu, notes


def step_weights(inputs: CpeInputs, mu: np.ndarray) -> np.ndarray:
    """``w = pi(a|s) / mu(a|s)`` per row (unclipped)."""
    target = np.take_along_axis(inputs.target_probabilities, inputs.action[:, None], axis=1)[:, 0]
    return target / mu


def clip_weights(weights: np.ndarray, options: CpeOptions, what: str) -> tuple[np.ndarray, list]:
    if options.weight_clip is None:
        return weights, []
    count = int((weights > options.weight_clip).sum())
    return (
        np.minimum(weights, options.weight_clip),
        [f"{what} clipped at {options.weight_clip:g} ({count} rows)"],
    )


def effective_sample_size(weights: np.ndarray) -> float | None:
    squares = float(np.dot(weights, weights))
    return float(weights.sum()) ** 2 / squares if squares > 0 else None


def episode_layout(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lengths [E], episode of each row [N], step of each row [N])``."""
    lengths = np.diff(starts)
    episode = np.repeat(np.arange(len(lengths)), lengths)
    step = np.arange(starts[-1]) - np.repeat(starts[:-1], lengths)
    return lengths, episode, step


def cumulative_weights(weights: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``rho_t = prod_{k<=t} w_k`` within each episode, for every row at once.

    A product of logs: zeros are counted apart (a zero anywhere before makes ``rho`` 0) and the
    logs of the other weights are summed along all rows, each episode's sum taken from its own
    start. Summing over 1e6 rows loses about 1e-16 of the running total's size: a relative
    error near 1e-10 in ``rho`` at worst, far below anything an estimate shows.
    """
    lengths = np.diff(starts)
    zero = weights == 0
    logs = np.log(np.where(zero, 1.0, weights))
    log_sum = np.cumsum(logs)
    zero_count = np.cumsum(zero)
    first = starts[:-1]
    before_log = np.repeat(log_sum[first] - logs[first], lengths)
    before_zero = np.repeat(zero_count[first] - zero[first], lengths)
    with np.errstate(over="ignore"):
        rho = np.exp(log_sum - before_log)
    return np.where(zero_count - before_zero > 0, 0.0, rho)


# --- the bootstrap ---------------------------------------------------------------------------


def bootstrap_blocks(num_episodes: int, options: CpeOptions, width: int = 0):
    """The ``[B, E]`` float64 count matrix of ``B = num_bootstrap`` resamples (how often each
    episode is drawn when ``E`` episodes are drawn with replacement; each row sums to ``E``),
    yielded in blocks of rows, each at most ``BOOTSTRAP_BLOCK`` rows and
    ``BOOTSTRAP_ENTRIES`` entries of ``max(E, width)`` per row. The generator is seeded once,
    so the resamples are the same whatever the blocks."""
    rng = np.random.default_rng(options.seed)
    rows = max(1, min(BOOTSTRAP_BLOCK, BOOTSTRAP_ENTRIES // max(num_episodes, width, 1)))
    for start in range(0, options.num_bootstrap, rows):
        b = min(rows, options.num_bootstrap - start)
        dtype = np.int32 if b * num_episodes < 2**31 else np.int64  # a quarter faster
        draws = rng.integers(0, num_episodes, size=(b, num_episodes), dtype=dtype)
        draws += (np.arange(b, dtype=dtype) * num_episodes)[:, None]
        counts = np.bincount(draws.ravel(), minlength=b * num_episodes)
        yield counts.reshape(b, num_episodes).astype(np.float64)


def bootstrap_counts(num_episodes: int, options: CpeOptions) -> np.ndarray:
    """All of ``bootstrap_blocks`` as one ``[B, E]`` matrix."""
    blocks = list(bootstrap_blocks(num_episodes, options))
    return np.concatenate(blocks) if blocks else np.zeros((0, num_episodes))


def percentile_interval(samples: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``samples [B, M]``: the ``(1 -+ confidence) / 2`` quantiles."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(samples, [tail, 1.0 - tail], axis=0)
    return low, high


def episode_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``[E, ...]``: the sum of ``values [N, ...]`` over each episode's rows."""
    return np.add.reduceat(values, starts[:-1], axis=0)


# --- results ---------------------------------------------------------------------------------


def finish(
    inputs: CpeInputs,
    options: CpeOptions,
    value: np.ndarray,
    samples: np.ndarray | None,
    logged: np.ndarray,
    logged_samples: np.ndarray | None,
    scale: np.ndarray,
    ess: float | None,
    notes: list[str],
    extra: list[dict] | None = None,
) -> dict[str, MetricEstimate]:
    """One ``MetricEstimate`` per metric from the point estimates ``[M]``, the bootstrap
    samples ``[B, M]`` (or None) of the estimate and of the logged value, and the rewards'
    scale ``[M]`` that decides what "near zero" means."""
    low = high = rel_low = rel_high = diff_low = diff_high = None
    if samples is not None and len(samples):
        low, high = percentile_interval(samples, options.confidence)
        diff_low, diff_high = percentile_interval(samples - logged_samples, options.confidence)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel_low, rel_high = percentile_interval(samples / logged_samples, options.confidence)
    results = {}
    for m, name in enumerate(inputs.metric_names):
        metric_notes = list(notes)
        near_zero = abs(logged[m]) <= NEAR_ZERO * scale[m] or logged[m] == 0
        relative = relative_low = relative_high = None
        if near_zero:
            metric_notes.append(f"logged value near zero ({logged[m]:.3g}): no relative value")
        else:
            relative = float(value[m] / logged[m])
            if low is not None:
                crosses = (logged_samples[:, m] <= 0).any() and (logged_samples[:, m] >= 0).any()
                if crosses:
                    metric_notes.append(
                        "the logged value's resamples include zero: no relative interval"
                    )
                else:
                    relative_low, relative_high = float(rel_low[m]), float(rel_high[m])
        results[name] = MetricEstimate(
            value=float(value[m]),
            low=None if low is None else float(low[m]),
            high=None if high is None else float(high[m]),
            logged_value=float(logged[m]),
            relative=relative,
            relative_low=relative_low,
            relative_high=relative_high,
            effective_sample_size=ess,
            note="; ".join(metric_notes) or None,
            difference_low=None if diff_low is None else float(diff_low[m]),
            difference_high=None if diff_high is None else float(diff_high[m]),
            **(extra[m] if extra else {}),
        )
    return results


# --- one-step --------------------------------------------------------------------------------


def one_step(
    kind: str, inputs: CpeInputs, models: ModelValues | None, options: CpeOptions
) -> dict[str, MetricEstimate]:
    starts = np.asarray(inputs.episode_starts)
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    mu, notes = logged_propensities(inputs, options)
    weights, clip_notes = clip_weights(step_weights(inputs, mu), options, "importance weights")
    notes += clip_notes
    ess = None
    if kind == "dm":
        notes = []  # neither floor nor clip touches the direct method
        per_row = models.expected
    elif kind in ("ips", "snips"):
        per_row = weights[:, None] * rewards
        ess = effective_sample_size(weights)
    else:  # dr
        per_row = models.expected + weights[:, None] * (rewards - models.logged)
        ess = effective_sample_size(weights)
    lengths = np.diff(starts).astype(np.float64)
    n = float(starts[-1])
    numerator = episode_sums(per_row, starts)  # [E, M]
    logged_sums = episode_sums(rewards, starts)
    denominator = episode_sums(weights, starts) if kind == "snips" else lengths
    with np.errstate(divide="ignore", invalid="ignore"):
        value = numerator.sum(axis=0) / denominator.sum()
    logged = logged_sums.sum(axis=0) / n
    samples = logged_samples = None
    if options.num_bootstrap > 0:
        resampled, corrections = _refit_sums(kind, inputs, models, weights, notes)
        pieces, logged_pieces = [], []
        with np.errstate(divide="ignore", invalid="ignore"):
            for counts in bootstrap_blocks(inputs.num_episodes, options):
                if resampled is None:
                    totals = counts @ numerator
                else:
                    totals = resampled(counts)
                    if corrections is not None:
                        totals += counts @ corrections
                pieces.append(totals / (counts @ denominator)[:, None])
                logged_pieces.append((counts @ logged_sums) / (counts @ lengths)[:, None])
        samples, logged_samples = np.concatenate(pieces), np.concatenate(logged_pieces)
    if kind == "snips" and denominator.sum() == 0:
        notes.append(
            "every importance weight is 0: the evaluated policy never took a logged action"
        )
    scale = np.abs(rewards).mean(axis=0)
    return finish(inputs, options, value, samples, logged, logged_samples, scale, ess, notes)


def _refit_sums(
    kind: str, inputs: CpeInputs, models: ModelValues | None, weights: np.ndarray, notes: list
) -> tuple[Callable | None, np.ndarray | None]:
    """For the ``REFIT_KINDS`` with a model that refits (``ModelValues.refit``): its
    resampled sums (``ResampledModel.sums``) and, for ``dr``, each episode's ``sum_i w_i
    r_i`` (the part of its value the model does not touch); else ``(None, None)``, with a
    note where the model is held fixed."""
    if kind not in REFIT_KINDS:
        return None, None
    refit = models.refit
    reason = FIXED_MODEL if refit is None else refit.unavailable
    if reason is not None:
        notes.append(reason)
        return None, None
    if kind == "dm":
        return refit.sums(None), None
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    corrections = episode_sums(weights[:, None] * rewards, np.asarray(inputs.episode_starts))
    return refit.sums(weights), corrections


# --- sequential ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Episodes:
    """The per-row arrays every sequential kind needs, built once per call."""

    starts: np.ndarray
    lengths: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    gamma: float
    discount: np.ndarray
    """``gamma^t`` per row."""
    rho: np.ndarray
    """The cumulative weight per row (clipped when asked)."""
    rho_prev: np.ndarray
    """``rho_{t-1}`` per row (1 at ``t = 0``)."""
    notes: list

    @property
    def longest(self) -> int:
        return int(self.lengths.max())


def sequential_episodes(inputs: CpeInputs, options: CpeOptions) -> Episodes:
    starts = np.asarray(inputs.episode_starts)
    lengths, episode, step = episode_layout(starts)
    mu, notes = logged_propensities(inputs, options)
    rho = cumulative_weights(step_weights(inputs, mu), starts)
    rho, clip_notes = clip_weights(rho, options, "cumulative importance weights")
    rho_prev = np.empty_like(rho)
    rho_prev[1:] = rho[:-1]
    rho_prev[starts[:-1]] = 1.0
    gamma = float(options.gamma)
    discount = np.power(gamma, step.astype(np.float64))
    return Episodes(
        starts, lengths, episode, step, gamma, discount, rho, rho_prev, notes + clip_notes
    )


def step_layout(ep: Episodes, values: np.ndarray, dense: bool | None = None):
    """A function of resamples ``counts [B, E]`` giving ``[B, T, K]``: ``sum_e counts[b, e] *
    values[row of (e, t), k]`` over the episodes still running at step ``t``, for ``values
    [N, K]``. The layout is built once: a dense ``[E, T K]`` array (BLAS products) when it
    holds at most ``DENSE_STEP_LIMIT`` times the rows, a sparse matrix otherwise (one very long
    episode among short ones); ``dense`` forces one (for tests)."""
    num_episodes, steps, k = len(ep.lengths), ep.longest, values.shape[1]
    if dense is None:
        dense = num_episodes * steps <= DENSE_STEP_LIMIT * len(ep.step)
    if dense:
        layout = np.zeros((num_episodes, steps, k))
        layout[ep.episode, ep.step] = values
        layout = layout.reshape(num_episodes, steps * k)
        return lambda counts: (counts @ layout).reshape(-1, steps, k)
    from scipy import sparse

    rows = (ep.step[:, None] * k + np.arange(k)).ravel()
    columns = np.repeat(ep.episode, k)
    layout = sparse.csr_matrix((values.ravel(), (rows, columns)), shape=(steps * k, num_episodes))
    return lambda counts: np.asarray(layout @ counts.T).T.reshape(-1, steps, k)


def per_step_sums(
    counts: np.ndarray, ep: Episodes, values: np.ndarray, dense: bool | None = None
) -> np.ndarray:
    """``step_layout(ep, values, dense)(counts)``."""
    return step_layout(ep, values, dense)(counts)


class WeightedTerms:
    """Weighted DR step by step, for any resamples ``counts [B, E]`` (``[[1] * E]`` for the
    data itself); what does not depend on the resample is built once. A call returns

    - ``u [B, T, M]``: step ``t``'s term, ``gamma^t (sum_e c_e rho_t (r_t - Q_t) / D_t +
      sum_e c_e rho_{t-1} V_t / D_{t-1}) / sum_e c_e``; weighted DR is ``u.sum(axis=1)``;
    - ``v [B, T + 1, M]``: the second half of ``u`` alone (the model's value after ``t``
      importance-sampled steps), 0 at ``T``; MAGIC's ``g_j = u[:, :j + 1].sum() + v[:, j + 1]``;
    - ``D [B, T]``: the mean cumulative weight at each step, ended episodes carried at their
      final weight (``D_-1 = 1``). A step where every weight is 0 contributes 0 (0 / 0).
    """

    def __init__(self, ep: Episodes, rewards: np.ndarray, models: ModelValues) -> None:
        self.metrics = rewards.shape[1]
        self.steps = ep.longest
        values = np.concatenate(
            [
                ep.rho[:, None],
                ep.rho[:, None] * (rewards - models.logged),
                ep.rho_prev[:, None] * models.expected,
            ],
            axis=1,
        )
        self.sums = step_layout(ep, values)
        # An ended episode keeps its final weight in the normalizer: at step t, add the final
        # weights of the episodes no longer than t. ``ended`` [T + 1, E] holds each episode's
        # final weight at its length: a product with the counts, summed over the steps.
        from scipy import sparse

        num_episodes = len(ep.lengths)
        self.ended = sparse.csr_matrix(
            (ep.rho[ep.starts[1:] - 1], (ep.lengths, np.arange(num_episodes))),
            shape=(self.steps + 1, num_episodes),
        )
        self.powers = ep.gamma ** np.arange(self.steps, dtype=np.float64)

    def __call__(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, b = self.metrics, len(counts)
        sums = self.sums(counts)  # [B, T, 1 + 2M]
        carried = np.cumsum(np.asarray(self.ended @ counts.T), axis=0)[: self.steps].T
        total = counts.sum(axis=1)[:, None]
        mean_weight = (sums[:, :, 0] + carried) / total
        previous = np.concatenate([np.ones((b, 1)), mean_weight[:, :-1]], axis=1)
        powers = self.powers[None, :, None] / total[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            current = np.where(
                mean_weight[:, :, None] > 0, sums[:, :, 1 : 1 + m] / mean_weight[:, :, None], 0.0
            )
            model = np.where(
                previous[:, :, None] > 0, sums[:, :, 1 + m :] / previous[:, :, None], 0.0
            )
        v = model * powers
        u = current * powers + v
        return u, np.concatenate([v, np.zeros((b, 1, m))], axis=1), mean_weight


def magic_j_steps(longest: int, count: int) -> np.ndarray:
    """MAGIC's grid: ``-1`` (the model alone) and ``count - 1`` steps spread evenly over
    ``0 .. longest - 1`` (rounded down, duplicates dropped), always ending at ``longest - 1``
    (weighted DR)."""
    spread = np.floor(np.linspace(0, longest - 1, max(count - 1, 1))).astype(np.int64)
    return np.unique(np.concatenate([[-1], spread, [longest - 1]]))


def j_step_returns(u: np.ndarray, v: np.ndarray, j_steps: np.ndarray) -> np.ndarray:
    """``[B, J, M]``: ``g_j`` for each ``j`` of the grid from ``weighted_terms``' ``u, v``."""
    cumulative = np.concatenate([np.zeros_like(u[:, :1]), np.cumsum(u, axis=1)], axis=1)
    return cumulative[:, j_steps + 1] + v[:, j_steps + 1]


def episode_j_step_returns(
    ep: Episodes,
    rewards: np.ndarray,
    models: ModelValues,
    mean_weight: np.ndarray,
    j_steps: np.ndarray,
) -> np.ndarray:
    """``[E, J, M]``: each episode's ``j``-step weighted return, the quantity whose mean over
    episodes is ``g_j``: ``sum_{t <= j} gamma^t (rho_t (r_t - Q_t) / D_t + rho_{t-1} V_t /
    D_{t-1}) + gamma^{j+1} rho_j V_{j+1} / D_j`` (terms past the episode's end are 0)."""
    d = mean_weight[ep.step]
    d_prev = np.where(ep.step > 0, mean_weight[np.maximum(ep.step - 1, 0)], 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        current = np.where(d > 0, ep.rho / d, 0.0)[:, None] * (rewards - models.logged)
        model = np.where(d_prev > 0, ep.rho_prev / d_prev, 0.0)[:, None] * models.expected
    model *= ep.discount[:, None]
    per_row = current * ep.discount[:, None] + model
    cumulative = np.cumsum(per_row, axis=0)
    first = ep.starts[:-1]
    before = cumulative[first] - per_row[first]  # [E, M]
    last = np.minimum(j_steps[None, :], ep.lengths[:, None] - 1)  # [E, J]
    rows = first[:, None] + last
    returns = np.where((j_steps >= 0)[None, :, None], cumulative[rows] - before[:, None, :], 0.0)
    following = j_steps[None, :] + 1 < ep.lengths[:, None]
    next_rows = np.where(following, first[:, None] + j_steps[None, :] + 1, 0)
    return returns + np.where(following[:, :, None], model[next_rows], 0.0)


def magic_weights(error: np.ndarray) -> np.ndarray:
    """``x`` minimising ``x^T error x`` under ``sum x = 1``, ``x >= 0``.

    The matrix is scaled to unit trace (which moves no minimum) and written as a least-squares
    problem, ``|S x|^2 + mu (1^T x - 1)^2`` with ``S^T S = error`` (from its eigenvalues, so a
    singular covariance is fine) and the sum held by a row weighted ``mu = 1e6``; scipy's
    ``nnls`` (Lawson-Hanson, an exact active-set method) finds the support. The support is
    then solved exactly, ``x_S = error_SS^-1 1 / (1^T error_SS^-1 1)``, and corrected until
    the KKT conditions hold (a negative weight leaves the support, an outside return whose
    gradient is below the support's joins it). Should that not settle, scipy's SLSQP on the
    constrained problem decides. The first route is the fast one (measured:
    docs/measurements.md#magic_weights).
    """
    from scipy.optimize import nnls

    size = len(error)
    trace = float(np.trace(error))
    if not np.isfinite(trace) or trace <= 0:
        weights = np.zeros(size)
        weights[-1] = 1.0
        return weights
    scaled = (error + error.T) / (2 * trace)
    eigenvalues, eigenvectors = np.linalg.eigh(scaled)
    root = np.sqrt(np.clip(eigenvalues, 0.0, None))[:, None] * eigenvectors.T
    penalty = 1e3  # sqrt(mu)
    design = np.vstack([root, np.full((1, size), penalty)])
    target = np.zeros(size + 1)
    target[-1] = penalty
    try:
        start, _ = nnls(design, target)
    except RuntimeError:
        start = np.zeros(size)
    if start.sum() > 0:
        exact = _active_set_polish(scaled, start > 0)
        if exact is not None:
            return exact
    return _slsqp_weights(scaled)


def _slsqp_weights(scaled: np.ndarray) -> np.ndarray:
    """The blend by scipy's SLSQP (the fallback of ``magic_weights``), polished when the
    exact solve on its support is feasible and no worse."""
    from scipy.optimize import minimize

    size = len(scaled)
    result = minimize(
        lambda x: x @ scaled @ x,
        np.full(size, 1.0 / size),
        jac=lambda x: 2 * scaled @ x,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * size,
        constraints=[
            {"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones_like(x)}
        ],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    weights = np.clip(result.x, 0.0, None)
    weights /= weights.sum()
    exact = _active_set_polish(scaled, weights > 1e-6)
    if exact is not None and exact @ scaled @ exact <= weights @ scaled @ weights + 1e-15:
        return exact
    return weights


def _active_set_polish(matrix: np.ndarray, support: np.ndarray) -> np.ndarray | None:
    """The exact minimiser on the simplex reached from ``support`` by the KKT corrections of
    ``magic_weights``; None when they do not settle (a singular block, or a cycle)."""
    support = support.copy()
    for _ in range(2 * len(matrix) + 2):
        if not support.any():
            return None
        block = matrix[np.ix_(support, support)]
        try:
            solved = np.linalg.solve(block, np.ones(int(support.sum())))
        except np.linalg.LinAlgError:
            return None
        if not np.isfinite(solved).all() or solved.sum() <= 0:
            return None
        x = np.zeros(len(matrix))
        x[support] = solved / solved.sum()
        if (x < 0).any():
            support &= x > 0
            continue
        gradient = matrix @ x
        level = float(gradient[support].mean())
        outside = np.where(support, np.inf, gradient)
        joining = int(np.argmin(outside))
        if outside[joining] < level - 1e-12 * max(abs(level), 1e-300):
            support[joining] = True
            continue
        return x
    return None


def sequential(
    kind: str, inputs: CpeInputs, models: ModelValues, options: CpeOptions
) -> dict[str, MetricEstimate]:
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    ep = sequential_episodes(inputs, options)
    notes = list(ep.notes)
    num_episodes = inputs.num_episodes
    returns = episode_sums(ep.discount[:, None] * rewards, ep.starts)  # [E, M]
    scale = episode_sums(ep.discount[:, None] * np.abs(rewards), ep.starts).mean(axis=0)
    logged = returns.mean(axis=0)
    ess = effective_sample_size(ep.rho[ep.starts[1:] - 1])
    resampled = options.num_bootstrap > 0
    per_episode_totals = [returns]
    if kind == "sequential_dr":
        per_row = ep.discount[:, None] * (
            ep.rho[:, None] * (rewards - models.logged) + ep.rho_prev[:, None] * models.expected
        )
        totals = episode_sums(per_row, ep.starts)
        per_episode_totals.append(totals)
        value = totals.mean(axis=0)
    else:
        weighted_terms = WeightedTerms(ep, rewards, models)
        u, v, mean_weight = weighted_terms(np.ones((1, num_episodes)))
        j_steps = (
            magic_j_steps(ep.longest, options.magic_j_steps)
            if kind == "magic"
            else np.array([ep.longest - 1])
        )
        g = j_step_returns(u, v, j_steps)[0]  # [J, M]
    logged_samples = samples = g_samples = None
    if resampled:
        # one pass over the resamples: the logged value (and sequential DR) are linear in the
        # per-episode totals; weighted DR needs each resample's per-step sums
        width = 0 if kind == "sequential_dr" else ep.longest * (1 + 2 * len(logged))
        linear, nonlinear = [], []
        for counts in bootstrap_blocks(num_episodes, options, width):
            linear.append([counts @ totals / num_episodes for totals in per_episode_totals])
            if kind != "sequential_dr":
                ub, vb, _ = weighted_terms(counts)
                nonlinear.append(j_step_returns(ub, vb, j_steps))
        logged_samples = np.concatenate([piece[0] for piece in linear])
        if kind == "sequential_dr":
            samples = np.concatenate([piece[1] for piece in linear])
        else:
            g_samples = np.concatenate(nonlinear)  # [B, J, M]
    if kind == "sequential_dr":
        return finish(inputs, options, value, samples, logged, logged_samples, scale, ess, notes)
    if kind == "weighted_dr":
        samples = None if g_samples is None else g_samples[:, -1]
        return finish(inputs, options, g[-1], samples, logged, logged_samples, scale, ess, notes)

    # MAGIC: the blend per metric.
    per_episode = episode_j_step_returns(ep, rewards, models, mean_weight[0], j_steps)
    if g_samples is not None:
        low, high = percentile_interval(g_samples[:, -1], options.confidence)
    else:
        from scipy.stats import norm

        half = norm.ppf((1 + options.confidence) / 2) * per_episode[:, -1].std(axis=0, ddof=1)
        low = g[-1] - half / np.sqrt(num_episodes)
        high = g[-1] + half / np.sqrt(num_episodes)
    value = np.empty(rewards.shape[1])
    samples = None if g_samples is None else np.empty((len(g_samples), rewards.shape[1]))
    extra = []
    for m in range(rewards.shape[1]):
        bias = np.maximum(0.0, np.maximum(low[m] - g[:, m], g[:, m] - high[m]))
        omega = magic_covariance(per_episode[:, :, m])
        x = magic_weights(omega + np.outer(bias, bias))
        value[m] = x @ g[:, m]
        if samples is not None:
            samples[:, m] = g_samples[:, :, m] @ x
        extra.append(
            {"j_steps": tuple(int(j) for j in j_steps), "magic_weights": tuple(float(w) for w in x)}
        )
    return finish(inputs, options, value, samples, logged, logged_samples, scale, ess, notes, extra)


def magic_covariance(per_episode: np.ndarray) -> np.ndarray:
    """``Omega [J, J]``: the covariance of the per-episode ``j``-step returns ``[E, J]``
    divided by the number of episodes ``E`` (the covariance of their means, the ``g_j``)."""
    count = len(per_episode)
    if count < 2:
        return np.zeros((per_episode.shape[1],) * 2)
    return np.atleast_2d(np.cov(per_episode, rowvar=False, ddof=1)) / count


# --- the entry point -------------------------------------------------------------------------


def estimate(
    kind: str, inputs: CpeInputs, models: ModelValues | None, options: CpeOptions
) -> dict[str, MetricEstimate]:
    """``kind``'s estimate of the evaluated policy's value for every metric, by metric name.

    ``models`` is ``reward_model_values(inputs, options)`` for one-step kinds and
    ``q_model_values(inputs, options)`` for sequential kinds (``horizon_plugins_cpe.models``);
    None fits them here (it may stay None for ``ips`` and ``snips``, which use none).
    Raises ``CpeInputError`` for input no estimator can use, naming the row.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown CPE kind {kind!r}; expected one of {KINDS}")
    check_inputs(inputs)
    if kind in MARGINALIZED_KINDS:
        from horizon_plugins_cpe.marginalized import marginalized

        return marginalized(inputs, options)
    if models is None and kind not in ("ips", "snips"):
        from horizon_plugins_cpe import models as fitting

        fit = fitting.reward_model_values if kind in ONE_STEP_KINDS else fitting.q_model_values
        models = fit(inputs, options)
    if kind in ONE_STEP_KINDS:
        results = one_step(kind, inputs, models, options)
    elif kind in DIRECT_KINDS:
        results = direct_per_episode(inputs, models.expected, options, models.start_refit)
    else:
        results = sequential(kind, inputs, models, options)
    if models is not None and models.note:
        results = {name: _with_note(result, models.note) for name, result in results.items()}
    return results


# --- the direct method: models alone -----------------------------------------------------------


def direct_per_decision(
    inputs: Any, expected: np.ndarray, options: CpeOptions
) -> dict[str, MetricEstimate]:
    """The model's reward of the evaluated policy's action, per decision (row): ``dm`` where
    there are no probabilities to weigh the logged actions by (continuous actions).
    ``inputs`` needs ``episode_starts``, ``rewards`` and ``metric_names``; ``expected [N, M]``
    is the model's value of each row's state and the policy's action there."""
    starts = np.asarray(inputs.episode_starts)
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    per_episode = episode_sums(expected, starts)
    logged_sums = episode_sums(rewards, starts)
    scale = np.abs(rewards).mean(axis=0)
    lengths = np.diff(starts).astype(np.float64)
    return _direct(inputs, options, per_episode, logged_sums, lengths, scale)


def direct_per_episode(
    inputs: Any,
    expected: np.ndarray,
    options: CpeOptions,
    refit: ResampledStartValues | None = None,
) -> dict[str, MetricEstimate]:
    """``fqe``: the evaluated policy's discounted return per episode as the Q model says it,
    ``V_hat(s_0) = sum_a pi(a | s_0) Q_hat(s_0, a)`` (or ``Q_hat(s_0, pi(s_0))`` for a
    continuous policy) at each episode's first row, beside the logged discounted return.
    No importance weight enters, so it applies to any policy, deterministic or continuous, and
    is only as good as the model. ``expected [N, M]`` is the model's value of each row's state
    under the policy; ``refit`` (``ModelValues.start_refit``), where given, refits the model
    inside the bootstrap's resamples."""
    starts = np.asarray(inputs.episode_starts)
    rewards = np.asarray(inputs.rewards, dtype=np.float64)
    lengths = np.diff(starts)
    step = np.arange(len(rewards)) - np.repeat(starts[:-1], lengths)
    discount = options.gamma ** step.astype(np.float64)
    returns = episode_sums(discount[:, None] * rewards, starts)  # [E, M]
    scale = episode_sums(discount[:, None] * np.abs(rewards), starts).mean(axis=0)
    ones = np.ones(len(lengths))
    return _direct(inputs, options, expected[starts[:-1]], returns, ones, scale, refit)


def _direct(
    inputs: Any,
    options: CpeOptions,
    per_episode: np.ndarray,
    logged_per_episode: np.ndarray,
    units: np.ndarray,
    scale: np.ndarray,
    refit: ResampledStartValues | None = None,
) -> dict[str, MetricEstimate]:
    """A direct method's estimate: the model's total per episode ``[E, M]`` and the logged
    one, each over the episodes' ``units`` ``[E]`` (rows, or 1 an episode), with a bootstrap
    over episodes that refits the model in the resamples ``refit`` plans (its first ones, the
    logged value from the same), else holds the model's values fixed."""
    value = per_episode.sum(axis=0) / units.sum()
    logged = logged_per_episode.sum(axis=0) / units.sum()
    samples = logged_samples = None
    notes = []
    if options.num_bootstrap > 0:
        refits, note = (0, FIXED_MODEL) if refit is None else refit.plan(options.num_bootstrap)
        notes.append(note)
        kept = refits or options.num_bootstrap
        pieces, logged_pieces = [], []
        for counts in bootstrap_blocks(len(units), options):
            counts = counts[: kept - sum(map(len, pieces))]
            if not len(counts):
                break
            drawn = (counts @ units)[:, None]
            totals = refit.totals(counts) if refits else counts @ per_episode
            pieces.append(totals / drawn)
            logged_pieces.append((counts @ logged_per_episode) / drawn)
        samples, logged_samples = np.concatenate(pieces), np.concatenate(logged_pieces)
    return finish(inputs, options, value, samples, logged, logged_samples, scale, None, notes)


def _with_note(result: MetricEstimate, note: str) -> MetricEstimate:
    from dataclasses import replace

    return replace(result, note="; ".join(filter(None, [result.note, note])))
