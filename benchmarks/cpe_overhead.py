"""What per-epoch counterfactual evaluation adds to the example's train stage.

    .venv/bin/python benchmarks/cpe_overhead.py                 # 7 rounds at each size
    .venv/bin/python benchmarks/cpe_overhead.py --quick         # 3 rounds, for make bench
    .venv/bin/python benchmarks/cpe_overhead.py --episodes 1000

``examples/cartpole_dqn.toml`` runs its ``[[evaluation]]`` estimators after every epoch; the
same pipeline without them is the baseline. Both run folders are built once; then each round
runs the train stage alone (``horizon run --stages train``, a fresh process each time) of both,
in turns A B, B A, ... so that other work on the machine weighs on both alike. The figure is
the train stage's compute time from its manifest (its seconds less the part spent importing):
the overhead is what the estimators cost, not what starting a process costs. The issue's goal:
at most 20% more than training alone.

Two sizes by default: the example's own 200 episodes (about 4,500 rows, 381 of them in the
eval split), where the estimators' fixed cost per epoch (about 9 ms: copying the policy, fitting
two small models, 200 bootstrap resamples per estimate) weighs on 27 ms epochs, and 1,400
episodes (about 30,000 rows), where both sides grow with the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[1]
HORIZON = Path(sys.executable).parent / "horizon"
EXAMPLE = ROOT / "examples" / "cartpole_dqn.toml"


def without_evaluation(pipeline: str) -> tuple[str, int]:
    """``pipeline``'s text without its ``[[evaluation]]`` tables (each from its header line to
    the next table's), and how many there were."""
    kept, skipping, entries = [], False, 0
    for line in pipeline.splitlines(keepends=True):
        if line.startswith("["):
            skipping = line.startswith("[[evaluation]]")
            entries += skipping
        if not skipping:
            kept.append(line)
    return "".join(kept), entries


def train_seconds(pipeline: Path, output: Path, stages: str | None, episodes: int | None) -> float:
    """Run ``pipeline`` into ``output`` (only ``stages`` when given; ``episodes`` of logged
    play instead of the example's when given); the train stage's compute seconds from the
    manifest."""
    command = [str(HORIZON), "run", str(pipeline), "--overwrite"]
    command += ["--set", f"pipeline.output_dir={json.dumps(str(output))}"]
    if episodes is not None:
        command += ["--set", f"source.episodes={episodes}"]
    if stages:
        command += ["--stages", stages]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    train = json.loads((output / "manifest.json").read_text())["stages"]["train"]
    return train["seconds"] - train.get("import_seconds", 0.0)


EXAMPLE_EPISODES = 200
"""The episodes the example logs (``[source] episodes``)."""

LARGER_EPISODES = 1400
"""About 30,000 rows, the size of ``train_throughput.py``'s whole-stage figure."""


def overhead(episodes: int, rounds: int, folder: Path) -> tuple[str, dict[str, list[float]]]:
    """The example (logging ``episodes`` episodes) with and without its ``[[evaluation]]``
    entries, built once, then its train stage alone in alternating turns; the seconds of each
    side by name, after a line describing the run."""
    bare = folder / "without_evaluation.toml"
    text, entries = without_evaluation(EXAMPLE.read_text())
    bare.write_text(text)
    sides = {
        "with per-epoch CPE": (EXAMPLE, folder / "with"),
        "training alone": (bare, folder / "without"),
    }
    for pipeline, output in sides.values():
        train_seconds(pipeline, output, None, episodes)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_number in range(rounds):
        order = list(sides) if round_number % 2 == 0 else list(sides)[::-1]
        for name in order:
            times[name].append(train_seconds(*sides[name], "train", episodes))
    title = (
        f"{EXAMPLE.name}, {episodes} episodes logged: the train stage's compute seconds, "
        f"{entries} [[evaluation]] entries"
    )
    return title, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 rounds, for make bench")
    parser.add_argument(
        "--episodes",
        type=int,
        nargs="+",
        default=[EXAMPLE_EPISODES, LARGER_EPISODES],
        help="the example's logged episodes, one measurement each (default: 200 and 1400)",
    )
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds

    lines = []
    for episodes in args.episodes:
        with tempfile.TemporaryDirectory() as folder:
            title, times = overhead(episodes, rounds, Path(folder))
        print(title)
        for name, values in times.items():
            print(
                f"{name:>18}: median {statistics.median(values):.3f} s "
                f"(range {min(values):.3f}-{max(values):.3f}, {rounds} runs)"
            )
        ours, baseline = (statistics.median(times[name]) for name in times)
        print(f"overhead of per-epoch CPE: {ours / baseline - 1:+.1%} (goal: at most +20%)\n")
        lines.append(
            f"RESULT name=cpe_overhead_{episodes}_episodes ours={ours:.3f}s "
            f"baseline={baseline:.3f}s ratio={ours / baseline:.3f} goal=at_most_1.2"
        )
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
