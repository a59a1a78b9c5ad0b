"""Exporting a gym run's policy: at the end of ``horizon gym train``, or by ``horizon export``."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from horizon_engine.config import Choice
from horizon_engine.errors import HorizonError
from horizon_engine.files import write_json
from horizon_engine.normalization import NORMALIZATION_FILE
from horizon_engine.online.config import load_gym_spec
from horizon_engine.online.runner import GYM_COMMAND, OnlineRun

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

    from horizon_engine.plugins import PluginHost
    from horizon_engine.run_context import RunContext


def export_policy(
    run: RunContext,
    choice: Choice,
    policy: torch.nn.Module,
    states: np.ndarray,
    feature_ids: list[str],
    actions: list[str],
    action_feature_ids: list[str],
) -> dict[str, Any]:
    """Export ``policy`` with the ``[export]`` component, checked on ``states``; returns the
    files written (``outputs``, relative to the run folder) and the exporter's ``details``.
    A parametric policy (``action_feature_ids``, one-hot) is checked with every action
    offered as a candidate."""
    import torch

    from horizon_engine.export import PolicyBundle

    exporter = choice.create()
    values = torch.from_numpy(states.astype(np.float32))
    candidates = None
    if action_feature_ids:
        every = torch.eye(len(action_feature_ids)).expand(len(values), -1, -1)
        candidates = (every, every, torch.ones(every.shape[:2]))
    normalization = json.loads((run.output_dir / NORMALIZATION_FILE).read_text(encoding="utf-8"))
    bundle = PolicyBundle(
        model=policy.to("cpu").eval(),
        feature_ids=feature_ids,
        actions=actions,
        normalization=normalization,
        sample_values=values,
        sample_presence=torch.ones_like(values),
        run_id=run.run_id,
        action_feature_ids=action_feature_ids,
        sample_candidates=candidates,
    )
    outputs = exporter.export(run, bundle)
    return {"outputs": outputs, "details": exporter.details}


def export_gym_run(
    run_dir: Path, overrides: Iterable[str] = (), plugins: PluginHost | None = None
) -> dict[str, Any]:
    """``horizon export`` for a ``horizon gym train`` run: its latest checkpoint, set up with
    the run's own config and normalization.json, exported as its ``[export]`` says (ONNX by
    default) and checked on greedy-play states. Returns the exporter's outputs and details,
    also recorded under ``export`` in the run's manifest.json; a run whose export had failed
    at the end of training is then marked succeeded."""
    from horizon_engine.normalization import read_normalization
    from horizon_engine.plugins import get_plugin_host
    from horizon_engine.training import load_checkpoint

    host = plugins or get_plugin_host()
    manifest_path = Path(run_dir) / "manifest.json"
    manifest = _read_manifest(manifest_path)
    config = manifest["config"]
    config["gym"]["output_dir"] = str(run_dir)
    config.setdefault("export", {"kind": "onnx"})
    spec = load_gym_spec(config, host, overrides)
    run = OnlineRun(spec, host, show_progress=False)
    run.run_context.run_id = manifest.get("run_id", run.run_context.run_id)
    with ExitStack() as envs:
        run._open_envs(envs)
        path = Path(run_dir) / NORMALIZATION_FILE
        normalization = read_normalization(path)
        run._check_features(normalization, str(path))
        run._build_trainer(normalization)
        run.trainer.load_state_dict(load_checkpoint(Path(run_dir), "export")["trainer"])
        exported = run._export()
    manifest["export"] = exported
    if manifest.get("failed_stage") == "export":
        manifest["status"] = "succeeded"
        del manifest["failed_stage"], manifest["error"]
    write_json(manifest_path, manifest)
    return exported


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HorizonError(f"{path}: cannot read the run's manifest ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise HorizonError(f"{path}: not a run's manifest (no config in it)")
    if not isinstance(manifest["config"].get("gym"), dict):
        raise HorizonError(f"{path}: not the manifest of a {GYM_COMMAND} run (no [gym] config)")
    return manifest


def is_gym_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a ``horizon gym train`` run (its manifest says so)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("command") == GYM_COMMAND
