"""``make run``'s pipeline, end to end, beside the imports it cannot avoid.

    .venv/bin/python benchmarks/make_run.py             # 5 rounds
    .venv/bin/python benchmarks/make_run.py --rounds 3

Times ``horizon run examples/cartpole_dqn.toml`` (a fresh process each time, at the default
settings: the README's first command without the install) against the floor any run of it pays:
a process that only imports what the pipeline needs (torch, scipy.stats, onnx, onnxruntime,
pyarrow, gymnasium). The two alternate (A B A B, the order rotating each round) so that other
work on the machine weighs on both alike; medians and ranges are printed, with the stages'
own timings (and the part of each spent importing) from the last run's manifest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
HORIZON = Path(sys.executable).parent / "horizon"
FLOOR = "import torch, scipy.stats, onnx, onnxruntime, pyarrow, gymnasium"


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 rounds, for make bench")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds

    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "run"
        pipeline = [
            str(HORIZON),
            "run",
            "examples/cartpole_dqn.toml",
            "--overwrite",
            "--set",
            f"pipeline.output_dir={json.dumps(str(output))}",
        ]
        floor = [sys.executable, "-c", FLOOR]
        sides = {"horizon run": pipeline, "imports only": floor}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for round_number in range(rounds):
            order = list(sides) if round_number % 2 == 0 else list(sides)[::-1]
            for name in order:
                times[name].append(timed(sides[name]))
        manifest = json.loads((output / "manifest.json").read_text())

    for name, values in times.items():
        print(
            f"{name:>13}: median {statistics.median(values):.2f} s "
            f"(range {min(values):.2f}-{max(values):.2f}, {rounds} runs)"
        )
    for stage, report in manifest["stages"].items():
        print(
            f"  {stage:>13}: {report['seconds']:.2f} s, "
            f"{report.get('import_seconds', 0.0):.2f} s of it importing"
        )
    ours, floor_seconds = (statistics.median(times[name]) for name in sides)
    print(f"ratio (horizon run / imports only): {ours / floor_seconds:.2f}")
    print(
        f"RESULT name=make_run ours={ours:.2f}s baseline={floor_seconds:.2f}s "
        f"ratio={ours / floor_seconds:.2f} goal=under_5s"
    )


if __name__ == "__main__":
    main()
