"""``horizon serve`` killed with SIGKILL mid-load: every decision a client was answered is in
the JSONL log afterwards (rows are written before the answer), and a Parquet log loses at most
its documented window: the rows gathered since its last part (``rows_per_part``)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_serve_hostile import tiny_model

from horizon_plugins_serving.decision_log import read_decisions

pytestmark = pytest.mark.reliability

HORIZON = str(Path(sys.executable).with_name("horizon"))
ROW = {"state_features": {"0": 0.1, "1": -0.2, "2": 0.3, "3": 0.0}}


def answered_until_killed(model: Path, log: Path, clients: int = 4) -> set[str]:
    """Serve ``model`` logging to ``log``, send batch-1 requests from ``clients`` threads,
    SIGKILL the server once 600 are answered, and return the decision_ids answered."""
    server = subprocess.Popen(
        [HORIZON, "serve", str(model), "--port", "0", "--log", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    port = int(re.search(r":(\d+);", server.stdout.readline())[1])
    answered: set[str] = set()
    enough = threading.Event()

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        body = json.dumps({"rows": [ROW]})
        while True:
            try:
                connection.request("POST", "/decisions", body)
                answer = json.loads(connection.getresponse().read())
            except (OSError, http.client.HTTPException, ValueError):
                return  # killed
            answered.update(decision["decision_id"] for decision in answer["decisions"])
            if len(answered) >= 600:
                enough.set()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    enough.wait(120)
    server.send_signal(signal.SIGKILL)
    server.wait(30)
    for thread in threads:
        thread.join(60)
    return answered


def test_a_killed_server_loses_no_answered_decision_from_its_jsonl_log(tmp_path):
    log = tmp_path / "decisions.jsonl"
    answered = answered_until_killed(tiny_model(tmp_path / "model.onnx"), log)
    contents = read_decisions(log)
    logged = {row["decision_id"] for row in contents.rows}
    assert len(answered) >= 600
    assert answered <= logged
    assert len(contents.torn_lines) <= 1


def test_a_killed_server_loses_at_most_the_parquet_window(tmp_path):
    """The window: rows gathered since the last part, at most rows_per_part (10,000)."""
    log = tmp_path / "decisions.parquet"
    answered = answered_until_killed(tiny_model(tmp_path / "model.onnx"), log)
    logged = {row["decision_id"] for row in read_decisions(log).rows}
    assert logged <= answered
    assert len(answered - logged) <= 10_000
