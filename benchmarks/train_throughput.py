"""DQN training throughput: the ``dqn`` trainer and the train stage beside a bare PyTorch loop.

    .venv/bin/python benchmarks/train_throughput.py            # about 3 minutes here
    .venv/bin/python benchmarks/train_throughput.py --quick    # about 1.5 minutes
    .venv/bin/python benchmarks/train_throughput.py --threads-sweep

Builds CartPole timelines from random play with examples/cartpole_dqn.toml (1,370 episodes:
about 30,000 rows; 3-step windows as the example builds them, and 1-step ones for the plain
rows), then measures, on the same rows and the same number of CPU threads (``--threads``, 1 by
default, as ``[trainer] threads = "auto"`` picks for these networks):

- ``update_b256``, ``update_b1024``: the update alone. Ours: the ``dqn`` trainer (layers
  [128, 64], double Q, 1 step, no CQL) set up by the training driver, fed the minibatches of
  the split the driver prepares (``TrainingDriver.prepare``: the preprocessor's output computed
  once), each through ``train_batch`` (the update, the metrics' sums). The bare loop: the same
  network and double-DQN update written directly, on states normalized once beforehand, with
  ``torch.optim.Adam(foreach=True)`` and a ``torch._foreach_lerp_`` target update, reading its
  loss every step as the trainer reads its metrics. The trainer's own optimizer makes Adam's
  foreach operations without ``torch.optim`` (horizon_engine/optimizers.py, the same
  numbers to the bit), so the bare loop also runs on it: ``ratio_same_optimizer`` is ours
  against that, the gap the optimizer does not explain.
- ``update_example_b256``: the same with the example's settings (the trainer's defaults:
  3-step returns and CQL), the bare loop computing the same 3-step target and CQL penalty.
- ``stage``: the whole train stage of the example (``horizon run --stages train``: loading the
  splits, setting up, 20 epochs of updates with the evaluation, the per-epoch estimators and
  a checkpoint after each), its updates per second of its wall time, against the bare loop's
  updates per second with the example's settings. Beside them, the same epochs of the
  stage's updates alone (``train_batch`` on the prepared split): where the rest goes, the
  update's gap to the bare loop or the stage's time outside its updates. Then the stage again,
  its phases timed (``stage_phases``): each phase of the training thread as a share of the
  wall time (loading, setup, the updates, the epochs' ends on that thread, waiting for one),
  and each part of the epochs' ends (evaluation, estimators, checkpoints, the hook), which run
  beside the next epoch's updates after the first (``horizon_engine.epoch_ends``), and the rate
  of the updates inside the stage against the updates alone: what the work beside them costs
  the training thread (the GIL, or a core the machine does not have free).
- ``stage_streamed``: the same with ``[trainer] data = "streamed"`` (the train split read from
  its Parquet row groups as it goes), against the same bare loop in memory.
- ``first_optimizer``: seconds to construct the first optimizer of a fresh process
  (``torch.optim.Adam`` imports ``torch._dynamo`` then), the trainer's against torch's; its
  ratio is of seconds, lower is better.

The sides run in interleaved blocks (A B C, then B C A, ...) so that the load of a shared
machine falls on all alike; each row prints the medians and ranges of the blocks' rates and the
median and range of the blocks' ratios (ours / bare, above 1 is faster: each block's sides run
within seconds of each other), then a line ``RESULT name=... ours=... baseline=... ratio=...
unit=...`` to build a table from (baseline: the bare PyTorch loop).

``--threads-sweep`` times a synthetic double-DQN update at growing sizes on one thread and on
torch's default, interleaved: how ``[trainer] threads = "auto"`` was chosen
(``horizon_engine.training.PARALLEL_UPDATE_WORK``).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from horizon_engine import ForeachAdam
from horizon_engine import driver as driver_module
from horizon_engine import streamed as streamed_module
from horizon_engine import training as training_module
from horizon_engine.config import build_spec
from horizon_engine.dataset import TimelineTensors
from horizon_engine.driver import TrainingDriver, load_split, timeline_problem
from horizon_engine.epoch_ends import EpochEnds
from horizon_engine.evaluation import EpisodeEvaluation
from horizon_engine.pipeline import Engine
from horizon_engine.run_context import HostedRun, StageRun

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cartpole_dqn.toml"
GAMMA = 0.99
TARGET_UPDATE_RATE = 0.01
LAYERS = (128, 64)
PLAIN = {"n_step": 1, "cql_alpha": 0.0, "double_q": True}
"""The plain rows' trainer options: one-step double DQN, the bare loop's update."""


def overrides(folder: Path, episodes: int, threads: int, **options: object) -> list[str]:
    """``--set`` overrides of the example: the run folder, the episodes, the threads, and
    ``options`` as ``section.key`` -> value."""
    values = {
        "pipeline.output_dir": str(folder),
        "source.episodes": episodes,
        "trainer.threads": threads,
        "trainer.device": "cpu",
        **options,
    }
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def build_timeline(engine: Engine, settings: list[str]) -> None:
    """The example's source, timeline and normalization stages, with ``settings``."""
    engine.run(EXAMPLE, settings, stages=["source", "timeline", "normalization"], overwrite=True)


def trainer_driver(engine: Engine, settings: list[str]) -> tuple[TrainingDriver, TimelineTensors]:
    """The training driver for the run ``settings`` describe, and its train split as the
    driver trains on it."""
    spec = build_spec(EXAMPLE, engine.plugins, settings)
    run = StageRun.start(spec, engine.plugins, "benchmark")
    description, normalization = timeline_problem(run)
    driver = TrainingDriver(
        run, spec.sections["trainer"], description, normalization, plugins=engine.plugins
    )
    data = driver.prepare(load_split(run, description, "train", driver.device))
    return driver, data


@dataclass
class BareLoop:
    """A double-DQN update written directly on the split, its states normalized once: the
    baseline. ``n_step`` bootstraps from the timeline's 3-step windows, ``cql_alpha`` adds the
    conservative penalty with the trainer's default weighting: ``cql_alpha * max(0, 1 -
    coverage / cql_covered)``, the coverage each minibatch's logged propensities show (the
    least probability the logger gave any possible action, times their count; 0 for a row
    without a valid propensity). Random play covers the actions evenly, so the weight is 0 and,
    as in the trainer, the penalty's backward is left out: a bare loop adding it at the full
    ``cql_alpha`` did work the trainer does not."""

    data: TimelineTensors
    states: dict[str, torch.Tensor]
    batch_size: int
    n_step: bool
    cql_alpha: float
    cql_covered: float = 1.0
    optimizer_kind: str = "torch"
    """"torch": ``torch.optim.Adam(foreach=True)``; "trainer": the trainer's ``ForeachAdam``."""

    def __post_init__(self) -> None:
        torch.manual_seed(0)
        width = self.states["state"].shape[1]
        self.network = torch.nn.Sequential(
            torch.nn.Linear(width, LAYERS[0]),
            torch.nn.ReLU(),
            torch.nn.Linear(LAYERS[0], LAYERS[1]),
            torch.nn.ReLU(),
            torch.nn.Linear(LAYERS[1], self.data.possible_actions.shape[1]),
        )
        self.target = copy.deepcopy(self.network).requires_grad_(False)
        optimizer = torch.optim.Adam if self.optimizer_kind == "torch" else ForeachAdam
        kind = {"foreach": True} if self.optimizer_kind == "torch" else {}
        self.optimizer = optimizer(self.network.parameters(), lr=1e-3, **kind)
        self.slow = list(self.target.parameters())
        self.fast = list(self.network.parameters())
        self.generator = torch.Generator().manual_seed(0)
        if self.n_step:
            window = self.data.next_n_rewards.shape[1]
            self.powers = GAMMA ** torch.arange(window, dtype=torch.float32)
            self.steps = torch.arange(window)

    def target_value(self, rows: torch.Tensor) -> torch.Tensor:
        """The TD target of ``rows``: one step, or the n-step return and its bootstrap."""
        data = self.data
        if self.n_step:
            rewards = data.next_n_rewards[rows]
            length = data.next_n_length[rows]
            inside = (self.steps < length.unsqueeze(1)).float()
            returns = (inside * self.powers * rewards).sum(dim=1)
            last = data.next_n_not_terminal[rows].gather(1, (length - 1).unsqueeze(1))
            discount = GAMMA ** length.float() * last.squeeze(1)
            following = self.states["next_n_state"][rows]
            possible = data.next_n_possible_next_actions[rows]
        else:
            returns = data.reward[rows]
            discount = GAMMA * data.not_terminal[rows]
            following = self.states["next_state"][rows]
            possible = data.possible_next_actions[rows]
        online = self.network(following)
        best = torch.where(possible > 0, online, -1e9).argmax(dim=1, keepdim=True)
        return returns + discount * self.target(following).gather(1, best).squeeze(1)

    def cql_weight(self, rows: torch.Tensor) -> float:
        """The conservative penalty's weight on ``rows``: 0 where the logs cover every
        possible action as evenly as ``cql_covered`` asks."""
        if not self.cql_alpha:
            return 0.0
        possible = self.data.possible_actions[rows]
        propensity = self.data.action_probability[rows]
        count = possible.sum(dim=1)
        floor = torch.minimum(propensity, (1 - propensity) / (count - 1).clamp(min=1))
        known = (propensity > 0) & (propensity <= 1) & (count > 1)
        coverage = float(torch.where(known, (count * floor).clamp(0, 1), 0.0).mean())
        return self.cql_alpha * max(0.0, 1.0 - coverage / self.cql_covered)

    def epoch(self) -> int:
        """One pass of shuffled minibatches; returns the updates made."""
        order = torch.randperm(len(self.data), generator=self.generator)
        updates = 0
        for start in range(0, len(self.data), self.batch_size):
            rows = order[start : start + self.batch_size]
            with torch.no_grad():
                wanted = self.target_value(rows)
            scores = self.network(self.states["state"][rows])
            action = self.data.action[rows].unsqueeze(1)
            chosen = scores.gather(1, action).squeeze(1)
            loss = F.smooth_l1_loss(chosen, wanted)
            weight = self.cql_weight(rows)
            if weight > 0:
                possible = self.data.possible_actions[rows] > 0
                penalty = torch.logsumexp(torch.where(possible, scores, -1e9), dim=1) - chosen
                loss = loss + weight * penalty.mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            with torch.no_grad():
                torch._foreach_lerp_(self.slow, self.fast, TARGET_UPDATE_RATE)
            float(loss.detach())
            updates += 1
        return updates


def bare_loop(driver: TrainingDriver, data: TimelineTensors, optimizer: str) -> BareLoop:
    """The baseline on ``data``, normalized once by the driver's preprocessor, with the math
    of the driver's trainer options and ``optimizer`` (``BareLoop.optimizer_kind``)."""
    preprocessor = driver.problem.state_preprocessor
    with torch.no_grad():
        states = {
            name: preprocessor(getattr(data, name), getattr(data, f"{name}_presence"))
            for name in ("state", "next_state", "next_n_state")
            if getattr(data, name) is not None
        }
    config = driver.trainer.config
    n_step = config.n_step != 1 and data.next_n_rewards is not None
    batch_size = config.minibatch_size
    return BareLoop(
        data, states, batch_size, n_step, config.cql_alpha, config.cql_covered, optimizer
    )


def trainer_epoch(driver: TrainingDriver, data: TimelineTensors) -> Callable[[], int]:
    """One epoch of the driver's updates on ``data``; returns the updates made."""
    generator = torch.Generator().manual_seed(0)
    batch_size = driver.config.minibatch_size

    def epoch() -> int:
        before = driver.updates
        for batch in data.minibatches(batch_size, generator):
            driver.train_batch(batch)
        return driver.updates - before

    return epoch


def interleaved(
    sides: dict[str, Callable[[], tuple[int, float]]], blocks: int
) -> dict[str, list[float]]:
    """Each side's rate (work / seconds) in ``blocks`` blocks, the sides' order rotating from
    block to block; one untimed call of each first."""
    for run in sides.values():
        run()
    names = list(sides)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for block in range(blocks):
        shift = block % len(names)
        for name in names[shift:] + names[:shift]:
            work, seconds = sides[name]()
            rates[name].append(work / seconds)
    return rates


def timed(run: Callable[[], int], repeats: int = 1) -> Callable[[], tuple[int, float]]:
    """``run`` called ``repeats`` times, as (its total work, seconds)."""

    def measure() -> tuple[int, float]:
        started = time.perf_counter()
        work = sum(run() for _ in range(repeats))
        return work, time.perf_counter() - started

    return measure


def report(name: str, what: str, rates: dict[str, list[float]], unit: str, goal: float) -> None:
    """The row: medians and ranges of the sides, the ratio of ours to each bare loop (the median
    and range of the blocks' own ratios: each pairs runs a second apart, under the same load),
    then its RESULT line (baseline: the bare PyTorch loop)."""
    labels = {
        "ours": "ours",
        "bare": "bare loop, torch.optim.Adam(foreach=True)",
        "bare_same_optimizer": "bare loop, the trainer's ForeachAdam",
        "updates": "ours, the stage's updates alone",
    }
    median = {side: statistics.median(found) for side, found in rates.items()}
    lines = [what]
    for side, found in rates.items():
        lines.append(
            f"  {median[side]:9,.1f} {unit} [{min(found):,.1f} - {max(found):,.1f}]  {labels[side]}"
        )
    ratios = {}
    for side in ("bare", "bare_same_optimizer"):
        blocks = [a / b for a, b in zip(rates["ours"], rates[side], strict=True)]
        ratios[side] = (statistics.median(blocks), min(blocks), max(blocks))
    (ratio, low, high), same = ratios["bare"], ratios["bare_same_optimizer"]
    lines.append(
        f"  ratio {ratio:.2f} [blocks {low:.2f} - {high:.2f}], goal >= {goal}; against the bare "
        f"loop on the trainer's optimizer {same[0]:.2f} [{same[1]:.2f} - {same[2]:.2f}]"
    )
    print("\n".join(lines), flush=True)
    print(
        f"RESULT name={name} ours={median['ours']:.1f} baseline={median['bare']:.1f} "
        f"ratio={ratio:.3f} ratio_min={low:.3f} ratio_max={high:.3f} "
        f"ratio_same_optimizer={same[0]:.3f} unit={unit} goal={goal}",
        flush=True,
    )


def update_row(
    engine: Engine, name: str, what: str, settings: list[str], epochs: int, blocks: int
) -> None:
    """An update-alone row: the driver's updates against the bare loop's on one split."""
    driver, data = trainer_driver(engine, settings)
    sides = {"ours": timed(trainer_epoch(driver, data), epochs)}
    for side, optimizer in (("bare", "torch"), ("bare_same_optimizer", "trainer")):
        sides[side] = timed(bare_loop(driver, data, optimizer).epoch, epochs)
    rows = f"{len(data):,} rows, batch {driver.config.minibatch_size}"
    report(name, f"{what} ({rows})", interleaved(sides, blocks), "updates/s", 1.0)


def stage_row(engine: Engine, name: str, settings: list[str], blocks: int) -> None:
    """The whole train stage's updates per second of its wall time, against the bare loop;
    then where its time goes (``stage_phases``)."""
    spec = build_spec(EXAMPLE, engine.plugins, settings)
    engine.run(EXAMPLE, settings, stages=["train"])  # then problem.json is the run's to replace
    driver, data = trainer_driver(engine, settings)
    config = driver.config
    batches = -(-len(data) // config.minibatch_size)
    epochs = driver.planned_epochs(data)

    def stage() -> int:
        engine.run(EXAMPLE, settings, stages=["train"])
        return epochs * batches

    sides = {"ours": timed(stage)}
    for side, optimizer in (("bare", "torch"), ("bare_same_optimizer", "trainer")):
        sides[side] = timed(bare_loop(driver, data, optimizer).epoch, epochs)
    sides["updates"] = timed(trainer_epoch(driver, data), epochs)
    what = (
        f"whole train stage, the example's settings, data {config.data} ({len(data):,} train "
        f"rows, {epochs} epochs, batch {config.minibatch_size}, evaluation and "
        f"{len(spec.evaluation)} estimator(s) every epoch), {spec.pipeline.output_dir}"
    )
    rates = interleaved(sides, blocks)
    report(name, what, rates, "updates/s", 0.95)
    updates = [a / b for a, b in zip(rates["updates"], rates["bare_same_optimizer"], strict=True)]
    outside = [1 - a / b for a, b in zip(rates["ours"], rates["updates"], strict=True)]
    print(
        f"  where the rest goes: the updates alone run at {statistics.median(updates):.2f} of "
        f"the bare loop on the trainer's optimizer [{min(updates):.2f} - {max(updates):.2f}]; "
        f"the stage spends {statistics.median(outside):.0%} [{min(outside):.0%} - "
        f"{max(outside):.0%}] of its time outside them (loading, setup, evaluation, "
        "estimators, checkpoints)",
        flush=True,
    )
    print(
        f"RESULT name={name}_updates ours={statistics.median(rates['updates']):.1f} "
        f"baseline={statistics.median(rates['bare_same_optimizer']):.1f} "
        f"ratio={statistics.median(updates):.3f} outside_updates={statistics.median(outside):.3f} "
        "unit=updates/s",
        flush=True,
    )
    inside = stage_phases(lambda: engine.run(EXAMPLE, settings, stages=["train"]), blocks)
    alone = statistics.median(rates["updates"])
    print(
        f"  the updates inside the stage ran at {epochs * batches / inside / alone:.2f} of the "
        "updates alone (below 1: slowed by the epochs' ends beside them, for the GIL or a core)",
        flush=True,
    )


PHASES: dict[str, tuple[object, str]] = {
    "load the splits": (driver_module, "load_split"),
    "set up the trainer": (TrainingDriver, "__init__"),
    "set up the estimators": (EpisodeEvaluation, "__init__"),
    "the updates (train_batch)": (TrainingDriver, "train_batch"),
    "epoch ends on the training thread": (EpochEnds, "end_epoch"),
    "waiting for an epoch's end": (EpochEnds, "wait"),
}
"""The stage's phases on its training thread, each timed whole: the callable that runs it."""

PARTS: dict[str, tuple[object, str]] = {
    "evaluation": (streamed_module, "evaluate_split"),
    "estimators": (EpisodeEvaluation, "epoch_metrics"),
    "checkpoints": (training_module, "save_checkpoint"),
    "horizon_on_epoch_end": (HostedRun, "emit_epoch_metrics"),
}
"""The parts of an epoch's end: in line at the first epoch's end (and, for a part that draws
from torch's generator, at every one), beside the updates on the epoch-end thread otherwise."""


@contextmanager
def phase_clock(phases: dict[str, tuple[object, str]]) -> Iterator[dict[str, list[float]]]:
    """Inside, each phase's callable records the seconds of each call, by phase."""
    seconds: dict[str, list[float]] = {name: [] for name in phases}
    originals = {name: getattr(owner, attribute) for name, (owner, attribute) in phases.items()}

    def clocked(name: str) -> Callable[..., object]:
        original = originals[name]

        def call(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[name].append(time.perf_counter() - started)

        return call

    for name, (owner, attribute) in phases.items():
        setattr(owner, attribute, clocked(name))
    try:
        yield seconds
    finally:
        for name, (owner, attribute) in phases.items():
            setattr(owner, attribute, originals[name])


def stage_phases(stage: Callable[[], object], runs: int) -> float:
    """Where the stage's wall time goes, over ``runs`` runs: each phase of its training thread
    as a share of it (the rest: the minibatches' gathering, the run's own bookkeeping), then
    each part of the epochs' ends, which runs beside the updates after the first epoch.
    Returns the seconds of a run's updates."""
    walls: list[float] = []
    with phase_clock({**PHASES, **PARTS}) as seconds:
        for _ in range(runs):
            started = time.perf_counter()
            stage()
            walls.append(time.perf_counter() - started)
    wall = sum(walls)
    lines = [f"  where the stage's time goes ({runs} runs, {wall / runs:.2f} s each):"]
    phases = {name: sum(seconds[name]) for name in PHASES}
    phases["the rest (minibatches, run bookkeeping)"] = wall - sum(phases.values())
    for name, total in phases.items():
        lines.append(f"    {total / wall:6.1%}  {name}")
    lines.append("  the epochs' ends, in line at the first and beside the updates after:")
    for name in PARTS:
        calls = len(seconds[name])
        total = sum(seconds[name])
        each = total / max(1, calls) * 1000
        lines.append(f"    {total / wall:6.1%}  {name} ({calls // runs} a run, {each:.1f} ms each)")
    print("\n".join(lines), flush=True)
    return sum(seconds["the updates (train_batch)"]) / runs


FIRST_OPTIMIZER = """
import sys, time, torch
from horizon_engine import ForeachAdam
network = torch.nn.Linear(4, 2)
started = time.perf_counter()
if sys.argv[1] == "ours":
    ForeachAdam(network.parameters(), lr=1e-3)
else:
    torch.optim.Adam(network.parameters(), lr=1e-3, foreach=True)
print(time.perf_counter() - started, "torch._dynamo" in sys.modules)
"""


def first_optimizer_row(blocks: int) -> None:
    """Seconds to construct the first optimizer of a process, in fresh processes."""
    seconds: dict[str, list[float]] = {"ours": [], "bare": []}
    imports = {}
    for block in range(blocks):
        for side in ("ours", "bare") if block % 2 == 0 else ("bare", "ours"):
            command = [sys.executable, "-c", FIRST_OPTIMIZER, side]
            found = subprocess.run(command, capture_output=True, text=True, check=True)
            took, dynamo = found.stdout.split()
            seconds[side].append(float(took))
            imports[side] = dynamo == "True"
    ours, bare = statistics.median(seconds["ours"]), statistics.median(seconds["bare"])
    print(
        "first optimizer of a process (imports torch._dynamo: "
        f"ours {imports['ours']}, torch.optim.Adam {imports['bare']})\n"
        f"  ours {ours:.3f} s [{min(seconds['ours']):.3f} - {max(seconds['ours']):.3f}]\n"
        f"  torch.optim.Adam {bare:.3f} s [{min(seconds['bare']):.3f} - "
        f"{max(seconds['bare']):.3f}]",
        flush=True,
    )
    print(
        f"RESULT name=first_optimizer ours={ours:.4f} baseline={bare:.4f} "
        f"ratio={ours / bare:.4f} unit=s_lower_is_better",
        flush=True,
    )


class SyntheticUpdate:
    """A double-DQN update of a two-layer network of ``width`` units on ``batch`` random rows,
    for the threads sweep."""

    def __init__(self, width: int, batch: int) -> None:
        self.network = torch.nn.Sequential(
            torch.nn.Linear(4, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 2),
        )
        self.target = copy.deepcopy(self.network).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=1e-3, foreach=True)
        self.work = batch * sum(parameter.numel() for parameter in self.network.parameters())
        self.states, self.action = torch.randn(batch, 4), torch.randint(0, 2, (batch, 1))
        self.updates = max(5, min(200, int(2e9 / self.work)))

    def on(self, threads: int) -> Callable[[], tuple[int, float]]:
        """A timed run of ``self.updates`` updates on ``threads`` threads."""

        def run() -> int:
            torch.set_num_threads(threads)
            for _ in range(self.updates):
                with torch.no_grad():
                    wanted = self.target(self.states).max(dim=1).values
                chosen = self.network(self.states).gather(1, self.action).squeeze(1)
                loss = F.smooth_l1_loss(chosen, wanted)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                float(loss.detach())
            return self.updates

        return timed(run)


def threads_sweep(sizes: Sequence[tuple[int, int]], blocks: int) -> None:
    """``SyntheticUpdate`` at each (width, batch) of ``sizes`` on one thread and on torch's
    default, interleaved; prints the default's speed-up."""
    default = torch.get_num_threads()
    print(f"threads sweep: 1 thread against {default} (torch's default here)")
    for width, batch in sizes:
        update = SyntheticUpdate(width, batch)
        rates = interleaved({"one": update.on(1), "default": update.on(default)}, blocks)
        one, many = statistics.median(rates["one"]), statistics.median(rates["default"])
        print(
            f"  width {width:5}, batch {batch:5}, rows x parameters {update.work:8.1e}: "
            f"1 thread {one:8.1f} updates/s [{min(rates['one']):.1f} - "
            f"{max(rates['one']):.1f}], {default} threads {many:8.1f} "
            f"[{min(rates['default']):.1f} - {max(rates['default']):.1f}] ({many / one:.2f}x)",
            flush=True,
        )
    torch.set_num_threads(default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1370, help="random CartPole episodes")
    parser.add_argument("--blocks", type=int, help="interleaved blocks per row (default 9)")
    parser.add_argument("--epochs", type=int, help="epochs per block of an update row (2)")
    parser.add_argument("--stage-epochs", type=int, help="epochs of the stage row (20)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="5 blocks, 1 epoch per block")
    parser.add_argument("--rows", help="comma-separated rows to run (default: all)")
    parser.add_argument("--threads-sweep", action="store_true", help="only the threads sweep")
    args = parser.parse_args()
    blocks = args.blocks or (5 if args.quick else 9)
    epochs = args.epochs or (1 if args.quick else 2)
    stage_epochs = args.stage_epochs or 20
    if args.threads_sweep:
        sizes = [(128, 256), (128, 1024), (256, 1024), (512, 1024), (512, 4096), (1024, 2048)]
        threads_sweep(sizes, blocks)
        return
    chosen = set(args.rows.split(",")) if args.rows else None
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {blocks} interleaved blocks; "
        f"CartPole, {args.episodes} random episodes"
    )
    engine = Engine(show_progress=False)
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        plain = overrides(folder / "plain", args.episodes, args.threads, **{"timeline.n_step": 1})
        example = overrides(folder / "example", args.episodes, args.threads)
        staged = overrides(folder / "stage", args.episodes, args.threads)
        for settings in (plain, example, staged):
            build_timeline(engine, settings)
        rows = {
            "update_b256": lambda: update_row(
                engine,
                "update_b256",
                "dqn update alone, 1-step double DQN, batch 256",
                plain + overrides_of(PLAIN, minibatch_size=256),
                epochs,
                blocks,
            ),
            "update_b1024": lambda: update_row(
                engine,
                "update_b1024",
                "dqn update alone, 1-step double DQN, batch 1024",
                plain + overrides_of(PLAIN, minibatch_size=1024),
                epochs,
                blocks,
            ),
            "update_example_b256": lambda: update_row(
                engine,
                "update_example_b256",
                "dqn update alone, the example's settings (3-step, CQL), batch 256",
                example,
                epochs,
                blocks,
            ),
            "stage": lambda: stage_row(
                engine, "stage", staged + overrides_of({}, epochs=stage_epochs), blocks
            ),
            "stage_streamed": lambda: stage_row(
                engine,
                "stage_streamed",
                staged + overrides_of({}, epochs=stage_epochs, data="streamed"),
                blocks,
            ),
            "first_optimizer": lambda: first_optimizer_row(blocks),
        }
        for name, row in rows.items():
            if chosen is None or name in chosen:
                row()


def overrides_of(options: dict[str, object], **more: object) -> list[str]:
    """``[trainer]`` options as ``--set`` overrides."""
    return [f"trainer.{key}={json.dumps(value)}" for key, value in {**options, **more}.items()]


if __name__ == "__main__":
    main()
