"""Counterfactual policy evaluation: every estimator on 1,000,000 eval rows in 10,000 episodes.

    .venv/bin/python benchmarks/cpe.py
    .venv/bin/python benchmarks/cpe.py --rows 1000000 --episodes 10000 --rounds 5
    .venv/bin/python benchmarks/cpe.py --quick          # 3 rounds, for make bench

The models are already scored (``ModelValues`` given as arrays), so this times the
estimators themselves: ``horizon_plugins_cpe.formulas.estimate`` with its input checks, the
episode bootstrap at the default 200 resamples (interval, relative interval), the effective
sample size and, for MAGIC, the blend. The baseline is the same estimate written as plain
numpy formulas, the point estimate only: one-step kinds as one-line means, sequential kinds
on ``[episodes, longest]`` padded arrays (Horizon's layout; weights padded with 1, which
carries an ended episode's final weight), MAGIC's blend solved once with SLSQP, no interval
(MAGIC's bias then comes from the normal-theory interval, so its point estimate is compared
with ours at ``num_bootstrap = 0``, which takes the bias from that interval too). The ratio
``ours / baseline`` is what the intervals and checks cost beside the bare formula; the goal
is ours under 2 s for each kind. The two sides run interleaved (A B A B ...) and each reports
its median; the point estimates of both are compared, so the baseline also checks the
formulas.

Then the models: the cross-fitted ridge reward model and FQE (``reward_model_values``,
``q_model_values``) on the same rows with 8 feature columns (4 values, 4 presence) and 2
actions, as CartPole's eval split has; and the whole per-epoch CPE at the size of the
example's eval split (about 3,000 rows in 150 episodes): both models and all seven
estimators. What the example's own estimators add to its training, measured end to end, is
``benchmarks/cpe_overhead.py`` (the budget is 20%).

One ``RESULT name=cpe_<kind> rows=... ours_s=... baseline_s=... ratio=...`` line per kind,
``RESULT name=cpe_models ...`` and ``RESULT name=cpe_epoch_3k ...`` last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from scipy.optimize import minimize

from horizon_plugins_cpe.formulas import (
    ONE_STEP_KINDS,
    SEQUENTIAL_KINDS,
    CpeInputs,
    CpeOptions,
    ModelValues,
    estimate,
    magic_j_steps,
)
from horizon_plugins_cpe.models import q_model_values, reward_model_values


def eval_split(rows: int, episodes: int, seed: int) -> tuple[CpeInputs, ModelValues]:
    """``rows`` rows in ``episodes`` episodes of 50% to 150% of the mean length, 2 actions,
    a logging policy between 0.2 and 0.8, a target policy near it, rewards around 1, 8
    feature columns, and model values as a scored model would give them."""
    rng = np.random.default_rng(seed)
    mean = rows // episodes
    lengths = rng.integers(mean // 2, mean + mean // 2 + 1, episodes)
    lengths += (rows - lengths.sum()) // episodes
    lengths[: rows - lengths.sum()] += 1
    assert lengths.sum() == rows and lengths.min() > 0
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    logging = rng.uniform(0.2, 0.8, rows)
    logging = np.stack([logging, 1 - logging], axis=1)
    target = np.clip(logging + rng.normal(0, 0.05, (rows, 1)) * [1, -1], 0.05, 0.95)
    action = (rng.random(rows) > logging[:, 0]).astype(np.int64)
    values = rng.normal(size=(rows, 4))
    inputs = CpeInputs(
        episode_starts=starts,
        rewards=rng.normal(1.0, 0.5, (rows, 1)),
        metric_names=("reward",),
        action=action,
        logged_propensity=logging[np.arange(rows), action],
        target_probabilities=target,
        possible=np.ones((rows, 2), dtype=bool),
        features=np.concatenate([values, np.ones((rows, 4))], axis=1),
    )
    models = ModelValues(
        logged=rng.normal(1.0, 0.3, (rows, 1)), expected=rng.normal(1.0, 0.3, (rows, 1))
    )
    return inputs, models


def plain(kind: str, inputs: CpeInputs, models: ModelValues, gamma: float) -> float:
    """The point estimate as the plainest numpy formula (first metric)."""
    n = inputs.num_rows
    w = inputs.target_probabilities[np.arange(n), inputs.action] / inputs.logged_propensity
    r = inputs.rewards[:, 0]
    q, v = models.logged[:, 0], models.expected[:, 0]
    if kind == "dm":
        return float(v.mean())
    if kind == "ips":
        return float((w * r).mean())
    if kind == "snips":
        return float((w * r).sum() / w.sum())
    if kind == "dr":
        return float((v + w * (r - q)).mean())
    starts = inputs.episode_starts
    lengths = np.diff(starts)
    episodes, longest = len(lengths), int(lengths.max())
    episode = np.repeat(np.arange(episodes), lengths)
    step = np.arange(n) - np.repeat(starts[:-1], lengths)

    def padded(values, fill):
        out = np.full((episodes, longest), fill)
        out[episode, step] = values
        return out

    rho = np.cumprod(padded(w, 1.0), axis=1)
    rho_prev = np.hstack([np.ones((episodes, 1)), rho[:, :-1]])
    residual, value = padded(r - q, 0.0), padded(v, 0.0)
    discount = gamma ** np.arange(longest)
    if kind == "sequential_dr":
        return float((discount * (rho * residual + rho_prev * value)).sum(axis=1).mean())
    mean_rho = rho.mean(axis=0)
    mean_prev = np.concatenate([[1.0], mean_rho[:-1]])
    model = discount * rho_prev / mean_prev * value
    terms = discount * rho / mean_rho * residual + model
    if kind == "weighted_dr":
        return float(terms.sum(axis=1).mean())
    j_steps = magic_j_steps(longest, 25)
    cumulative = np.hstack([np.zeros((episodes, 1)), np.cumsum(terms, axis=1)])
    following = np.hstack([model, np.zeros((episodes, 1))])
    returns = cumulative[:, j_steps + 1] + following[:, j_steps + 1]  # [E, J]
    g = returns.mean(axis=0)
    half = 1.959964 * returns[:, -1].std(ddof=1) / np.sqrt(episodes)
    bias = np.maximum(0.0, np.maximum(g[-1] - half - g, g - g[-1] - half))
    error = np.cov(returns, rowvar=False) / episodes + np.outer(bias, bias)
    error /= np.trace(error)
    size = len(g)
    x = minimize(
        lambda x: x @ error @ x,
        np.full(size, 1 / size),
        method="SLSQP",
        bounds=[(0, 1)] * size,
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
        options={"ftol": 1e-15, "maxiter": 500},
    ).x
    return float(x @ g)


def interleaved(ours, baseline, rounds: int) -> tuple[float, float, object, object]:
    """Median seconds of each, run A B A B ..., and their last results."""
    ours_times, baseline_times = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        ours_result = ours()
        ours_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        baseline_result = baseline()
        baseline_times.append(time.perf_counter() - start)
    return (
        statistics.median(ours_times),
        statistics.median(baseline_times),
        ours_result,
        baseline_result,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 rounds, for make bench")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 3

    inputs, models = eval_split(args.rows, args.episodes, args.seed)
    options = CpeOptions(gamma=args.gamma)
    print(
        f"{args.rows:,} rows in {args.episodes:,} episodes (longest "
        f"{int(np.diff(inputs.episode_starts).max())}), 2 actions, 1 metric, gamma "
        f"{args.gamma}, num_bootstrap {options.num_bootstrap}; median of {args.rounds} "
        f"interleaved rounds; {os.cpu_count()} cores"
    )
    print(
        f"{'kind':<15}{'ours (s)':>10}{'plain (s)':>11}{'ratio':>8}"
        f"{'plain value':>16}{'ours, no bootstrap':>20}"
    )
    lines = []
    worst = 0.0
    for kind in ONE_STEP_KINDS + SEQUENTIAL_KINDS:
        ours_s, baseline_s, _, baseline = interleaved(
            lambda kind=kind: estimate(kind, inputs, models, options)["reward"].value,
            lambda kind=kind: plain(kind, inputs, models, args.gamma),
            args.rounds,
        )
        # MAGIC's bias term comes from the bootstrap interval by default and from the normal
        # one without resamples, as in the plain formula: compare point estimates there.
        unresampled = estimate(kind, inputs, models, CpeOptions(args.gamma, num_bootstrap=0))
        check = unresampled["reward"].value
        worst = max(worst, abs(check - baseline) / abs(baseline))
        print(
            f"{kind:<15}{ours_s:>10.3f}{baseline_s:>11.3f}{ours_s / baseline_s:>8.2f}"
            f"{baseline:>16.10g}{check:>20.10g}"
        )
        lines.append(
            f"RESULT name=cpe_{kind} rows={args.rows} ours_s={ours_s:.4f} "
            f"baseline_s={baseline_s:.4f} ratio={ours_s / baseline_s:.3g}"
        )

    print(f"largest relative difference between the point estimates: {worst:.1e}")

    timings = {"reward model": [], "FQE": []}
    for _ in range(args.rounds):
        start = time.perf_counter()
        reward_model_values(inputs, options)
        timings["reward model"].append(time.perf_counter() - start)
        start = time.perf_counter()
        q_model_values(inputs, options)
        timings["FQE"].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in timings.items()}
    print(
        f"models on the same rows (8 feature columns, cross-fitted, median of {args.rounds}): "
        f"reward model {medians['reward model']:.3f} s, FQE {medians['FQE']:.3f} s"
    )
    lines.append(
        f"RESULT name=cpe_models rows={args.rows} ours_s={sum(medians.values()):.4f} "
        f"reward_model_s={medians['reward model']:.4f} fqe_s={medians['FQE']:.4f}"
    )

    small, _ = eval_split(3_000, 150, args.seed + 1)

    def epoch() -> None:
        rewards = reward_model_values(small, options)
        values = q_model_values(small, options)
        for kind in ONE_STEP_KINDS:
            estimate(kind, small, rewards, options)
        for kind in SEQUENTIAL_KINDS:
            estimate(kind, small, values, options)

    epoch()
    seconds = []
    for _ in range(max(args.rounds, 5)):
        start = time.perf_counter()
        epoch()
        seconds.append(time.perf_counter() - start)
    per_epoch = statistics.median(seconds)
    print(
        f"one epoch's CPE on 3,000 rows in 150 episodes (both models, all 7 kinds, "
        f"{options.num_bootstrap} resamples): {per_epoch:.3f} s (its share of training: "
        f"benchmarks/cpe_overhead.py)"
    )
    lines.append(f"RESULT name=cpe_epoch_3k rows=3000 ours_s={per_epoch:.4f}")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
