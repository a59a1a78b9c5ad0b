"""``horizon serve``'s fast paths read and write what the exact ones did: orjson's reading of a
body gives way to Python's ``json`` where the two would differ (integers beyond 64 bits), the
log's lines and the answers fall back to ``json`` for what orjson cannot write, decision ids
are uuid4's (and a forked child's are its own), a one-row batch scored through the
preallocated binding scores as a plain run does, a model's nodes that the fetched outputs do
not need are left out of the session, and POST /decisions, answered outside
Starlette's routing, keeps its 405, 401 and 422; requests that arrive together are decided in
one run of at most ``max_batch`` rows, each answered its own decisions, logged first; and the
command freezes its startup objects, which every full garbage collection used to walk."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import uuid

import numpy as np
import pytest
from starlette.testclient import TestClient
from test_serve_hostile import tiny_model

from horizon_plugins_serving import server
from horizon_plugins_serving.decision_log import (
    DecisionLog,
    decision_ids,
    json_line,
    read_decisions,
)
from horizon_plugins_serving.predictor import Predictor, file_digest
from horizon_plugins_serving.request_body import decode_body
from horizon_plugins_serving.served_policy import PolicyFlags
from horizon_plugins_serving.server import build_app


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model.onnx")


@pytest.mark.parametrize(
    "number", [-(2**63) - 1, -(2**63), 2**63, 2**64 - 1, 2**64, 10**30, -(10**39)]
)
def test_integers_near_and_beyond_64_bits_are_read_exactly(number):
    assert decode_body(b'{"value": %d}' % number) == {"value": number}


@pytest.mark.parametrize(
    "text", ["0.00123456789012345678901", "-12345678901234567890.5", "1234567890123456789e3"]
)
def test_floats_with_long_runs_of_digits_read_as_python_reads_them(text):
    assert decode_body(b"[%s, %s]" % (text.encode(), text.encode())) == json.loads(f"[{text}]") * 2


def test_decision_ids_are_distinct_uuid4_hex():
    ids = decision_ids(1000)
    assert len(set(ids)) == 1000
    for text in ids:
        parsed = uuid.UUID(hex=text)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, text)


def test_a_forked_child_makes_decision_ids_of_its_own():
    decision_ids(1)  # the pool holds bytes the child must not hand out again
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(writing, "".join(decision_ids(100)).encode())
        os._exit(0)
    os.close(writing)
    os.waitpid(child, 0)
    with os.fdopen(reading, "rb") as pipe:
        theirs = pipe.read().decode()
    ours = "".join(decision_ids(100))
    assert len(theirs) == len(ours) == 3200 and theirs != ours


def test_one_row_through_the_binding_scores_as_a_plain_run(model):
    predictor = Predictor(model)
    assert predictor.one_row is not None
    states = [{"0": 0.5, "1": -2.0, "3": 1.0}, {"2": 3.0}, {}]
    expected = predictor.session.run(
        ["scores"], dict(zip(("features", "presence"), predictor.state_arrays(states), strict=True))
    )[0]
    for row, state in enumerate(states):
        np.testing.assert_array_equal(predictor.predict([state]).scores, expected[row : row + 1])
    with predictor.one_row.lock:  # another thread scoring: the plain run answers
        np.testing.assert_array_equal(predictor.predict(states[:1]).scores, expected[:1])


def test_nodes_the_fetched_scores_do_not_need_are_left_out(model, tmp_path):
    import onnx
    import onnxruntime
    from onnx import helper

    full = onnx.load(str(model))
    full.graph.node.append(helper.make_node("Softmax", ["scores"], ["probabilities"]))
    full.graph.output.append(
        helper.make_tensor_value_info("probabilities", onnx.TensorProto.FLOAT, ["rows", 2])
    )
    onnx.save(full, str(tmp_path / "two_outputs.onnx"))
    predictor = Predictor(tmp_path / "two_outputs.onnx")
    assert [output.name for output in predictor.session.get_outputs()] == ["scores"]
    states = [{"0": 0.5, "1": -2.0}, {"2": 3.0, "3": 1.0}]
    feeds = dict(zip(("features", "presence"), predictor.state_arrays(states), strict=True))
    unpruned = onnxruntime.InferenceSession(str(tmp_path / "two_outputs.onnx"))
    expected = unpruned.run(["scores"], feeds)[0]
    np.testing.assert_array_equal(predictor.predict(states).scores, expected)
    assert predictor.model_id == file_digest(tmp_path / "two_outputs.onnx")[:16]


def test_a_model_onnx_cannot_read_again_is_run_whole(model, monkeypatch):
    import onnx

    def unreadable(path):
        raise OSError("gone")

    monkeypatch.setattr(onnx, "load", unreadable)
    predictor = Predictor(model)
    assert [output.name for output in predictor.session.get_outputs()] == ["scores"]
    assert predictor.predict([{"0": 1.0}]).actions == ["0"]


def test_a_log_line_orjson_cannot_write_is_written_by_json(tmp_path):
    rows = [{"state_features": {"big": 10**38, "café": 0.5}, "mdp_id": "é"}]
    assert json_line(rows[0]).endswith(b"\n")
    with DecisionLog(tmp_path / "log.jsonl") as log:
        log.append(rows)
    assert read_decisions(tmp_path / "log.jsonl").rows == rows


def test_decisions_outside_starlettes_routing_keep_their_statuses(model, tmp_path):
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"), token="tok")
    bearer = {"authorization": "Bearer tok"}
    with TestClient(app) as client:
        assert client.get("/decisions").status_code == 405
        refused = client.post("/decisions", json={"rows": []})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        too_big = {"state_features": {"0": 1.0}, "sequence_number": 2**64}
        answer = client.post("/decisions", json={"rows": [too_big]}, headers=bearer)
        assert answer.status_code == 422
        assert "expected a 64-bit integer, found 18446744073709551616" in answer.json()["error"]
        big_feature = {"state_features": {"0": 10**30}}
        answer = client.post("/decisions", json={"rows": [big_feature]}, headers=bearer)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
    assert read_decisions(tmp_path / "d.jsonl").rows[0]["state_features"] == {"0": 10**30}


async def post_together(app, bodies: list[bytes]) -> list[object]:
    """POST each body to ``app`` (an ASGI app) from tasks started in the same turn of the
    event loop; each one's (status, JSON answer), or the exception its request raised."""

    async def post(body: bytes) -> tuple[int, object]:
        sent = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/decisions", "headers": []}
        await app(scope, receive, send)
        return sent[0]["status"], json.loads(sent[1]["body"])

    app.service.writer.start()
    try:
        return await asyncio.gather(*map(post, bodies), return_exceptions=True)
    finally:
        await app.service.writer.stop()


def counting_decide(service) -> list[int]:
    """Replace ``service.decide`` by a wrapper that records each call's number of rows."""
    calls: list[int] = []
    decide = service.decide

    def counted(rows):
        calls.append(len(rows))
        return decide(rows)

    service.decide = counted
    return calls


def rows_body(count: int) -> bytes:
    return json.dumps(
        {"rows": [{"state_features": {"0": float(i)}} for i in range(count)]}
    ).encode()


def test_requests_arriving_together_are_decided_in_one_run_and_logged_before_answers(
    model, tmp_path
):
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"))
    calls = counting_decide(app.service)
    answers = asyncio.run(post_together(app, [rows_body(n) for n in (1, 3, 2, 1)]))
    assert calls == [7]
    assert [status for status, _ in answers] == [200] * 4
    assert [len(answer["decisions"]) for _, answer in answers] == [1, 3, 2, 1]
    answered = [d["decision_id"] for _, answer in answers for d in answer["decisions"]]
    logged = read_decisions(tmp_path / "d.jsonl").rows
    assert [row["decision_id"] for row in logged] == answered
    assert [row["state_features"] for row in logged][1:4] == [{"0": i} for i in (0.0, 1.0, 2.0)]


def test_a_batch_of_requests_stays_within_max_batch_rows(model, tmp_path):
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"), max_batch=3)
    calls = counting_decide(app.service)
    answers = asyncio.run(post_together(app, [rows_body(n) for n in (2, 1, 2, 3)]))
    assert calls == [3, 2, 3]
    assert [len(answer["decisions"]) for _, answer in answers] == [2, 1, 2, 3]


def test_an_error_deciding_a_batch_fails_its_requests_and_logs_nothing(model, tmp_path):
    app = build_app(Predictor(model), DecisionLog(tmp_path / "d.jsonl"))

    def broken(rows):
        raise RuntimeError("the model broke")

    app.service.decide = broken
    answers = asyncio.run(post_together(app, [rows_body(1), rows_body(2)]))
    assert [str(answer) for answer in answers] == ["the model broke"] * 2
    assert read_decisions(tmp_path / "d.jsonl").rows == []


class RecordingServer:
    """Stands in for uvicorn in ``serve``: records how many objects are frozen when serving
    starts, then closes the socket and the log as a shutdown would."""

    def __init__(self, app, frozen: list[int]) -> None:
        self.app, self.frozen = app, frozen

    def run(self, sockets) -> None:
        self.frozen.append(gc.get_freeze_count())
        for listening in sockets:
            listening.close()
        asyncio.run(self.app.service.writer.stop())


def test_the_command_freezes_its_startup_objects_before_serving(model, tmp_path, monkeypatch):
    frozen: list[int] = []
    monkeypatch.setattr(server, "uvicorn_server", lambda app, limits: RecordingServer(app, frozen))
    before = gc.get_freeze_count()
    try:
        server.serve(
            model,
            PolicyFlags(),
            host="127.0.0.1",
            port=0,
            log_path=tmp_path / "d.jsonl",
            seed=0,
            max_body_bytes=1 << 20,
            max_batch=1024,
            target_send_rate=None,
            send_action=None,
        )
    finally:
        gc.unfreeze()
    assert frozen[0] > before + 10_000  # the imports' and the model's objects, walked no more


FREED_MEMORY = """
import re, sys
from pathlib import Path
from horizon_plugins_serving.server import keep_freed_memory

def resident_kib():
    return int(re.search(r"VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text())[1])

if sys.argv[1] == "kept":
    keep_freed_memory()
pieces = [bytes(1000 + i % 7) for i in range(20_000)]  # 20 MB from malloc, not pymalloc
before = resident_kib()
del pieces
print(before - resident_kib())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_freed_memory_is_kept_for_the_next_batch_not_handed_back():
    import subprocess
    import sys

    handed_back = {
        how: int(
            subprocess.run(
                [sys.executable, "-c", FREED_MEMORY, how],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for how in ("default", "kept")
    }
    if handed_back["default"] < 10_000:
        pytest.skip(f"this C library kept the memory freed anyway: {handed_back}")
    assert handed_back["kept"] < 1_000, handed_back  # KiB
