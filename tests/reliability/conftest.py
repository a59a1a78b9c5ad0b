"""Shared by the kill-and-resume tests: small pipelines for every trainer, their uninterrupted
runs (made once per session), and the comparison of a resumed run folder with one of them.

A run here is tiny (tens of episodes, 3 epochs of a 16-unit network on one thread) so that
every trainer can be killed and resumed in a few seconds; what is compared does not depend on
the size.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from horizon_engine.pipeline import Engine

EPOCHS = 3

UNCOMPARED = {"manifest.json", "model.onnx", "report.html"}
"""Files a resumed run writes otherwise than an uninterrupted one, by design: the manifest
(run ids, timings, the interruption's record), the report page (which shows them) and the
model's card (its run id); the model is
compared by its graph, its other metadata and its outputs. TensorBoard's event files hold wall
times and are compared by their scalars."""

SOURCES: dict[str, dict[str, Any]] = {
    "discrete": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 20},
    "parametric": {
        "kind": "gym",
        "env": "CartPole-v1",
        "policy": "random",
        "episodes": 20,
        "parametric_actions": True,
    },
    "continuous": {"kind": "gym", "env": "Pendulum-v1", "policy": "random", "episodes": 2},
}

TRAINERS: dict[str, tuple[str, dict[str, Any]]] = {
    "dqn": ("discrete", {"layers": [16], "activations": ["relu"]}),
    "parametric_dqn": ("parametric", {"layers": [16], "activations": ["relu"]}),
    "sac": ("continuous", {"layers": [16]}),
    "td3": ("continuous", {"layers": [16]}),
    "ddpg": ("continuous", {"layers": [16]}),
}
"""Each trainer's data and its options besides the shared ones (``pipeline_config``)."""


def pipeline_config(output_dir: Path, kind: str = "dqn") -> dict[str, Any]:
    """The pipeline of trainer ``kind``: every stage, per-epoch estimates for the discrete
    trainer (their record must survive a resume too), one training thread (bit-identity)."""
    data, options = TRAINERS[kind]
    config: dict[str, Any] = {
        "pipeline": {"output_dir": str(output_dir), "seed": 0},
        "source": SOURCES[data],
        "timeline": {"reward": {"reward": 1.0}},
        "normalization": {},
        "trainer": {"kind": kind, "epochs": EPOCHS, "minibatch_size": 64, "threads": 1, **options},
        "export": {"kind": "onnx"},
    }
    if data == "discrete":
        config["timeline"]["actions"] = ["0", "1"]
        config["evaluation"] = [{"kind": "dr", "every_epoch": True}]
    return config


def toml_text(config: dict[str, Any]) -> str:
    """``config`` as a pipeline.toml (the command line reads files): tables of scalars,
    lists, inline tables and one array of tables."""

    def value(item: Any) -> str:
        if isinstance(item, dict):
            return "{" + ", ".join(f"{key} = {value(v)}" for key, v in item.items()) + "}"
        if isinstance(item, list):
            return "[" + ", ".join(value(v) for v in item) + "]"
        return json.dumps(item)

    lines = []
    for section, options in config.items():
        tables = options if isinstance(options, list) else [options]
        for table in tables:
            lines.append(f"[[{section}]]" if isinstance(options, list) else f"[{section}]")
            lines += [f"{key} = {value(item)}" for key, item in table.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The output folder of trainer ``kind``'s uninterrupted run, made on first use."""
    made: dict[str, Path] = {}

    def folder(kind: str) -> Path:
        if kind not in made:
            output_dir = tmp_path_factory.mktemp("uninterrupted") / kind
            Engine(show_progress=False).run(pipeline_config(output_dir, kind))
            made[kind] = output_dir
        return made[kind]

    return folder


def differing_files(expected: Path, found: Path) -> list[str]:
    """The run-relative files that are not byte-identical in ``found`` (missing, extra or
    different), leaving out ``UNCOMPARED`` and TensorBoard's event files."""

    def files(folder: Path) -> dict[str, bytes]:
        return {
            str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
            and path.name not in UNCOMPARED
            and not path.name.startswith("events.out.tfevents")
        }

    want, got = files(expected), files(found)
    return sorted(name for name in want.keys() | got.keys() if want.get(name) != got.get(name))


def model_outputs(run_dir: Path) -> list[np.ndarray]:
    """The exported model's outputs (onnxruntime) on the run's check rows."""
    import onnxruntime

    from horizon_engine.driver import CHECK_FIELDS, ProblemDescription

    action_type = ProblemDescription.read(run_dir).action_type
    rows = torch.load(run_dir / "check_rows.pt", weights_only=True)
    session = onnxruntime.InferenceSession(
        str(run_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    types = {"tensor(float)": np.float32, "tensor(bool)": np.bool_, "tensor(int64)": np.int64}
    feeds = {
        spec.name: rows[field].numpy().astype(types[spec.type])
        for spec, field in zip(session.get_inputs(), CHECK_FIELDS[action_type], strict=False)
    }
    return session.run(None, feeds)


def model_without_run_id(run_dir: Path) -> bytes:
    """``model.onnx`` serialized without its run id (the one metadata a resume changes)."""
    import onnx

    model = onnx.load(str(run_dir / "model.onnx"))
    kept = [prop for prop in model.metadata_props if prop.key != "run_id"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model.SerializeToString()


def assert_same_result(expected: Path, found: Path) -> None:
    """``found`` (a resumed run) holds the uninterrupted run's result, to the bit: every
    deterministic file byte-identical (checkpoints, cpe.json, the data stages' files), the
    final checkpoint's tensors equal, the same model and the same model outputs."""
    assert differing_files(expected, found) == []
    want = torch.load(expected / "checkpoints" / "latest.pt", weights_only=True)["trainer"]
    got = torch.load(found / "checkpoints" / "latest.pt", weights_only=True)["trainer"]
    for name, tensor in flat_tensors(want).items():
        assert torch.equal(tensor, flat_tensors(got)[name]), name
    if (expected / "model.onnx").exists():
        assert model_without_run_id(found) == model_without_run_id(expected)
        for want_output, got_output in zip(
            model_outputs(expected), model_outputs(found), strict=True
        ):
            assert np.array_equal(want_output, got_output)


def flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested state dict, by its dotted path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, list | tuple):
        items = enumerate(state)
    else:
        return {}
    found: dict[str, torch.Tensor] = {}
    for key, value in items:
        found |= flat_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    return found


@pytest.fixture
def same_result() -> Callable[[Path, Path], None]:
    return assert_same_result


@pytest.fixture
def resume_config() -> Callable[..., dict[str, Any]]:
    return pipeline_config


@pytest.fixture
def pipeline_toml() -> Callable[[dict[str, Any]], str]:
    return toml_text


def start_paused(script: str, marker: Path, arguments: list[str], point: str) -> subprocess.Popen:
    """``python -c script marker *arguments`` in a process of its own, once it has written
    ``marker``: the script pauses there (at ``point``, named if it never gets there) so that a
    signal lands where the test wants it."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(marker), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"the run never reached {point}"
        time.sleep(0.05)
    return process
