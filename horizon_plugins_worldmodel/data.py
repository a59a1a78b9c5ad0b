"""The logged transitions as the world model reads them: inputs, targets, episodes, groups.

Built once from the timeline's splits (``TimelineTensors`` with the state preprocessor's output)
and the ``TrainingProblem``: the normalized state, the action (one-hot for discrete actions,
normalized action features otherwise), the normalized next state with a mask of the columns
that are there (none on an episode's last row), the reward and whether the episode ended. The
input columns are grouped by what a user calls a feature (an enum's one-hot columns are one
feature) and the action is one more group: what feature importance masks, one group at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from horizon_engine import ActionType, HorizonError, TimelineTensors, TrainingProblem

ACTION = "action"
"""The name of the action's input group (state features are named by their ids)."""


@dataclass
class InputGroup:
    """One feature (or the action) among the input columns, and its next-state columns."""

    name: str
    columns: torch.Tensor
    """Its input columns (state columns first, then the action's)."""
    next_columns: torch.Tensor
    """Its columns of the next state (none for the action)."""


@dataclass
class Transitions:
    """Every row of the timeline's splits together, as the world model's tensors."""

    state: torch.Tensor
    """``[N, W]`` normalized."""
    action: torch.Tensor
    """``[N, A]``: one-hot, or the normalized action features."""
    next_state: torch.Tensor
    """``[N, W]`` normalized, 0 where ``next_mask`` is."""
    next_mask: torch.Tensor
    """``[N, W]``: 1 where the next state has the column (never on an episode's last row)."""
    reward: torch.Tensor
    terminal: torch.Tensor
    """``[N]``: 1 where the episode ends with the row."""
    episode: torch.Tensor
    """``[N]``: the row's episode, numbered 0.. over both splits."""
    step: torch.Tensor
    groups: list[InputGroup]

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    @property
    def episode_count(self) -> int:
        return int(self.episode.max()) + 1 if len(self) else 0

    def inputs(self) -> torch.Tensor:
        """``[N, W + A]``: the state's columns, then the action's."""
        return torch.cat([self.state, self.action], dim=1)

    def group(self, name: str) -> InputGroup:
        """The input group of feature ``name`` (or of the action, ``ACTION``)."""
        return next(group for group in self.groups if group.name == name)


def transitions(problem: TrainingProblem, splits: list[TimelineTensors]) -> Transitions:
    """The rows of ``splits`` (each with ``state_preprocessed``, disjoint by episode) as
    ``Transitions``, on the problem's device."""
    parts = [_split_transitions(problem, split) for split in splits if len(split)]
    if not parts:
        raise HorizonError("[analysis] the timeline has no rows to fit a world model on")
    offset = 0
    episodes = []
    for part in parts:
        episodes.append(part["episode"] + offset)
        offset += int(part["episode"].max()) + 1
    joined = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
    joined["episode"] = torch.cat(episodes)
    names = list(problem.state_preprocessor.output_names)
    return Transitions(**joined, groups=input_groups(names, joined["action"].shape[1]))


def _split_transitions(problem: TrainingProblem, split: TimelineTensors) -> dict[str, torch.Tensor]:
    """One split's tensors as ``Transitions`` fields, its episodes numbered within it."""
    found = transition_tensors(problem, split.tensors())
    return {**found, "episode": split.episode_id, "step": split.step}


def transition_tensors(
    problem: TrainingProblem, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A split's or a batch's tensors (batch-schema names) as the world model's inputs and
    targets: ``state``, ``action``, ``next_state``, ``next_mask``, ``reward``, ``terminal``.
    The state preprocessor's output is used where the tensors carry it."""
    preprocessor = problem.state_preprocessor

    def normalized(name: str) -> torch.Tensor:
        if f"{name}_preprocessed" in tensors:
            return tensors[f"{name}_preprocessed"]
        with torch.no_grad():
            return preprocessor(tensors[name], tensors[f"{name}_presence"])

    if problem.action_type is ActionType.DISCRETE:
        action = torch.nn.functional.one_hot(tensors["action"], len(problem.actions)).float()
    else:
        with torch.no_grad():
            action = problem.action_preprocessor(tensors["action"], tensors["action_presence"])
    position = {feature: index for index, feature in enumerate(preprocessor.feature_ids)}
    column_feature = torch.tensor(
        [position[_feature_of(name)] for name in preprocessor.output_names],
        device=action.device,
    )
    not_terminal = tensors["not_terminal"]
    present = tensors["next_state_presence"].index_select(1, column_feature)
    next_mask = present * not_terminal.unsqueeze(1)
    return {
        "state": normalized("state"),
        "action": action,
        "next_state": normalized("next_state") * next_mask,
        "next_mask": next_mask,
        "reward": tensors["reward"],
        "terminal": 1.0 - not_terminal,
    }


def _feature_of(column_name: str) -> str:
    """The feature id of a preprocessor output column: ``id``, or ``id=value`` for an enum."""
    return column_name.split("=", 1)[0]


def input_groups(column_names: list[str], action_width: int) -> list[InputGroup]:
    """The state features (in column order) and the action, as groups of input columns."""
    by_feature: dict[str, list[int]] = {}
    for index, name in enumerate(column_names):
        by_feature.setdefault(_feature_of(name), []).append(index)
    groups = [
        InputGroup(feature, torch.tensor(columns), torch.tensor(columns))
        for feature, columns in by_feature.items()
    ]
    width = len(column_names)
    action_columns = torch.arange(width, width + action_width)
    groups.append(InputGroup(ACTION, action_columns, torch.tensor([], dtype=torch.long)))
    return groups
