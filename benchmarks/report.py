"""What the report page costs a run: ``make run``'s pipeline with the report stage (the
default) beside the same pipeline with ``[report] enabled = false``.

    .venv/bin/python benchmarks/report.py             # 5 rounds
    .venv/bin/python benchmarks/report.py --quick     # 3 rounds, for make bench

Each run is a fresh ``horizon run examples/cartpole_dqn.toml`` process, the two settings
alternating (A B, B A, ...) so that other work on the machine weighs on both alike. Prints the
medians and ranges, the report stage's own seconds (and the part spent importing matplotlib)
from the manifests, and ``horizon report`` of the finished run alone, in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from make_run import HORIZON, timed  # the same fresh-process timing as make run's benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 rounds, for make bench")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds

    with tempfile.TemporaryDirectory() as folder:
        outputs = {"with the page": Path(folder) / "with", "without": Path(folder) / "without"}
        commands = {
            name: [
                str(HORIZON),
                "run",
                "examples/cartpole_dqn.toml",
                "--overwrite",
                "--set",
                f"pipeline.output_dir={json.dumps(str(output))}",
                *(["--set", "report.enabled=false"] if name == "without" else []),
            ]
            for name, output in outputs.items()
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        stage: list[tuple[float, float]] = []
        for round_number in range(rounds):
            order = list(commands) if round_number % 2 == 0 else list(commands)[::-1]
            for name in order:
                times[name].append(timed(commands[name]))
            manifest = json.loads((outputs["with the page"] / "manifest.json").read_text())
            record = manifest["stages"]["report"]
            stage.append((record["seconds"], record.get("import_seconds", 0.0)))
        page = Path(folder) / "page.html"
        alone = [
            timed([str(HORIZON), "report", str(outputs["with the page"]), "-o", str(page)])
            for _ in range(rounds)
        ]

    for name, values in times.items():
        print(
            f"horizon run, {name:>13}: median {statistics.median(values):.2f} s "
            f"(range {min(values):.2f}-{max(values):.2f}, {rounds} runs)"
        )
    seconds = statistics.median(value for value, _ in stage)
    importing = statistics.median(value for _, value in stage)
    print(f"the report stage: median {seconds:.2f} s, {importing:.2f} s of it importing")
    print(
        f"horizon report alone (a fresh process): median {statistics.median(alone):.2f} s "
        f"(range {min(alone):.2f}-{max(alone):.2f})"
    )
    ours, baseline = (statistics.median(times[name]) for name in commands)
    print(f"ratio (with the page / without): {ours / baseline:.2f}")
    print(
        f"RESULT name=report_stage ours={ours:.2f}s baseline={baseline:.2f}s "
        f"ratio={ours / baseline:.2f} stage={seconds:.2f}s"
    )


if __name__ == "__main__":
    main()
