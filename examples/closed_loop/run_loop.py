"""The closed loop of the Horizon paper, simulated: score, explore, log, join late rewards,
retrain warm-started, round after round.

    python examples/closed_loop/run_loop.py --product bandit --rounds 4 --out runs/loop
    python examples/closed_loop/run_loop.py --product mdp --rounds 4 --out runs/loop

Round 0 logs a uniformly random policy's decisions (propensity 1/n). Each later round trains
with ``horizon run`` (the product's pipeline template beside this file) on every round's
joined decisions so far, warm-started from the previous round's run from round 2 on, exports
the policy to ONNX, serves it epsilon-greedy with ``horizon serve``'s HTTP app, lets the
simulated users ask it for decisions over HTTP (``traffic``), writes the rewards they report
late, and joins them with ``horizon join --window 48h``. Every round prints a line of the
table: decisions, rewarded and defaulted ones, rewards that came too late for the window, the
served policy's exact true value and CPE's estimate of that same policy (the run's
``cpe.json``, on its held-out episodes of the data it trained on).

Layout under ``--out/PRODUCT``: ``round-N/decisions.jsonl`` (the decision log),
``round-N/rewards.jsonl`` (the late metric rows), ``round-N/run/`` (the round's pipeline run,
``model.onnx`` and its own ``report.html`` in it), ``joined/round-N.jsonl`` (with its
``_round-N.jsonl.report.json``) and ``report.html``: every trained round's page side by side,
each round's policy evaluated on the last round's eval data.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from products import EngagementMdp, NotificationBandit, Policy
from traffic import Decide, DecisionClient, play_bandit, play_mdp, random_service

from horizon_engine import (
    Engine,
    Exploration,
    HorizonError,
    atomic_output,
    get_plugin_host,
    write_report,
)
from horizon_plugins_serving.decision_log import DecisionLog, open_decision_log
from horizon_plugins_serving.join_report import report_path
from horizon_plugins_serving.predictor import Predictor
from horizon_plugins_serving.server import BackgroundServer, build_app

HERE = Path(__file__).resolve().parent
EPSILON = 0.1
"""Exploration of every served policy: the actions it does not prefer keep being logged
(2.5% each in the bandit, 3.3% in the MDP), at about a tenth of what the best policy gains
over random play (0.031 of 0.31 in the bandit, 0.045 of 0.34 in the MDP)."""


@dataclass(frozen=True)
class ProductSpec:
    """A product, its pipeline template and its traffic per round: ``users`` decisions in
    requests of ``batch_size`` for the bandit, ``users`` episodes for the MDP.
    ``cold_start_epochs`` replaces the template's epochs in round 1, which trains from
    scratch, where the later rounds continue a trained network."""

    make: Callable[[int], NotificationBandit | EngagementMdp]
    template: Path
    users: int
    batch_size: int = 0
    cold_start_epochs: int | None = None


PRODUCTS = {
    "bandit": ProductSpec(NotificationBandit, HERE / "bandit.toml", users=1000, batch_size=500),
    "mdp": ProductSpec(EngagementMdp, HERE / "mdp.toml", users=1000, cold_start_epochs=7),
}


@dataclass
class RoundResult:
    """One round of the loop: what was logged and joined, and how good the served policy is
    (its exact value, and CPE's estimate of it from the run that trained it)."""

    round: int
    policy: str
    decisions: int
    rewarded: int
    defaulted: int
    late_rewards: int
    true_value: float
    estimates: dict[str, dict[str, float]] = field(default_factory=dict)
    """CPE label -> the reward's ``value``, ``low`` and ``high`` (none in round 0)."""


def uniform_policy(actions: Sequence[str]) -> Policy:
    return lambda observations: np.full((len(observations), len(actions)), 1.0 / len(actions))


def served_policy(model: Path) -> Policy:
    """The served model's action probabilities under the loop's exploration, computed by the
    same ``Predictor`` code that the server runs."""
    predictor = Predictor(model, Exploration("epsilon_greedy", EPSILON))
    return lambda observations: predictor.predict(observations).probabilities


def play(
    simulator: NotificationBandit | EngagementMdp,
    decide: Decide,
    spec: ProductSpec,
    round_number: int,
) -> list[dict[str, Any]]:
    """One round of the product's users asking ``decide``; the reward rows they report."""
    if isinstance(simulator, NotificationBandit):
        return play_bandit(simulator, decide, spec.users, spec.batch_size, round_number)
    return play_mdp(simulator, decide, spec.users, round_number)


def serve(model: Path, log: Path, seed: int, traffic: Callable[[Decide], Any]) -> Any:
    """``traffic`` run against ``model`` served epsilon-greedy over HTTP on 127.0.0.1, every
    decision logged to ``log``; the server stops (and the log is complete) on return."""
    predictor = Predictor(model, Exploration("epsilon_greedy", EPSILON), seed=seed)
    app = build_app(predictor, open_decision_log(log))
    with BackgroundServer(app) as server, DecisionClient(server.url) as client:
        return traffic(client.decide)


def horizon_command() -> str:
    """The ``horizon`` command of this Python's environment (or the first on PATH)."""
    beside = Path(sys.executable).with_name("horizon")
    found = str(beside) if beside.is_file() else shutil.which("horizon")
    if found is None:
        raise HorizonError("no `horizon` command beside this Python or on PATH (install it)")
    return found


def join_rewards(decisions: Path, rewards: Path, joined: Path) -> dict[str, Any]:
    """``horizon join DECISIONS REWARDS -o JOINED --window 48h``, a decision that no reward
    reached in time getting no click and no cost; the counts of its report."""
    command = [horizon_command(), "join", str(decisions), str(rewards), "-o", str(joined)]
    command += ["--window", "48h", "--default", "click=0", "--default", "cost=0"]
    joined.parent.mkdir(parents=True, exist_ok=True)
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise HorizonError(f"{' '.join(command)} failed: {finished.stderr.strip()}")
    return json.loads(report_path(joined).read_text("utf-8"))


def pipeline_config(spec: ProductSpec, out: Path, round_number: int, seed: int) -> dict[str, Any]:
    """The product's template with this round's paths filled in."""
    with open(spec.template, "rb") as handle:
        config = tomllib.load(handle)
    config["pipeline"] |= {"output_dir": str(run_folder(out, round_number)), "seed": seed}
    config["source"]["path"] = str(out / "joined" / "*.jsonl")
    if round_number >= 2:
        config["trainer"]["warm_start_from"] = str(run_folder(out, round_number - 1))
    elif spec.cold_start_epochs is not None:
        config["trainer"]["epochs"] = spec.cold_start_epochs
    return config


def run_folder(out: Path, round_number: int) -> Path:
    return out / f"round-{round_number}" / "run"


def cpe_estimates(run: Path) -> dict[str, dict[str, float]]:
    """Each estimator's final estimate of the reward, with its interval, from cpe.json."""
    report = json.loads((run / "cpe.json").read_text(encoding="utf-8"))
    estimates = {}
    for label, metrics in report["final"].items():
        reward = metrics.get("reward") if isinstance(metrics, dict) else None
        if isinstance(reward, dict) and "value" in reward:
            estimates[label] = {key: reward[key] for key in ("value", "low", "high")}
    return estimates


def run_round(
    spec: ProductSpec,
    simulator: NotificationBandit | EngagementMdp,
    out: Path,
    round_number: int,
    seed: int,
) -> RoundResult:
    """Train (from round 1 on), serve, play, write the rewards and join them."""
    folder = out / f"round-{round_number}"
    folder.mkdir(parents=True)
    decisions, rewards = folder / "decisions.jsonl", folder / "rewards.jsonl"
    estimates: dict[str, dict[str, float]] = {}
    if round_number == 0:
        name, policy = "uniform random", uniform_policy(simulator.ACTIONS)
        with DecisionLog(decisions) as log:
            decide = random_service(simulator.ACTIONS, seed, log)
            reward_list = play(simulator, decide, spec, round_number)
    else:
        run = run_folder(out, round_number)
        Engine(show_progress=False).run(pipeline_config(spec, out, round_number, seed))
        estimates = cpe_estimates(run)
        name, policy = f"trained, epsilon {EPSILON}", served_policy(run / "model.onnx")
        reward_list = serve(
            run / "model.onnx",
            decisions,
            seed * 1000 + round_number,
            lambda decide: play(simulator, decide, spec, round_number),
        )
    with atomic_output(rewards) as temporary:
        temporary.write_text("".join(json.dumps(row) + "\n" for row in reward_list), "utf-8")
    counts = join_rewards(decisions, rewards, out / "joined" / f"round-{round_number}.jsonl")
    return RoundResult(
        round_number,
        name,
        counts["decisions"],
        counts["rewarded"],
        counts["defaulted"],
        counts["late_rewards"],
        simulator.true_value(policy),
        estimates,
    )


def run_loop(product: str, rounds: int, out: Path, seed: int = 0) -> list[RoundResult]:
    """Run ``rounds`` rounds of the loop for ``product`` in the new folder ``out/product``,
    printing a line of the table after each; return the rounds' results."""
    spec = PRODUCTS[product]
    out = out / product
    if out.exists() and any(out.iterdir()):
        raise HorizonError(f"{out} holds an earlier loop's rounds: remove it or choose --out")
    simulator = spec.make(seed)
    print(table_header())
    results = []
    for round_number in range(rounds):
        results.append(run_round(spec, simulator, out, round_number, seed))
        print(table_line(results[-1]), flush=True)
    trained = [run_folder(out, number) for number in range(1, rounds)]
    if trained:
        page = write_report(trained, out / "report.html", get_plugin_host(), f"{product} loop")
        print(f"every trained round side by side: {page}")
    return results


def table_header() -> str:
    return (
        f"{'round':>5}  {'policy':<20} {'decisions':>9} {'rewarded':>8} {'defaulted':>9} "
        f"{'late':>5}  {'true value':>10}  CPE estimate of the served policy [95% interval]"
    )


def table_line(result: RoundResult) -> str:
    estimates = "  ".join(
        f"{label} {e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"
        for label, e in result.estimates.items()
    )
    return (
        f"{result.round:>5}  {result.policy:<20} {result.decisions:>9} {result.rewarded:>8} "
        f"{result.defaulted:>9} {result.late_rewards:>5}  {result.true_value:>10.4f}  "
        f"{estimates or '-'}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--product", choices=sorted(PRODUCTS), required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("runs/loop"))
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    try:
        run_loop(arguments.product, arguments.rounds, arguments.out, arguments.seed)
    except HorizonError as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
