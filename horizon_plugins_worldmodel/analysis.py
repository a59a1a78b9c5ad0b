"""The ``analysis`` stage's work for the ``world_model`` component: check the MDP, write the
report into the run folder.

It fits the checks' world models on the timeline's rows (train and eval splits together: the
folds hold episodes out, so every row's loss is a held-out one), logs the first fold's full
model's losses per epoch to TensorBoard as ``WorldModel/<loss>``, and writes, each whole or not
at all, ``analysis/mdp_check.json`` (every number behind every verdict),
``analysis/mdp_check.txt`` (the report ``horizon check-mdp`` prints) and
``analysis/feature_importance.png`` (the ranking as a bar chart).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from horizon_engine import (
    RunContext,
    RunFolder,
    StageReport,
    TimelineTensors,
    TrainingProblem,
    atomic_output,
)
from horizon_plugins_worldmodel.config import WorldModelConfig
from horizon_plugins_worldmodel.report import RESULT_FILE
from horizon_plugins_worldmodel.statistics import plain

FOLDER = RunFolder.ANALYSIS
REPORT_FILE = f"{FOLDER}/mdp_check.txt"
CHART_FILE = f"{FOLDER}/feature_importance.png"
FIT_STEPS = 4
"""Progress steps: the full model, without the action, without the state, without the
features the action moves."""


def _analyse(
    config: WorldModelConfig,
    problem: TrainingProblem,
    splits: list[TimelineTensors],
    run: RunContext,
    advance: Callable[[int], None],
) -> dict[str, Any]:
    """The checks' result for the rows of ``splits``, JSON-ready."""
    from horizon_plugins_worldmodel.checks import MdpAnalysis
    from horizon_plugins_worldmodel.data import transitions

    data = transitions(problem, splits)

    def log_epoch(epoch: int, losses: dict[str, float]) -> None:
        metrics = {f"WorldModel/{name}": value for name, value in losses.items()}
        run.emit_epoch_metrics(epoch, metrics)

    result = MdpAnalysis(config, data, problem.seed).run(log_epoch, advance)
    return plain(
        {
            **result,
            "model": {
                "model": config.model,
                "num_gaussians": config.num_gaussians,
                "layers": config.layers,
                "epochs": config.epochs,
                "minibatch_size": config.minibatch_size,
                "learning_rate": config.learning_rate,
            },
        }
    )


def run_analysis(
    config: WorldModelConfig,
    run: RunContext,
    problem: TrainingProblem,
    splits: list[TimelineTensors],
) -> StageReport:
    """Check the MDP on the run's timeline and write the three files; the stage's report."""
    from horizon_plugins_worldmodel.report import importance_chart, report_text

    with torch_threads(config.threads), run.progress("checking the MDP", FIT_STEPS) as advance:
        result = _analyse(config, problem, splits, run, advance)
    text = report_text(result)
    folder = run.output_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    _write(run.output_dir / RESULT_FILE, json.dumps(result, indent=2) + "\n")
    _write(run.output_dir / REPORT_FILE, text + "\n")
    with atomic_output(run.output_dir / CHART_FILE) as temporary:
        temporary.write_bytes(importance_chart(result).png)
    flagged = [check["name"] for check in result["checks"] if check["passed"] is False]
    return StageReport(
        "analysis",
        rows_in=result["data"]["rows"],
        rows_out=result["data"]["rows"],
        outputs=[RESULT_FILE, REPORT_FILE, CHART_FILE],
        warnings=[f"MDP check flagged: {check}" for check in flagged],
        details={check["name"]: check["verdict"] for check in result["checks"]},
    )


@contextmanager
def torch_threads(choice: int | str) -> Iterator[None]:
    """torch computes on ``[analysis] threads`` CPU threads inside ("auto": one, as the core
    trains its small networks: the world model's updates are far below the size where a
    second thread pays), on as many as before after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1 if choice == "auto" else int(choice))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write(path: Path, text: str) -> None:
    with atomic_output(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
