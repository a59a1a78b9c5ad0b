"""Preprocessor throughput: 1,000 mixed-type features beside a bare ``(x - mean) / std``.

    .venv/bin/python benchmarks/normalization.py
    .venv/bin/python benchmarks/normalization.py --features 1000 --batch 1024 --seconds 2

The features are a realistic mix of what identification picks on logged data (by default 40%
continuous, 15% Box-Cox, 15% quantile with 21 boundaries, 10% enum with 2 to 10 values, 15%
binary, 5% probability), with 10% of the values missing. Both sides run the same
``[batch, features]`` float32 tensor on the CPU under ``torch.inference_mode``, after a warm-up;
each is timed over repeated rounds of at least ``--seconds`` and the best round counts (the
least disturbed by other work). The baseline is the cheapest thing a network could do with its
input (one subtraction and one division, no missing values, no types), so the ratio is what
the preprocessor's types and presence mask cost on top of it. The baseline writes into one
preallocated tensor: allocating a fresh 4 MB result each call made it flip between two speeds,
6x apart, from run to run (the allocator's page faults on this VM), which measured the
allocator rather than the arithmetic. Prints rows/s for both, the ratio, and the threads torch
used (left at torch's default).

``--cpu-time`` times both sides on one thread by the CPU time the process used, not the wall
clock: on a machine that other work loads, the wall clock measures that work (the baseline was
seen to vary 80-fold between runs of the same code), the CPU time of one thread far less.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from horizon_engine.normalization import NormalizationParameters
from horizon_engine.plugins import PluginHost
from horizon_engine.preprocessor import build_preprocessor

MIX = {
    "continuous": 0.40,
    "boxcox": 0.15,
    "quantile": 0.15,
    "enum": 0.10,
    "binary": 0.15,
    "probability": 0.05,
}
"""Share of the features of each type."""


def mixed_features(
    count: int, rng: np.random.Generator
) -> tuple[dict[str, NormalizationParameters], np.ndarray]:
    """``count`` features' parameters (types per ``MIX``) and a sample of 4,096 rows of them."""
    types = np.repeat(list(MIX), [round(share * count) for share in MIX.values()])[:count]
    types = np.concatenate([types, ["continuous"] * (count - len(types))])
    rng.shuffle(types)
    parameters: dict[str, NormalizationParameters] = {}
    columns = []
    for index, kind in enumerate(types):
        if kind == "enum":
            values = rng.integers(0, rng.integers(2, 11), 4096).astype(np.float64)
            params = NormalizationParameters(
                feature_type="enum", possible_values=np.unique(values).tolist()
            )
        elif kind == "binary":
            values = rng.binomial(1, 0.5, 4096).astype(np.float64)
            params = NormalizationParameters(feature_type="binary")
        elif kind == "probability":
            values = rng.beta(2, 2, 4096)
            params = NormalizationParameters(feature_type="probability")
        elif kind == "quantile":
            values = np.concatenate([rng.normal(size=2048), rng.exponential(size=2048)])
            boundaries = np.unique(np.quantile(values, np.linspace(0, 1, 21)))
            params = NormalizationParameters(feature_type="quantile", quantiles=boundaries.tolist())
        elif kind == "boxcox":
            values = rng.exponential(size=4096)
            params = NormalizationParameters(
                feature_type="boxcox", boxcox_lambda=0.27, boxcox_shift=0.0, mean=-0.6, stddev=0.9
            )
        else:
            values = rng.normal(rng.normal(), rng.uniform(0.5, 2.0), 4096)
            params = NormalizationParameters(
                feature_type="continuous", mean=float(values.mean()), stddev=float(values.std())
            )
        parameters[str(index)] = params
        columns.append(values)
    return parameters, np.stack(columns, axis=1)


def rows_per_second(
    step: Callable[[], object],
    rows: int,
    seconds: float,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The best of ``rounds`` rounds, each repeating ``step`` for at least ``seconds`` of
    ``clock``."""
    for _ in range(10):
        step()
    best = 0.0
    for _ in range(rounds):
        calls = 0
        start = clock()
        while (elapsed := clock() - start) < seconds:
            step()
            calls += 1
        best = max(best, calls * rows / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 0.5 s, for make bench")
    parser.add_argument(
        "--cpu-time", action="store_true", help="one thread, timed by the process's CPU time"
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 0.5, 3
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)

    rng = np.random.default_rng(args.seed)
    parameters, sample = mixed_features(args.features, rng)
    feature_ids = list(parameters)
    preprocessor = build_preprocessor(
        feature_ids, parameters, plugins=PluginHost(env={"HORIZON_LOAD_PLUGINS": ""})
    ).eval()
    rows = rng.integers(0, len(sample), args.batch)
    x = torch.from_numpy(sample[rows].astype(np.float32))
    presence = torch.from_numpy((rng.random(x.shape) > 0.1).astype(np.float32))
    mean = x.mean(dim=0)
    std = x.std(dim=0)

    counts = {kind: 0 for kind in MIX}
    for params in parameters.values():
        counts[params.feature_type] += 1
    print(
        f"{args.features} features ({', '.join(f'{n} {kind}' for kind, n in counts.items())}) "
        f"-> {len(preprocessor.output_names)} columns; batch {args.batch}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
        f"{', CPU time' if args.cpu_time else ''}"
    )
    with torch.inference_mode():
        out = torch.empty_like(x)
        baseline = rows_per_second(
            lambda: torch.div(torch.sub(x, mean, out=out), std, out=out),
            args.batch,
            args.seconds,
            args.rounds,
            clock,
        )
        ours = rows_per_second(
            lambda: preprocessor(x, presence), args.batch, args.seconds, args.rounds, clock
        )
    print(f"bare (x - mean) / std : {baseline:>14,.0f} rows/s")
    print(f"preprocessor          : {ours:>14,.0f} rows/s")
    print(f"ratio (bare / preprocessor): {baseline / ours:.1f}x")
    print(
        f"RESULT name=preprocessor_{args.features}_features ours={ours:.0f}rows/s "
        f"baseline={baseline:.0f}rows/s ratio={ours / baseline:.3g}"
    )


if __name__ == "__main__":
    main()
