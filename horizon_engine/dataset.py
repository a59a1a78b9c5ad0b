"""The timeline as dense tensors, loaded once, sampled in minibatches without per-row Python.

Training reads the timeline Parquet into dense float32 tensors once:
sparse feature maps become ``[rows, features]`` values plus a presence mask (0 where a row lacks
a feature), in the order of ``normalization.json``'s features, which is the order the
preprocessor takes them in. Discrete actions stay indices (``-1`` for a terminal row's missing
next action) with their 0/1 possible-action masks; continuous and parametric actions become
dense action-feature tensors the same way as states. A parametric row's possible actions (a list
of feature maps, of any length) become ``[rows, K, features]`` candidate tensors padded to the
split's longest list, and ``possible_actions`` is then the ``[rows, K]`` mask of real candidates:
the same role the discrete mask plays over the action indices, so that masking, max and the
policies work alike on both. Minibatches are slices of one random permutation, gathered with
tensor indexing, a tensor at a time as a trainer reads it (``Minibatch``): a trainer pays for the
tensors it uses, not for every tensor of the batch schema. ``with_preprocessed`` adds the state
preprocessor's output for the split's states, computed once, which the training driver trains on
(normalization does not change during training; the batch schema's ``*_preprocessed``).

torch is imported where it is used; this module is imported by trainers only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from horizon_engine.errors import HorizonError
from horizon_engine.schema import ActionType, list_entries, map_entries

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from horizon_engine.shards import TimelineShard

PREPROCESS_CHUNK_ROWS = 65_536
"""Rows preprocessed at once by ``TimelineTensors.with_preprocessed``, bounding the memory of
the preprocessor's intermediates on a large split."""


def dense_features(column: pa.Array, feature_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """A feature-map column as ``[rows, len(feature_ids)]`` values and presence (float32).

    Features not in ``feature_ids`` are ignored (normalization decides which features the
    model sees); a null map is a row without features.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    parents, keys, values = map_entries(column)
    position = pc.index_in(keys, value_set=pa.array(list(feature_ids), pa.string()))
    known = ~position.is_null().to_numpy(zero_copy_only=False)
    columns = position.to_numpy(zero_copy_only=False)[known].astype(np.int64)
    rows = parents[known]
    dense = np.zeros((len(column), len(feature_ids)), dtype=np.float32)
    presence = np.zeros_like(dense)
    dense[rows, columns] = values.to_numpy(zero_copy_only=False)[known]
    presence[rows, columns] = 1.0
    return dense, presence


def candidate_features(
    column: pa.Array, feature_ids: Sequence[str], width: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list-of-feature-maps column (each row's candidate actions) as ``[rows, K, features]``
    values and presence and the ``[rows, K]`` mask of real candidates (float32).

    ``K`` is the longest list, at least ``width`` (1: every row has a slot to mask; a streamed
    split passes the whole split's longest, so that its batches have the in-memory shapes); a
    null or empty list (a terminal row's next actions, or ones not recorded) is a row of masked
    slots.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        column = pc.fill_null(column, pa.scalar([], type=column.type))
    parents, maps = list_entries(column)
    offsets = column.offsets.to_numpy(zero_copy_only=False)
    counts = np.diff(offsets)
    width = max(int(counts.max()) if len(counts) else 0, width)
    slots = np.arange(len(parents)) - np.repeat(offsets[:-1] - offsets[0], counts)
    values, presence = dense_features(maps, feature_ids)
    shape = (len(column), width, len(feature_ids))
    dense = np.zeros(shape, dtype=np.float32)
    dense_presence = np.zeros(shape, dtype=np.float32)
    mask = np.zeros(shape[:2], dtype=np.float32)
    dense[parents, slots] = values
    dense_presence[parents, slots] = presence
    mask[parents, slots] = 1.0
    return dense, dense_presence, mask


def _candidate_tensors(
    column: pa.Array, feature_ids: Sequence[str], name: str, width: int = 1
) -> dict[str, torch.Tensor]:
    """``candidate_features`` as the tensors named after the column: ``name`` (the mask),
    ``<singular>_features`` and ``<singular>_presence``, e.g. ``possible_action_features``."""
    import torch

    values, presence, mask = candidate_features(column, feature_ids, width)
    singular = name.replace("actions", "action")
    return {
        name: torch.from_numpy(mask),
        f"{singular}_features": torch.from_numpy(values),
        f"{singular}_presence": torch.from_numpy(presence),
    }


def _masks(column: pa.Array, width: int) -> np.ndarray:
    """A list<int8> column of equal-length 0/1 masks as ``[rows, width]`` float32."""
    _, values = list_entries(column)
    flags = values.to_numpy(zero_copy_only=False).astype(np.float32)
    return flags.reshape(len(column), width)


@dataclass
class TimelineTensors:
    """One split of the timeline as tensors; every tensor has the rows as its first axis."""

    state: torch.Tensor
    state_presence: torch.Tensor
    next_state: torch.Tensor
    next_state_presence: torch.Tensor
    reward: torch.Tensor
    not_terminal: torch.Tensor
    time_diff: torch.Tensor
    action_probability: torch.Tensor
    action: torch.Tensor
    next_action: torch.Tensor
    episode_id: torch.Tensor
    step: torch.Tensor
    action_presence: torch.Tensor | None = None
    next_action_presence: torch.Tensor | None = None
    possible_actions: torch.Tensor | None = None
    possible_next_actions: torch.Tensor | None = None
    next_n_rewards: torch.Tensor | None = None
    next_n_time_diffs: torch.Tensor | None = None
    next_n_not_terminal: torch.Tensor | None = None
    next_n_length: torch.Tensor | None = None
    next_n_state: torch.Tensor | None = None
    next_n_state_presence: torch.Tensor | None = None
    next_n_possible_next_actions: torch.Tensor | None = None
    possible_action_features: torch.Tensor | None = None
    possible_action_presence: torch.Tensor | None = None
    possible_next_action_features: torch.Tensor | None = None
    possible_next_action_presence: torch.Tensor | None = None
    next_n_possible_next_action_features: torch.Tensor | None = None
    next_n_possible_next_action_presence: torch.Tensor | None = None
    state_preprocessed: torch.Tensor | None = None
    next_state_preprocessed: torch.Tensor | None = None
    next_n_state_preprocessed: torch.Tensor | None = None
    feature_ids: list[str] = field(default_factory=list)
    action_feature_ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.reward.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by name (the ones this split has)."""
        import torch

        return {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if isinstance(getattr(self, item.name), torch.Tensor)
        }

    def to(self, device: str | torch.device) -> TimelineTensors:
        """The same split on ``device`` (moved once, not per batch)."""
        moved = {name: tensor.to(device) for name, tensor in self.tensors().items()}
        return TimelineTensors(
            **moved, feature_ids=self.feature_ids, action_feature_ids=self.action_feature_ids
        )

    def take(self, index: torch.Tensor) -> TimelineTensors:
        """The rows at ``index``, in that order (a reordering or a subset of the split)."""
        taken = {name: tensor.index_select(0, index) for name, tensor in self.tensors().items()}
        return TimelineTensors(
            **taken, feature_ids=self.feature_ids, action_feature_ids=self.action_feature_ids
        )

    def with_preprocessed(
        self, preprocessor: torch.nn.Module, chunk_rows: int = PREPROCESS_CHUNK_ROWS
    ) -> TimelineTensors:
        """The split with ``<name>_preprocessed``: ``preprocessor``'s output for each of its
        states (``state``, ``next_state`` and, with n-step windows, ``next_n_state``), computed
        once, ``chunk_rows`` rows at a time, without gradient."""
        import torch

        from horizon_engine.batch_schema import PREPROCESSED_STATES

        outputs = {}
        with torch.no_grad():
            for name in PREPROCESSED_STATES:
                values = getattr(self, name)
                if values is None:
                    continue
                chunks = zip(
                    values.split(chunk_rows),
                    getattr(self, f"{name}_presence").split(chunk_rows),
                    strict=True,
                )
                outputs[f"{name}_preprocessed"] = torch.cat(
                    [preprocessor(part, presence) for part, presence in chunks]
                )
        return replace(self, **outputs)

    def minibatches(
        self, batch_size: int, generator: torch.Generator, drop_last: bool = False
    ) -> Iterator[Minibatch]:
        """One epoch of shuffled minibatches: slices of one permutation, each a ``Minibatch``
        that gathers a tensor's rows when it is first read."""
        import torch

        tensors = self.tensors()
        order = torch.randperm(len(self), generator=generator, device="cpu")
        order = order.to(self.reward.device)
        stop = len(self) - len(self) % batch_size if drop_last else len(self)
        for start in range(0, stop, batch_size):
            yield Minibatch(tensors, order[start : start + batch_size])

    def shard(self, rank: int, world: int) -> TimelineTensors | TimelineShard:
        """What rank ``rank`` of ``world`` data-parallel processes trains on: its part of each
        global minibatch (``horizon_engine.shards``); the split itself for one process."""
        from horizon_engine.shards import TimelineShard

        return self if world == 1 else TimelineShard(self, rank, world)


class Minibatch(Mapping[str, "torch.Tensor"]):
    """Rows ``index`` of a split's tensors, a batch as the batch schema names its tensors.

    A tensor's rows are gathered when it is first read, then kept: a trainer that reads 8 of a
    batch's 20 tensors gathers 8 (gathering all of a CartPole batch's was 12% of the default
    network's update at batch 256). Reading one, testing a name (``in``) and iterating the
    names work as on a dict; it is read-only (``dict(batch)`` makes a dict of it, gathering
    every tensor)."""

    __slots__ = ("_index", "_taken", "_tensors")

    def __init__(self, tensors: Mapping[str, torch.Tensor], index: torch.Tensor) -> None:
        self._tensors = tensors
        self._index = index
        self._taken: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        taken = self._taken.get(name)
        if taken is None:
            taken = self._taken[name] = self._tensors[name].index_select(0, self._index)
        return taken

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def load_timeline(
    folder: Path,
    action_type: ActionType,
    feature_ids: Sequence[str],
    action_feature_ids: Sequence[str] = (),
    actions: Sequence[str] = (),
) -> TimelineTensors:
    """Read one split folder (``timeline/train`` or ``timeline/eval``) into tensors.

    ``feature_ids`` and ``action_feature_ids`` come from ``normalization.json``; ``actions``
    (the discrete action names) from ``timeline/timeline.json``.
    """
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(folder).combine_chunks()
    except (OSError, ValueError) as exc:
        raise HorizonError(f"{folder}: cannot read the timeline split: {exc}") from None
    return timeline_tensors(table, action_type, feature_ids, action_feature_ids, actions)


PADDED_COLUMNS = (
    "possible_actions",
    "possible_next_actions",
    "next_n_rewards",
    "next_n_possible_next_actions",
)
"""The list columns whose tensors are padded to the longest list: a streamed split reads them
alone first (``padding_widths``) to pad every batch alike."""


def padding_widths(table: pa.Table, action_type: ActionType) -> dict[str, int]:
    """The widths ``timeline_tensors`` pads ``table``'s lists to, by column: the candidates of
    parametric rows (``possible_actions``, ...) and the n-step window (``next_n_rewards``).
    The widest of a split's row groups are the split's: what the whole split would be padded
    to in memory."""
    import pyarrow as pa

    widths = {}
    for name in PADDED_COLUMNS:
        if name not in table.column_names:
            continue
        if name != "next_n_rewards" and action_type is not ActionType.PARAMETRIC:
            continue
        column = table[name].combine_chunks()
        if name == "next_n_possible_next_actions":
            ends = _window_ends(table["next_n_rewards"].combine_chunks())
            column = list_entries(column)[1].take(pa.array(ends))
        lengths = np.diff(column.offsets.to_numpy(zero_copy_only=False))
        widths[name] = int(lengths.max()) if len(lengths) else 0
    return widths


def timeline_tensors(
    table: pa.Table,
    action_type: ActionType,
    feature_ids: Sequence[str],
    action_feature_ids: Sequence[str] = (),
    actions: Sequence[str] = (),
    widths: Mapping[str, int] | None = None,
) -> TimelineTensors:
    """Rows of a timeline split (a whole split, or a row group of one) as tensors: the one
    conversion the in-memory and the streamed split share. ``widths`` (``padding_widths`` of
    the whole split) pads lists to the split's longest rather than ``table``'s."""
    import torch

    widths = widths or {}
    column = {name: table[name].combine_chunks() for name in table.column_names}
    state, state_presence = dense_features(column["state_features"], feature_ids)
    next_state, next_presence = dense_features(column["next_state_features"], feature_ids)

    def numbers(name: str, dtype: type = np.float32) -> torch.Tensor:
        return torch.from_numpy(column[name].to_numpy(zero_copy_only=False).astype(dtype))

    loaded: dict[str, torch.Tensor] = {
        "state": torch.from_numpy(state),
        "state_presence": torch.from_numpy(state_presence),
        "next_state": torch.from_numpy(next_state),
        "next_state_presence": torch.from_numpy(next_presence),
        "reward": numbers("reward"),
        "not_terminal": numbers("not_terminal"),
        "time_diff": numbers("time_diff"),
        "action_probability": numbers("action_probability"),
        "episode_id": _episode_ids(column["mdp_id"]),
        "step": numbers("sequence_number", np.int64),
    }
    if action_type is ActionType.DISCRETE:
        loaded["action"] = numbers("action", np.int64)
        next_action = column["next_action"].fill_null(-1)
        loaded["next_action"] = torch.from_numpy(next_action.to_numpy().astype(np.int64))
        loaded["possible_actions"] = torch.from_numpy(
            _masks(column["possible_actions"], len(actions))
        )
        loaded["possible_next_actions"] = torch.from_numpy(
            _masks(column["possible_next_actions"], len(actions))
        )
    else:
        for name in ("action", "next_action"):
            values, presence = dense_features(column[name], action_feature_ids)
            loaded[name] = torch.from_numpy(values)
            loaded[f"{name}_presence"] = torch.from_numpy(presence)
    if action_type is ActionType.PARAMETRIC:
        for name in ("possible_actions", "possible_next_actions"):
            width = widths.get(name, 1)
            loaded |= _candidate_tensors(column[name], action_feature_ids, name, width)
    if "next_n_rewards" in column:
        loaded |= _n_step_tensors(column, feature_ids, len(actions), action_feature_ids, widths)
    return TimelineTensors(
        **loaded, feature_ids=list(feature_ids), action_feature_ids=list(action_feature_ids)
    )


def _episode_ids(mdp_ids: pa.Array) -> torch.Tensor:
    """``[rows]`` int64: each row's episode numbered by its ``mdp_id``'s first appearance in
    the split, so that rows of one episode share a number (the batch schema's ``episode_id``)."""
    import pyarrow.compute as pc
    import torch

    encoded = pc.dictionary_encode(mdp_ids)
    return torch.from_numpy(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))


def _n_step_tensors(
    column: dict[str, pa.Array],
    feature_ids: Sequence[str],
    action_count: int,
    action_feature_ids: Sequence[str],
    widths: Mapping[str, int],
) -> dict[str, torch.Tensor]:
    """The n-step arrays, padded to the longest (0 reward, terminal) with their lengths, and
    the state (and possible actions) where each row's n-step window ends, to bootstrap from.
    ``action_count`` is the number of discrete actions (0 otherwise); ``action_feature_ids``
    are the parametric candidates' features; ``widths`` the least widths to pad to."""
    import pyarrow as pa
    import torch

    rewards = column["next_n_rewards"]
    offsets = rewards.offsets.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    width = max(int(lengths.max()) if len(lengths) else 0, widths.get("next_n_rewards", 0))
    rows = np.repeat(np.arange(len(rewards)), lengths)
    steps = np.arange(offsets[-1] - offsets[0]) - np.repeat(offsets[:-1] - offsets[0], lengths)
    last = pa.array(_window_ends(rewards))

    def padded(name: str, dtype: type) -> torch.Tensor:
        _, values = list_entries(column[name])
        dense = np.zeros((len(rewards), width), dtype=dtype)
        dense[rows, steps] = values.to_numpy(zero_copy_only=False)
        return torch.from_numpy(dense)

    _, end_states = list_entries(column["next_n_state_features"])
    end_state, end_presence = dense_features(end_states.take(last), feature_ids)
    tensors = {
        "next_n_rewards": padded("next_n_rewards", np.float32),
        "next_n_time_diffs": padded("next_n_time_diffs", np.float32),
        "next_n_not_terminal": padded("next_n_not_terminal", np.float32),
        "next_n_length": torch.from_numpy(lengths.astype(np.int64)),
        "next_n_state": torch.from_numpy(end_state),
        "next_n_state_presence": torch.from_numpy(end_presence),
    }
    if "next_n_possible_next_actions" in column:
        _, ends = list_entries(column["next_n_possible_next_actions"])
        name = "next_n_possible_next_actions"
        if action_count:
            tensors[name] = torch.from_numpy(_masks(ends.take(last), action_count))
        elif action_feature_ids:
            width = widths.get(name, 1)
            tensors |= _candidate_tensors(ends.take(last), action_feature_ids, name, width)
    return tensors


def _window_ends(rewards: pa.ListArray) -> np.ndarray:
    """The position, among a list column's entries, of each row's n-step window's last step."""
    offsets = rewards.offsets.to_numpy(zero_copy_only=False)
    return offsets[1:] - offsets[0] - 1
