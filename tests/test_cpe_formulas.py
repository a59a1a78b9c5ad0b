"""The CPE formulas against plain, loop-by-loop numpy computations of the same definitions.

Every reference below is written the obvious way (Python loops over episodes, steps and
bootstrap resamples, the resampled data rebuilt as a list of episodes) on small random data,
and the vectorized estimators must agree with it to 1e-6 (float64 arithmetic in a different
order agrees to about 1e-12; 1e-6 leaves room for the log-sum cumulative weights and nothing
else). MAGIC's blend is checked against a direct solve of its quadratic programme.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from horizon_engine import HorizonError
from horizon_plugins_cpe import formulas
from horizon_plugins_cpe.formulas import (
    NEAR_ZERO,
    ONE_STEP_KINDS,
    SEQUENTIAL_KINDS,
    CpeInputError,
    CpeInputs,
    CpeOptions,
    ModelValues,
    bootstrap_counts,
    cumulative_weights,
    estimate,
    magic_j_steps,
    magic_weights,
    per_step_sums,
    sequential_episodes,
)
from horizon_plugins_cpe.models import fit_fqe, q_model_values, reward_model_values

TOLERANCE = 1e-6


def random_data(
    seed: int, episodes: int = 40, actions: int = 3, metrics: int = 2, longest: int = 7
) -> tuple[CpeInputs, ModelValues]:
    """Episodes of 1 to ``longest`` rows, a random logging policy, a random target policy,
    rewards around 1, and model values that are random numbers (the formulas must not care
    where they come from)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest + 1, episodes)
    lengths[0] = longest
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(starts[-1])
    logging = rng.dirichlet(np.full(actions, 2.0), n)
    action = (rng.random((n, 1)) > logging.cumsum(axis=1)).sum(axis=1).astype(np.int64)
    target = rng.dirichlet(np.ones(actions), n)
    inputs = CpeInputs(
        episode_starts=starts,
        rewards=rng.normal(1.0, 1.0, (n, metrics)),
        metric_names=("reward", *(f"metric_{m}" for m in range(1, metrics))),
        action=action,
        logged_propensity=logging[np.arange(n), action],
        target_probabilities=target,
        possible=np.ones((n, actions), dtype=bool),
        features=rng.normal(size=(n, 3)),
    )
    models = ModelValues(
        logged=rng.normal(1.0, 0.5, (n, metrics)), expected=rng.normal(1.0, 0.5, (n, metrics))
    )
    return inputs, models


def episodes_of(inputs: CpeInputs) -> list[range]:
    starts = inputs.episode_starts
    return [range(starts[e], starts[e + 1]) for e in range(len(starts) - 1)]


def resampled(inputs: CpeInputs, options: CpeOptions) -> list[list[range]]:
    """Each bootstrap resample as a plain list of episodes (repeated as often as drawn)."""
    episodes = episodes_of(inputs)
    counts = bootstrap_counts(len(episodes), options)
    return [
        [episodes[e] for e in range(len(episodes)) for _ in range(int(row[e]))] for row in counts
    ]


def weight(inputs: CpeInputs, i: int, options: CpeOptions, clip: bool = True) -> float:
    mu = inputs.logged_propensity[i]
    if options.propensity_floor is not None:
        mu = max(mu, options.propensity_floor)
    w = inputs.target_probabilities[i, inputs.action[i]] / mu
    if clip and options.weight_clip is not None:
        w = min(w, options.weight_clip)
    return w


# --- plain references ------------------------------------------------------------------------


def plain_one_step(kind, inputs, models, options, episodes, m):
    rows = [i for episode in episodes for i in episode]
    r = inputs.rewards
    if kind == "dm":
        return sum(models.expected[i, m] for i in rows) / len(rows)
    if kind == "ips":
        return sum(weight(inputs, i, options) * r[i, m] for i in rows) / len(rows)
    if kind == "snips":
        return sum(weight(inputs, i, options) * r[i, m] for i in rows) / sum(
            weight(inputs, i, options) for i in rows
        )
    total = 0.0
    for i in rows:
        w = weight(inputs, i, options)
        total += models.expected[i, m] + w * (r[i, m] - models.logged[i, m])
    return total / len(rows)


def plain_logged_one_step(inputs, episodes, m):
    rows = [i for episode in episodes for i in episode]
    return sum(inputs.rewards[i, m] for i in rows) / len(rows)


def plain_rhos(inputs, episode, options):
    """The cumulative weights of one episode (clipped cumulatively when asked)."""
    rhos, product = [], 1.0
    for i in episode:
        product *= weight(inputs, i, options, clip=False)
        rho = product if options.weight_clip is None else min(product, options.weight_clip)
        rhos.append(rho)
    return rhos


def plain_sequential_dr(inputs, models, options, episodes, m):
    total = 0.0
    for episode in episodes:
        rhos = plain_rhos(inputs, episode, options)
        for t, i in enumerate(episode):
            previous = 1.0 if t == 0 else rhos[t - 1]
            total += options.gamma**t * (
                rhos[t] * inputs.rewards[i, m]
                - (rhos[t] * models.logged[i, m] - previous * models.expected[i, m])
            )
    return total / len(episodes)


def plain_normalizers(inputs, options, episodes):
    """``D_t``: the mean over episodes of ``rho_t``, an ended episode's last weight carried."""
    longest = max(len(episode) for episode in episodes)
    rhos = [plain_rhos(inputs, episode, options) for episode in episodes]
    return [sum(rho[min(t, len(rho) - 1)] for rho in rhos) / len(episodes) for t in range(longest)]


def plain_episode_j_return(inputs, models, options, episode, normalizers, j, m):
    rhos = plain_rhos(inputs, episode, options)

    def normalized(t):
        if t < 0:
            return 1.0
        return rhos[t] / normalizers[t] if normalizers[t] > 0 else 0.0

    total = 0.0
    for t, i in enumerate(episode):
        if t > j:
            break
        total += options.gamma**t * (
            normalized(t) * (inputs.rewards[i, m] - models.logged[i, m])
            + normalized(t - 1) * models.expected[i, m]
        )
    if j + 1 < len(episode):
        total += options.gamma ** (j + 1) * normalized(j) * models.expected[episode[j + 1], m]
    return total


def plain_j_returns(inputs, models, options, episodes, j_steps, m):
    """``[E][J]`` per-episode j-step returns and the ``g_j`` (their means)."""
    normalizers = plain_normalizers(inputs, options, episodes)
    per_episode = [
        [
            plain_episode_j_return(inputs, models, options, episode, normalizers, j, m)
            for j in j_steps
        ]
        for episode in episodes
    ]
    means = [sum(row[k] for row in per_episode) / len(episodes) for k in range(len(j_steps))]
    return per_episode, means


def plain_logged_sequential(inputs, options, episodes, m):
    return sum(
        sum(options.gamma**t * inputs.rewards[i, m] for t, i in enumerate(episode))
        for episode in episodes
    ) / len(episodes)


def direct_qp(error: np.ndarray) -> np.ndarray:
    """min x^T error x, sum x = 1, x >= 0 by enumerating supports: on a support S the
    minimiser is error_SS^-1 1 / (1^T error_SS^-1 1); the answer is the feasible one
    (x_S >= 0) whose KKT condition holds off the support ((error x)_j >= (error x)_S)."""
    size = len(error)
    best, best_value = None, np.inf
    for k in range(1, size + 1):
        for support in itertools.combinations(range(size), k):
            s = list(support)
            solved = np.linalg.solve(error[np.ix_(s, s)], np.ones(k))
            x = np.zeros(size)
            x[s] = solved / solved.sum()
            if (x < -1e-12).any():
                continue
            gradient = error @ x
            if (gradient < gradient[s].mean() - 1e-10).any():
                continue
            if x @ error @ x < best_value:
                best, best_value = x, x @ error @ x
    return best


def interval_of(samples, confidence):
    tail = (1 - confidence) / 2
    return np.quantile(samples, tail), np.quantile(samples, 1 - tail)


# --- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ONE_STEP_KINDS)
@pytest.mark.parametrize(
    "options",
    [
        CpeOptions(num_bootstrap=25, seed=3),
        CpeOptions(num_bootstrap=25, seed=4, weight_clip=1.5, propensity_floor=0.2),
    ],
    ids=["plain", "clipped-floored"],
)
def test_one_step_estimates_and_intervals_match_plain_loops(kind, options):
    inputs, models = random_data(seed=1)
    results = estimate(kind, inputs, models, options)
    episodes = episodes_of(inputs)
    samples = resampled(inputs, options)
    for m, name in enumerate(inputs.metric_names):
        result = results[name]
        value = plain_one_step(kind, inputs, models, options, episodes, m)
        logged = plain_logged_one_step(inputs, episodes, m)
        assert result.value == pytest.approx(value, abs=TOLERANCE)
        assert result.logged_value == pytest.approx(logged, abs=TOLERANCE)
        assert result.relative == pytest.approx(value / logged, abs=TOLERANCE)
        values = [plain_one_step(kind, inputs, models, options, s, m) for s in samples]
        loggeds = [plain_logged_one_step(inputs, s, m) for s in samples]
        low, high = interval_of(values, options.confidence)
        assert (result.low, result.high) == pytest.approx((low, high), abs=TOLERANCE)
        relative = np.array(values) / np.array(loggeds)
        rel_low, rel_high = interval_of(relative, options.confidence)
        assert (result.relative_low, result.relative_high) == pytest.approx(
            (rel_low, rel_high), abs=TOLERANCE
        )
        if kind == "dm":
            assert result.effective_sample_size is None
        else:
            w = [weight(inputs, i, options) for i in range(inputs.num_rows)]
            ess = sum(w) ** 2 / sum(x * x for x in w)
            assert result.effective_sample_size == pytest.approx(ess, rel=TOLERANCE)


@pytest.mark.parametrize("kind", SEQUENTIAL_KINDS)
@pytest.mark.parametrize(
    "options",
    [
        CpeOptions(gamma=0.9, num_bootstrap=20, seed=5),
        CpeOptions(gamma=1.0, num_bootstrap=20, seed=6, weight_clip=2.0, propensity_floor=0.15),
    ],
    ids=["plain", "clipped-floored"],
)
def test_sequential_estimates_and_intervals_match_plain_loops(kind, options):
    inputs, models = random_data(seed=2)
    results = estimate(kind, inputs, models, options)
    episodes = episodes_of(inputs)
    samples = resampled(inputs, options)
    longest = max(len(e) for e in episodes)
    j_steps = list(range(-1, longest))  # 7 steps: the default grid keeps every j
    assert magic_j_steps(longest, options.magic_j_steps).tolist() == j_steps
    for m, name in enumerate(inputs.metric_names):
        result = results[name]

        def plain(data, x=None, m=m):
            if kind == "sequential_dr":
                return plain_sequential_dr(inputs, models, options, data, m)
            _, means = plain_j_returns(inputs, models, options, data, j_steps, m)
            return means[-1] if kind == "weighted_dr" else float(np.dot(x, means))

        x = None
        if kind == "magic":
            per_episode, means = plain_j_returns(inputs, models, options, episodes, j_steps, m)
            per_episode = np.array(per_episode)
            count = len(episodes)
            omega = np.zeros((len(j_steps), len(j_steps)))
            for a in range(len(j_steps)):
                for b in range(len(j_steps)):
                    omega[a, b] = sum(
                        (per_episode[e, a] - means[a]) * (per_episode[e, b] - means[b])
                        for e in range(count)
                    ) / ((count - 1) * count)
            wdr_low, wdr_high = interval_of(
                [plain_j_returns(inputs, models, options, s, j_steps, m)[1][-1] for s in samples],
                options.confidence,
            )
            bias = np.array([max(0.0, wdr_low - g, g - wdr_high) for g in means])
            x = direct_qp(omega + np.outer(bias, bias))
            assert result.j_steps == tuple(j_steps)
            assert result.magic_weights == pytest.approx(list(x), abs=TOLERANCE)
        value = plain(episodes, x)
        logged = plain_logged_sequential(inputs, options, episodes, m)
        assert result.value == pytest.approx(value, abs=TOLERANCE)
        assert result.logged_value == pytest.approx(logged, abs=TOLERANCE)
        values = [plain(s, x) for s in samples]
        low, high = interval_of(values, options.confidence)
        assert (result.low, result.high) == pytest.approx((low, high), abs=TOLERANCE)
        loggeds = [plain_logged_sequential(inputs, options, s, m) for s in samples]
        rel_low, rel_high = interval_of(np.array(values) / np.array(loggeds), options.confidence)
        assert (result.relative_low, result.relative_high) == pytest.approx(
            (rel_low, rel_high), abs=TOLERANCE
        )
        finals = [plain_rhos(inputs, e, options)[-1] for e in episodes]
        ess = sum(finals) ** 2 / sum(f * f for f in finals)
        assert result.effective_sample_size == pytest.approx(ess, rel=TOLERANCE)


def test_weighted_dr_carries_ended_episodes_in_the_normalizer():
    """Two one-step episodes and one two-step episode: at step 1 only one episode runs, yet
    the normalizer averages the carried final weights of all three, so a normalized weight
    at step 1 is rho / mean(all three), not 1 (which the running episodes alone would give)."""
    starts = np.array([0, 1, 2, 4])
    inputs = CpeInputs(
        episode_starts=starts,
        rewards=np.array([[0.0], [0.0], [0.0], [1.0]]),
        metric_names=("reward",),
        action=np.zeros(4, dtype=np.int64),
        logged_propensity=np.full(4, 0.5),
        target_probabilities=np.array([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0], [1.0, 0.0]]),
        possible=np.ones((4, 2), dtype=bool),
        features=np.zeros((4, 1)),
    )
    zero = ModelValues(logged=np.zeros((4, 1)), expected=np.zeros((4, 1)))
    result = estimate("weighted_dr", inputs, zero, CpeOptions(num_bootstrap=0))["reward"]
    # rho: episode 0 ends at 0.5, episode 1 at 1.0, episode 2 runs 2.0 then 4.0.
    carried_mean = (0.5 + 1.0 + 4.0) / 3
    assert result.value == pytest.approx(4.0 / carried_mean / 3, abs=TOLERANCE)
    assert result.value != pytest.approx(1.0 / 3)


def test_cumulative_weights_are_products_within_episodes():
    rng = np.random.default_rng(7)
    starts = np.array([0, 3, 4, 9, 12])
    weights = rng.uniform(0.1, 3.0, 12)
    weights[[1, 6]] = 0.0
    expected = np.concatenate([np.cumprod(weights[a:b]) for a, b in itertools.pairwise(starts)])
    assert cumulative_weights(weights, starts) == pytest.approx(expected, rel=1e-12)


def test_dense_and_sparse_per_step_sums_agree():
    inputs, models = random_data(seed=8)
    options = CpeOptions(gamma=0.9, num_bootstrap=10)
    episodes = sequential_episodes(inputs, options)
    counts = bootstrap_counts(inputs.num_episodes, options)
    values = np.concatenate([episodes.rho[:, None], models.logged], axis=1)
    dense = per_step_sums(counts, episodes, values, dense=True)
    sparse = per_step_sums(counts, episodes, values, dense=False)
    assert dense == pytest.approx(sparse, abs=1e-12)
    # and both equal the loop: sum over the episodes running at step t of count * value
    t, k, b = 2, 1, 3
    loop = sum(
        counts[b, e] * values[start + t, k]
        for e, (start, end) in enumerate(
            zip(inputs.episode_starts[:-1], inputs.episode_starts[1:], strict=True)
        )
        if end - start > t
    )
    assert dense[b, t, k] == pytest.approx(loop, abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_magic_weights_match_a_direct_solve(seed):
    """Random positive definite ``Cov + b b^T`` of 5 j-steps, some with a large bias so the
    x >= 0 constraints bind; the direct solve enumerates every support (KKT)."""
    rng = np.random.default_rng(seed)
    factor = rng.normal(size=(5, 8))
    covariance = factor @ factor.T / 8 * 10.0 ** rng.uniform(-6, 0)
    bias = np.where(rng.random(5) < 0.5, rng.uniform(0, 3, 5), 0.0) * np.sqrt(np.trace(covariance))
    error = covariance + np.outer(bias, bias)
    x = magic_weights(error)
    reference = direct_qp(error)
    assert x.sum() == pytest.approx(1.0, abs=1e-12)
    assert (x >= 0).all()
    assert x == pytest.approx(reference, abs=TOLERANCE)
    # the SLSQP fallback reaches the same blend
    fallback = formulas._slsqp_weights(error / np.trace(error))
    assert fallback == pytest.approx(reference, abs=TOLERANCE)


def test_magic_weights_of_a_singular_error_reach_the_minimum():
    """Two j-steps with identical returns (a duplicated column: many blends are optimal) and
    one with zero variance but a bias: the blend must reach the direct solve's minimum."""
    rng = np.random.default_rng(3)
    returns = rng.normal(size=(50, 3))
    returns[:, 1] = returns[:, 0]
    returns[:, 2] = 0.0
    error = np.cov(returns, rowvar=False) / 50 + np.outer([0, 0, 0.3], [0, 0, 0.3])
    x = magic_weights(error)
    weight = np.linspace(0, 1, 100001)  # x_0 + x_1 acts as one weight: scan that edge
    edge = np.stack([weight, np.zeros_like(weight), 1 - weight], axis=1)
    best = np.einsum("ni,ij,nj->n", edge, error, edge).min()
    assert x.sum() == pytest.approx(1.0) and (x >= 0).all()
    assert x @ error @ x <= best + 1e-12


def test_magic_uses_the_outer_product_not_the_elementwise_square():
    """Two j-steps with uncorrelated unit variances and biases 1 and 2 (same sign). The MSE
    of the blend x g_0 + (1 - x) g_1 is x^2 + (1 - x)^2 + (x + 2 (1 - x))^2: the biases add
    before squaring, so every bit of weight moved to the more biased return costs more, and
    the minimum is at x = 1. Horizon's elementwise b * b treats the biases as if they could
    cancel: x^2 + (1 - x)^2 + x^2 + 4 (1 - x)^2, minimum at x = 5/7."""
    covariance = np.eye(2)
    bias = np.array([1.0, 2.0])
    outer = magic_weights(covariance + np.outer(bias, bias))
    diagonal = magic_weights(covariance + np.diag(bias * bias))
    assert outer == pytest.approx(direct_qp(covariance + np.outer(bias, bias)), abs=TOLERANCE)
    assert outer[0] == pytest.approx(1.0, abs=TOLERANCE)
    assert diagonal[0] == pytest.approx(5 / 7, abs=TOLERANCE)


@pytest.mark.parametrize("episodes", [400, 1600, 6400])
def test_bootstrap_interval_has_the_normal_theory_width(episodes):
    """IPS with the target policy equal to the logging policy (every weight 1) is the mean of
    the rewards; with one row per episode and normal rewards its sampling distribution is
    normal with standard error s / sqrt(E). The percentile interval's width must match
    2 z_0.975 s / sqrt(E) (so it shrinks like 1 / sqrt(E)). Tolerance 8%: with 2,000
    resamples each 2.5% quantile has a Monte Carlo standard error of sqrt(0.025 * 0.975 /
    2000) / phi(1.96) = 0.06 standard errors, the width about 2.2% of itself; 8% is over
    3.5 of those, and the bootstrap's plug-in variance (1/E, not 1/(E-1)) is 0.06% off."""
    rng = np.random.default_rng(episodes)
    rewards = rng.normal(5.0, 2.0, (episodes, 1))
    probabilities = np.full((episodes, 2), 0.5)
    inputs = CpeInputs(
        episode_starts=np.arange(episodes + 1),
        rewards=rewards,
        metric_names=("reward",),
        action=rng.integers(0, 2, episodes),
        logged_propensity=np.full(episodes, 0.5),
        target_probabilities=probabilities,
        possible=np.ones((episodes, 2), dtype=bool),
        features=np.zeros((episodes, 1)),
    )
    result = estimate("ips", inputs, None, CpeOptions(num_bootstrap=2000, seed=1))["reward"]
    normal_width = 2 * 1.959964 * rewards.std(ddof=1) / np.sqrt(episodes)
    assert result.high - result.low == pytest.approx(normal_width, rel=0.08)
    assert result.low < rewards.mean() < result.high


def test_bootstrap_resamples_whole_episodes():
    """Each resample draws E episodes with replacement: a count matrix whose rows sum to E."""
    counts = bootstrap_counts(50, CpeOptions(num_bootstrap=30, seed=2))
    assert counts.shape == (30, 50)
    assert (counts.sum(axis=1) == 50).all()
    assert (counts >= 0).all() and np.allclose(counts, counts.round())


def test_clipping_and_floor_are_reported():
    inputs, _ = random_data(seed=9)
    options = CpeOptions(num_bootstrap=0, weight_clip=1.5, propensity_floor=0.2)
    result = estimate("ips", inputs, None, options)["reward"]
    floored = int((inputs.logged_propensity < 0.2).sum())
    clipped = sum(weight(inputs, i, options, clip=False) > 1.5 for i in range(inputs.num_rows))
    assert floored > 0 and clipped > 0
    assert f"propensity floor 0.2 applied to {floored} rows" in result.note
    assert f"importance weights clipped at 1.5 ({clipped} rows)" in result.note
    assert result.low is None and result.high is None
    plain = estimate("ips", inputs, None, CpeOptions(num_bootstrap=0))["reward"]
    assert plain.note is None
    assert plain.value != pytest.approx(result.value)


@pytest.mark.parametrize("bad", [0.0, -0.25, float("nan")])
def test_a_taken_action_without_logged_probability_is_named(bad):
    inputs, models = random_data(seed=10)
    propensity = inputs.logged_propensity.copy()
    propensity[17] = bad
    broken = CpeInputs(**{**inputs.__dict__, "logged_propensity": propensity})
    with pytest.raises(CpeInputError, match=r"eval row 17 \(episode \d+, step \d+\)") as error:
        estimate("ips", broken, None, CpeOptions())
    assert repr(bad) in str(error.value) or str(bad) in str(error.value)
    assert isinstance(error.value, HorizonError)
    labelled = CpeInputs(**{**broken.__dict__, "row_label": lambda row: f"mdp_id m{row}"})
    with pytest.raises(CpeInputError, match=r"\[mdp_id m17\]"):
        estimate("dr", labelled, models, CpeOptions())
    # a floor does not excuse a zero: it raises small positive propensities only
    with pytest.raises(CpeInputError, match="eval row 17"):
        estimate("ips", broken, None, CpeOptions(propensity_floor=0.1))


@pytest.mark.parametrize("kind", ["dr", "magic"])
def test_no_relative_value_when_the_logged_value_is_near_zero(kind):
    """Rewards of +-1 that cancel exactly: the logged value is 0 (one-step: mean reward per
    row; sequential: mean return per episode), so there is no relative value, and a note."""
    inputs, models = random_data(seed=11, metrics=1)
    rewards = np.where(np.arange(inputs.num_rows) % 2 == 0, 1.0, -1.0)[:, None]
    # two-row episodes, +1 then -1: every episode's return is 0 as well
    starts = np.arange(0, inputs.num_rows - inputs.num_rows % 2 + 1, 2)
    n = int(starts[-1])
    zeroed = CpeInputs(
        **{
            **inputs.__dict__,
            "episode_starts": starts,
            "rewards": rewards[:n],
            "action": inputs.action[:n],
            "logged_propensity": inputs.logged_propensity[:n],
            "target_probabilities": inputs.target_probabilities[:n],
            "possible": inputs.possible[:n],
            "features": inputs.features[:n],
        }
    )
    cut = ModelValues(logged=models.logged[:n], expected=models.expected[:n])
    result = estimate(kind, zeroed, cut, CpeOptions(gamma=1.0, num_bootstrap=20))["reward"]
    assert abs(result.logged_value) <= NEAR_ZERO
    assert result.relative is None
    assert result.relative_low is None and result.relative_high is None
    assert "logged value near zero" in result.note
    assert result.low is not None  # the raw estimate keeps its interval


@pytest.mark.parametrize("kind", ["ips", "sequential_dr", "weighted_dr", "magic"])
def test_memory_bounds_change_no_number(kind, monkeypatch):
    """Resamples in blocks of one row (as a 1M-episode bandit log would get) and the sparse
    per-step layout give the very estimates the single block and dense layout give."""
    inputs, models = random_data(seed=12)
    options = CpeOptions(gamma=0.95, num_bootstrap=30, seed=1)
    whole = estimate(kind, inputs, models, options)
    monkeypatch.setattr(formulas, "BOOTSTRAP_ENTRIES", 1)
    monkeypatch.setattr(formulas, "DENSE_STEP_LIMIT", 0)
    blocked = estimate(kind, inputs, models, options)
    for name in inputs.metric_names:
        for field in ("value", "low", "high", "relative_low", "relative_high"):
            assert getattr(blocked[name], field) == pytest.approx(
                getattr(whole[name], field), abs=1e-12
            ), field


def test_models_are_fitted_when_not_given():
    inputs, _ = random_data(seed=13)
    options = CpeOptions(gamma=0.9, num_bootstrap=0)
    assert estimate("dr", inputs, None, options) == estimate(
        "dr", inputs, reward_model_values(inputs, options), options
    )
    assert estimate("magic", inputs, None, options) == estimate(
        "magic", inputs, q_model_values(inputs, options), options
    )


def test_fqe_that_does_not_contract_is_iterated_and_says_so():
    """Every row's next state is itself and never terminal, at gamma 1: the FQE map has
    spectral radius 1, its fixed point does not exist, and the capped iteration (200 steps of
    adding the reward) runs instead, with a note."""
    basis = np.ones((10, 1))
    weights, note = fit_fqe(
        basis,
        np.zeros(10, dtype=np.int64),
        np.ones((10, 1)),
        1,
        next_basis=basis,
        next_probabilities=np.ones((10, 1)),
        gamma=1.0,
    )
    assert "does not contract" in note and "200-iteration" in note
    assert np.isfinite(weights).all()


def test_no_relative_interval_when_the_logged_resamples_cross_zero():
    """A logged mean of 1.5 / 41 from rewards of +-1: not near zero, so the relative value is
    given, but resamples of the logged value fall on both sides of zero, where a ratio's
    interval means nothing; it is left out with a note."""
    rewards = np.array([1.0, -1.0] * 20 + [1.5])[:, None]
    n = len(rewards)
    inputs = CpeInputs(
        episode_starts=np.arange(n + 1),
        rewards=rewards,
        metric_names=("reward",),
        action=np.zeros(n, dtype=np.int64),
        logged_propensity=np.full(n, 0.5),
        target_probabilities=np.full((n, 2), 0.5),
        possible=np.ones((n, 2), dtype=bool),
        features=np.zeros((n, 1)),
    )
    result = estimate("ips", inputs, None, CpeOptions(num_bootstrap=200))["reward"]
    assert result.logged_value == pytest.approx(1.5 / 41)
    assert result.relative == pytest.approx(1.0)
    assert result.relative_low is None and result.relative_high is None
    assert "resamples include zero" in result.note


def test_bounded_fqe_is_the_fixed_point_of_the_clipped_map_where_plain_fqe_diverges():
    """Bounded FQE's weights reproduce themselves through ``A^-1 Phi^T (r + gamma clip(Psi
    W))`` (terminal rows bootstrapping from 0), every next value it bootstraps from inside the
    bounds, on data where the unclipped map does not contract."""
    from horizon_plugins_cpe.models import (
        FEATURE_RIDGE,
        _gram,
        design,
        expected_design,
        fit_bounded_fqe,
        return_bounds,
    )

    rng = np.random.default_rng(3)
    rows, width, actions, gamma = 300, 6, 2, 0.99
    basis = np.concatenate([np.ones((rows, 1)), rng.normal(size=(rows, width))], axis=1)
    action = rng.integers(actions, size=rows)
    rewards = rng.uniform(0.0, 1.0, size=(rows, 2))
    # Next states that grow away from the states: off-policy FQE's classic divergence.
    next_basis = basis * 1.5
    terminal = rng.random(rows) < 0.05
    next_basis[terminal] = 0.0
    probabilities = rng.dirichlet(np.ones(actions), size=rows)
    probabilities[terminal] = 0.0
    low, high = return_bounds(rewards, gamma)

    weights, note = fit_bounded_fqe(
        basis, action, rewards, actions, next_basis, probabilities, gamma, low, high
    )

    assert note is None
    assert low.tolist() == pytest.approx(rewards.min(axis=0).tolist())
    assert high.tolist() == pytest.approx((rewards.max(axis=0) / (1 - gamma)).tolist())
    phi = design(basis, action, actions)
    psi = expected_design(next_basis, probabilities)
    gram, _, _ = _gram(basis, action, rewards, actions)
    regularized = gram + FEATURE_RIDGE * rows * np.eye(len(gram))
    following = np.where(terminal[:, None], 0.0, np.clip(psi @ weights, low, high))
    again = np.linalg.solve(regularized, phi.T @ (rewards + gamma * following))
    np.testing.assert_allclose(again, weights, rtol=1e-7, atol=1e-7)
    assert ((psi @ weights)[~terminal] > high).any()  # the bounds were needed


def test_a_single_episode_fits_its_models_on_its_own_rows():
    """With one episode there is nothing to cross-fit against: both models are fitted on the
    episode they evaluate, and say so, rather than on the other fold, which is empty."""
    inputs, _ = random_data(seed=5, episodes=1, longest=30)
    options = CpeOptions(gamma=0.9, num_bootstrap=20)
    for models in (reward_model_values(inputs, options), q_model_values(inputs, options)):
        assert np.isfinite(models.logged).all() and np.isfinite(models.expected).all()
        assert "one episode: the models are fitted on the rows they evaluate" in models.note
    estimate = formulas.estimate("dm", inputs, None, options)["reward"]
    assert np.isfinite(estimate.value)
