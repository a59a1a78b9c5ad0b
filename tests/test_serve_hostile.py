"""``horizon serve`` facing hostile clients over real sockets on 127.0.0.1: slow bodies and
headers get 408 within the request deadline, stalled connections at the cap are shed for
newcomers (503 only when every connection is busy), a file-descriptor limit lowered in a
subprocess is never reached, a request head over 64 KiB gets 431, a half-closed pipelining
client is answered and a disconnecting one is one log line, a second signal during shutdown is
one line too, and the decision log survives all of it; the bearer token (its scheme in any
case); a non-loopback host without one; a log write failing with EMFILE stalls the log instead
of failing it; a model whose outputs are NaN is refused by serve and score, and a row whose
output is not finite is refused alone."""

from __future__ import annotations

import asyncio
import errno
import http.client
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_serve import http_json, request_rows

from horizon_engine import HorizonError
from horizon_plugins_serving.commands import serve_token
from horizon_plugins_serving.connections import MAX_HEAD_BYTES, ConnectionLimits, connection_cap
from horizon_plugins_serving.decision_log import DecisionLog, read_decisions
from horizon_plugins_serving.predictor import NonFiniteOutput, Predictor
from horizon_plugins_serving.server import BackgroundServer, build_app, is_loopback

HORIZON = str(Path(sys.executable).with_name("horizon"))


def tiny_model(path: Path, weight: float | None = None) -> Path:
    """A two-action ONNX model on four features, built by hand in milliseconds (no training):
    scores = (features * presence) @ W, with the metadata ``horizon export`` writes; with
    ``weight``, every entry of W is that (NaN: a model whose training went NaN)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    matrix = np.array([[1.0, -1.0], [0.5, 0.25], [-0.5, 0.5], [0.1, 0.2]], np.float32)
    if weight is not None:
        matrix[:] = weight
    weights = numpy_helper.from_array(matrix, "weights")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["features", "presence"], ["present"]),
            helper.make_node("MatMul", ["present", "weights"], ["scores"]),
        ],
        "tiny",
        [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, ["rows", 4])
            for name in ("features", "presence")
        ],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["rows", 2])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"feature_ids": '["0", "1", "2", "3"]', "actions": '["0", "1"]'})
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model.onnx")


def slow_client(port: int) -> socket.socket:
    """A client that sends its headers and the body's first byte, then nothing."""
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    return client


def answer_of(client: socket.socket) -> bytes:
    client.settimeout(30)
    answer = b""
    while chunk := client.recv(4096):
        answer += chunk
    return answer


def test_a_slow_body_and_slow_headers_get_408_within_the_deadline(model, tmp_path):
    limits = ConnectionLimits(request_timeout=0.5, max_connections=10)
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"))
    with BackgroundServer(app, limits=limits) as server:
        port = int(server.url.rsplit(":", 1)[1])
        body_never_ends = slow_client(port)
        headers_never_end = socket.create_connection(("127.0.0.1", port))
        headers_never_end.sendall(b"POST /decisions HTTP/1.1\r\nHost:")
        silent = socket.create_connection(("127.0.0.1", port))
        for client in (body_never_ends, headers_never_end):
            answer = answer_of(client)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert b"--request-timeout" in answer
        assert answer_of(silent).startswith(b"HTTP/1.1 408")  # closed, not held for ever
        status, body = http_json(server.url, "POST", "/decisions", {"rows": request_rows(2)})
        assert status == 200 and len(body["decisions"]) == 2
    assert len(read_decisions(tmp_path / "d.jsonl").rows) == 2


def stalled_clients(port: int, count: int) -> list[socket.socket]:
    """Connections that opened and sent nothing, part of a request line, or headers and the
    body's first byte, then nothing more."""
    partial = [
        b"",
        b"POST /deci",
        b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n{",
    ]
    clients = []
    for number in range(count):
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(partial[number % len(partial)])
        clients.append(client)
    return clients


def test_stalled_connections_at_the_cap_are_shed_for_ordinary_requests(model, tmp_path):
    """20 stalled connections fill a cap of 20: a newcomer used to get 503 until their request
    deadline (30 s here) cut them; now each newcomer sheds the connection furthest behind the
    minimum data rate. 30 clients each keep their connection open after their answer, so all
    20 stalled ones are shed (with 408), then the earliest of the idle ones."""
    limits = ConnectionLimits(request_timeout=30.0, max_connections=20)
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"))
    body = json.dumps({"rows": request_rows(1)})
    with BackgroundServer(app, limits=limits) as server:
        port = int(server.url.rsplit(":", 1)[1])
        stalled = stalled_clients(port, 20)
        time.sleep(0.2)
        ordinary, statuses = [], []
        for _ in range(30):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("POST", "/decisions", body)
            response = connection.getresponse()
            statuses.append(response.status)
            response.read()
            ordinary.append(connection)  # kept open: an idle keep-alive connection
        assert statuses == [200] * 30
        for client in stalled:
            answer = answer_of(client)
            assert answer.startswith(b"HTTP/1.1 408") and b"--max-connections" in answer, answer
            client.close()
        for connection in ordinary:
            connection.close()
    assert len(read_decisions(tmp_path / "d.jsonl").rows) == 30


async def held_app(scope, receive, send) -> None:
    """An ASGI app whose answers wait until ``RELEASE`` is set: connections busy with a request."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    while not RELEASE.is_set():
        await asyncio.sleep(0.01)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


RELEASE = threading.Event()


def test_at_the_cap_with_every_connection_busy_a_newcomer_gets_503(tmp_path):
    """Shedding takes only a connection waiting on its client: one whose request arrived whole
    is being answered, so with every one such a newcomer is refused, and the rest answered."""
    RELEASE.clear()
    with BackgroundServer(held_app, limits=ConnectionLimits(max_connections=3)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        busy = []
        for _ in range(3):
            client = socket.create_connection(("127.0.0.1", port))
            client.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            busy.append(client)
        time.sleep(0.3)
        refused = socket.create_connection(("127.0.0.1", port))
        answer = answer_of(refused)
        assert answer.startswith(b"HTTP/1.1 503") and b"--max-connections" in answer
        RELEASE.set()
        for client in busy:
            client.settimeout(30)
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
            client.close()


SLOW_CLIENTS = r"""
import http.client, json, re, socket, subprocess, sys, time
horizon, model, log, clients = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
server = subprocess.Popen(
    [horizon, "serve", model, "--port", "0", "--log", log, "--request-timeout", "1"],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    preexec_fn=lambda: __import__("resource").setrlimit(
        __import__("resource").RLIMIT_NOFILE, (700, 700)),
)
port = int(re.search(r":(\d+);", server.stdout.readline())[1])
limits = server.stdout.readline()
body = json.dumps({"rows": [{"state_features": {"0": 0.1, "1": 0.2, "2": 0.0, "3": 0.1}}]})
slow = []
for _ in range(clients):
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    slow.append(client)
for client in slow:
    client.settimeout(30)
    try:
        client.recv(100)
    except OSError:
        pass
    client.close()
answers = []
for _ in range(3):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", "/decisions", body)
    response = connection.getresponse()
    answers.append([response.status, json.loads(response.read())])
server.terminate()
out, err = server.communicate(timeout=60)
print(json.dumps({"limits": limits, "answers": answers, "stderr": err, "out": out}))
"""


def test_many_slow_clients_under_a_low_file_limit_leave_the_server_and_its_log_whole(
    model, tmp_path
):
    """With the open-file limit at 700 (the cap then 60 connections) 300 slow clients come:
    before the fix accept() met EMFILE, logged a traceback each time and never recovered."""
    import json

    log = tmp_path / "decisions.parquet"
    run = subprocess.run(
        [sys.executable, "-c", SLOW_CLIENTS, HORIZON, str(model), str(log), "300"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert "60 connections" in result["limits"]
    assert [status for status, _ in result["answers"]] == [200, 200, 200]
    assert "decisions logged to" in result["out"] and result["out"].rstrip().endswith(": 3")
    assert "Traceback" not in result["stderr"]
    assert len(result["stderr"].splitlines()) <= 300  # at most one line a client
    answered = {answer["decisions"][0]["decision_id"] for _, answer in result["answers"]}
    assert {row["decision_id"] for row in read_decisions(log).rows} == answered


def test_the_connection_cap_fits_the_file_limit():
    assert connection_cap(None, 1 << 20) == 1000
    assert connection_cap(None, 700) == 60
    assert connection_cap(200, 1 << 20) == 200
    with pytest.raises(HorizonError, match="--max-connections 500 needs 1140 file descriptors"):
        connection_cap(500, 700)
    with pytest.raises(HorizonError, match="too few to serve"):
        connection_cap(None, 256)


def test_a_passing_log_error_stalls_the_log_then_it_writes_again(model, tmp_path):
    """EMFILE from the log's write used to fail the log for good: 503 until a restart."""
    log = DecisionLog(tmp_path / "d.jsonl")
    real_write = os.write
    failing = {"on": True}

    def write(fd: int, data: bytes) -> int:
        if failing["on"] and fd == log._fd:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_write(fd, data)

    with TestClient(build_app(Predictor(model), log)) as client:
        os.write = write
        try:
            first = client.post("/decisions", json={"rows": request_rows(2)})
            assert first.status_code == 200  # its rows are the log's, written when it can
            stalled = client.post("/decisions", json={"rows": request_rows(1)})
            assert stalled.status_code == 503 and "for now" in stalled.json()["error"]
            failing["on"] = False
            deadline = time.monotonic() + 30
            while client.post("/decisions", json={"rows": request_rows(1)}).status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            os.write = real_write
        assert client.get("/health").json()["status"] == "ok"
    rows = read_decisions(tmp_path / "d.jsonl").rows
    assert first.json()["decisions"][0]["decision_id"] in {row["decision_id"] for row in rows}
    assert len(rows) == 3


def test_a_bearer_token_guards_decisions_and_is_compared_whole(model, tmp_path):
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"), token="s3cret-token")
    rows = {"rows": request_rows(1)}
    with TestClient(app) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
            refused = client.post("/decisions", json=rows, headers=headers)
            assert refused.status_code == 401 and "bearer token" in refused.json()["error"]
            assert refused.headers["www-authenticate"] == "Bearer"
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive
            answered = client.post(
                "/decisions", json=rows, headers={"Authorization": f"{scheme} s3cret-token"}
            )
            assert answered.status_code == 200
        refused = client.post(
            "/decisions", json=rows, headers={"Authorization": "bearer S3CRET-TOKEN"}
        )
        assert refused.status_code == 401  # the token is not
        assert client.get("/health").status_code == 200
    assert len(read_decisions(tmp_path / "d.jsonl").rows) == 3


def test_the_token_comes_from_a_file_or_the_environment_never_empty(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("  abc123\n")
    assert serve_token(token_file, "ignored") == "abc123"
    assert serve_token(None, "from-env") == "from-env"
    assert serve_token(None, None) is None
    token_file.write_text("\n")
    with pytest.raises(HorizonError, match="printable ASCII"):
        serve_token(token_file, None)


def test_serve_refuses_a_host_beyond_loopback_without_a_token_or_insecure(model, tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("no-such-host.invalid")
    run = subprocess.run(
        [
            HORIZON,
            "serve",
            str(model),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--log",
            str(tmp_path / "d.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={key: value for key, value in os.environ.items() if key != "HORIZON_SERVE_TOKEN"},
    )
    assert run.returncode == 1
    assert "--host 0.0.0.0" in run.stderr and "--insecure" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "d.jsonl").exists()


def test_serve_on_another_host_with_a_token_requires_it(model, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("tok-123")
    server = subprocess.Popen(
        [
            HORIZON,
            "serve",
            str(model),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--log",
            str(tmp_path / "d.jsonl"),
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(re.search(r":(\d+);", server.stdout.readline())[1])
        assert "bearer token required" in server.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        assert http_json(url, "POST", "/decisions", {"rows": request_rows(1)})[0] == 401
    finally:
        server.terminate()
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0 and "Traceback" not in err and "tok-123" not in err + out


def test_a_model_whose_outputs_are_nan_is_refused_by_serve_and_score(tmp_path):
    """A model whose training went NaN used to be served, answering ``"scores": null`` and
    logging ``"action_probability": null``."""
    broken = tiny_model(tmp_path / "nan.onnx", weight=float("nan"))
    with pytest.raises(HorizonError, match=r"scores is nan .* refusing to load it"):
        Predictor(broken)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"state_features": {"0": 1.0}}) + "\n")
    for command in (
        ["serve", str(broken), "--port", "0", "--log", str(tmp_path / "d.jsonl")],
        ["score", str(broken), str(rows), "-o", str(tmp_path / "scored.jsonl")],
    ):
        run = subprocess.run([HORIZON, *command], capture_output=True, text=True, timeout=60)
        assert run.returncode == 1, run.stdout
        assert "error:" in run.stderr and "(not finite) on its check rows" in run.stderr
        assert "Traceback" not in run.stderr
    assert not (tmp_path / "d.jsonl").exists() and not (tmp_path / "scored.jsonl").exists()


HUGE = {"0": 3e38, "1": 3e38, "2": 0.0, "3": 0.0}
"""Values the row check takes (within float32) whose scores overflow to infinity."""


def test_a_non_finite_output_for_a_request_is_a_500_with_one_log_line(model, tmp_path, caplog):
    log = tmp_path / "d.jsonl"
    with TestClient(build_app(Predictor(model), DecisionLog(log))) as client:
        rows = [request_rows(1)[0], {"state_features": HUGE}]
        answer = client.post("/decisions", json={"rows": rows})
        assert answer.status_code == 500
        assert answer.json()["error"] == (
            "row 1: the model's scores is inf (not finite) for its values; nothing decided or "
            "logged"
        )
        assert client.post("/decisions", json={"rows": request_rows(2)}).status_code == 200
    errors = [record for record in caplog.records if record.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert "answered 500, row 1: the model's scores is inf" in errors[0].getMessage()
    assert len(read_decisions(log).rows) == 2


def test_requests_decided_with_one_whose_output_is_not_finite_are_answered(model, tmp_path):
    """Requests arriving together are decided as one batch: only the one holding the row the
    model cannot score is refused, the others are decided again without it."""
    log = tmp_path / "d.jsonl"
    app = build_app(Predictor(model), DecisionLog(log))
    with TestClient(app) as client:
        service = app.state.service

        async def together() -> list[object]:
            requests = [request_rows(2), [{"state_features": HUGE}], request_rows(3, seed=1)]
            return await asyncio.gather(
                *(service.decided(rows) for rows in requests), return_exceptions=True
            )

        first, refused, last = client.portal.call(together)
    assert len(first) == 2 and len(last) == 3
    assert isinstance(refused, NonFiniteOutput) and refused.rows == [0]
    logged = read_decisions(log).rows
    assert len(logged) == 5
    assert all(math.isfinite(row["action_probability"]) for row in logged)


def test_a_request_head_over_64_kib_gets_431(model, tmp_path):
    """httptools sets no limit: a 30 MB header used to be read whole."""
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"))
    with BackgroundServer(app) as server:
        port = int(server.url.rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"POST /decisions HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(13):  # 208 KiB, far past the limit
                client.sendall(b"a" * 16384)
        except OSError:  # closed by the server: what remains unsent is refused
            pass
        answer = answer_of(client)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert str(MAX_HEAD_BYTES).encode() in answer
        client.close()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/health", headers={"X-Fine": "a" * 8000})
        assert connection.getresponse().status == 200  # a large head within the limit
        connection.close()


HALF_CLOSE = r"""
import json, re, signal, socket, subprocess, sys, time
horizon, model, log = sys.argv[1:4]
server = subprocess.Popen(
    [horizon, "serve", model, "--port", "0", "--log", log, "--request-timeout", "2"],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
)
port = int(re.search(r":(\d+);", server.stdout.readline())[1])
body = json.dumps({"rows": [{"state_features": {"0": 0.1}}]}).encode()
request = b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
    len(body), body)
half_closed = socket.create_connection(("127.0.0.1", port))
half_closed.sendall(request * 5)
half_closed.shutdown(socket.SHUT_WR)
half_closed.settimeout(30)
answers = b""
while chunk := half_closed.recv(65536):
    answers += chunk
closed = socket.create_connection(("127.0.0.1", port))
closed.sendall(request * 5)
closed.close()
time.sleep(0.5)
slow = socket.create_connection(("127.0.0.1", port))
slow.sendall(b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
time.sleep(0.2)
server.send_signal(signal.SIGTERM)  # the shutdown waits for the slow request's deadline
time.sleep(0.5)
server.send_signal(signal.SIGINT)
out, err = server.communicate(timeout=60)
print(json.dumps({"answered": answers.count(b"HTTP/1.1 200"), "code": server.returncode,
                  "out": out, "err": err}))
"""


def test_half_closed_and_closed_pipelining_clients_and_sigint_during_shutdown(model, tmp_path):
    """A client half-closing after five pipelined requests got no answer, one closing got an
    "Exception in ASGI application" traceback a request, and SIGINT during the SIGTERM
    shutdown cut it short (the log undrained) with a traceback."""
    log = tmp_path / "d.jsonl"
    run = subprocess.run(
        [sys.executable, "-c", HALF_CLOSE, HORIZON, str(model), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["answered"] == 5
    assert result["code"] == 0 and "stopped on SIGTERM" in result["out"]
    err = result["err"]
    assert "Traceback" not in err and "Exception in ASGI" not in err, err
    assert "SIGINT while stopping" in err
    closed = [line for line in err.splitlines() if "answer(s) were sent" in line]
    assert len(closed) == 1
    logged = int(result["out"].rstrip().rsplit(": ", 1)[1])
    assert logged == len(read_decisions(log).rows) >= 5


def test_score_names_the_line_whose_output_is_not_finite_or_skips_it(model, tmp_path):
    rows = tmp_path / "rows.jsonl"
    lines = [{"state_features": {"0": 1.0}}, {"state_features": HUGE}, {"state_features": {}}]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = tmp_path / "scored.jsonl"
    run = subprocess.run(
        [HORIZON, "score", str(model), str(rows), "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert f"{rows}, line 2: the model's scores is inf (not finite)" in run.stderr
    assert not output.exists()
    run = subprocess.run(
        [HORIZON, "score", str(model), str(rows), "-o", str(output), "--skip-bad-rows"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert f"skipped {rows}, line 2: the model's scores is not finite" in run.stderr
    assert "scored 2 rows" in run.stdout and "skipped 1 bad rows" in run.stdout
    logged = read_decisions(output).rows
    assert len(logged) == 2 and all(math.isfinite(row["action_probability"]) for row in logged)
