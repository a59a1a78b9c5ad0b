"""``horizon serve``: decisions over HTTP on a real exported CartPole model, each answer the
Predictor's and each decision in the log once the server has stopped; the 4xx answers; the body
cap; uvicorn on 127.0.0.1 in a thread and the command in a process stopped by a signal; the
Parquet decision log."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pyarrow.parquet as pq
import pytest
from starlette.testclient import TestClient
from test_serving import (
    bare_outputs,
    cartpole_model,
    continuous_model,
    parametric_model,
    states,
)

from horizon_plugins_serving.decision_log import (
    DecisionLog,
    ParquetDecisionLog,
    decision_rows,
    open_decision_log,
    read_decisions,
)
from horizon_plugins_serving.predictor import (
    Exploration,
    Predictor,
    SendRateController,
    send_probabilities,
)
from horizon_plugins_serving.server import (
    SEND_RATE_WINDOW,
    BackgroundServer,
    _listening_socket,
    build_app,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small CartPole DQN of test_serving, exported to ONNX."""
    return cartpole_model(tmp_path_factory.mktemp("serve"))


def request_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    return [
        {"state_features": row, "mdp_id": f"m{i}", "sequence_number": i}
        for i, row in enumerate(states(count, seed))
    ]


def http_json(url: str, method: str, path: str, body: Any = None) -> tuple[int, dict]:
    """One plain HTTP request to the server at ``url``, its status and JSON answer."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request(method, path, None if body is None else json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_health_names_the_model_and_counts_the_decisions_logged(model, tmp_path):
    predictor = Predictor(model)
    with TestClient(build_app(predictor, DecisionLog(tmp_path / "d.jsonl"))) as client:
        answer = client.get("/health")
        assert answer.status_code == 200
        assert answer.json() == {
            "status": "ok",
            "model_id": predictor.model_id,
            "action_type": "discrete",
            "actions": ["0", "1"],
            "policy": "greedy",
            "served_policy": {"label": "greedy", "from": {"policy": "the caller"}},
            "decisions_logged": 0,
            "featureless_rows": 0,
        }
        assert client.post("/decisions", json={"rows": request_rows(3)}).status_code == 200
        deadline = time.monotonic() + 30  # the writer runs beside the answers
        while client.get("/health").json()["decisions_logged"] < 3:
            assert time.monotonic() < deadline, "the writer never logged the decisions"
            time.sleep(0.01)
        assert client.get("/health").json()["decisions_logged"] == 3


def test_a_batch_is_answered_in_order_greedily_and_every_decision_logged(model, tmp_path):
    rows = request_rows(50)
    rows[7]["possible_actions"] = ["0"]
    want = bare_outputs(model, [row["state_features"] for row in rows])
    log = tmp_path / "decisions.jsonl"
    with TestClient(build_app(Predictor(model), DecisionLog(log))) as client:
        answer = client.post("/decisions", json={"rows": rows})
    assert answer.status_code == 200
    decisions = answer.json()["decisions"]
    actions = [decision["action"] for decision in decisions]
    greedy = [str(action) for action in want["action"]]
    assert actions[:7] + actions[8:] == greedy[:7] + greedy[8:]
    assert actions[7] == "0"
    assert all(decision["action_probability"] == 1.0 for decision in decisions)
    np.testing.assert_array_equal(
        [[decision["scores"]["0"], decision["scores"]["1"]] for decision in decisions],
        want["scores"],
    )
    logged = read_decisions(log)
    assert not logged.torn_lines
    assert [
        (row["decision_id"], row["action"], row["action_probability"], row["timestamp"])
        for row in logged.rows
    ] == [
        (d["decision_id"], d["action"], d["action_probability"], d["timestamp"]) for d in decisions
    ]
    assert [row["state_features"] for row in logged.rows] == [r["state_features"] for r in rows]
    assert logged.rows[9]["mdp_id"] == "m9" and logged.rows[9]["sequence_number"] == 9
    assert logged.rows[7]["possible_actions"] == ["0"]
    assert logged.rows[8]["possible_actions"] == ["0", "1"]


def test_epsilon_greedy_decisions_carry_their_propensities(model, tmp_path):
    rows = request_rows(400, seed=1)
    greedy = [str(a) for a in bare_outputs(model, [r["state_features"] for r in rows])["action"]]
    predictor = Predictor(model, Exploration("epsilon_greedy", epsilon=0.2), seed=0)
    log = tmp_path / "decisions.jsonl"
    with TestClient(build_app(predictor, DecisionLog(log))) as client:
        assert client.get("/health").json()["policy"] == "epsilon_greedy"
        decisions = client.post("/decisions", json={"rows": rows}).json()["decisions"]
    # the best action with 0.8 + 0.2 / 2, the other with 0.2 / 2
    want = [0.9 if d["action"] == best else 0.1 for d, best in zip(decisions, greedy, strict=True)]
    np.testing.assert_allclose([d["action_probability"] for d in decisions], want)
    explored = np.mean([p == pytest.approx(0.1) for p in want])
    assert abs(explored - 0.1) < 0.05  # 400 draws: a standard error of 0.015
    logged = read_decisions(log).rows
    assert [row["action_probability"] for row in logged] == [
        d["action_probability"] for d in decisions
    ]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "body is not JSON"),
        (b"[1, 2]", 422, 'expected a JSON object {"rows": [row, ...]}'),
        (b'{"row": []}', 422, 'expected a JSON object {"rows": [row, ...]}'),
        (
            json.dumps(
                {"rows": [{"state_features": {"0": 1}}] * 3 + [{"state_features": {"x": "a"}}]}
            ),
            422,
            "row 3: state feature 'x': expected a number, found 'a' (str)",
        ),
        (
            json.dumps({"rows": [{"state_features": {"0": 1}, "possible_actions": ["7"]}]}),
            422,
            "row 0: possible action(s) ['7'] not among the model's actions ['0', '1']",
        ),
        (
            json.dumps({"rows": [{"state_features": {"0": 1}, "sequence_number": "first"}]}),
            422,
            "row 0: sequence_number: expected an integer, found 'first' (str)",
        ),
        (
            json.dumps({"rows": [{"features": {"0": 1}}]}),
            422,
            "row 0: no state_features map",
        ),
        (
            json.dumps({"rows": [{"state_features": {"0": 1}}] * 5}),
            413,
            "5 rows, more than the limit of 4 (--max-batch)",
        ),
        (
            json.dumps({"rows": [{"state_features": {"0": 1}, "pad": "x" * 600}]}),
            413,
            "is over the limit of 512 (--max-body-bytes)",
        ),
    ],
)
def test_bad_requests_are_answered_4xx_with_a_clear_message_and_nothing_logged(
    model, tmp_path, body, status, message
):
    log = tmp_path / "decisions.jsonl"
    app = build_app(Predictor(model), DecisionLog(log), max_body_bytes=512, max_batch=4)
    with TestClient(app) as client:
        answer = client.post("/decisions", content=body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    assert read_decisions(log).rows == []


def raw_exchange(url: str, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send a request's head and body parts over a socket, stopping when the server answers
    (it closes or replies before the body is complete); return the answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as connection:
        connection.sendall(head)
        for part in body_parts:
            try:
                connection.sendall(part)
            except OSError:  # the server answered and closed the connection
                break
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_the_body_cap_is_enforced_before_and_while_reading(model, tmp_path):
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"), max_body_bytes=1000)
    with BackgroundServer(app) as server:
        # a declared length over the cap: refused at the head, the body never sent
        head = b"POST /decisions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n"
        answer = raw_exchange(server.url, head, [])
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"body of 10000000000 bytes is over the limit of 1000" in answer
        # no declared length (chunked): refused once 1,000 bytes have come, the rest unsent
        head = b"POST /decisions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunk = b"%x\r\n%s\r\n" % (300, b" " * 300)
        answer = raw_exchange(server.url, head, [chunk] * 4)
        assert answer.startswith(b"HTTP/1.1 413")
        assert b"body over the limit of 1000 bytes" in answer
        status, health = http_json(server.url, "GET", "/health")
        assert status == 200 and health["decisions_logged"] == 0


def test_uvicorn_in_a_thread_answers_plain_http_and_the_log_is_complete_after_exit(model, tmp_path):
    log = tmp_path / "decisions.jsonl"
    answered = []
    with BackgroundServer(build_app(Predictor(model), DecisionLog(log))) as server:
        assert server.url.startswith("http://127.0.0.1:")
        status, health = http_json(server.url, "GET", "/health")
        assert status == 200 and health["status"] == "ok"
        for seed in range(20):
            status, answer = http_json(
                server.url, "POST", "/decisions", {"rows": request_rows(25, seed)}
            )
            assert status == 200
            answered += [decision["decision_id"] for decision in answer["decisions"]]
    logged = read_decisions(log)
    assert [row["decision_id"] for row in logged.rows] == answered
    assert len(set(answered)) == 500 and not logged.torn_lines


def test_a_parquet_log_round_trips_and_its_reader_skips_a_leftover_temporary_file(model, tmp_path):
    predictor = Predictor(model, Exploration("softmax"), seed=0)
    rows = states(7)
    result = predictor.predict(rows)
    records = decision_rows(
        rows, result.actions, result.propensities, predictor.model_id, None, predictor.actions
    )
    folder = tmp_path / "decisions.parquet"
    with ParquetDecisionLog(folder, rows_per_part=3) as log:
        log.append(records[:2])
        assert log.written == 0 and not list(folder.iterdir())  # gathered, not yet a part
        log.append(records[2:5])
        assert log.written == 5  # a part of 5 rows
    assert len(list(folder.iterdir())) == 1
    with open_decision_log(folder) as log:  # a second writer goes on after the first's parts
        assert isinstance(log, ParquetDecisionLog) and log.sequence == 1
        log.append(records[5:])
    leftover = folder / ".part-00000002-0123456789abcdef0123456789abcdef.parquet.tmp-99"
    leftover.write_bytes(b"PAR1 half a part")  # what a crash in the middle of a part leaves
    contents = read_decisions(folder)
    assert contents.rows == records
    assert contents.ignored_files == [leftover.name] and not contents.torn_lines
    first = sorted(folder.glob("part-*.parquet"))[0]
    assert first.name.startswith("part-00000000-")
    metadata = pq.read_schema(first).metadata
    assert metadata[b"horizon.row_format"] == b"pre_timeline"
    assert metadata[b"horizon.action_type"] == b"discrete"


def test_a_continuous_actor_is_served_with_its_action_map_into_a_parquet_log(tmp_path):
    predictor = Predictor(continuous_model(tmp_path / "model.onnx"))
    folder = tmp_path / "decisions.parquet"
    with TestClient(build_app(predictor, open_decision_log(folder))) as client:
        assert client.get("/health").json()["action_feature_ids"] == ["3", "4"]
        answer = client.post("/decisions", json={"rows": [{"state_features": {"1": 1.0}}]})
        refused = client.post(
            "/decisions", json={"rows": [{"state_features": {"1": 1.0}, "possible_actions": []}]}
        )
    (decision,) = answer.json()["decisions"]
    assert decision["action"] == {"3": 0.0, "4": 2.0} and "scores" not in decision
    assert decision["action_probability"] == pytest.approx(np.exp(2.0))
    assert refused.status_code == 422 and "takes none" in refused.json()["error"]
    (logged,) = read_decisions(folder).rows
    assert logged["action"] == decision["action"] and "possible_actions" not in logged
    assert logged["decision_id"] == decision["decision_id"]


def test_send_drop_decisions_follow_the_rule_and_move_the_threshold(model, tmp_path):
    controller = SendRateController(target=0.2)
    predictor = Predictor(model, seed=0)
    app = build_app(
        predictor, DecisionLog(tmp_path / "d.jsonl"), send_rate=controller, send_action="1"
    )
    with TestClient(app) as client:
        assert client.get("/health").json()["policy"] == "send_drop"
        rows = request_rows(SEND_RATE_WINDOW - 1)
        decisions = client.post("/decisions", json={"rows": rows}).json()["decisions"]
        assert controller.threshold == 0.0  # one decision short of the first update
        client.post("/decisions", json={"rows": request_rows(1)})
    difference = [d["scores"]["1"] - d["scores"]["0"] for d in decisions]
    p_send = send_probabilities(np.array(difference), 0.0)
    sent = np.array([d["action"] == "1" for d in decisions])
    np.testing.assert_allclose(
        [d["action_probability"] for d in decisions], np.where(sent, p_send, 1 - p_send)
    )
    assert controller.integral != 0.0  # the 200 decisions' send rate moved it


def test_horizon_serve_defaults_to_127_0_0_1_and_flushes_its_log_on_a_signal(model, tmp_path):
    folder = tmp_path / "decisions.parquet"
    for stop in (signal.SIGINT, signal.SIGTERM):
        command = [Path(sys.executable).with_name("horizon"), "serve", model, "--port", "0"]
        process = subprocess.Popen(
            [*map(str, command), "--log", str(folder), "--policy", "softmax"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = process.stdout.readline()
            assert " on http://127.0.0.1:" in first, first + process.stderr.read()
            url = first.split(" on ")[1].split(";")[0]
            status, health = http_json(url, "GET", "/health")
            assert status == 200 and health["policy"] == "softmax"
            status, _ = http_json(url, "POST", "/decisions", {"rows": request_rows(3)})
            assert status == 200
            process.send_signal(stop)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == 0, err
        assert f"stopped on {stop.name}; decisions logged to " in out and out.endswith(": 3\n")
    assert len(read_decisions(folder).rows) == 6


def test_serving_over_http_imports_neither_torch_nor_spark(model, tmp_path):
    code = (
        "import sys\n"
        "from starlette.testclient import TestClient\n"
        "from horizon_plugins_serving.decision_log import DecisionLog\n"
        "from horizon_plugins_serving.predictor import Predictor\n"
        "from horizon_plugins_serving.server import BackgroundServer, build_app\n"
        f"app = build_app(Predictor({str(model)!r}), DecisionLog({str(tmp_path / 'd')!r}))\n"
        "with TestClient(app) as client:\n"
        "    client.post('/decisions', json={'rows': [{'state_features': {'0': 0.1}}]})\n"
        "print(sorted(m for m in ('torch', 'pyspark') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


class FailingLog:
    """A decision log on a full disk."""

    path = Path("full-disk.jsonl")

    def append(self, rows: list[dict[str, Any]]) -> None:
        raise OSError("No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_failed_log_stops_the_decisions_with_503_and_says_why(model):
    with TestClient(build_app(Predictor(model), FailingLog())) as client:
        assert client.post("/decisions", json={"rows": request_rows(2)}).status_code == 200
        deadline = time.monotonic() + 30  # the writer fails beside the answers
        while (health := client.get("/health")).status_code == 200:
            assert time.monotonic() < deadline, "the writer never reported the failure"
            time.sleep(0.01)
        assert health.status_code == 503 and health.json()["status"] == "failed"
        refused = client.post("/decisions", json={"rows": request_rows(1)})
        service = client.app.state.service
    assert refused.status_code == 503
    assert refused.json()["error"] == ("the decision log failed: OSError: No space left on device")
    assert service.writer.logged == 0 and service.writer.lost == 2


def test_a_parametric_model_scores_the_offered_candidates_and_logs_the_chosen_map(tmp_path):
    predictor = Predictor(parametric_model(tmp_path / "run"))
    one, two = {"4": 1.0, "5": 0.0}, {"4": 0.0, "5": 1.0}
    offered = [[one, two, one], [two]]
    rows = [
        {"state_features": state, "possible_actions": candidates}
        for state, candidates in zip(states(2), offered, strict=True)
    ]
    log = tmp_path / "decisions.parquet"
    with TestClient(build_app(predictor, open_decision_log(log))) as client:
        assert client.get("/health").json()["action_type"] == "parametric"
        decisions = client.post("/decisions", json={"rows": rows}).json()["decisions"]
        missing = client.post("/decisions", json={"rows": [{"state_features": {"0": 1.0}}]})
    want = predictor.predict([row["state_features"] for row in rows], candidates=offered)
    assert [list(d["scores"]) for d in decisions] == [["0", "1", "2"], ["0"]]
    np.testing.assert_allclose(list(decisions[0]["scores"].values()), want.scores[0])
    assert [d["action"] for d in decisions] == [offered[0][want.actions[0]], two]
    assert missing.status_code == 422 and "needs possible_actions" in missing.json()["error"]
    logged = read_decisions(log).rows
    assert [row["action"] for row in logged] == [d["action"] for d in decisions]
    assert logged[0]["possible_actions"] == [one, two, one]


def test_the_commands_connections_send_without_waiting_for_acknowledgements():
    """``horizon serve`` listens on a socket it makes itself; asyncio sets TCP_NODELAY on the
    connections it accepts only when that socket's protocol is TCP (without, an answer's
    second write waits ~40 ms for the client's delayed acknowledgement)."""

    async def accepted_nodelay() -> int:
        listening = _listening_socket("127.0.0.1", 0)
        options: asyncio.Queue[int] = asyncio.Queue()

        class Accept(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                connection = transport.get_extra_info("socket")
                options.put_nowait(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Accept, sock=listening)
        async with server:
            _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
            option = await options.get()
            writer.close()
        return option

    assert asyncio.run(accepted_nodelay()) != 0
