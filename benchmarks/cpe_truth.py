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
estimate of a user who assumes no change) the undiscounted return per episode. The sequential
kinds and ``fqe`` run again at gamma 1 (labelled ``<kind>.g1``: finite-horizon FQE over the
longest eval episode, ``horizon_plugins_cpe.horizon_fqe``) and are judged against the
undiscounted return of each played episode's first ``H`` steps, ``H`` the longest logged
episode of the data set (nothing past what was logged can be known; CartPole-v1's own cap is
500), and again (``<kind>.g1@eval``) over the eval split's longest episode, the horizon the
estimator values (shorter than the logged one where the eval split is small). ``--no-refit``
holds ``fqe.g1``'s model fixed in its interval (the figures before its
refit per resample). Per estimator
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


UNDISCOUNTED_KINDS = ("sequential_dr", "weighted_dr", "magic", "fqe", "mis")
"""The kinds also run at gamma 1 (finite-horizon FQE, ``horizon_plugins_cpe.horizon_fqe``),
labelled ``<kind>.g1`` and judged against the undiscounted return cut at the logged horizon."""
GAMMA_ONE = ".g1"
EVAL_CUT = "@eval"
"""``<kind>.g1@eval``: the same estimate judged against the return of the first ``H`` steps,
``H`` the eval split's longest episode (the horizon the estimator itself values)."""


def discounted_unit(gamma: float) -> str:
    """The sequential kinds' unit."""
    return f"return per episode, discounted at {gamma:g}"


def cut_unit(horizon: int) -> str:
    """The unit of the kinds run at gamma 1."""
    return f"return per episode, first {horizon} steps"


def at_gamma_one(kind: str) -> bool:
    """Whether ``kind`` is a label of a kind run at gamma 1 (or its judgement at the eval
    split's horizon)."""
    return GAMMA_ONE in kind


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


def judged_kinds() -> tuple[str, ...]:
    """``estimator_kinds`` and each kind at gamma 1 judged at the eval split's horizon too."""
    return (*estimator_kinds(), *(kind + GAMMA_ONE + EVAL_CUT for kind in UNDISCOUNTED_KINDS))


def estimator_kinds() -> tuple[str, ...]:
    """Every ``[[evaluation]]`` kind: the cpe plugin's estimators, the sequential ones again at
    gamma 1 (``<kind>.g1``), and ``logged_value``."""
    from horizon_plugins_cpe.formulas import KINDS

    return (*KINDS, *(kind + GAMMA_ONE for kind in UNDISCOUNTED_KINDS), "logged_value")


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
    cut: float = math.nan
    """The undiscounted return of each episode's first ``horizon`` steps (the logged
    horizon: what the kinds at gamma 1 estimate), and its standard error."""
    cut_error: float = math.nan
    eval_cut: float = math.nan
    """The same over the first ``H`` steps, ``H`` the eval split's longest episode."""
    eval_cut_error: float = math.nan

    def in_unit(self, kind: str) -> float:
        """The truth in the unit ``kind`` claims."""
        return getattr(self, _unit_fields(kind)[0])

    def error_in_unit(self, kind: str) -> float:
        """The standard error of ``in_unit(kind)``; 0 for the reward per step, which is 1 on
        every CartPole step whatever the policy."""
        error = _unit_fields(kind)[1]
        return 0.0 if error is None else getattr(self, error)


def _unit_fields(kind: str) -> tuple[str, str | None]:
    """The ``Truth`` fields of the value and of its standard error in ``kind``'s unit."""
    if kind in ONE_STEP:
        return "per_step", None
    if kind == "logged_value":
        return "undiscounted", "undiscounted_error"
    if kind.endswith(EVAL_CUT):
        return "eval_cut", "eval_cut_error"
    if at_gamma_one(kind):
        return "cut", "cut_error"
    return "discounted", "discounted_error"


def truth_of_episodes(
    rewards: Sequence[Sequence[float]],
    gamma: float,
    horizon: int | None = None,
    eval_horizon: int | None = None,
) -> Truth:
    """The mean returns of episodes given as their rewards (``cut`` over their first
    ``horizon`` steps, ``eval_cut`` over their first ``eval_horizon``; all when None)."""
    undiscounted = [float(np.sum(episode)) for episode in rewards]
    discounted = [float(np.dot(gamma ** np.arange(len(episode)), episode)) for episode in rewards]
    cut = [float(np.sum(episode[:horizon])) for episode in rewards]
    eval_cut = [float(np.sum(episode[:eval_horizon])) for episode in rewards]
    steps = sum(len(episode) for episode in rewards)
    root = math.sqrt(len(rewards))
    return Truth(
        statistics.fmean(undiscounted),
        statistics.fmean(discounted),
        sum(undiscounted) / steps,
        len(rewards),
        statistics.stdev(undiscounted) / root if len(rewards) > 1 else math.nan,
        statistics.stdev(discounted) / root if len(rewards) > 1 else math.nan,
        statistics.fmean(cut),
        statistics.stdev(cut) / root if len(rewards) > 1 else math.nan,
        statistics.fmean(eval_cut),
        statistics.stdev(eval_cut) / root if len(rewards) > 1 else math.nan,
    )


def play(
    model: Path | None,
    episodes: int,
    gamma: float,
    horizon: int | None = None,
    eval_horizon: int | None = None,
    env_id: str = "CartPole-v1",
) -> Truth:
    """The truth of the exported ``model`` played greedily (uniform random play for None),
    cut at ``horizon`` and ``eval_horizon`` steps for the kinds at gamma 1."""
    rewards = played_rewards(model, episodes, env_id)
    return truth_of_episodes(rewards, gamma, horizon, eval_horizon)


@functools.cache
def played_rewards(model: Path | None, episodes: int, env_id: str) -> list[list[float]]:
    """Each played episode's rewards (kept: the borrowed policies are played once)."""
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
    return played


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


def eval_horizon(run: Path) -> int:
    """The longest episode of ``run``'s eval split, in rows (the estimators' ``H``)."""
    import pyarrow.parquet as pq

    lengths: dict[str, int] = {}
    for path in sorted((run / "timeline" / "eval").glob("*.parquet")):
        for mdp_id in pq.read_table(path, columns=["mdp_id"]).column("mdp_id").to_pylist():
            lengths[mdp_id] = lengths.get(mdp_id, 0) + 1
    return max(lengths.values())


def logged_episodes(rows: Path) -> list[list[float]]:
    """Every logged episode's rewards, in step order."""
    episodes: dict[str, list[tuple[int, float]]] = {}
    with rows.open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            episodes.setdefault(row["mdp_id"], []).append(
                (int(row["sequence_number"]), float(row["reward"]))
            )
    return [[reward for _, reward in sorted(steps)] for steps in episodes.values()]


def suite_entries(num_bootstrap: int) -> list[dict[str, Any]]:
    """The suite's ``[[evaluation]]`` entries: every estimator, run once after training."""
    entries = []
    for label in estimator_kinds():
        kind = label.removesuffix(GAMMA_ONE)
        entry: dict[str, Any] = {"kind": kind, "every_epoch": False}
        if at_gamma_one(label):
            entry |= {"label": label, "gamma": 1.0}
        if kind != "logged_value":
            entry["num_bootstrap"] = num_bootstrap
        entries.append(entry)
    return entries


def train_shipping_best(rows: Path, output: Path, seed: int, epochs: int) -> Path:
    """The ``many`` run as a user who ships by the verdict runs it: the same training (its
    epochs' checkpoints are ``many``'s), the default estimators (no ``[[evaluation]]``) and
    ``[export] checkpoint = "best"``; returns its folder."""
    from horizon_engine import Engine

    shutil.rmtree(output, ignore_errors=True)
    config = {
        "pipeline": {"output_dir": str(output), "seed": seed},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"actions": ACTIONS, "eval_fraction": EVAL_FRACTION},
        "trainer": {"kind": "dqn", "epochs": epochs, "threads": 1},
        "export": {"kind": "onnx", "checkpoint": "best"},
    }
    Engine(show_progress=False).run(config)
    return output


@dataclass(frozen=True)
class Shipping:
    """What ``[export] checkpoint = "best"`` shipped of the ``many`` training, against the
    last epoch (``many`` itself), each played."""

    epoch: int
    last_epoch: int
    evaluated: list[int]
    best: Truth
    last: Truth
    same_training: bool
    """Whether the run's last checkpoint holds ``many``'s weights (so that ``last`` is its
    last epoch's truth)."""


def same_weights(first: Path, second: Path) -> bool:
    """Whether two checkpoints hold the same trainer weights."""
    import torch

    def tensors(path: Path) -> dict[str, Any]:
        state = torch.load(path, map_location="cpu", weights_only=False)["trainer"]
        return {
            f"{module}.{name}": value
            for module, values in state.items()
            if isinstance(values, dict)
            for name, value in values.items()
            if isinstance(value, torch.Tensor)
        }

    one, two = tensors(first), tensors(second)
    return one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def train(
    rows: Path, output: Path, seed: int, epochs: int, num_bootstrap: int, negated: bool = False
) -> Path:
    """A ``horizon run`` of the dqn defaults on ``rows`` for ``epochs`` epochs (on the negated
    reward where ``negated``), with the suite's entries (``suite_entries``) as its
    ``[[evaluation]]``, which its evaluation stage runs once (without them the run records
    the evaluation's defaults, and ``horizon evaluate`` runs those); returns its folder."""
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
        "evaluation": suite_entries(num_bootstrap),
    }
    Engine(show_progress=False).run(config)
    return output


def evaluate(run: Path, reference: Path, num_bootstrap: int, random_policy: bool) -> dict:
    """``horizon evaluate RUN --data REFERENCE`` with every estimator (the evaluated policy
    uniform random where ``random_policy``): what ``cpe_evaluate.json`` would hold."""
    from horizon_engine import evaluate_run

    entries = suite_entries(num_bootstrap)
    overrides = []
    if random_policy:
        for index, entry in enumerate(entries):
            if entry["kind"] != "logged_value":
                overrides += [f"evaluation.{index}.policy=epsilon_greedy"]
                overrides += [f"evaluation.{index}.epsilon=1.0"]
    return evaluate_run(run, data=reference, default_evaluation=entries, overrides=overrides)


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
    final: dict[str, Any] = field(default_factory=dict)
    """``evaluate_run``'s ``final``: every entry's estimates as ``cpe.json`` holds them (what
    the verdict is decided from)."""


@dataclass
class DatasetResult:
    """A data set's candidates, its logger's truth and the discount its estimates used."""

    name: str
    logger: Truth
    gamma: float
    eval_episodes: int
    policies: list[PolicyResult]
    seconds: float
    horizon: int = 0
    """The longest logged episode's steps: where the truth of the kinds at gamma 1 is cut."""
    eval_horizon: int = 0
    """The eval split's longest episode's (``<kind>.g1@eval``'s cut)."""
    shipping: Shipping | None = None


def estimates_of(evaluation: dict) -> tuple[dict[str, Estimate], float]:
    """The ``reward`` estimate of every entry of an ``evaluate_run`` result, and the gamma."""
    found: dict[str, Estimate] = {}
    gamma = math.nan
    for label, entry in evaluation["final"].items():
        if not at_gamma_one(label):
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
    logged = logged_episodes(rows)
    horizon = max(map(len, logged))
    runs = {
        name: train(rows, folder / f"{spec.name}-{name}", seed, epochs, profile.num_bootstrap)
        for name, epochs in (
            ("few", profile.few_epochs),
            ("mid", profile.mid_epochs),
            ("many", profile.many_epochs),
        )
    }
    runs["bad"] = train(
        rows,
        folder / f"{spec.name}-bad",
        seed,
        profile.many_epochs,
        profile.num_bootstrap,
        negated=True,
    )
    candidates = {name: runs["few" if name == "random" else name] for name in POLICIES}
    valued = eval_horizon(runs["few"])
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
        truth = play(model, profile.played, gamma, horizon, valued)
        policies.append(PolicyResult(name, truth, estimates, evaluation["final"]))
    best_run = train_shipping_best(
        rows, folder / f"{spec.name}-many-best", seed, profile.many_epochs
    )
    choice = json.loads((best_run / "manifest.json").read_text())["verdict"]["checkpoint"]
    shipping = Shipping(
        choice["epoch"],
        choice["last_epoch"],
        choice["evaluated"],
        play(best_run / "model.onnx", profile.played, gamma, horizon, valued),
        next(p.truth for p in policies if p.name == "many"),
        same_weights(
            runs["many"] / "checkpoints" / "latest.pt", best_run / "checkpoints" / "latest.pt"
        ),
    )
    if not borrowed:
        borrowed.update(runs)
    return DatasetResult(
        spec.name,
        truth_of_episodes(logged, gamma, horizon, valued),
        gamma,
        eval_episodes,
        policies,
        time.perf_counter() - start,
        horizon,
        valued,
        shipping,
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
        else cut_unit(result.eval_horizon)
        if kind.endswith(EVAL_CUT)
        else cut_unit(result.horizon)
        if at_gamma_one(kind)
        else discounted_unit(result.gamma)
    )
    errors, ratio_errors, covered, near, intervals = [], [], 0, 0, 0
    for policy in result.policies:
        estimate = policy.estimates[kind.removesuffix(EVAL_CUT)]
        truth = policy.truth.in_unit(kind)
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
        float(f"{policy.estimates[kind.removesuffix(EVAL_CUT)].value:.{RANKED_DIGITS}g}")
        for policy in result.policies
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
and best policy's undiscounted truth lost by shipping the policy with the highest estimate;
<kind>.g1: the kind at gamma 1 (finite-horizon FQE), judged against the undiscounted return of
the first H steps, H the longest logged episode; <kind>.g1@eval: the same estimate judged over
the first H steps, H the longest eval episode (the horizon the estimator values)."""


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
        "truth (played; return per episode: undiscounted, discounted, over the first "
        f"{result.horizon} steps (the longest logged episode), over the first "
        f"{result.eval_horizon} (the longest eval episode), each +- its standard error; "
        "reward per step; episodes):",
    ]
    for policy in result.policies:
        truth = policy.truth
        lines.append(
            f"  {policy.name:<11}{truth.undiscounted:>7.1f} +-{truth.undiscounted_error:<6.1f}"
            f"{truth.discounted:>7.2f} +-{truth.discounted_error:<6.2f}"
            f"{truth.cut:>7.1f} +-{truth.cut_error:<6.1f}"
            f"{truth.eval_cut:>7.1f} +-{truth.eval_cut_error:<6.1f}"
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
        lines.append(f"  {kind:<17}" + "; ".join(cells))
    lines += [
        "",
        f"{'estimator':<22}{'unit':<40}{'rel.err':>8}{'ratio err':>10}{'coverage':>9}"
        f"{'cov.2se':>8}{'spearman':>9}{'regret':>7}",
    ]
    for kind in judged_kinds():
        figure = figures(result, kind)
        lines.append(
            f"{kind:<22}{figure.unit:<40}{_number(figure.relative_error):>8}"
            f"{_number(figure.ratio_error):>10}{_number(figure.coverage, 2):>9}"
            f"{_number(figure.near_coverage, 2):>8}"
            f"{_number(figure.spearman, 2):>9}{_number(figure.regret, 2):>7}"
        )
    return "\n".join(lines)


def default_labels() -> dict[str, str]:
    """The suite's label of each entry a pipeline runs at its defaults (each estimator's
    ``default_entries``), by the label the pipeline gives it: the same kind at the same
    gamma (the suite runs every kind at the trainer's gamma, and the sequential ones again at
    gamma 1 as ``<kind>.g1``)."""
    from horizon_engine import get_plugin_host

    labels = {}
    for component in get_plugin_host().components("estimators"):
        for entry in component.cls.default_entries:
            label = entry.get("label") or component.name
            gamma_one = entry.get("gamma") == 1.0 and component.name in UNDISCOUNTED_KINDS
            labels[label] = component.name + (GAMMA_ONE if gamma_one else "")
    return labels


def default_verdict(final: dict[str, Any], episodes: int) -> dict[str, Any]:
    """The verdict a pipeline at its default ``[[evaluation]]`` reaches: its entries' estimates
    taken from the suite's ``final`` (``default_labels``), decided as the evaluation stage
    decides (``horizon_engine.verdict``)."""
    from horizon_engine import get_plugin_host
    from horizon_engine.verdict import candidates_of, decide

    classes = {c.name: c.cls for c in get_plugin_host().components("estimators")}
    chosen, kinds, preferences = {}, {}, {}
    for label, suite_label in default_labels().items():
        if suite_label in final:
            kind = suite_label.removesuffix(GAMMA_ONE)
            chosen[label] = final[suite_label]
            kinds[label] = kind
            preferences[label] = classes[kind].verdict_preference
    return decide(candidates_of(chosen, kinds, preferences, episodes), episodes)


@dataclass(frozen=True)
class VerdictFigures:
    """The default verdict's figures on one data set, against the played truth over the
    horizon the verdict counts (the longest logged episode's steps; the eval split's where
    the timeline it read held no longer one)."""

    coverage: float
    """Share of the policies whose truth lies in the verdict's interval."""
    relative_error: float
    """Median |estimate - truth| / |truth|."""
    spearman: float | None
    """Rank correlation of the verdicts' lower bounds with the truths."""
    regret: float
    """Share of the gap between the worst and best policy's truth lost by shipping the one
    whose verdict has the highest lower bound (the conservative choice: an unclear verdict's
    interval reaches down to what the rewards allow)."""
    false_ships: list[str]
    """Policies decided ``better`` whose truth is below the logger's."""
    missed: list[str]
    """Policies at least 20% above the logger (in truth) not decided ``better``."""
    decisions: dict[str, str]
    """Each policy's decision and recommended estimator, ``better (fqe)``."""


BETTER_BY = 1.2
"""A policy this many times the logger's truth must be shipped (``VerdictFigures.missed``)."""


def verdict_figures(result: DatasetResult) -> VerdictFigures:
    """The default verdict's coverage, error, ranking, regret and decisions on ``result``."""
    from scipy.stats import spearmanr

    covered, errors, lows, truths = 0, [], [], []
    false_ships, missed, decisions = [], [], {}
    for policy in result.policies:
        verdict = default_verdict(policy.final, result.eval_episodes)
        eval_cut = verdict["horizon"] == result.eval_horizon != result.horizon
        truth = policy.truth.eval_cut if eval_cut else policy.truth.cut
        logger = result.logger.eval_cut if eval_cut else result.logger.cut
        low, high = verdict["interval"] or (math.nan, math.nan)
        covered += low <= truth <= high
        estimate = verdict["estimate"] if verdict["estimate"] is not None else math.nan
        errors.append(abs(estimate - truth) / abs(truth))
        lows.append(low)
        truths.append(truth)
        decision = verdict["decision"]
        decisions[policy.name] = f"{decision} ({verdict['estimator']})"
        if decision == "better" and truth < logger:
            false_ships.append(policy.name)
        if truth >= BETTER_BY * logger and decision != "better":
            missed.append(policy.name)
    correlation = spearmanr(lows, truths).statistic if len(set(lows)) > 1 else None
    best, worst = max(truths), min(truths)
    shipped = truths[int(np.nanargmax(lows))] if not all(map(math.isnan, lows)) else worst
    return VerdictFigures(
        coverage=covered / len(result.policies),
        relative_error=statistics.median(errors),
        spearman=None if correlation is None or math.isnan(correlation) else float(correlation),
        regret=(best - shipped) / (best - worst) if best > worst else 0.0,
        false_ships=false_ships,
        missed=missed,
        decisions=decisions,
    )


def verdict_report(result: DatasetResult) -> str:
    """The default verdict's figures on one data set, for people."""
    figure = verdict_figures(result)
    lines = [
        f"  verdict at the defaults (truth over the first {result.horizon} steps; "
        f"logger {result.logger.cut:.1f}): coverage {figure.coverage:.2f}, median "
        f"relative error {figure.relative_error:.3f}, Spearman {_number(figure.spearman, 2)}, "
        f"regret {figure.regret:.2f}, false ships {figure.false_ships or 'none'}, missed "
        f"ships {figure.missed or 'none'}"
    ]
    for policy in result.policies:
        verdict = default_verdict(policy.final, result.eval_episodes)
        interval = verdict["interval"] or [math.nan, math.nan]
        lines.append(
            f"    {policy.name:<11} truth {policy.truth.cut:7.1f}  "
            f"{figure.decisions[policy.name]:<24} {_number(verdict['estimate'], 1):>7} "
            f"[{_number(interval[0], 1)}, {_number(interval[1], 1)}]"
        )
    shipping = result.shipping
    if shipping is not None:
        lines.append(
            f'  shipping the many run by the verdict ([export] checkpoint = "best", the '
            f"default estimators): epoch {shipping.epoch} of {shipping.evaluated} plays "
            f"{shipping.best.undiscounted:.1f} per episode; the last epoch, "
            f"{shipping.last_epoch}, plays {shipping.last.undiscounted:.1f} (ratio "
            f"{shipping.best.undiscounted / shipping.last.undiscounted:.3f})"
            + ("" if shipping.same_training else "; NOTE: its training differs from many's")
        )
    return "\n".join(lines)


def saved(results: Sequence[DatasetResult]) -> list[dict[str, Any]]:
    """Every data set's truths and every policy's estimates, as JSON (``--save``): what a
    change to the verdict's rules can be measured on without training again."""
    from dataclasses import asdict

    return [
        {
            "name": result.name,
            "logger": asdict(result.logger),
            "gamma": result.gamma,
            "eval_episodes": result.eval_episodes,
            "horizon": result.horizon,
            "eval_horizon": result.eval_horizon,
            "policies": [
                {"name": p.name, "truth": asdict(p.truth), "final": p.final}
                for p in result.policies
            ],
        }
        for result in results
    ]


def result_lines(result: DatasetResult) -> list[str]:
    """One ``RESULT`` line per estimator, as ``benchmarks/run_all.py`` gathers them: ours is
    the median relative error against the baseline, the played truth (in the estimator's
    unit), with the coverage, rank correlation and regret beside it."""
    lines = []
    for kind in judged_kinds():
        figure = figures(result, kind)
        lines.append(
            f"RESULT name=cpe_truth_{result.name}_{kind}_relative_error"
            f" ours={figure.relative_error:.4g} baseline=played_truth"
            f" coverage={_number(figure.coverage, 2)}"
            f" coverage_2se={_number(figure.near_coverage, 2)}"
            f" spearman={_number(figure.spearman, 2)}"
            f" regret={figure.regret:.3g}"
        )
    if result.shipping is not None:
        lines.append(
            f"RESULT name=cpe_truth_{result.name}_ship_best"
            f" ours={result.shipping.best.undiscounted:.4g}"
            f" baseline={result.shipping.last.undiscounted:.4g}"
            f" ratio={result.shipping.best.undiscounted / result.shipping.last.undiscounted:.3f}"
            f" epoch={result.shipping.epoch}"
        )
    verdict = verdict_figures(result)
    lines.append(
        f"RESULT name=cpe_truth_{result.name}_verdict_relative_error"
        f" ours={verdict.relative_error:.4g} baseline=played_truth"
        f" coverage={verdict.coverage:.2f} spearman={_number(verdict.spearman, 2)}"
        f" regret={verdict.regret:.3g} false_ships={len(verdict.false_ships)}"
        f" missed={len(verdict.missed)}"
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
    parser.add_argument("--save", type=Path, help="write every truth and estimate here (JSON)")
    parser.add_argument(
        "--no-refit",
        action="store_true",
        help="hold fqe.g1's finite-horizon model fixed in its interval (before the refit)",
    )
    args = parser.parse_args()
    if args.no_refit:
        from horizon_plugins_cpe import horizon_fqe

        horizon_fqe.REFIT_WORK = 0.0
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
        print(verdict_report(result), flush=True)
    if args.save:
        args.save.write_text(json.dumps(saved(results), indent=1) + "\n", encoding="utf-8")
    print()
    for result in results:
        print("\n".join(result_lines(result)))


if __name__ == "__main__":
    main()
