"""``make bench``: every benchmark, quick, and one table of our figures beside their baselines.

    .venv/bin/python benchmarks/run_all.py            # what make bench runs
    .venv/bin/python benchmarks/run_all.py --full     # each benchmark's own, longer defaults

Each benchmark prints its own report and, last, one ``RESULT name=... ours=... baseline=...
ratio=...`` line per figure; this script runs them one after the other (never side by side:
they would measure each other), echoes their reports, and gathers the RESULT lines into a
Markdown table with the machine it ran on, ready for the README. The defaults sweep is left
out: it trains for hours and measures learning, not speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
BENCHMARKS = (
    "make_run.py",
    "report.py",
    "train_throughput.py",
    "ac_throughput.py",
    "timeline.py",
    "normalization.py",
    "cpe.py",
    "cpe_overhead.py",
    "cpe_truth.py",
    "serving.py",
    "join.py",
)
"""In the order they run; each accepts ``--quick``."""


def parse_result(line: str) -> dict[str, str]:
    """``RESULT a=1 b=x`` -> ``{"a": "1", "b": "x"}``; times given as ``ours_s`` (``baseline_s``)
    become ``ours`` (``baseline``) in seconds; rates given as ``ours_rows_per_s`` (and
    ``baseline_rows_per_s``) become ``ours`` (``baseline``) in rows/s, after the baseline's name
    where one is given (``baseline=plain_arrow``), with ``rows`` in the figure's name."""
    fields = dict(item.split("=", 1) for item in line.split()[1:] if "=" in item)
    for side in ("ours", "baseline"):
        seconds = fields.pop(f"{side}_s", None)
        if seconds is not None and side not in fields:
            fields[side] = f"{float(seconds):.3g}s"
        rate = fields.pop(f"{side}_rows_per_s", None)
        if rate is not None:
            named = f"{fields[side]}: " if side in fields else ""
            fields[side] = f"{named}{float(rate):,.0f} rows/s"
    if "rows" in fields:
        fields["name"] = f"{fields.get('name', '?')} ({int(float(fields.pop('rows'))):,} rows)"
    return fields


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.system()} {platform.release()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the benchmarks' own defaults")
    args = parser.parse_args()

    results: list[dict[str, str]] = []
    failed: list[str] = []
    for script in BENCHMARKS:
        command = [sys.executable, str(HERE / script), *([] if args.full else ["--quick"])]
        print(f"$ {' '.join(command[1:])}", flush=True)
        finished = subprocess.run(command, capture_output=True, text=True, check=False)
        print(finished.stdout, end="", flush=True)
        if finished.returncode != 0:
            failed.append(script)
            print(finished.stderr, end="", file=sys.stderr)
        results += [
            {"benchmark": script, **parse_result(line)}
            for line in finished.stdout.splitlines()
            if line.startswith("RESULT ")
        ]

    print(f"\nMachine: {machine()}\n")
    print("| benchmark | figure | ours | baseline | ratio |")
    print("|---|---|---|---|---|")
    for result in results:
        print(
            f"| {result['benchmark']} | {result.get('name', '?')} | {result.get('ours', '')} | "
            f"{result.get('baseline', '')} | {result.get('ratio', '')} |"
        )
    if failed:
        sys.exit(f"benchmarks that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
