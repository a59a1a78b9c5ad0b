"""What a run's trained policy does on its eval split, beside what the logging policy did.

The report's action section: on the eval rows, the logged actions against the actions of the
policy the run ships (the latest checkpoint, under the ``[export]`` section's exploration,
greedy without one). Discrete and parametric actions compare as shares per action (the
trained policy's share is its mean probability, so a softmax policy's spread shows);
continuous actions as values per dimension, in the user's units. The first
``ACTION_ROWS`` rows are used: shares settle long before. The split is read as the estimators
read it (``episodes_within``: whole where it fits the trainer's memory budget, else its first
episodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from horizon_engine.errors import HorizonError
from horizon_engine.run_folder import RunFolder

if TYPE_CHECKING:
    import numpy as np

    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.plugins import PluginHost

ACTION_ROWS = 20_000
"""Eval rows the comparison reads at most."""


@dataclass(frozen=True)
class ActionComparison:
    """The logged and the trained policy's actions on ``rows`` eval rows.

    ``names`` are the discrete actions, the parametric candidates' positions (a logged action
    is the candidate with its features; one that matches none counts in no share), or the
    continuous action's dimensions; ``logged`` and ``trained`` are shares per name (discrete,
    parametric) or ``[rows, dimensions]`` values (continuous). ``policy`` says which policy was
    applied.
    """

    action_type: str
    names: list[str]
    rows: int
    logged: np.ndarray
    trained: np.ndarray
    policy: str


def compare_actions(
    run_dir: Path, plugins: PluginHost, data: Path | None = None, rows: int = ACTION_ROWS
) -> ActionComparison:
    """The comparison on ``run_dir``'s eval split (or the eval split of the run folder
    ``data``, which must have the same problem); an error saying why where there is none to
    make (no trained policy, no eval rows)."""
    import numpy as np
    import torch

    from horizon_engine.config import build_spec
    from horizon_engine.evaluation_stage import trained_run_config
    from horizon_engine.export_stage import shipped_checkpoint, trained_policy
    from horizon_engine.policies import ExplorationConfig, policy_output
    from horizon_engine.schema import ActionType
    from horizon_engine.streamed import episodes_within

    folder = RunFolder(run_dir)
    spec = build_spec(trained_run_config(run_dir), plugins)
    description = folder.problem()
    split = RunFolder(data if data is not None else run_dir).split("eval")
    if not any(split.glob("*.parquet")):
        raise HorizonError(f"{split} holds no eval rows ([timeline] eval_fraction is 0)")
    trainer = spec.sections["trainer"]
    table, _ = episodes_within(split, description, trainer.config, torch.device("cpu"))
    if not len(table):
        raise HorizonError(f"{split} holds no eval rows")
    if len(table) > rows:
        table = table.take(torch.arange(rows))
    export = spec.sections.get("export")
    exploration = ExplorationConfig.model_validate(
        export.config.model_dump(include={"policy", "epsilon", "temperature"}) if export else {}
    )
    policy = trained_policy(run_dir, trainer, plugins, shipped_checkpoint(run_dir, export))
    action_type = description.action_type
    candidates = None
    if action_type is ActionType.PARAMETRIC:
        candidates = (table.possible_action_features, table.possible_action_presence)
    with torch.no_grad():
        output = policy_output(
            policy,
            action_type,
            table.state,
            table.state_presence,
            exploration,
            table.possible_actions,
            candidates,
        )
    label = exploration.policy
    if action_type is ActionType.CONTINUOUS:
        # An actor applies no exploration setting: it draws its action, or gives it.
        label = "stochastic actor" if output.log_density is not None else "deterministic actor"
        return ActionComparison(
            action_type.value,
            list(description.action_feature_ids),
            len(table),
            table.action.numpy().astype(np.float64),
            output.action.numpy().astype(np.float64),
            label,
        )
    count = int(output.probabilities.shape[1])
    if action_type is ActionType.PARAMETRIC:
        names = [f"candidate {index}" for index in range(count)]
        chosen = _logged_candidates(table)
    else:
        names = list(description.actions)
        chosen = table.action.long().numpy()
    chosen = chosen[chosen >= 0]
    logged = np.bincount(chosen, minlength=count)[:count] / len(table)
    trained = output.probabilities.double().mean(dim=0).numpy()
    return ActionComparison(action_type.value, names, len(table), logged, trained, label)


def _logged_candidates(table: TimelineTensors) -> np.ndarray:
    """Each row's logged action as the position of the candidate with its features (the first
    such), -1 where none of the row's candidates has them."""
    import torch

    same = (table.possible_action_features == table.action.unsqueeze(1)).all(dim=2)
    if table.possible_actions is not None:
        same &= table.possible_actions.bool()
    first = same.int().argmax(dim=1)
    return torch.where(same.any(dim=1), first, -1).numpy()
