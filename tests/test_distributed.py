"""Data-parallel training (``horizon_engine.distributed``): each rank's share of the data, two
CPU processes training as one process does, every trainer on two processes with identical
parameters on every rank, and two torchrun "nodes" on this machine.

The process tests start real processes through torch's launcher (gloo on the CPU); the data is
made once, in this process, by the source, timeline and normalization stages of a gym source.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from horizon_engine.dataset import TimelineTensors
from horizon_engine.distributed import free_port
from horizon_engine.pipeline import Engine
from horizon_engine.run_folder import RunFolder

SOURCES: dict[str, dict[str, Any]] = {
    "discrete": {"kind": "gym", "episodes": 7},
    "parametric": {"kind": "gym", "episodes": 7, "parametric_actions": True},
    "continuous": {"kind": "gym", "env": "Pendulum-v1", "episodes": 2},
}
"""Tiny logs of each action type. With seed 1 the discrete one's train split has 96 rows:
three minibatches of 32, split 16 and 16 between two ranks."""

TRAINERS = {
    "dqn": "discrete",
    "parametric_dqn": "parametric",
    "sac": "continuous",
    "td3": "continuous",
    "ddpg": "continuous",
}
OPTIONS: dict[str, dict[str, Any]] = {"sac": {"cql_alpha": 1.0, "cql_samples": 2}}
"""The conservative penalty forwards the wrapped critics (``parametric_dqn``'s Q-network, with
its default ``cql_alpha``) a second time before the one backward: DistributedDataParallel must
still average each gradient once."""
MINIBATCH = 32
EPOCHS = 2

RANKS_SCRIPT = """
import json
import sys

import torch

from horizon_engine import distributed
from horizon_engine.driver import TrainingDriver
from horizon_engine.pipeline import Engine

if not distributed.is_distributed():
    distributed.launch_local(2, [sys.executable, *sys.argv])
    sys.exit(0)


def floats(value):
    if isinstance(value, torch.Tensor):
        return [value.double().flatten()] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in floats(value[key])]
    if isinstance(value, list | tuple):
        return [t for item in value for t in floats(item)]
    return []


spreads = {}
train_epochs = TrainingDriver.train_epochs


def train_and_compare(self, *args, **kwargs):
    history = train_epochs(self, *args, **kwargs)
    mine = torch.cat(floats(self.trainer.state_dict()))
    everyone = [torch.empty_like(mine) for _ in range(distributed.world_size())]
    torch.distributed.all_gather(everyone, mine)
    spreads[self.run.output_dir.name] = max(float((o - mine).abs().max()) for o in everyone)
    return history


TrainingDriver.train_epochs = train_and_compare
configs = json.loads(open(sys.argv[1]).read())
with distributed.process_group():
    for config in configs:
        Engine(show_progress=False).run(config, stages=["train"])
if distributed.is_writer():
    open(sys.argv[2], "w").write(json.dumps(spreads))
"""
"""Run as a script: launches itself on two ranks, which train each config's train stage and
compare every floating tensor of the trainer's state (weights, optimizer moments, SAC's
temperature) across the ranks after training; rank 0 writes the largest difference per run."""


def pipeline(folder: Path, source: str, trainer: dict[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "pipeline": {"output_dir": str(folder), "seed": 1},
        "source": SOURCES[source],
        "timeline": {"eval_fraction": 0.4},
        "normalization": {},
    }
    if trainer is not None:
        config["trainer"] = {
            "epochs": EPOCHS,
            "minibatch_size": MINIBATCH,
            "threads": 1,
            **trainer,
        }
    return config


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run folder of each action type holding its timeline and normalization."""
    root = tmp_path_factory.mktemp("prepared")
    for source in SOURCES:
        Engine(show_progress=False).run(pipeline(root / source, source))
    return {source: root / source for source in SOURCES}


def copy_for(prepared: dict[str, Path], kind: str, destination: Path) -> dict[str, Any]:
    """A copy of the prepared folder of ``kind``'s action type, and its config training
    ``kind``."""
    source = TRAINERS[kind]
    shutil.copytree(prepared[source], destination)
    return pipeline(destination, source, {"kind": kind, **OPTIONS.get(kind, {})})


def trained_state(folder: Path) -> dict[str, Any]:
    return torch.load(RunFolder(folder).latest_checkpoint, weights_only=True)["trainer"]


def tensors(rows: int) -> TimelineTensors:
    zeros = torch.zeros(rows)
    return TimelineTensors(
        state=torch.arange(rows, dtype=torch.float32).unsqueeze(1),
        state_presence=torch.ones(rows, 1),
        next_state=torch.zeros(rows, 1),
        next_state_presence=torch.ones(rows, 1),
        reward=zeros,
        not_terminal=zeros,
        time_diff=zeros,
        action_probability=zeros,
        action=torch.zeros(rows, dtype=torch.long),
        next_action=torch.zeros(rows, dtype=torch.long),
        episode_id=torch.zeros(rows, dtype=torch.long),
        step=torch.zeros(rows, dtype=torch.long),
    )


@pytest.mark.parametrize(("rows", "batch", "dropped"), [(96, 32, 0), (10, 4, 0), (9, 4, 1)])
def test_each_global_minibatch_is_split_between_the_ranks(rows, batch, dropped):
    """The shards' parts of each minibatch are the one-process minibatch (same generator
    seed), every rank makes as many updates, none on an empty batch; a last minibatch with
    fewer rows than ranks is left out."""
    data = tensors(rows)
    assert data.shard(0, 1) is data
    whole = [
        sorted(b["state"].squeeze(1).tolist())
        for b in data.minibatches(batch, torch.Generator().manual_seed(3))
    ]
    parts = [
        [
            b["state"].squeeze(1).tolist()
            for b in data.shard(rank, 2).minibatches(batch, torch.Generator().manual_seed(3))
        ]
        for rank in range(2)
    ]
    assert len(parts[0]) == len(parts[1]) == len(whole) - dropped
    assert all(part for rank in parts for part in rank)
    joined = [sorted(first + second) for first, second in zip(*parts, strict=True)]
    assert joined == whole[: len(joined)]


@pytest.mark.slow
def test_two_processes_train_every_trainer_alike_and_dqn_as_one_process(prepared, tmp_path):
    """Every trainer trains on two gloo processes and ends with the same state on both ranks
    (weights, optimizer moments, SAC's temperature: each gradient is averaged before the
    step). DQN has no noise, so its two-process run must reach one process's parameters on
    the same data and effective batch: each rank's half-batch mean loss averaged over the ranks
    is the whole batch's mean, so the two runs differ by floating-point summation order only,
    amplified a little by Adam over 6 updates; 1e-5 is far below one learning-rate step."""
    configs = [copy_for(prepared, kind, tmp_path / kind) for kind in TRAINERS]
    listed = tmp_path / "configs.json"
    listed.write_text(json.dumps(configs))
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    spreads_file = tmp_path / "spreads.json"
    finished = subprocess.run(
        [sys.executable, str(script), str(listed), str(spreads_file)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    spreads = json.loads(spreads_file.read_text())
    assert spreads == {kind: 0.0 for kind in TRAINERS}
    for kind in TRAINERS:
        assert RunFolder(tmp_path / kind).latest_checkpoint.is_file()
        manifest = json.loads((tmp_path / kind / RunFolder.MANIFEST).read_text())
        assert manifest["status"] == "succeeded"

    alone = copy_for(prepared, "dqn", tmp_path / "dqn_alone")
    Engine(show_progress=False).run(alone, stages=["train"])
    together, single = trained_state(tmp_path / "dqn"), trained_state(tmp_path / "dqn_alone")
    for name, weight in single["q_network"].items():
        torch.testing.assert_close(together["q_network"][name], weight, rtol=0, atol=1e-5)
    together_train, single_train = (
        json.loads((tmp_path / name / RunFolder.MANIFEST).read_text())["stages"]["train"]
        for name in ("dqn", "dqn_alone")
    )
    assert together_train["details"]["updates"] == single_train["details"]["updates"] == 6
    assert together_train["details"]["last_epoch"] == pytest.approx(
        single_train["details"]["last_epoch"], rel=1e-4
    )


@pytest.mark.slow
def test_two_torchrun_nodes_train_a_pipeline_into_one_run_folder(prepared, tmp_path):
    """Multi-machine training simulated: two torchrun agents ("nodes", one process each)
    meeting at a c10d rendezvous on 127.0.0.1 run the same ``horizon run``; rank 0 writes the
    one run folder, both exit 0."""
    copy_for(prepared, "dqn", tmp_path / "run")
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\nseed = 1\n\n'
        f'[source]\nkind = "gym"\nepisodes = {SOURCES["discrete"]["episodes"]}\n\n'
        "[timeline]\neval_fraction = 0.4\n\n[normalization]\n\n"
        f'[trainer]\nkind = "dqn"\nepochs = {EPOCHS}\nminibatch_size = {MINIBATCH}\n'
        "threads = 1\n"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                "--local-addr=127.0.0.1",
                "--max-restarts=0",
                "-m",
                "horizon_engine.cli",
                "run",
                str(toml),
                "--stages=train",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for node in range(2)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    printed = "".join(out for out, _ in outputs)
    assert printed.count(" succeeded: ") == 1
    manifest = json.loads((tmp_path / "run" / RunFolder.MANIFEST).read_text())
    assert manifest["status"] == "succeeded"
    assert sorted(path.name for path in RunFolder(tmp_path / "run").checkpoints.iterdir()) == [
        "epoch-0001.pt",
        "epoch-0002.pt",
        "latest.pt",
    ]


def test_a_rank_that_does_not_see_rank_zeros_run_folder_says_the_folder_must_be_shared(tmp_path):
    """A rank on another machine without a shared filesystem finds no run (or an old one) at
    the output path: it stops with what to do rather than failing on a missing timeline."""
    from horizon_engine.errors import HorizonError
    from horizon_engine.pipeline import _check_shared

    with pytest.raises(HorizonError, match=r"same path .* shared filesystem"):
        _check_shared(tmp_path, "abc123")
    (tmp_path / RunFolder.MANIFEST).write_text(json.dumps({"run_id": "older"}))
    with pytest.raises(HorizonError, match="does not hold rank 0's run abc123"):
        _check_shared(tmp_path, "abc123")
    (tmp_path / RunFolder.MANIFEST).write_text(json.dumps({"run_id": "abc123"}))
    _check_shared(tmp_path, "abc123")
