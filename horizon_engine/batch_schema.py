"""The batch schema: the tensors a trainer receives, by name, with their shapes and dtypes.

Every way of training hands a trainer the same dict of tensors, whether the rows come from the
timeline (``TimelineTensors.minibatches``) or from an online replay buffer, so a trainer written
against this schema runs in ``horizon run`` and in ``horizon gym train`` unchanged. Shapes use
``B`` for the rows of the batch, ``F`` for the state features, ``A`` for the discrete actions,
``G`` for the action features, ``K`` for the most candidate actions of a row, ``N`` for the
longest n-step window and ``W`` for the width of the state preprocessor's output
(``TrainingProblem.state_width``).
``episode_id`` and ``step`` let sequential estimators rebuild the episodes of a split: rows of
one episode share an ``episode_id`` and are ordered by ``step``.

Normalization is fixed while a trainer trains, so the training driver runs the state
preprocessor once over a split rather than on every minibatch: the timeline's batches also carry
``state_preprocessed`` (and ``next_state_preprocessed``, ``next_n_state_preprocessed``), the
preprocessor's output for the raw tensors beside them. A trainer may use them when the batch has
them (the replay buffer's batches do not: they hold transitions newer than any precomputation)
and must give the same result as running ``TrainingProblem.state_preprocessor`` itself; the raw
tensors stay, for what needs raw features (a policy for export, estimators, a callback).

Shown by ``docs/plugins.md``; ``check_batch`` is what the tests hold every source of batches to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from horizon_engine.errors import HorizonError
from horizon_engine.schema import ActionType

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

DISCRETE = frozenset({ActionType.DISCRETE})
PARAMETRIC = frozenset({ActionType.PARAMETRIC})
FEATURE_ACTIONS = frozenset({ActionType.PARAMETRIC, ActionType.CONTINUOUS})
EVERY_ACTION_TYPE = frozenset(ActionType)


@dataclass(frozen=True)
class BatchField:
    """One tensor of a batch: its name, dtype, shape, the action types that have it, whether
    it is there only with n-step windows (a timeline built with ``window > 1``), and whether it
    is there only in batches the driver precomputed the state preprocessor's output for."""

    name: str
    dtype: str
    shape: tuple[str, ...]
    action_types: frozenset[ActionType]
    description: str
    n_step: bool = False
    preprocessed: bool = False


BATCH_SCHEMA: tuple[BatchField, ...] = (
    BatchField("state", "float32", ("B", "F"), EVERY_ACTION_TYPE, "raw state feature values"),
    BatchField("state_presence", "float32", ("B", "F"), EVERY_ACTION_TYPE, "1 present, 0 missing"),
    BatchField("next_state", "float32", ("B", "F"), EVERY_ACTION_TYPE, "the next row's state"),
    BatchField("next_state_presence", "float32", ("B", "F"), EVERY_ACTION_TYPE, "its presence"),
    BatchField("reward", "float32", ("B",), EVERY_ACTION_TYPE, "the row's reward"),
    BatchField("not_terminal", "float32", ("B",), EVERY_ACTION_TYPE, "0 on an episode's last row"),
    BatchField(
        "time_diff", "float32", ("B",), EVERY_ACTION_TYPE, "steps to the next row (discount)"
    ),
    BatchField(
        "action_probability",
        "float32",
        ("B",),
        EVERY_ACTION_TYPE,
        "the logging policy's propensity of the logged action",
    ),
    BatchField(
        "episode_id",
        "int64",
        ("B",),
        EVERY_ACTION_TYPE,
        "the row's episode, numbered within its split (or replay buffer)",
    ),
    BatchField(
        "step", "int64", ("B",), EVERY_ACTION_TYPE, "the row's place in its episode (ascending)"
    ),
    BatchField("action", "int64", ("B",), DISCRETE, "the logged action's index"),
    BatchField("next_action", "int64", ("B",), DISCRETE, "the next row's action, -1 if none"),
    BatchField(
        "possible_actions", "float32", ("B", "A"), DISCRETE, "1 where an action was possible"
    ),
    BatchField(
        "possible_next_actions", "float32", ("B", "A"), DISCRETE, "the same in the next state"
    ),
    BatchField("action", "float32", ("B", "G"), FEATURE_ACTIONS, "the logged action's features"),
    BatchField("action_presence", "float32", ("B", "G"), FEATURE_ACTIONS, "their presence"),
    BatchField("next_action", "float32", ("B", "G"), FEATURE_ACTIONS, "the next row's action"),
    BatchField("next_action_presence", "float32", ("B", "G"), FEATURE_ACTIONS, "its presence"),
    BatchField(
        "possible_actions", "float32", ("B", "K"), PARAMETRIC, "1 for a real candidate slot"
    ),
    BatchField("possible_action_features", "float32", ("B", "K", "G"), PARAMETRIC, "candidates"),
    BatchField(
        "possible_action_presence", "float32", ("B", "K", "G"), PARAMETRIC, "their presence"
    ),
    BatchField(
        "possible_next_actions", "float32", ("B", "K"), PARAMETRIC, "next state's candidates"
    ),
    BatchField(
        "possible_next_action_features", "float32", ("B", "K", "G"), PARAMETRIC, "their features"
    ),
    BatchField("possible_next_action_presence", "float32", ("B", "K", "G"), PARAMETRIC, "presence"),
    BatchField(
        "next_n_rewards",
        "float32",
        ("B", "N"),
        EVERY_ACTION_TYPE,
        "the window's rewards, 0 past its length",
        n_step=True,
    ),
    BatchField(
        "next_n_time_diffs", "float32", ("B", "N"), EVERY_ACTION_TYPE, "their time_diffs", True
    ),
    BatchField(
        "next_n_not_terminal",
        "float32",
        ("B", "N"),
        EVERY_ACTION_TYPE,
        "not_terminal along the window, 0 past its length",
        True,
    ),
    BatchField(
        "next_n_length", "int64", ("B",), EVERY_ACTION_TYPE, "rows in the row's window", True
    ),
    BatchField(
        "next_n_state", "float32", ("B", "F"), EVERY_ACTION_TYPE, "the state after the window", True
    ),
    BatchField(
        "next_n_state_presence", "float32", ("B", "F"), EVERY_ACTION_TYPE, "its presence", True
    ),
    BatchField(
        "next_n_possible_next_actions",
        "float32",
        ("B", "A"),
        DISCRETE,
        "actions possible after the window",
        True,
    ),
    BatchField(
        "next_n_possible_next_actions",
        "float32",
        ("B", "K"),
        PARAMETRIC,
        "candidates after the window",
        True,
    ),
    BatchField(
        "next_n_possible_next_action_features",
        "float32",
        ("B", "K", "G"),
        PARAMETRIC,
        "their features",
        True,
    ),
    BatchField(
        "next_n_possible_next_action_presence",
        "float32",
        ("B", "K", "G"),
        PARAMETRIC,
        "their presence",
        True,
    ),
    BatchField(
        "state_preprocessed",
        "float32",
        ("B", "W"),
        EVERY_ACTION_TYPE,
        "the state preprocessor's output for state, state_presence",
        preprocessed=True,
    ),
    BatchField(
        "next_state_preprocessed",
        "float32",
        ("B", "W"),
        EVERY_ACTION_TYPE,
        "the same for next_state",
        preprocessed=True,
    ),
    BatchField(
        "next_n_state_preprocessed",
        "float32",
        ("B", "W"),
        EVERY_ACTION_TYPE,
        "the same for next_n_state",
        n_step=True,
        preprocessed=True,
    ),
)
"""Every tensor a batch may hold; ``batch_fields`` selects those of one kind of batch."""

PREPROCESSED_STATES = ("state", "next_state", "next_n_state")
"""The raw states whose preprocessor output a batch may carry, as ``<name>_preprocessed``."""


def batch_fields(
    action_type: ActionType, n_step: bool, preprocessed: bool = False
) -> dict[str, BatchField]:
    """The fields a batch of ``action_type`` holds, by name; with ``n_step`` the n-step
    windows' fields too, with ``preprocessed`` the state preprocessor's outputs too."""
    return {
        item.name: item
        for item in BATCH_SCHEMA
        if action_type in item.action_types
        and (n_step or not item.n_step)
        and (preprocessed or not item.preprocessed)
    }


def check_batch(batch: Mapping[str, torch.Tensor], action_type: ActionType) -> None:
    """Raise a ``HorizonError`` naming every way ``batch`` differs from the schema: a missing or
    unknown tensor, a wrong dtype, a wrong number of dimensions, or sizes that disagree (every
    ``B`` the same, every ``F`` the same, ...). A batch with ``next_n_rewards`` must have every
    n-step tensor, one with ``state_preprocessed`` every preprocessed one."""
    n_step = "next_n_rewards" in batch
    expected = batch_fields(action_type, n_step, "state_preprocessed" in batch)
    problems = [f"missing tensor '{name}'" for name in expected if name not in batch]
    problems += [f"unknown tensor '{name}'" for name in batch if name not in expected]
    sizes: dict[str, tuple[int, str]] = {}
    for name, item in expected.items():
        tensor = batch.get(name)
        if tensor is None:
            continue
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype != item.dtype:
            problems.append(f"'{name}' is {dtype}, expected {item.dtype}")
        if tensor.dim() != len(item.shape):
            problems.append(f"'{name}' has shape {tuple(tensor.shape)}, expected {item.shape}")
            continue
        for axis, size in zip(item.shape, tensor.shape, strict=True):
            seen = sizes.setdefault(axis, (int(size), name))
            if seen[0] != int(size):
                problems.append(
                    f"'{name}' has {axis} = {int(size)}, but '{seen[1]}' has {axis} = {seen[0]}"
                )
    if problems:
        raise HorizonError(f"a {action_type.value} batch: " + "; ".join(problems))
