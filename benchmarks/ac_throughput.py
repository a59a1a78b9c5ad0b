"""Actor-critic training throughput: the ``sac`` and ``td3`` trainers beside bare PyTorch loops.

    .venv/bin/python benchmarks/ac_throughput.py            # 9 interleaved blocks
    .venv/bin/python benchmarks/ac_throughput.py --quick    # 5 blocks, for make bench

Logs uniformly random play of Pendulum-v1 (150 episodes of 200 steps: 30,000 rows) through the
gym source, the timeline (1-step rows) and normalization stages, then measures updates per
second on the same train split and one CPU thread (``--threads``):

- ours: the trainer (hidden layers [256, 256], batch 256, learning from the rows alone:
  ``bc_weight = 0``, ``cql_alpha = 0``) set up by the training driver and fed the driver's
  prepared minibatches through ``train_batch`` (the update, the metrics' sums);
- the baseline: the same update written directly on the split, its states and actions
  normalized once beforehand, with ``torch.optim.Adam(foreach=True)`` and foreach target
  updates: SAC with twin critics, a tanh-squashed Gaussian actor and a learned temperature;
  TD3 with twin critics, target policy smoothing and an actor (and targets) updated every
  second step.

The sides run in interleaved blocks whose order rotates (``train_throughput.interleaved``);
each row prints the medians and ranges and the median of the blocks' ratios (ours / bare, above
1 is faster), then ``RESULT name=... ours=... baseline=... ratio=... unit=updates/s``. The
issue's goal: at least 0.9.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from train_throughput import interleaved, timed, trainer_epoch

from horizon_engine.config import build_spec
from horizon_engine.dataset import TimelineTensors
from horizon_engine.driver import TrainingDriver, load_split, timeline_problem
from horizon_engine.pipeline import Engine
from horizon_engine.run_context import StageRun

GAMMA = 0.99
TAU = 0.005
LEARNING_RATE = 3e-4
HIDDEN = 256

PIPELINE = """
[pipeline]
output_dir = {output}
seed = 0

[source]
kind = "gym"
env = "Pendulum-v1"
episodes = {episodes}

[timeline]
n_step = 1

[normalization]

[trainer]
kind = "{kind}"
threads = {threads}
device = "cpu"
minibatch_size = 256
layers = [256, 256]
bc_weight = 0.0
cql_alpha = 0.0
"""


def mlp(inputs: int, outputs: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, outputs),
    )


def adam(parameters: list[torch.Tensor]) -> torch.optim.Adam:
    return torch.optim.Adam(parameters, lr=LEARNING_RATE, foreach=True)


class BareActorCritic:
    """Twin critics and an actor on the split normalized once: what both baselines share."""

    def __init__(self, driver: TrainingDriver, data: TimelineTensors) -> None:
        torch.manual_seed(0)
        problem = driver.problem
        with torch.no_grad():
            self.state = problem.state_preprocessor(data.state, data.state_presence)
            self.next_state = problem.state_preprocessor(data.next_state, data.next_state_presence)
            self.action = problem.action_preprocessor(data.action, data.action_presence)
        self.reward = data.reward
        self.not_terminal = data.not_terminal
        self.rows = len(data)
        self.batch_size = driver.config.minibatch_size
        width, actions = self.state.shape[1], self.action.shape[1]
        self.actions = actions
        self.critics = [mlp(width + actions, 1), mlp(width + actions, 1)]
        self.target_critics = [copy.deepcopy(c).requires_grad_(False) for c in self.critics]
        self.critic_optimizer = adam([p for critic in self.critics for p in critic.parameters()])
        self.fast = [p for critic in self.critics for p in critic.parameters()]
        self.slow = [p for critic in self.target_critics for p in critic.parameters()]
        self.generator = torch.Generator().manual_seed(0)
        self.steps = 0

    def q(self, critics: list[torch.nn.Module], state: torch.Tensor, action: torch.Tensor):
        joined = torch.cat([state, action], dim=1)
        return critics[0](joined).squeeze(1), critics[1](joined).squeeze(1)

    def critic_step(self, rows: torch.Tensor, wanted: torch.Tensor) -> float:
        first, second = self.q(self.critics, self.state[rows], self.action[rows])
        loss = F.mse_loss(first, wanted) + F.mse_loss(second, wanted)
        self.critic_optimizer.zero_grad()
        loss.backward()
        self.critic_optimizer.step()
        return float(loss.detach())

    def update(self, rows: torch.Tensor) -> None:
        raise NotImplementedError

    def epoch(self) -> int:
        """One pass of shuffled minibatches; returns the updates made."""
        order = torch.randperm(self.rows, generator=self.generator)
        updates = 0
        for start in range(0, self.rows, self.batch_size):
            self.update(order[start : start + self.batch_size])
            self.steps += 1
            updates += 1
        return updates


class BareSac(BareActorCritic):
    """SAC (Haarnoja et al. 2018): a learned temperature, target entropy ``-|A|``."""

    def __init__(self, driver: TrainingDriver, data: TimelineTensors) -> None:
        super().__init__(driver, data)
        self.actor = mlp(self.state.shape[1], 2 * self.actions)
        self.actor_optimizer = adam(list(self.actor.parameters()))
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha_optimizer = adam([self.log_alpha])
        self.target_entropy = -float(self.actions)

    def sample(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.actor(state).chunk(2, dim=1)
        std = log_std.clamp(-20.0, 2.0).exp()
        raw = mean + std * torch.randn_like(mean)
        action = torch.tanh(raw)
        gaussian = -0.5 * ((raw - mean) / std) ** 2 - std.log() - 0.5 * math.log(2 * math.pi)
        squash = 2 * (math.log(2) - raw - F.softplus(-2 * raw))  # log(1 - tanh(raw)^2)
        log_density = (gaussian - squash).sum(dim=1)
        return action, log_density

    def update(self, rows: torch.Tensor) -> None:
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            following, log_density = self.sample(self.next_state[rows])
            value = torch.min(*self.q(self.target_critics, self.next_state[rows], following))
            wanted = self.reward[rows] + GAMMA * self.not_terminal[rows] * (
                value - alpha * log_density
            )
        self.critic_step(rows, wanted)
        action, log_density = self.sample(self.state[rows])
        value = torch.min(*self.q(self.critics, self.state[rows], action))
        actor_loss = (alpha * log_density - value).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        alpha_loss = -(self.log_alpha * (log_density.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.slow, self.fast, TAU)
        float(actor_loss.detach())


class BareTd3(BareActorCritic):
    """TD3 (Fujimoto et al. 2018): target smoothing (0.2, clipped at 0.5), delay 2."""

    def __init__(self, driver: TrainingDriver, data: TimelineTensors) -> None:
        super().__init__(driver, data)
        self.actor = torch.nn.Sequential(mlp(self.state.shape[1], self.actions), torch.nn.Tanh())
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.actor_optimizer = adam(list(self.actor.parameters()))
        self.fast += list(self.actor.parameters())
        self.slow += list(self.target_actor.parameters())

    def update(self, rows: torch.Tensor) -> None:
        with torch.no_grad():
            following = self.target_actor(self.next_state[rows])
            noise = (0.2 * torch.randn_like(following)).clamp(-0.5, 0.5)
            following = (following + noise).clamp(-1.0, 1.0)
            value = torch.min(*self.q(self.target_critics, self.next_state[rows], following))
            wanted = self.reward[rows] + GAMMA * self.not_terminal[rows] * value
        self.critic_step(rows, wanted)
        if self.steps % 2:
            return
        first, _ = self.q(self.critics, self.state[rows], self.actor(self.state[rows]))
        actor_loss = -first.mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.slow, self.fast, TAU)
        float(actor_loss.detach())


BARE = {"sac": BareSac, "td3": BareTd3}


def prepared(
    engine: Engine, pipeline: Path, settings: list[str]
) -> tuple[TrainingDriver, TimelineTensors]:
    """The training driver of ``pipeline`` and its train split as the driver trains on it."""
    spec = build_spec(pipeline, engine.plugins, settings)
    run = StageRun.start(spec, engine.plugins, "benchmark")
    description, normalization = timeline_problem(run)
    driver = TrainingDriver(
        run, spec.sections["trainer"], description, normalization, plugins=engine.plugins
    )
    data = driver.prepare(load_split(run, description, "train", driver.device))
    return driver, data


def row(engine: Engine, pipeline: Path, kind: str, epochs: int, blocks: int) -> None:
    """``kind``'s updates against its bare loop's, interleaved, and the RESULT line."""
    driver, data = prepared(engine, pipeline, [f'trainer.kind="{kind}"'])
    sides: dict[str, Callable[[], tuple[int, float]]] = {
        "ours": timed(trainer_epoch(driver, data), epochs),
        "bare": timed(BARE[kind](driver, data).epoch, epochs),
    }
    rates = interleaved(sides, blocks)
    median = {side: statistics.median(found) for side, found in rates.items()}
    ratios = [a / b for a, b in zip(rates["ours"], rates["bare"], strict=True)]
    ratio = statistics.median(ratios)
    print(f"{kind} update alone ({len(data):,} rows, batch {driver.config.minibatch_size})")
    for side, label in (("ours", "ours"), ("bare", "bare loop, torch.optim.Adam(foreach=True)")):
        found = rates[side]
        print(f"  {median[side]:9,.1f} updates/s [{min(found):,.1f} - {max(found):,.1f}]  {label}")
    print(f"  ratio {ratio:.2f} [blocks {min(ratios):.2f} - {max(ratios):.2f}], goal >= 0.9")
    print(
        f"RESULT name={kind}_update_b256 ours={median['ours']:.1f} baseline={median['bare']:.1f} "
        f"ratio={ratio:.3f} unit=updates/s goal=0.9",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=150, help="random Pendulum episodes")
    parser.add_argument("--blocks", type=int, help="interleaved blocks per row (default 9)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per block")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="5 blocks")
    args = parser.parse_args()
    blocks = args.blocks or (5 if args.quick else 9)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {blocks} interleaved blocks; "
        f"Pendulum-v1, {args.episodes} random episodes"
    )
    engine = Engine(show_progress=False)
    with tempfile.TemporaryDirectory() as temporary:
        pipeline = Path(temporary) / "pendulum.toml"
        pipeline.write_text(
            PIPELINE.format(
                output=json.dumps(str(Path(temporary) / "run")),
                episodes=args.episodes,
                kind="sac",
                threads=args.threads,
            )
        )
        engine.run(pipeline, stages=["source", "timeline", "normalization"], overwrite=True)
        for kind in BARE:
            row(engine, pipeline, kind, args.epochs, blocks)


if __name__ == "__main__":
    main()
