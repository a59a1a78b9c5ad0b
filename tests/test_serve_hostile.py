"""``horizon serve`` facing hostile clients over real sockets on 127.0.0.1: slow bodies and
headers get 408 within the request deadline, connections over the cap get 503 and hold nothing,
a file-descriptor limit lowered in a subprocess is never reached, a disconnecting client is one
log line, and the decision log survives all of it; the bearer token; a non-loopback host
without one; a log write failing with EMFILE stalls the log instead of failing it."""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_serve import http_json, request_rows

from horizon_engine import HorizonError
from horizon_plugins_serving.commands import serve_token
from horizon_plugins_serving.connections import ConnectionLimits, connection_cap
from horizon_plugins_serving.decision_log import DecisionLog, read_decisions
from horizon_plugins_serving.predictor import Predictor
from horizon_plugins_serving.server import BackgroundServer, build_app, is_loopback

HORIZON = str(Path(sys.executable).with_name("horizon"))


def tiny_model(path: Path) -> Path:
    """A two-action ONNX model on four features, built by hand in milliseconds (no training):
    scores = (features * presence) @ W, with the metadata ``horizon export`` writes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(
        np.array([[1.0, -1.0], [0.5, 0.25], [-0.5, 0.5], [0.1, 0.2]], np.float32), "weights"
    )
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


def test_connections_over_the_cap_get_503_and_the_server_answers_once_they_go(model, tmp_path):
    limits = ConnectionLimits(request_timeout=30.0, max_connections=5)
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"))
    with BackgroundServer(app, limits=limits) as server:
        port = int(server.url.rsplit(":", 1)[1])
        holding = [slow_client(port) for _ in range(5)]
        time.sleep(0.2)
        refused = socket.create_connection(("127.0.0.1", port))  # sends nothing: no reset
        answer = answer_of(refused)
        assert answer.startswith(b"HTTP/1.1 503") and b"--max-connections" in answer
        for client in holding:
            client.close()
        deadline = time.monotonic() + 30
        while (
            status := http_json(server.url, "POST", "/decisions", {"rows": request_rows(1)})[0]
        ) != 200:
            assert status == 503 and time.monotonic() < deadline
            time.sleep(0.05)
    assert len(read_decisions(tmp_path / "d.jsonl").rows) == 1


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
        answered = client.post(
            "/decisions", json=rows, headers={"Authorization": "Bearer s3cret-token"}
        )
        assert answered.status_code == 200
        assert client.get("/health").status_code == 200
    assert len(read_decisions(tmp_path / "d.jsonl").rows) == 1


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
