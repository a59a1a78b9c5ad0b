"""``horizon serve`` under load and attack on 127.0.0.1, in one bounded run: keep-alive clients
sending good requests while others send slow bodies, leave mid-body, send oversized and
malformed requests. Every good request is answered with its decision, every decision
accepted is logged, and the server's p99 latency and resident memory are printed before and
after (nothing timed is asserted; memory may grow by less than a generous bound).

``HORIZON_SERVE_LOAD_REQUESTS`` sets the good requests (2,000 by default; the closing note's
figures: 100000)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_serve_hostile import tiny_model

from horizon_plugins_serving.decision_log import read_decisions

pytestmark = pytest.mark.reliability

HORIZON = str(Path(sys.executable).with_name("horizon"))
REQUESTS = int(os.environ.get("HORIZON_SERVE_LOAD_REQUESTS", "2000"))
CLIENTS = 8
ROW = {"state_features": {"0": 0.1, "1": -0.2, "2": 0.3, "3": 0.0}}


def request(body: bytes, length: int | None = None) -> bytes:
    return (
        b"POST /decisions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body) if length is None else length, body)
    )


GOOD = request(json.dumps({"rows": [ROW]}).encode())


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])
    return int(head.split()[1]), await reader.readexactly(length)


async def good_client(port: int, count: int, latencies: list[float], ids: list[str]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        start = time.perf_counter()
        writer.write(GOOD)
        status, body = await answer(reader)
        latencies.append(time.perf_counter() - start)
        assert status == 200, body
        decisions = json.loads(body)["decisions"]
        assert len(decisions) == 1 and decisions[0]["action"] in ("0", "1")
        ids.append(decisions[0]["decision_id"])
    writer.close()


async def attacker(port: int, rounds: int, statuses: list[int]) -> None:
    """Slow bodies, bodies cut off mid-way, oversized and malformed requests, in turn."""
    for turn in range(rounds):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        kind = turn % 4
        if kind == 0:  # a slow body: one byte, then silence until the deadline
            writer.write(request(b"{", length=100))
        elif kind == 1:  # leaves mid-body
            writer.write(request(b'{"rows": [', length=100))
            await writer.drain()
            writer.close()
            continue
        elif kind == 2:  # oversized
            writer.write(request(b"", length=10**9))
        else:  # malformed
            writer.write(request(b'{"rows": [{"state_features": {"0": "x"}}]}'))
        try:
            statuses.append((await answer(reader))[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            statuses.append(0)
        writer.close()


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) / 1024


async def load(port: int, requests: int) -> tuple[list[float], list[str], list[int]]:
    latencies: list[float] = []
    ids: list[str] = []
    statuses: list[int] = []
    await asyncio.gather(
        *(good_client(port, requests // CLIENTS, latencies, ids) for _ in range(CLIENTS)),
        attacker(port, 12, statuses),
    )
    return latencies, ids, statuses


def test_serve_under_load_and_attack_answers_every_good_request_and_logs_it(tmp_path):
    log = tmp_path / "decisions.jsonl"
    server = subprocess.Popen(
        [
            HORIZON,
            "serve",
            str(tiny_model(tmp_path / "model.onnx")),
            "--port",
            "0",
            "--log",
            str(log),
            "--request-timeout",
            "1",
            "--max-body-bytes",
            "10000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(re.search(r":(\d+);", server.stdout.readline())[1])
        warm, warm_ids, _ = asyncio.run(load(port, CLIENTS * 50))
        before = rss_mib(server.pid)
        latencies, ids, statuses = asyncio.run(load(port, REQUESTS))
        after = rss_mib(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=120)
    assert server.returncode == 0, err
    p99_before, p99 = (np.percentile(times, 99) * 1e3 for times in (warm, latencies))
    print(
        f"\n{len(ids):,} good requests over {CLIENTS} connections with attacks: p99 "
        f"{p99_before:.2f} ms warm-up, {p99:.2f} ms under load; RSS {before:.1f} MiB before, "
        f"{after:.1f} MiB after; attack answers {sorted(set(statuses))}"
    )
    assert len(ids) == REQUESTS // CLIENTS * CLIENTS
    assert set(statuses) <= {0, 408, 413, 422}
    logged = [row["decision_id"] for row in read_decisions(log).rows]
    assert sorted(logged) == sorted(warm_ids + ids)  # logged == accepted, each once
    assert after - before < 100
    assert "Traceback" not in err
