"""Training throughput on a streamed timeline against the same split in memory.

    .venv/bin/python benchmarks/streamed_throughput.py                  # about a minute here
    .venv/bin/python benchmarks/streamed_throughput.py --max-memory-gb 0.005 --blocks 3

Builds the CartPole timeline of examples/cartpole_dqn.toml (1,370 episodes of random play:
about 30,000 rows with 3-step windows), sets the example's ``dqn`` trainer up through the
training driver, and times epochs of its updates (``TrainingDriver.train_batch``) on the train
split two ways, in interleaved blocks so that a shared machine's load falls on both alike:

- ``memory``: the split loaded into tensors once and prepared once (the preprocessor's output
  computed for the whole split), the default for data that fits;
- ``streamed``: ``StreamedTimeline`` with the shuffle buffer ``[trainer] max_memory_gb``
  allows (``streamed.choose_data``), every epoch reading and converting the Parquet row groups
  again and preprocessing each slice, on a background thread ``READ_AHEAD`` slices ahead (the
  next epoch's first shuffle buffer while this epoch's last batches train);
- ``streamed_in_line``: the same, read and converted on the training thread (``read_ahead = 0``),
  what reading ahead is measured against.

It prints the medians and ranges of the updates per second, the share of each side's epoch
spent getting the next batch (shuffling, waiting for slices) and in the updates (slower than in
memory when the reading thread holds the GIL), the median of the blocks' ratios (each
streamed side / in memory: 1 is as fast), the same ratios of updates per CPU second of the
training thread (what reading ahead gains with a core free for it, which a busy shared machine
may not have) and a ``RESULT`` line (baseline: in memory).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from horizon_engine.config import build_spec
from horizon_engine.driver import TrainingDriver, load_split, timeline_problem
from horizon_engine.pipeline import Engine
from horizon_engine.run_context import StageRun
from horizon_engine.run_folder import RunFolder
from horizon_engine.streamed import StreamedTimeline, choose_data

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cartpole_dqn.toml"


@dataclass
class Epoch:
    """One timed epoch: its updates, seconds, the training thread's CPU seconds (what reading
    ahead takes off it, whether or not a core is free) and the seconds it spent getting the
    next batch (shuffling and waiting for slices) and in the updates (which slow down when the
    reading thread holds the GIL)."""

    updates: int
    seconds: float
    cpu: float
    batches: float
    in_updates: float


def epoch_of(driver: TrainingDriver, data: object) -> Callable[[], Epoch]:
    """A function that trains one epoch of the driver's updates on ``data`` and times it."""
    generator = torch.Generator().manual_seed(0)

    def run() -> Epoch:
        started, used, before = time.perf_counter(), time.thread_time(), driver.updates
        batches = iter(data.minibatches(driver.config.minibatch_size, generator))
        getting = updating = 0.0
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            got = time.perf_counter()
            getting += got - asked
            if batch is None:
                break
            driver.train_batch(batch)
            updating += time.perf_counter() - got
        seconds, cpu = time.perf_counter() - started, time.thread_time() - used
        return Epoch(driver.updates - before, seconds, cpu, getting, updating)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1370)
    parser.add_argument("--max-memory-gb", type=float, default=0.02)
    parser.add_argument("--blocks", type=int, default=5)
    options = parser.parse_args()
    engine = Engine(show_progress=False)
    with tempfile.TemporaryDirectory() as folder:
        values = {
            "pipeline.output_dir": folder,
            "source.episodes": options.episodes,
            "trainer.threads": 1,
            "trainer.device": "cpu",
            "trainer.data": "streamed",
            "trainer.max_memory_gb": options.max_memory_gb,
        }
        settings = [f"{key}={json.dumps(value)}" for key, value in values.items()]
        engine.run(EXAMPLE, settings, stages=["source", "timeline", "normalization"])
        spec = build_spec(EXAMPLE, engine.plugins, settings)
        run = StageRun.start(spec, engine.plugins, "benchmark")
        description, normalization = timeline_problem(run)
        driver = TrainingDriver(
            run, spec.sections["trainer"], description, normalization, plugins=engine.plugins
        )
        splits = [
            StreamedTimeline.open(
                RunFolder(Path(folder)).split(name), description, 1, driver.device
            )
            for name in ("train", "eval")
        ]
        choice = choose_data(driver.config, *splits)
        streamed = driver.prepare(replace(splits[0], buffer_rows=choice.buffer_rows))
        memory = driver.prepare(load_split(run, description, "train", driver.device))
        in_line = replace(streamed, read_ahead=0)
        sides = {
            "memory": epoch_of(driver, memory),
            "streamed": epoch_of(driver, streamed),
            "streamed_in_line": epoch_of(driver, in_line),
        }
        with driver.torch_threads():
            for side in sides.values():
                side()
            epochs: dict[str, list[Epoch]] = {name: [] for name in sides}
            for block in range(options.blocks):
                turn = block % len(sides)
                for name in list(sides)[turn:] + list(sides)[:turn]:
                    epochs[name].append(sides[name]())
    rates = {name: [e.updates / e.seconds for e in found] for name, found in epochs.items()}
    cpu_rates = {name: [e.updates / e.cpu for e in found] for name, found in epochs.items()}
    print(f"{len(memory):,} rows, {choice.reason}")
    for name, found in rates.items():
        print(
            f"  {statistics.median(found):9,.1f} updates/s [{min(found):,.1f} - "
            f"{max(found):,.1f}]  {name}"
        )
    for name, found in epochs.items():
        getting = statistics.median(e.batches / e.seconds for e in found)
        updating = statistics.median(e.in_updates / e.seconds for e in found)
        print(f"  {name}: {getting:.0%} of the epoch getting batches, {updating:.0%} in updates")
    ratios = {
        name: [s / m for s, m in zip(rates[name], rates["memory"], strict=True)]
        for name in ("streamed", "streamed_in_line")
    }
    for name, found in ratios.items():
        print(
            f"  ratio {name} / memory {statistics.median(found):.2f} "
            f"[{min(found):.2f} - {max(found):.2f}]"
        )
    for name in ratios:
        found = [s / m for s, m in zip(cpu_rates[name], cpu_rates["memory"], strict=True)]
        print(
            f"  ratio {name} / memory per training thread CPU second "
            f"{statistics.median(found):.2f} [{min(found):.2f} - {max(found):.2f}]"
        )
    ratio = statistics.median(ratios["streamed"])
    print(
        f"RESULT name=streamed_b{driver.config.minibatch_size} "
        f"ours={statistics.median(rates['streamed']):.1f} "
        f"baseline={statistics.median(rates['memory']):.1f} ratio={ratio:.3f} unit=updates/s"
    )


if __name__ == "__main__":
    main()
