"""The Predictor's latency and throughput beside a bare onnxruntime session on the same model.

    .venv/bin/python benchmarks/serving.py                  # 20,000 calls at batch 1
    .venv/bin/python benchmarks/serving.py --quick          # 3,000, for make bench
    .venv/bin/python benchmarks/serving.py --model runs/cartpole_dqn/model.onnx

Without ``--model`` it trains the small CartPole DQN of tests/test_serving.py (60 episodes, two
epochs, ``[export] kind = "onnx"``) in a temporary folder. Both sides get one intra-op thread.
Ours: ``Predictor.predict`` on raw feature maps (assembling the dense inputs, fetching
``scores``, greedy choice and propensity in numpy). The baseline: a bare
``InferenceSession.run(None, feeds)`` on the same model with the same inputs prebuilt as
arrays (every output, as a caller of the exported model would run it). A third line gives the
bare session fetching ``scores`` only, the floor of the Predictor's lean path. The calls are
interleaved (one of each in turn, in alternating order) so that other work on the machine
weighs on both alike. The issue's goal: p50 at batch 1 at most 1.5x bare.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

PIPELINE = """
[pipeline]
output_dir = "{output}"
seed = 0
[source]
kind = "gym"
env = "CartPole-v1"
episodes = 60
ds = "2019-01-01"
[timeline]
actions = ["0", "1"]
eval_fraction = 0.3
[normalization]
[trainer]
kind = "dqn"
epochs = 2
layers = [16]
threads = 1
[export]
kind = "onnx"
"""


def train_model(folder: Path) -> Path:
    import subprocess

    config = folder / "pipeline.toml"
    config.write_text(PIPELINE.format(output=folder / "run"))
    horizon = Path(sys.executable).with_name("horizon")
    subprocess.run([str(horizon), "run", str(config)], check=True, capture_output=True)
    return folder / "run" / "model.onnx"


def raw_states(count: int, seed: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    values = rng.normal(0.0, [0.1, 0.5, 0.1, 0.8], size=(count, 4))
    return [{str(i): float(v) for i, v in enumerate(row)} for row in values]


def timed(call, *args) -> float:
    start = time.perf_counter_ns()
    call(*args)
    return (time.perf_counter_ns() - start) / 1e3


def measure(model: Path, calls: int, big_calls: int) -> None:
    import onnxruntime

    from horizon_plugins_serving.predictor import Predictor

    predictor = Predictor(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    bare = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])

    def sides(batch: int, seed: int):
        states = raw_states(batch, seed)
        features, presence = predictor.state_arrays(states)
        feeds = {"features": features, "presence": presence}
        return {
            "ours": (predictor.predict, states),
            "bare": (bare.run, None, feeds),
            "bare_scores": (bare.run, ["scores"], feeds),
        }

    for batch, count in ((1, calls), (1024, big_calls)):
        work = sides(batch, seed=batch)
        names = list(work)
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(min(200, count)):  # warm up
            for call, *args in work.values():
                call(*args)
        for round_ in range(count):
            for name in names if round_ % 2 == 0 else names[::-1]:
                call, *args = work[name]
                times[name].append(timed(call, *args))
        report(batch, {name: np.array(values) for name, values in times.items()})


def report(batch: int, times: dict[str, np.ndarray]) -> None:
    ours, bare, floor = times["ours"], times["bare"], times["bare_scores"]
    if batch == 1:
        print(f"batch 1, {len(ours)} calls each, microseconds:")
        for name, values in times.items():
            p50, p99 = np.percentile(values, [50, 99])
            print(f"  {name:12s} p50 {p50:8.1f}  p99 {p99:8.1f}")
        for q in (50, 99):
            a, b = np.percentile(ours, q), np.percentile(bare, q)
            print(
                f"RESULT name=serving_p{q}_b1 ours={a:.1f}us baseline={b:.1f}us ratio={a / b:.2f}"
            )
        a, b = np.percentile(ours, 50), np.percentile(floor, 50)
        print(
            f"RESULT name=serving_p50_b1_vs_scores_only ours={a:.1f}us baseline={b:.1f}us "
            f"ratio={a / b:.2f}"
        )
    else:
        rates = {name: batch / (np.median(values) / 1e6) for name, values in times.items()}
        print(f"batch {batch}, {len(ours)} calls each, rows/s (median call):")
        for name, rate in rates.items():
            print(f"  {name:12s} {rate:12,.0f}")
        print(
            f"RESULT name=serving_throughput_b{batch} ours_rows_per_s={rates['ours']:.0f} "
            f"baseline_rows_per_s={rates['bare']:.0f} ratio={rates['bare'] / rates['ours']:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3,000 calls, for make bench")
    parser.add_argument("--calls", type=int, default=20_000, help="calls at batch 1")
    parser.add_argument("--model", type=Path, help="an exported model.onnx to measure")
    args = parser.parse_args()
    calls = 3_000 if args.quick else args.calls
    big_calls = 100 if args.quick else 500
    if args.model:
        measure(args.model, calls, big_calls)
        return
    with tempfile.TemporaryDirectory() as folder:
        measure(train_model(Path(folder)), calls, big_calls)


if __name__ == "__main__":
    main()
