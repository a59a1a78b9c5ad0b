"""The CPE truth suite: every estimator's figure beside the policy's value played in the real
environment (issue 34, item 7).

    .venv/bin/python benchmarks/cpe_truth.py --profile short    # 1 minute on 2 cores
    .venv/bin/python benchmarks/cpe_truth.py --profile long     # the issue's sizes: 4 minutes
    .venv/bin/python benchmarks/cpe_truth.py --profile long --datasets cartpole_random

Data sets, logged by the ``gym`` source (``collect_rows``, as ``horizon gym collect`` and
``[source] kind = "gym"`` log) with a known logger, each row carrying the logger's propensity:

- ``cartpole_random``: CartPole-v1 played uniformly at random;
- ``cartpole_mediocre``: epsilon-greedy (0.2) around ``cartpole_random``'s ``mid`` policy
  (its exported ``model.onnx``; the gym source's ``policy = "epsilon_greedy"``, ``model``);
- ``cartpole_good``: epsilon-greedy (0.05) around ``cartpole_random``'s ``many`` policy;
- ``cartpole_random_10k`` (long profile): 10,000 uniformly random episodes (about 220,000
  rows), the size where the eval split holds about 2,000 episodes.

No softmax logger (the gym source logs uniform or epsilon-greedy play only) and no one-step
(contextual bandit) problem: Gymnasium ships no environment with one-step episodes, and
CartPole cut at one step is no bandit (its reward is 1 whatever the action).

Policies, each trained by ``Engine().run`` on the data set's rows as a user's ``horizon run``
(the dqn defaults but ``epochs``; ``eval_fraction`` 0.2; the run seed) and evaluated as
``horizon evaluate RUN --data REFERENCE`` (``evaluate_run``) does, all on the same eval split
(the ``few`` run's: every run of the same rows and seed holds out the same episodes):

- ``bad``: the dqn trained for ``many`` epochs on the negated reward (``[timeline] reward =
  {reward = -1.0}``), so that it learns to drop the pole; evaluated on the reference split,
  whose rewards are the environment's;
- ``random``: the ``few`` run evaluated with ``policy = "epsilon_greedy"``, ``epsilon = 1.0``
  (uniform random play: the random logger itself on ``cartpole_random``);
- ``few``, ``mid`` and ``many``: the dqn defaults trained for 2, 4 and 20 epochs;
- on the other data sets, also ``random:bad`` and ``random:few``: ``cartpole_random``'s
  policies, evaluated on this data set's eval split (``--data``), because every policy trained
  on a good logger's rows imitates it (even on the negated reward) and the truths would not
  spread.

The truth (the baseline, measured in the same run): each policy played in the environment
(the exported ONNX model greedily, or uniformly at random) over ``played`` episodes of seeds
100,000, 100,001, ...: the return per episode undiscounted (what the environment counts) and
discounted at the trainer's gamma, and the reward per step. The logger's truth is the mean
over every episode it logged.

Each estimator is judged in the unit it claims: the one-step kinds (``dm``, ``ips``,
``snips``, ``dr``) the mean reward per decision, the sequential kinds and ``fqe`` the
discounted return per episode, ``logged_value`` (the logger's ``reward_per_episode``, the
estimate of a user who assumes no change) the undiscounted return per episode. Per estimator
and data set the suite prints: the median relative error of the raw estimate against the
truth in that unit, and of the relative value (estimate / logged) against the true ratio
(policy / logger, same unit); the interval's coverage (the share of policies whose truth lies
in [low, high]), and the same forgiving the truth's own sampling error; the Spearman rank
correlation of the estimates with the undiscounted truth across the policies; and the regret
of shipping the policy with the highest estimate, as a share of the gap between the worst and
best policy's undiscounted truth. On CartPole every reward is 1, so the reward per step is 1
under every policy: the one-step kinds' near-zero error there says nothing of their use, and
they rank nothing (the issue's "a one-step estimator on a sequential problem").

Last, one ``RESULT name=cpe_truth_<dataset>_<kind>_relative_error ours=... baseline=...``
line per estimator and data set.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ACTIONS = ["0", "1"]
EVAL_FRACTION = 0.2
TRUTH_SEED = 100_000
"""Played episodes use seeds from here: none of them is a logged episode's."""
ONE_STEP = ("dm", "ips", "snips", "dr")
UNDISCOUNTED = "return per episode, undiscounted"
PER_STEP = "reward per step"


def discounted_unit(gamma: float) -> str:
    """The sequential kinds' unit."""
    return f"return per episode, discounted at {gamma:g}"


@dataclass(frozen=True)
class DatasetSpec:
    """Logged CartPole play: ``episodes`` of it by the ``logger``."""

    name: str
    episodes: int
    logger: str = "random"
    """``random``, or the name of ``cartpole_random``'s policy whose model logs
    epsilon-greedily (``mid`` or ``many``)."""
    epsilon: float = 1.0


@dataclass(frozen=True)
class Profile:
    """Sizes of one run of the suite."""

    datasets: tuple[DatasetSpec, ...]
    played: int
    """Episodes each policy is played for its truth."""
    few_epochs: int
    mid_epochs: int
    many_epochs: int
    num_bootstrap: int = 200


PROFILES = {
    "short": Profile(
        datasets=(
            DatasetSpec("cartpole_random", 1000),
            DatasetSpec("cartpole_good", 100, logger="many", epsilon=0.05),
        ),
        played=50,
        few_epochs=2,
        mid_epochs=4,
        many_epochs=20,
    ),
    "long": Profile(
        datasets=(
            DatasetSpec("cartpole_random", 1370),
            DatasetSpec("cartpole_mediocre", 300, logger="mid", epsilon=0.2),
            DatasetSpec("cartpole_good", 200, logger="many", epsilon=0.05),
            DatasetSpec("cartpole_random_10k", 10_000),
        ),
        played=200,
        few_epochs=2,
        mid_epochs=4,
        many_epochs=20,
    ),
}
POLICIES = ("bad", "random", "few", "mid", "many")
RANKED_DIGITS = 4
"""Estimates are ranked to 4 significant digits: the one-step kinds' figures on CartPole differ
in the sixth (0.999992 against 0.999993), a ranking by their numerical noise."""
BORROWED = ("bad", "few")
"""``cartpole_random``'s policies that are candidates on the other data sets too."""


def estimator_kinds() -> tuple[str, ...]:
    """Every ``[[evaluation]]`` kind: the cpe plugin's estimators and ``logged_value``."""
    from horizon_plugins_cpe.formulas import KINDS

    return (*KINDS, "logged_value")


@dataclass(frozen=True)
class Truth:
    """A policy's value played in the environment (or the logger's over its own episodes)."""

    undiscounted: float
    discounted: float
    per_step: float
    episodes: int
    undiscounted_error: float
    """The standard error of ``undiscounted`` (the truth is a sample mean too)."""
    discounted_error: float

    def in_unit(self, kind: str) -> float:
        """The truth in the unit ``kind`` claims."""
        if kind in ONE_STEP:
            return self.per_step
        if kind == "logged_value":
            return self.undiscounted
        return self.discounted

    def error_in_unit(self, kind: str) -> float:
        """The standard error of ``in_unit(kind)``; 0 for the reward per step, which is 1 on
        every CartPole step whatever the policy."""
        if kind in ONE_STEP:
            return 0.0
        if kind == "logged_value":
            return self.undiscounted_error
        return self.discounted_error


def truth_of_episodes(rewards: Sequence[Sequence[float]], gamma: float) -> Truth:
    """The mean returns of episodes given as their rewards."""
    undiscounted = [float(np.sum(episode)) for episode in rewards]
    discounted = [float(np.dot(gamma ** np.arange(len(episode)), episode)) for episode in rewards]
    steps = sum(len(episode) for episode in rewards)
    root = math.sqrt(len(rewards))
    return Truth(
        statistics.fmean(undiscounted),
        statistics.fmean(discounted),
        sum(undiscounted) / steps,
        len(rewards),
        statistics.stdev(undiscounted) / root if len(rewards) > 1 else math.nan,
        statistics.stdev(discounted) / root if len(rewards) > 1 else math.nan,
    )


@functools.cache
def play(model: Path | None, episodes: int, gamma: float, env_id: str = "CartPole-v1") -> Truth:
    """The truth of the exported ``model`` played greedily (uniform random play for None)."""
    import gymnasium
    import onnxruntime

    from horizon_engine import ModelInputs, ModelOutputs

    session = None
    if model is not None:
        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    env = gymnasium.make(env_id)
    env.action_space.seed(TRUTH_SEED)
    played: list[list[float]] = []
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=TRUTH_SEED + episode)
            rewards: list[float] = []
            done = False
            while not done:
                if session is None:
                    action = int(env.action_space.sample())
                else:
                    features = np.asarray(observation, dtype=np.float32).reshape(1, -1)
                    inputs = dict(
                        zip(ModelInputs.STATE, (features, np.ones_like(features)), strict=True)
                    )
                    action = int(session.run([ModelOutputs.ACTION], inputs)[0][0])
                observation, reward, terminated, truncated, _ = env.step(action)
                rewards.append(float(reward))
                done = terminated or truncated
            played.append(rewards)
    finally:
        env.close()
    return truth_of_episodes(played, gamma)


def log_rows(spec: DatasetSpec, seed: int, path: Path, logger_model: Path | None) -> None:
    """Write the data set's pre-timeline rows to ``path``: uniformly random play, or
    epsilon-greedy around ``logger_model``."""
    from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows

    source = GymSourceConfig(env="CartPole-v1", episodes=spec.episodes, ds="2019-01-01")
    if logger_model is not None:
        source = source.model_copy(
            update={"policy": "epsilon_greedy", "epsilon": spec.epsilon, "model": str(logger_model)}
        )
    with path.open("w", encoding="utf-8") as handle:
        for _, row in collect_rows(source, seed):
            handle.write(json.dumps(row) + "\n")


def logged_truth(rows: Path, gamma: float) -> Truth:
    """The logger's truth: the mean over every episode in ``rows`` (in logged order)."""
    episodes: dict[str, list[tuple[int, float]]] = {}
    with rows.open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            episodes.setdefault(row["mdp_id"], []).append(
                (int(row["sequence_number"]), float(row["reward"]))
            )
    return truth_of_episodes(
        [[reward for _, reward in sorted(steps)] for steps in episodes.values()], gamma
    )


def train(rows: Path, output: Path, seed: int, epochs: int, negated: bool = False) -> Path:
    """A ``horizon run`` of the dqn defaults on ``rows`` for ``epochs`` epochs (on the negated
    reward where ``negated``); returns its folder."""
    from horizon_engine import Engine

    shutil.rmtree(output, ignore_errors=True)
    timeline: dict[str, Any] = {"actions": ACTIONS, "eval_fraction": EVAL_FRACTION}
    if negated:
        timeline["reward"] = {"reward": -1.0}
    config = {
        "pipeline": {"output_dir": str(output), "seed": seed},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": timeline,
        "trainer": {"kind": "dqn", "epochs": epochs, "threads": 1},
    }
    Engine(show_progress=False).run(config)
    return output


def evaluate(run: Path, reference: Path, num_bootstrap: int, random_policy: bool) -> dict:
    """``horizon evaluate RUN --data REFERENCE`` with every estimator (the evaluated policy
    uniform random where ``random_policy``): what ``cpe_evaluate.json`` would hold."""
    from horizon_engine import evaluate_run

    entries = []
    for kind in estimator_kinds():
        entry: dict[str, Any] = {"kind": kind}
        if kind != "logged_value":
            entry["num_bootstrap"] = num_bootstrap
            if random_policy:
                entry |= {"policy": "epsilon_greedy", "epsilon": 1.0}
        entries.append(entry)
    return evaluate_run(run, data=reference, default_evaluation=entries)


@dataclass
class Estimate:
    """One estimator's figure for one policy, in the unit it claims."""

    value: float
    low: float | None
    high: float | None
    relative: float | None
    logged: float | None


@dataclass
class PolicyResult:
    """A candidate policy: its played truth and every estimator's figure for it."""

    name: str
    truth: Truth
    estimates: dict[str, Estimate] = field(default_factory=dict)


@dataclass
class DatasetResult:
    """A data set's candidates, its logger's truth and the discount its estimates used."""

    name: str
    logger: Truth
    gamma: float
    eval_episodes: int
    policies: list[PolicyResult]
    seconds: float


def estimates_of(evaluation: dict) -> tuple[dict[str, Estimate], float]:
    """The ``reward`` estimate of every entry of an ``evaluate_run`` result, and the gamma."""
    found: dict[str, Estimate] = {}
    gamma = math.nan
    for label, entry in evaluation["final"].items():
        gamma = evaluation["entries"][label]["details"].get("gamma", gamma)
        if label == "logged_value":
            value = entry["reward_per_episode"]
            found[label] = Estimate(value, None, None, 1.0, value)
            continue
        reward = entry["reward"]
        found[label] = Estimate(
            reward["value"],
            reward["low"],
            reward["high"],
            reward["relative"],
            reward["logged_value"],
        )
    return found, gamma


def run_dataset(
    spec: DatasetSpec, profile: Profile, seed: int, folder: Path, borrowed: dict[str, Path]
) -> DatasetResult:
    """Log the data set, train and play its policies, and evaluate each on its eval split.

    ``borrowed`` holds ``cartpole_random``'s runs by policy name: the loggers of the later
    data sets, and on those data sets two more candidates (``random:bad``, ``random:few``),
    evaluated as ``horizon evaluate --data`` evaluates another run's policy, so that the true
    values spread where every policy trained on a good logger's rows imitates it. This
    function adds the runs to it when it runs ``cartpole_random``."""
    start = time.perf_counter()
    rows = folder / f"{spec.name}.jsonl"
    logger_model = None if spec.logger == "random" else borrowed[spec.logger] / "model.onnx"
    log_rows(spec, seed, rows, logger_model)
    runs = {
        "few": train(rows, folder / f"{spec.name}-few", seed, profile.few_epochs),
        "mid": train(rows, folder / f"{spec.name}-mid", seed, profile.mid_epochs),
        "many": train(rows, folder / f"{spec.name}-many", seed, profile.many_epochs),
        "bad": train(rows, folder / f"{spec.name}-bad", seed, profile.many_epochs, negated=True),
    }
    candidates = {name: runs["few" if name == "random" else name] for name in POLICIES}
    if borrowed:
        candidates |= {f"random:{name}": borrowed[name] for name in BORROWED}
    reference = runs["few"]
    gamma, eval_episodes = math.nan, 0
    policies = []
    for name, run in candidates.items():
        evaluation = evaluate(run, reference, profile.num_bootstrap, random_policy=name == "random")
        estimates, gamma = estimates_of(evaluation)
        eval_episodes = evaluation["episodes"]
        model = None if name == "random" else run / "model.onnx"
        policies.append(PolicyResult(name, play(model, profile.played, gamma), estimates))
    if not borrowed:
        borrowed.update(runs)
    return DatasetResult(
        spec.name,
        logged_truth(rows, gamma),
        gamma,
        eval_episodes,
        policies,
        time.perf_counter() - start,
    )


@dataclass(frozen=True)
class Figures:
    """One estimator's figures on one data set."""

    kind: str
    unit: str
    relative_error: float
    """Median over the policies of |estimate - truth| / |truth|, in the estimator's unit."""
    ratio_error: float
    """Median of |relative - true ratio| / true ratio (the true ratio: policy / logger)."""
    coverage: float | None
    """Share of the policies whose truth lies in the interval; None without intervals."""
    near_coverage: float | None
    """Share of the policies whose interval meets the truth's own 95% interval (its mean +-
    2 standard errors): coverage forgiving the truth's sampling error."""
    spearman: float | None
    """Rank correlation of the estimates (to ``RANKED_DIGITS`` significant digits) with the
    undiscounted truth; None where either side is constant (no ranking to compare)."""
    regret: float
    """(best truth - truth of the policy with the highest estimate) / (best - worst), in the
    undiscounted return per episode; where several policies share the highest estimate, the
    mean of their truths (a choice among them at random)."""


def figures(result: DatasetResult, kind: str) -> Figures:
    """``kind``'s figures over the data set's policies."""
    from scipy.stats import spearmanr

    unit = (
        PER_STEP
        if kind in ONE_STEP
        else UNDISCOUNTED
        if kind == "logged_value"
        else discounted_unit(result.gamma)
    )
    errors, ratio_errors, covered, near, intervals = [], [], 0, 0, 0
    for policy in result.policies:
        estimate, truth = policy.estimates[kind], policy.truth.in_unit(kind)
        errors.append(abs(estimate.value - truth) / abs(truth))
        ratio = truth / result.logger.in_unit(kind)
        if estimate.relative is not None:
            ratio_errors.append(abs(estimate.relative - ratio) / abs(ratio))
        if estimate.low is not None and estimate.high is not None:
            intervals += 1
            covered += estimate.low <= truth <= estimate.high
            margin = 2 * policy.truth.error_in_unit(kind)
            near += estimate.low <= truth + margin and truth - margin <= estimate.high
    values = [
        float(f"{policy.estimates[kind].value:.{RANKED_DIGITS}g}") for policy in result.policies
    ]
    truths = [policy.truth.undiscounted for policy in result.policies]
    spearman = None
    if len(set(values)) > 1 and len(set(truths)) > 1:
        spearman = float(spearmanr(values, truths).statistic)
    chosen = statistics.fmean(
        truth for value, truth in zip(values, truths, strict=True) if value == max(values)
    )
    gap = max(truths) - min(truths)
    return Figures(
        kind,
        unit,
        float(np.median(errors)),
        float(np.median(ratio_errors)) if ratio_errors else math.nan,
        covered / intervals if intervals else None,
        near / intervals if intervals else None,
        spearman,
        (max(truths) - chosen) / gap if gap > 0 else 0.0,
    )


LEGEND = """\
rel.err: median over the policies of |estimate - truth| / truth, in the estimator's unit;
ratio err: the same of its relative value (estimate / logged) against truth / logger's truth;
coverage: share of the policies whose truth lies in the interval; cov.2se: whose interval
meets the truth's mean +- 2 standard errors (the truth is a sample mean); spearman: the estimates'
rank correlation with the undiscounted truth; regret: the share of the gap between the worst
and best policy's undiscounted truth lost by shipping the policy with the highest estimate."""


def _number(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def report(result: DatasetResult) -> str:
    """The data set's tables: the truths and every estimate, then the figures."""
    logger = result.logger
    lines = [
        f"\n## {result.name}: {logger.episodes} logged episodes, {result.eval_episodes} eval "
        f"episodes, gamma {result.gamma:g}, {result.seconds:.0f} s",
        f"logger: {logger.undiscounted:.1f} undiscounted / {logger.discounted:.2f} discounted "
        f"return per episode, {logger.per_step:.3f} reward per step (all logged episodes)",
        "",
        "truth (played; return per episode: undiscounted, discounted, each +- its standard "
        "error; reward per step; episodes):",
    ]
    for policy in result.policies:
        truth = policy.truth
        lines.append(
            f"  {policy.name:<11}{truth.undiscounted:>7.1f} +-{truth.undiscounted_error:<6.1f}"
            f"{truth.discounted:>7.2f} +-{truth.discounted_error:<6.2f}"
            f"{truth.per_step:>6.3f} {truth.episodes:>5}"
        )
    lines += [
        "",
        "estimates (raw value [interval], relative to the logged value on the eval rows):",
    ]
    for kind in estimator_kinds():
        cells = []
        for policy in result.policies:
            estimate = policy.estimates[kind]
            interval = (
                f" [{estimate.low:.2f}, {estimate.high:.2f}]"
                if estimate.low is not None and estimate.high is not None
                else ""
            )
            cells.append(
                f"{policy.name} {estimate.value:.2f}{interval} x{_number(estimate.relative, 2)}"
            )
        lines.append(f"  {kind:<14}" + "; ".join(cells))
    lines += [
        "",
        f"{'estimator':<14}{'unit':<40}{'rel.err':>8}{'ratio err':>10}{'coverage':>9}"
        f"{'cov.2se':>8}{'spearman':>9}{'regret':>7}",
    ]
    for kind in estimator_kinds():
        figure = figures(result, kind)
        lines.append(
            f"{kind:<14}{figure.unit:<40}{_number(figure.relative_error):>8}"
            f"{_number(figure.ratio_error):>10}{_number(figure.coverage, 2):>9}"
            f"{_number(figure.near_coverage, 2):>8}"
            f"{_number(figure.spearman, 2):>9}{_number(figure.regret, 2):>7}"
        )
    return "\n".join(lines)


def result_lines(result: DatasetResult) -> list[str]:
    """One ``RESULT`` line per estimator, as ``benchmarks/run_all.py`` gathers them: ours is
    the median relative error against the baseline, the played truth (in the estimator's
    unit), with the coverage, rank correlation and regret beside it."""
    lines = []
    for kind in estimator_kinds():
        figure = figures(result, kind)
        lines.append(
            f"RESULT name=cpe_truth_{result.name}_{kind}_relative_error"
            f" ours={figure.relative_error:.4g} baseline=played_truth"
            f" coverage={_number(figure.coverage, 2)}"
            f" coverage_2se={_number(figure.near_coverage, 2)}"
            f" spearman={_number(figure.spearman, 2)}"
            f" regret={figure.regret:.3g}"
        )
    return lines


def run_suite(profile: Profile, seed: int, folder: Path, names: Sequence[str] = ()) -> list:
    """Every data set of ``profile`` (those in ``names`` where given; ``cartpole_random``
    always, as it trains the other data sets' loggers)."""
    import torch

    torch.set_num_threads(1)
    borrowed: dict[str, Path] = {}
    results = []
    for spec in profile.datasets:
        if names and spec.name not in names and spec.name != "cartpole_random":
            continue
        results.append(run_dataset(spec, profile, seed, folder, borrowed))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="short")
    parser.add_argument("--quick", action="store_true", help="the short profile")
    parser.add_argument("--datasets", nargs="*", default=[], help="a subset of the profile's")
    parser.add_argument("--seed", type=int, default=7, help="logging and training seed")
    parser.add_argument("--played", type=int, help="episodes per played truth (the profile's)")
    parser.add_argument("--folder", type=Path, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.profile = "short"
    profile = PROFILES[args.profile]
    if args.played:
        profile = replace(profile, played=args.played)
    print(
        f"CPE truth suite, profile {args.profile}: CartPole-v1, seed {args.seed}, eval_fraction "
        f"{EVAL_FRACTION}, dqn few / mid / many = {profile.few_epochs} / {profile.mid_epochs} / "
        f"{profile.many_epochs} epochs, truth over {profile.played} played episodes per policy"
    )
    print(LEGEND)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        results = run_suite(profile, args.seed, folder, args.datasets)
    for result in results:
        print(report(result), flush=True)
    print()
    for result in results:
        print("\n".join(result_lines(result)))


if __name__ == "__main__":
    main()
