"""Faults and exits of several processes (``horizon_engine.distributed``): a rank that raises
ends the whole run quickly with its message, and two-process runs leave cleanly every time
(on a CPU with gloo, about one run in ten aborted at exit before the shutdown's garbage
collection, barrier and group destruction)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.reliability

BREAKING_TRAINER = '''
import os
import time

import torch

from horizon_engine import hookimpl
from horizon_engine.errors import HorizonError
from horizon_engine.training import TrainerBase


class BreaksOnRankOne(TrainerBase):
    """A linear model trained data-parallel whose rank 1 raises at its third update, while
    rank 0 waits in the gradients' all-reduce."""

    name = "breaks_on_rank_one"

    def setup(self, problem):
        self.model = torch.nn.Linear(problem.state_width, 1)
        self.synced = problem.data_parallel(self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.steps = 0

    def train_step(self, batch):
        self.steps += 1
        if os.environ.get("RANK") == "1" and self.steps == 3:
            with open(os.environ["BROKEN_AT_FILE"], "w") as broken_at:
                broken_at.write(repr(time.time()))
            raise HorizonError("rank 1 broke on purpose at update 3")
        loss = self.synced(batch["state_preprocessed"]).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def state_dict(self):
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])

    def policy(self):
        return self.model


@hookimpl
def horizon_register_trainers(register):
    register(BreaksOnRankOne)
'''

SHUTDOWN_RUNS = """
import os
import sys

from horizon_engine import distributed


def one_rank(rank, port):
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    with distributed.process_group():
        sums, counts = distributed.all_reduce_metrics({"rank": float(rank)}, {"rank": 1})
        assert sums == {"rank": 1.0} and counts == {"rank": 2}, (sums, counts)


import torch.distributed  # once, before the forks: a run's two ranks start at once

for run in range(int(sys.argv[1])):
    port = distributed.free_port()
    ranks = []
    for rank in (0, 1):
        child = os.fork()
        if child == 0:
            one_rank(rank, port)
            sys.exit(0)
        ranks.append(child)
    for child in ranks:
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        if status:
            sys.exit(f"run {run}: a rank exited with status {status}")
"""
"""Run as a script: ``argv[1]`` runs of two ranks, each a process of its own that goes
through the process group's start (from the environment torch's launcher sets), an
all-reduce, the shutdown and the interpreter's exit, where the abort came; the first run with
a rank that fails or aborts makes the script fail. The ranks are forked from a process that
imported torch once (importing it is 90% of a launched rank's time here); launching through
torch's launcher is what the other tests of ``--nproc`` do."""


def test_a_raising_rank_ends_the_run_with_its_message_within_seconds(plugin_site, tmp_path):
    """Rank 1 raises in its third update while rank 0 is inside the gradients' all-reduce: the
    launch stops every rank and exits non-zero, the failing rank's one-line message printed and
    the failing rank named. The issue asks for the end within 10 seconds of the failure (no
    hang): the bound is that promise, not a speed measurement (it takes about a second)."""
    plugin_site.install(
        "horizon-breaks-on-rank-one",
        "1.0",
        {"breaks_on_rank_one": "horizon_breaks_on_rank_one"},
        {"horizon_breaks_on_rank_one.py": BREAKING_TRAINER},
    )
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\nseed = 1\n\n'
        '[source]\nkind = "gym"\nepisodes = 4\n\n[timeline]\n\n[normalization]\n\n'
        '[trainer]\nkind = "breaks_on_rank_one"\nepochs = 2\nminibatch_size = 8\nthreads = 1\n'
    )
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plugin_site.path), *sys.path]),
        "OMP_NUM_THREADS": "1",
        "BROKEN_AT_FILE": str(tmp_path / "broken_at"),
    }
    run = subprocess.Popen(
        [sys.executable, "-m", "horizon_engine.cli", "run", str(pipeline), "--nproc", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    _, errors = run.communicate(timeout=180)
    ended = time.time()
    assert run.returncode == 1, errors[-2000:]
    assert "error: rank 1 broke on purpose at update 3" in errors
    assert "error: rank 1 of 2 failed (exit status 1)" in errors
    assert "Traceback" not in errors
    assert ended - float((tmp_path / "broken_at").read_text()) < 10


@pytest.mark.slow
def test_thirty_two_process_runs_end_cleanly(tmp_path: Path):
    """30 consecutive runs of two ranks that join, all-reduce and leave: every one exits 0 on
    both ranks, none aborts."""
    script = tmp_path / "shutdown.py"
    script.write_text(SHUTDOWN_RUNS)
    finished = subprocess.run(
        [sys.executable, str(script), "30"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output[-3000:]
    for sign in ("Aborted", "terminate called", "core dumped", "Traceback"):
        assert sign not in output
