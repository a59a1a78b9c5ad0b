"""How each stage grows with the data: time and peak memory from 10^4 to 10^7 logged rows.

    .venv/bin/python benchmarks/scaling.py --quick                  # 10^4 and 10^5 rows
    .venv/bin/python benchmarks/scaling.py                          # 10^4 to 10^6 rows
    .venv/bin/python benchmarks/scaling.py --sizes 1e4 1e5 1e6 1e7  # the issue's whole range
    .venv/bin/python benchmarks/scaling.py --sizes 1e6 1e7 --skip timeline_spark

Generates logged decisions with ``spark_timeline_baseline.generate_rows`` (pre-timeline rows in a
Parquet file, written in chunks: episodes of 50 steps, ``--features`` continuous state
features, two discrete actions, a reward metric) and
runs ``horizon run`` on them stage by stage, each in a fresh process whose wall time and peak
resident memory (of the process and everything under it: Spark's JVM, ``--nproc``'s processes;
sampled every 50 ms) are measured:

- ``timeline_local`` and ``timeline_spark``: the timeline stage on each engine;
- ``normalization``: identifying and fitting every feature's normalization;
- ``train_memory`` and ``train_streamed``: one epoch of the default ``dqn`` trainer on the
  train split, held in memory (``[trainer] data = "memory"``) and streamed from its row groups
  (``data = "streamed"``, ``max_memory_gb`` the same at every size: ``--streamed-memory-gb``,
  0.25 by default, well below the split from 10^6 rows).

Then, at ``--throughput-rows``, training throughput (train rows per second of the train stage)
of two processes (``--nproc 2``) on one thread each against one process on one thread (how
much a second process adds: 2.0 is perfect scaling) and against one process on two threads
(the same cores, used by torch's own threads instead), on the default network and on a large
one (``--large-layers``) where an update is compute-bound.

Prints a table with each stage's growth per 10x rows (the time at a size over the time at the
size before, scaled to 10 times the rows: 10 is linear), draws the same as an image
(``--image``, PNG), and one ``RESULT`` line per figure. The goals of the issue this answers:
every stage grows at most 11x per 10x rows; streamed training's peak memory at 10^7 rows within
1.2x of its peak at 10^6; streamed throughput at least 0.8x in-memory; two processes at least
1.6x one on the same cores where the model is compute-bound.

The rows of a size are generated once and deleted when the source stage has copied them. At 10^7
rows of 100 features the source's copy takes about 8 GB of disk, the timeline with next states
and 3-step windows about 30 GB, and Spark's shuffle about 10 GB more while it builds its
timeline: the script refuses a size the free disk cannot hold, and ``--skip timeline_spark``
measures the rest on a smaller disk.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from spark_timeline_baseline import ACTIONS, generate_rows

EPISODE_STEPS = 50
BYTES_PER_VALUE_ON_DISK = 40
"""Free disk needed per row and feature at the peak: the source stage's copy of the rows
(about 8 bytes a value; the generated file is deleted once it is made) and the timeline with
next states and 3-step windows (about 30: 24 GB were written at 10^7 rows of 100 features when
Spark's had not finished); the timeline stage of each engine replaces the other's."""
SPARK_SHUFFLE_BYTES_PER_VALUE = 10
"""Spark's shuffle files on top of that, while its timeline is built (8.7 GB at 10^7)."""
STAGES = (
    "timeline_spark",
    "timeline_local",
    "normalization",
    "train_memory",
    "train_streamed",
)
"""In the order they run: the local engine's timeline, built last, is the one trained on."""


def pipeline_file(folder: Path, rows_path: Path, layers: list[int]) -> Path:
    """A pipeline of the generated rows in ``folder`` (made): one epoch of the default dqn,
    no evaluation, no export (the stages this benchmark times, and nothing else)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = f"""
[pipeline]
output_dir = "{folder / "run"}"
seed = 0

[source]
kind = "parquet"
path = "{rows_path}"

[timeline]
engine = "local"
actions = {json.dumps(ACTIONS)}
reward = {{ reward = 1.0 }}
eval_fraction = 0.1

[normalization]

[trainer]
kind = "dqn"
epochs = 1
layers = {json.dumps(layers)}
"""
    path = folder / "pipeline.toml"
    path.write_text(text, encoding="utf-8")
    return path


def tree_rss_mb(root: int) -> float:
    """Resident memory of ``root`` and every process under it, in MB (Linux's /proc): the
    JVM Spark starts and the processes of ``--nproc`` are counted with the command's own."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid = int(entry.name)
        children.setdefault(int(fields["PPid"]), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / 1024


def measured(command: list[str]) -> dict[str, float]:
    """Wall seconds of ``command`` and the peak of its process tree's resident memory,
    sampled every 50 ms; an error with its output when it fails."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        peak = 0.0
        while process.poll() is None:
            peak = max(peak, tree_rss_mb(process.pid))
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        if process.returncode:
            output.seek(0)
            text = output.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"{' '.join(command)} failed:\n{text}")
    return {"seconds": seconds, "peak_mb": peak}


def available_mb() -> float:
    """Memory the machine can give without swapping (Linux's MemAvailable), in MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return math.inf


def expected_peak_mb(row: Row | None, rows: int) -> float:
    """A stage's peak at ``rows`` if it grew in proportion to the rows from the largest size
    measured so far: how in-memory training is kept from running the machine out of memory
    (at 10^7 rows of 100 features it would need about ten times its 10^6 peak)."""
    if row is None or not row.peak_mb:
        return 0.0
    largest = max(row.peak_mb)
    return row.peak_mb[largest] * rows / largest


def horizon(pipeline: Path, stage: str, *settings: str, nproc: int = 1) -> list[str]:
    """The ``horizon run`` command of one stage with ``--set`` overrides."""
    command = [str(Path(sys.executable).with_name("horizon")), "run", str(pipeline)]
    command += ["--stages", stage, *[item for s in settings for item in ("--set", s)]]
    return command + (["--nproc", str(nproc)] if nproc > 1 else [])


@dataclass
class Row:
    """One stage's figures by size."""

    seconds: dict[int, float] = field(default_factory=dict)
    peak_mb: dict[int, float] = field(default_factory=dict)

    def growth(self, sizes: list[int], rows: int) -> float:
        """Growth per 10x rows from the size before ``rows`` (NaN at the first)."""
        at = sizes.index(rows)
        if at == 0 or sizes[at - 1] not in self.seconds or rows not in self.seconds:
            return math.nan
        before = sizes[at - 1]
        ratio = self.seconds[rows] / self.seconds[before]
        return ratio ** (1 / math.log10(rows / before))


def run_size(
    rows: int,
    features: int,
    folder: Path,
    table: dict[str, Row],
    streamed_memory_gb: float,
    stages: list[str],
) -> None:
    """Generate ``rows`` rows and time every stage on them; streamed training within
    ``streamed_memory_gb`` at every size (its peak should not grow with the rows)."""
    data = folder / f"rows-{rows}.parquet"
    generate_rows(data, rows, EPISODE_STEPS, features=features)
    pipeline = pipeline_file(folder / f"size-{rows}", data, [128, 64])
    subprocess.run(horizon(pipeline, "source"), check=True, capture_output=True)
    data.unlink()
    for stage in stages:
        expected_mb = expected_peak_mb(table.get(stage), rows)
        if stage == "train_memory" and expected_mb > available_mb():
            print(
                f"  {stage:16s} {rows:>10,} rows  skipped: its peak grows with the rows, about "
                f"{expected_mb / 1e3:.0f} GB expected and {available_mb() / 1e3:.0f} GB available",
                flush=True,
            )
            continue
        if stage.startswith("timeline"):
            engine = stage.split("_")[1]
            command = horizon(pipeline, "timeline", f"timeline.engine={engine}")
        elif stage == "normalization":
            command = horizon(pipeline, "normalization")
        elif stage == "train_memory":
            command = horizon(pipeline, "train", "trainer.data=memory")
        else:
            command = horizon(
                pipeline,
                "train",
                "trainer.data=streamed",
                f"trainer.max_memory_gb={streamed_memory_gb}",
            )
        figures = measured(command)
        table.setdefault(stage, Row()).seconds[rows] = figures["seconds"]
        table[stage].peak_mb[rows] = figures["peak_mb"]
        print(
            f"  {stage:16s} {rows:>10,} rows  {figures['seconds']:8.1f} s  "
            f"{figures['peak_mb']:8.0f} MB",
            flush=True,
        )
    shutil.rmtree(pipeline.parent)


def throughput(rows: int, features: int, folder: Path, layers: list[int]) -> dict[str, float]:
    """Train rows per second of the train stage on the same timeline: one process on one
    thread, one process on two threads, two processes on one thread each."""
    data = folder / f"throughput-{rows}.parquet"
    generate_rows(data, rows, EPISODE_STEPS, features=features)
    pipeline = pipeline_file(folder / f"throughput-{len(layers)}x{layers[0]}", data, layers)
    for stage in ("source", "timeline", "normalization"):
        subprocess.run(horizon(pipeline, stage), check=True, capture_output=True)
    train_rows = json.loads((pipeline.parent / "run" / "timeline" / "timeline.json").read_text())
    count = train_rows["train_rows"]
    runs = {
        "one": horizon(pipeline, "train", "trainer.threads=1"),
        "one_two_threads": horizon(pipeline, "train", "trainer.threads=2"),
        "two": horizon(pipeline, "train", "trainer.threads=1", nproc=2),
    }
    rates = {side: count / measured(command)["seconds"] for side, command in runs.items()}
    data.unlink()
    return rates


def draw(table: dict[str, Row], sizes: list[int], image: Path) -> None:
    """Time and peak memory against rows, log-log, one line per stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (times, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for stage, row in table.items():
        measured_sizes = [rows for rows in sizes if rows in row.seconds]
        times.plot(measured_sizes, [row.seconds[r] for r in measured_sizes], "o-", label=stage)
        memory.plot(measured_sizes, [row.peak_mb[r] for r in measured_sizes], "o-", label=stage)
    for axis, label in ((times, "seconds"), (memory, "peak memory (MB)")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("logged rows")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    times.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(image, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    parser.add_argument("--quick", action="store_true", help="10^4 and 10^5 rows")
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument(
        "--streamed-memory-gb",
        type=float,
        default=0.25,
        help="[trainer] max_memory_gb of the streamed training, the same at every size",
    )
    parser.add_argument("--throughput-rows", type=float, default=1e5)
    parser.add_argument("--large-layers", type=int, nargs="+", default=[1024, 1024])
    parser.add_argument("--image", type=Path, default=Path("scaling.png"))
    parser.add_argument("--work-dir", type=Path, help="where to write rows and runs")
    parser.add_argument(
        "--skip",
        nargs="+",
        choices=STAGES,
        default=[],
        help="stages not to run (the Spark timeline needs the most disk and time)",
    )
    args = parser.parse_args()
    stages = [stage for stage in STAGES if stage not in args.skip]
    sizes = sorted({int(size) for size in ([1e4, 1e5] if args.quick else args.sizes)})
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    table: dict[str, Row] = {}
    with tempfile.TemporaryDirectory(dir=args.work_dir) as name:
        folder = Path(name)
        print(
            f"{args.features} features, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        for rows in sizes:
            per_value = BYTES_PER_VALUE_ON_DISK
            if "timeline_spark" in stages:
                per_value += SPARK_SHUFFLE_BYTES_PER_VALUE
            needed = rows * args.features * per_value
            free = shutil.disk_usage(folder).free
            if needed > free:
                print(
                    f"{rows:,} rows: skipped, needs about {needed / 1e9:.0f} GB of disk "
                    f"and {free / 1e9:.0f} GB are free"
                )
                continue
            started = time.perf_counter()
            run_size(rows, args.features, folder, table, args.streamed_memory_gb, stages)
            print(f"{rows:,} rows done in {time.perf_counter() - started:.0f} s", flush=True)
        rates = {
            "default": throughput(int(args.throughput_rows), args.features, folder, [128, 64]),
            "large": throughput(
                int(args.throughput_rows), args.features, folder, args.large_layers
            ),
        }
    print()
    print(f"{'stage':16s}" + "".join(f"{rows:>14,}" for rows in sizes) + "   growth/10x")
    for stage, row in table.items():
        cells = "".join(
            f"{row.seconds[r]:>8.1f}s {row.peak_mb[r]:>4.0f}M" if r in row.seconds else " " * 14
            for r in sizes
        )
        growth = [row.growth(sizes, r) for r in sizes[1:]]
        print(f"{stage:16s}{cells}   " + " ".join(f"{g:.1f}" for g in growth))
    draw(table, sizes, args.image)
    print(f"\nimage: {args.image}")
    for stage, row in table.items():
        for rows in sizes:
            if rows in row.seconds:
                growth = row.growth(sizes, rows)
                print(
                    f"RESULT name=scaling_{stage} rows={rows} ours_s={row.seconds[rows]:.2f} "
                    f"peak_mb={row.peak_mb[rows]:.0f} growth_per_10x={growth:.2f}"
                )
    streamed, in_memory = table.get("train_streamed"), table.get("train_memory")
    if streamed and in_memory:
        largest = max(set(streamed.seconds) & set(in_memory.seconds))
        ratio = in_memory.seconds[largest] / streamed.seconds[largest]
        print(f"RESULT name=scaling_streamed_vs_memory rows={largest} ratio={ratio:.2f}")
        if len(streamed.peak_mb) > 1:
            last, before = sorted(streamed.peak_mb)[-2:]
            peak_ratio = streamed.peak_mb[before] / streamed.peak_mb[last]
            print(
                f"RESULT name=scaling_streamed_peak rows={before} "
                f"peak_mb={streamed.peak_mb[before]:.0f} "
                f"baseline_peak_mb={streamed.peak_mb[last]:.0f} ratio={peak_ratio:.2f}"
            )
    for network, rate in rates.items():
        print(
            f"RESULT name=scaling_two_processes_{network} ours_rows_per_s={rate['two']:.0f} "
            f"baseline_rows_per_s={rate['one']:.0f} ratio={rate['two'] / rate['one']:.2f}"
        )
        print(
            f"RESULT name=scaling_two_processes_vs_two_threads_{network} "
            f"ours_rows_per_s={rate['two']:.0f} "
            f"baseline_rows_per_s={rate['one_two_threads']:.0f} "
            f"ratio={rate['two'] / rate['one_two_threads']:.2f}"
        )


if __name__ == "__main__":
    main()
