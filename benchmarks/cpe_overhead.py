"""What per-epoch counterfactual evaluation adds to the example's train stage.

    .venv/bin/python benchmarks/cpe_overhead.py             # 7 rounds
    .venv/bin/python benchmarks/cpe_overhead.py --quick     # 3 rounds, for make bench

``examples/cartpole_dqn.toml`` runs its ``[[evaluation]]`` estimators after every epoch; the
same pipeline without them is the baseline. Both run folders are built once; then each round
runs the train stage alone (``horizon run --stages train``, a fresh process each time) of both,
in turns A B, B A, ... so that other work on the machine weighs on both alike. The figure is
the train stage's compute time from its manifest (its seconds less the part spent importing):
the overhead is what the estimators cost, not what starting a process costs. The issue's goal:
at most 20% more than training alone.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 rounds, for make bench")
    parser.add_argument(
        "--episodes", type=int, help="episodes the example logs (its own 200 by default)"
    )
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds

    with tempfile.TemporaryDirectory() as folder:
        bare = Path(folder) / "without_evaluation.toml"
        text, entries = without_evaluation(EXAMPLE.read_text())
        bare.write_text(text)
        sides = {
            "with per-epoch CPE": (EXAMPLE, Path(folder) / "with"),
            "training alone": (bare, Path(folder) / "without"),
        }
        for pipeline, output in sides.values():
            train_seconds(pipeline, output, None, args.episodes)
        times: dict[str, list[float]] = {name: [] for name in sides}
        for round_number in range(rounds):
            order = list(sides) if round_number % 2 == 0 else list(sides)[::-1]
            for name in order:
                times[name].append(train_seconds(*sides[name], "train", args.episodes))

    size = f"{args.episodes} episodes" if args.episodes else "its own data"
    print(
        f"{EXAMPLE.name} ({size}): the train stage's compute seconds, {entries} [[evaluation]] "
        "entries"
    )
    for name, values in times.items():
        print(
            f"{name:>18}: median {statistics.median(values):.3f} s "
            f"(range {min(values):.3f}-{max(values):.3f}, {rounds} runs)"
        )
    ours, baseline = (statistics.median(times[name]) for name in sides)
    print(f"overhead of per-epoch CPE: {ours / baseline - 1:+.1%} (goal: at most +20%)")
    name = f"cpe_overhead_{args.episodes}_episodes" if args.episodes else "cpe_overhead"
    print(
        f"RESULT name={name} ours={ours:.3f}s baseline={baseline:.3f}s "
        f"ratio={ours / baseline:.3f} goal=at_most_1.2"
    )


if __name__ == "__main__":
    main()
