"""The Predictor's latency and throughput beside a bare onnxruntime session on the same model,
and ``horizon serve`` over HTTP beside a bare uvicorn + Starlette app.

    .venv/bin/python benchmarks/serving.py                  # 20,000 calls; 100,000 requests
    .venv/bin/python benchmarks/serving.py --quick          # 3,000 calls; 20,000, for make bench
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

Over HTTP: ``horizon serve MODEL --port 0`` in its own process with its JSONL decision log on,
beside a bare uvicorn + Starlette app in another (same uvicorn settings) that reads the body
and answers a constant JSON decision for each row: the ratio is what parsing, checking,
scoring, logging and our JSON cost over the HTTP stack itself. The load: 8 keep-alive
connections on 127.0.0.1 from one asyncio loop, each sending its next request when its answer
has come, a fixed number of requests in all, at batch 1 and at batch 64, the two servers taking
turns in 5 rounds.
Decisions per second (rows answered over wall time), each request's latency (p50, p99), and
each server's CPU time per request (user and system, from ``/proc/PID/stat``), which other work
on the machine sways far less than the rates. The client is the same for both servers (one
Python process, asyncio streams) and shares the machine's cores with them, as a client on the
same host would: on 2 cores it costs some 50 microseconds a request, less than either server.
Then memory: a fresh ``horizon serve``'s resident set (``VmRSS``) after 10,000 batch-1
requests and after ``--memory-requests`` (100,000; 20,000 with ``--quick``), which the issue
wants equal. ``--http-only`` skips the Predictor's figures and the memory run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
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

    from horizon_engine import ModelInputs, ModelOutputs
    from horizon_plugins_serving.predictor import Predictor

    predictor = Predictor(model)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    bare = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])

    def sides(batch: int, seed: int):
        states = raw_states(batch, seed)
        features, presence = predictor.state_arrays(states)
        feeds = dict(zip(ModelInputs.STATE, (features, presence), strict=True))
        return {
            "ours": (predictor.predict, states),
            "bare": (bare.run, None, feeds),
            "bare_scores": (bare.run, [ModelOutputs.SCORES], feeds),
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


CLIENTS = 8
ROUNDS = 5


class HttpServer:
    """A server process started by ``command``, which prints its URL on its first line."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        first = self.process.stdout.readline()
        found = re.search(r"(http://[\d.]+):(\d+)", first)
        if found is None:
            self.stop()
            sys.exit(f"{command[0]} did not start: {first!r}")
        self.host, self.port = found[1].removeprefix("http://"), int(found[2])

    def cpu_seconds(self) -> float:
        """The server's user and system CPU time so far."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.communicate(timeout=120)


def post(body: bytes) -> bytes:
    return (
        b"POST /decisions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


async def keep_alive_client(
    server: HttpServer, requests: list[bytes], latencies: list[float]
) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    for request in requests:
        start = time.perf_counter_ns()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])
        await reader.readexactly(length)
        latencies.append((time.perf_counter_ns() - start) / 1e3)
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"the server answered {head.splitlines()[0]!r}")
    writer.close()
    await writer.wait_closed()


def load(server: HttpServer, requests: list[bytes]) -> tuple[float, list[float]]:
    """Send ``requests`` over ``CLIENTS`` keep-alive connections; wall seconds and latencies."""
    latencies: list[float] = []

    async def clients() -> None:
        await asyncio.gather(
            *(keep_alive_client(server, requests[i::CLIENTS], latencies) for i in range(CLIENTS))
        )

    start = time.perf_counter()
    asyncio.run(clients())
    return time.perf_counter() - start, latencies


def request_bodies(count: int, batch: int) -> list[bytes]:
    rows = [{"state_features": state} for state in raw_states(batch * min(count, 100), 0)]
    return [
        post(json.dumps({"rows": rows[i % 100 * batch : (i % 100 + 1) * batch]}).encode())
        for i in range(count)
    ]


def measure_http(model: Path, folder: Path, requests: int, memory_requests: int) -> None:
    horizon = str(Path(sys.executable).with_name("horizon"))
    serve = [horizon, "serve", str(model), "--port", "0"]
    bare = [sys.executable, __file__, "--bare-http-server"]
    ours = HttpServer([*serve, "--log", str(folder / "decisions.jsonl")])
    baseline = HttpServer(bare)
    try:
        for batch, count in ((1, requests), (64, max(requests // 10, CLIENTS * ROUNDS))):
            bodies = request_bodies(count // ROUNDS, batch)
            load(ours, bodies[: CLIENTS * 10])  # warm up
            load(baseline, bodies[: CLIENTS * 10])
            seconds = {"ours": 0.0, "bare": 0.0}
            cpu = {"ours": 0.0, "bare": 0.0}
            latencies: dict[str, list[float]] = {"ours": [], "bare": []}
            for round_ in range(ROUNDS):
                sides = [("ours", ours), ("bare", baseline)]
                for name, server in sides if round_ % 2 == 0 else sides[::-1]:
                    before = server.cpu_seconds()
                    elapsed, times = load(server, bodies)
                    cpu[name] += server.cpu_seconds() - before
                    seconds[name] += elapsed
                    latencies[name] += times
            report_http(batch, len(bodies) * ROUNDS, seconds, cpu, latencies)
    finally:
        ours.stop()
        baseline.stop()
    if memory_requests:
        measure_memory([*serve, "--log", str(folder / "memory.jsonl")], memory_requests)


def report_http(
    batch: int,
    count: int,
    seconds: dict[str, float],
    cpu: dict[str, float],
    latencies: dict[str, list[float]],
) -> None:
    rates = {name: count * batch / seconds[name] for name in seconds}
    cpu_us = {name: cpu[name] / count * 1e6 for name in cpu}
    print(f"HTTP batch {batch}, {count:,} requests each over {CLIENTS} keep-alive connections:")
    for name in rates:
        p50, p99 = np.percentile(latencies[name], [50, 99])
        print(
            f"  {name:12s} {rates[name]:10,.0f} decisions/s  p50 {p50:8.1f}us  "
            f"p99 {p99:8.1f}us  server CPU {cpu_us[name]:6.1f}us a request"
        )
    print(f"  ours at {rates['ours'] / rates['bare']:.2f}x the bare server's rate")
    print(
        f"RESULT name=serving_http_b{batch} ours_rows_per_s={rates['ours']:.0f} "
        f"baseline=bare_starlette baseline_rows_per_s={rates['bare']:.0f} "
        f"ratio={rates['bare'] / rates['ours']:.2f}"
    )
    print(
        f"RESULT name=serving_http_cpu_b{batch} ours={cpu_us['ours']:.1f}us "
        f"baseline={cpu_us['bare']:.1f}us ratio={cpu_us['ours'] / cpu_us['bare']:.2f}"
    )
    for q in (50, 99):
        a, b = (np.percentile(latencies[name], q) for name in ("ours", "bare"))
        print(
            f"RESULT name=serving_http_p{q}_b{batch} ours={a:.0f}us baseline={b:.0f}us "
            f"ratio={a / b:.2f}"
        )


def measure_memory(serve: list[str], memory_requests: int) -> None:
    server = HttpServer(serve)
    try:
        bodies = request_bodies(10_000, 1)
        load(server, bodies)
        first = server.rss_mib()
        done = len(bodies)
        while done < memory_requests:
            more = bodies[: memory_requests - done]
            load(server, more)
            done += len(more)
        last = server.rss_mib()
    finally:
        server.stop()
    print(
        f"horizon serve's resident memory: {first:.1f} MiB after 10,000 requests, "
        f"{last:.1f} MiB after {memory_requests:,} ({last - first:+.1f} MiB)"
    )
    print(
        f"RESULT name=serving_http_rss_after_{memory_requests} ours={last:.1f}MiB "
        f"baseline={first:.1f}MiB ratio={last / first:.3f}"
    )


def serve_bare_http() -> None:
    """The baseline server: uvicorn + Starlette, reading the body and answering a constant
    decision for each row (rows counted in the raw body, which is not parsed)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from horizon_plugins_serving.server import BackgroundServer

    decision = {
        "decision_id": "0" * 32,
        "action": "1",
        "action_probability": 1.0,
        "timestamp": "2019-01-01T00:00:00+00:00",
        "scores": {"0": 0.25, "1": 0.5},
    }

    async def decisions(request):
        rows = (await request.body()).count(b'"state_features"')
        return JSONResponse({"decisions": [decision] * rows})

    app = Starlette(routes=[Route("/decisions", decisions, methods=["POST"])])
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    with BackgroundServer(app) as server:
        print(server.url, flush=True)
        signal.sigwait({signal.SIGTERM})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, for make bench")
    parser.add_argument("--calls", type=int, default=20_000, help="calls at batch 1")
    parser.add_argument("--requests", type=int, default=20_000, help="HTTP requests at batch 1")
    parser.add_argument("--memory-requests", type=int, default=100_000)
    parser.add_argument("--model", type=Path, help="an exported model.onnx to measure")
    parser.add_argument(
        "--http-only", action="store_true", help="only the HTTP figures: no Predictor, no memory"
    )
    parser.add_argument("--bare-http-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_http_server:
        serve_bare_http()
        return
    calls = 3_000 if args.quick else args.calls
    big_calls = 100 if args.quick else 500
    requests = 3_000 if args.quick else args.requests
    memory_requests = 20_000 if args.quick else args.memory_requests
    with tempfile.TemporaryDirectory() as folder:
        model = args.model or train_model(Path(folder))
        if not args.http_only:
            measure(model, calls, big_calls)
        measure_http(model, Path(folder), requests, 0 if args.http_only else memory_requests)


if __name__ == "__main__":
    main()
