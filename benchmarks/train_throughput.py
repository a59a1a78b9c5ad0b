"""DQN training throughput: the train stage's ``dqn`` trainer beside a bare PyTorch double-DQN loop.

    .venv/bin/python benchmarks/train_throughput.py
    .venv/bin/python benchmarks/train_throughput.py --episodes 400 --epochs 5 --threads 2

Builds a CartPole timeline from random play through the pipeline (gym source, timeline,
normalization), then times, on the same rows and the same CPU threads:
- the ``dqn`` trainer (layers [128, 64], batch 1024, double Q) driven as the train stage drives
  it, by the training driver (``horizon_engine.driver``): set up from the run folder, shuffled
  minibatches from ``TimelineTensors``, each through ``train_batch`` (the update, the metrics'
  sums), the normalization in every forward pass;
- a bare loop: the same network and double-DQN update on tensors normalized once beforehand,
  minibatches by a random permutation.
Prints updates/s and transitions/s of both and the ratio (trainer / bare; the target is 0.85).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from horizon_engine.config import build_spec
from horizon_engine.driver import TrainingDriver, load_split, timeline_problem
from horizon_engine.pipeline import Engine
from horizon_engine.run_context import RunContext

BATCH = 1024
ACTIONS = ["0", "1"]


def cartpole_run(folder: Path, episodes: int) -> RunContext:
    """A run folder holding a random CartPole timeline and its normalization, and the run's
    context with a ``[trainer]`` section for the dqn trainer."""
    config = {
        "pipeline": {"output_dir": str(folder), "seed": 0},
        "source": {"kind": "gym", "episodes": episodes, "ds": "2019-01-01"},
        "timeline": {"actions": ACTIONS, "eval_fraction": 0.0},
        "normalization": {"quantiles": False},
    }
    engine = Engine(show_progress=False)
    engine.run(config)
    config["trainer"] = {
        "kind": "dqn",
        "minibatch_size": BATCH,
        "layers": [128, 64],
        "double_q": True,
        "device": "cpu",
    }
    spec = build_spec(config, engine.plugins)
    return RunContext(spec, folder, engine.plugins, "benchmark")


def timed(run_epoch: Callable[[], int], epochs: int) -> tuple[float, int]:
    """Seconds and updates for ``epochs`` epochs, after one warm-up epoch."""
    run_epoch()
    started = time.perf_counter()
    updates = sum(run_epoch() for _ in range(epochs))
    return time.perf_counter() - started, updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1370, help="random CartPole episodes")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as temporary:
        run = cartpole_run(Path(temporary), args.episodes)
        description, normalization = timeline_problem(run)
        driver = TrainingDriver(run, run.spec.sections["trainer"], description, normalization)
        data = load_split(run, description, "train", driver.device)
    preprocessor = driver.problem.state_preprocessor
    generator = torch.Generator().manual_seed(0)

    def trainer_epoch() -> int:
        updates = driver.updates
        for batch in data.minibatches(BATCH, generator):
            driver.train_batch(batch)
        return driver.updates - updates

    with torch.no_grad():
        states = preprocessor(data.state, data.state_presence)
        next_states = preprocessor(data.next_state, data.next_state_presence)
    width = states.shape[1]
    network = torch.nn.Sequential(
        torch.nn.Linear(width, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, len(ACTIONS)),
    )
    target = copy.deepcopy(network)
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-3)

    def bare_epoch() -> int:
        order = torch.randperm(len(data), generator=generator)
        updates = 0
        for start in range(0, len(data), BATCH):
            rows = order[start : start + BATCH]
            with torch.no_grad():
                following = next_states[rows]
                online = network(following)
                possible = data.possible_next_actions[rows] > 0
                best = torch.where(possible, online, -1e9).argmax(dim=1, keepdim=True)
                bootstrap = target(following).gather(1, best).squeeze(1)
                wanted = data.reward[rows] + 0.99 * data.not_terminal[rows] * bootstrap
            chosen = network(states[rows]).gather(1, data.action[rows].unsqueeze(1)).squeeze(1)
            loss = F.smooth_l1_loss(chosen, wanted)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for slow, fast in zip(target.parameters(), network.parameters(), strict=True):
                    slow.lerp_(fast, 0.01)
            float(loss.detach())
            updates += 1
        return updates

    print(
        f"dqn on {len(data):,} CartPole transitions, batch {BATCH}, layers [128, 64], "
        f"{torch.get_num_threads()} torch thread(s)"
    )
    results = {}
    for name, run_epoch in (("dqn (driver)", trainer_epoch), ("bare loop", bare_epoch)):
        seconds, updates = timed(run_epoch, args.epochs)
        results[name] = updates / seconds
        print(
            f"{name:>12}: {updates / seconds:8,.0f} updates/s  "
            f"{updates * BATCH / seconds:12,.0f} transitions/s"
        )
    ratio = results["dqn (driver)"] / results["bare loop"]
    print(f"ratio (trainer / bare): {ratio:.2f}  (target 0.85)")


if __name__ == "__main__":
    main()
