"""The local Timeline engine: pyarrow and numpy, in-process, the embedded default.

Every step is a whole-column operation: one sort of the rows by (episode, sequence number),
then next-row columns as ``take`` with shifted indices, episode boundaries and filters as
numpy masks, and n-step arrays as list arrays over a flat index. No Python runs per row,
which is what lets it build millions of rows a second on one core. The semantics are those of
``horizon_engine.timeline``; the Spark engine builds the same table.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from horizon_engine.errors import BAD_ROWS_SHOWN
from horizon_engine.hookspecs import hookimpl
from horizon_engine.schema import ActionType, BadRow, list_entries
from horizon_engine.timeline import (
    TimelineConfig,
    TimelineResult,
    TimelineTransform,
    eval_episodes,
    sort_episodes,
    timeline_schema,
    weighted_reward,
    write_split,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from horizon_engine.run_context import RunContext


@dataclass
class _Rejections:
    """Rows the transform cannot use, collected column-wise before they are removed."""

    mask: np.ndarray
    kinds: np.ndarray
    reasons: dict[int, str]

    @classmethod
    def none(cls, rows: int) -> _Rejections:
        return cls(np.zeros(rows, dtype=bool), np.full(rows, "", dtype=object), {})

    def add(self, rows: np.ndarray, kind: str, reason: Callable[[int], str]) -> None:
        for row in np.flatnonzero(rows & ~self.mask):
            self.reasons[int(row)] = reason(int(row))
        self.kinds[rows & ~self.mask] = kind
        self.mask |= rows


class LocalTimeline(TimelineTransform):
    """Builds the timeline in-process with pyarrow and numpy (the default engine)."""

    engine = "local"
    Config = TimelineConfig
    config: TimelineConfig

    def build(
        self,
        run: RunContext,
        rows: Path,
        output: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> TimelineResult:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        config = self.config
        # One chunk per column: Arrow's take on a many-chunked column resolves chunks per row.
        table = pq.read_table(rows, memory_map=True).combine_chunks()
        rejections = _Rejections.none(table.num_rows)
        reward = self._reward(table, rejections)
        actions = (
            self._discrete_actions(table, rejections)
            if action_type is ActionType.DISCRETE
            else None
        )
        examples = self._examples(rows, table, rejections, quarantine, output)
        kinds, counts = np.unique(rejections.kinds[rejections.mask], return_counts=True)

        encoded = pc.dictionary_encode(_single_array(table["mdp_id"]))
        codes = encoded.indices.to_numpy()
        rank = pc.rank(encoded.dictionary, sort_keys="ascending").to_numpy(zero_copy_only=False)
        sequence = table["sequence_number"].to_numpy()
        kept = np.flatnonzero(~rejections.mask)
        order = kept[sort_episodes(rank[codes[kept]], sequence[kept])]
        episodes = _Episodes.of(codes[order], sequence[order], _truncated(table)[order])
        survives, dropped = self._filters(episodes)
        eval_episode = eval_episodes(run.seed, encoded.dictionary.to_pylist(), config.eval_fraction)
        is_eval = eval_episode[episodes.codes]
        rows_in = table.num_rows
        sorted_actions = actions and _DiscreteActions(actions.index[order], actions.masks[order])
        builder = _TimelineRows(
            _in_episode_order(table, order, action_type),
            action_type,
            config.window,
            episodes,
            reward[order],
            sorted_actions,
        )
        train = np.flatnonzero(survives & ~is_eval)
        evaluation = np.flatnonzero(survives & is_eval)
        write_split(builder.rows_at, train, evaluation, output)
        return TimelineResult(
            rows_in=rows_in,
            train_rows=len(train),
            eval_rows=len(evaluation),
            train_episodes=np.count_nonzero(np.bincount(episodes.codes[train])),
            eval_episodes=np.count_nonzero(np.bincount(episodes.codes[evaluation])),
            dropped=dropped,
            rejected={str(kind): int(count) for kind, count in zip(kinds, counts, strict=True)},
            examples=examples,
            n_step=config.window,
        )

    def _reward(self, table: pa.Table, rejections: _Rejections) -> np.ndarray:
        if self.config.reward is not None:
            return weighted_reward(_single_array(table["metrics"]), self.config.reward)
        logged = _single_array(table["reward"])
        missing = logged.is_null().to_numpy(zero_copy_only=False)
        rejections.add(
            missing,
            "missing_reward",
            lambda row: "no 'reward', and [timeline] has no reward weights to compute it from",
        )
        return logged.fill_null(0.0).to_numpy(zero_copy_only=False)

    def _discrete_actions(self, table: pa.Table, rejections: _Rejections) -> _DiscreteActions:
        """Action names -> indices into ``actions``; possible action names -> 0/1 masks."""
        import pyarrow as pa
        import pyarrow.compute as pc

        actions = self.config.actions or []
        names = pa.array(actions, pa.string())
        logged = _single_array(table["action"])
        index = pc.index_in(logged, value_set=names)
        unknown = index.is_null().to_numpy(zero_copy_only=False)
        rejections.add(
            unknown,
            "unknown_action",
            lambda row: f"action {logged[row].as_py()!r} is not in [timeline] actions {actions}",
        )
        possible = _single_array(table["possible_actions"])
        parents, possible_names = list_entries(possible)
        possible_index = pc.index_in(possible_names, value_set=names)
        unknown_possible = possible_index.is_null().to_numpy(zero_copy_only=False)
        bad_parents = np.zeros(len(possible), dtype=bool)
        bad_parents[parents[unknown_possible]] = True
        rejections.add(
            bad_parents,
            "unknown_action",
            lambda row: (
                f"possible_actions {possible[row].as_py()!r} name an action not in "
                f"[timeline] actions {actions}"
            ),
        )
        masks = np.zeros((len(possible), len(actions)), dtype=np.int8)
        lengths = np.diff(possible.offsets.to_numpy(zero_copy_only=False))
        unrecorded = possible.is_null().to_numpy(zero_copy_only=False) | (lengths == 0)
        masks[unrecorded] = 1
        known = ~unknown_possible
        masks[parents[known], possible_index.to_numpy(zero_copy_only=False)[known].astype(int)] = 1
        return _DiscreteActions(index.fill_null(-1).to_numpy().astype(np.int64), masks)

    def _examples(
        self,
        rows: Path,
        table: pa.Table,
        rejections: _Rejections,
        quarantine: bool,
        output: Path,
    ) -> list[BadRow]:
        """The first rejected rows for the error message; all of them in the quarantine."""
        rejected_rows = np.flatnonzero(rejections.mask)
        if not len(rejected_rows):
            return []
        chosen = rejected_rows if quarantine else rejected_rows[:BAD_ROWS_SHOWN]
        contents = table.take(chosen).to_pylist(maps_as_pydicts="lossy")
        bad_rows = [
            BadRow(f"{rows}:row {row}", rejections.reasons[row], rejections.kinds[row], content)
            for row, content in zip(chosen.tolist(), contents, strict=True)
        ]
        if quarantine:
            folder = output / "quarantine"
            folder.mkdir()
            with (folder / "part-00000.jsonl").open("w", encoding="utf-8") as handle:
                for bad in bad_rows:
                    record = {"location": bad.location, "kind": bad.kind, "reason": bad.reason}
                    handle.write(json.dumps({**record, "row": bad.row}, default=str) + "\n")
        return bad_rows[:BAD_ROWS_SHOWN]

    def _filters(self, episodes: _Episodes) -> tuple[np.ndarray, dict[str, int]]:
        """Rows that survive the outlier, time-window, truncation and terminal-row filters; drops
        by reason."""
        config = self.config
        survives = np.ones(episodes.rows, dtype=bool)
        dropped: dict[str, int] = {}

        def drop(rows: np.ndarray, reason: str) -> None:
            newly = rows & survives
            if newly.any():
                dropped[reason] = int(newly.sum())
            survives[newly] = False

        if config.outlier_episode_length_percentile is not None and episodes.rows:
            limit = np.percentile(episodes.lengths, config.outlier_episode_length_percentile)
            drop(episodes.lengths[episodes.episode] > limit, "outlier_episode")
        if config.time_window_limit is not None:
            drop(episodes.time_since_first > config.time_window_limit, "time_window")
        drop(episodes.cut, "truncated")
        if not config.add_terminal_state_row:
            drop(~episodes.has_next, "terminal_row")
        return survives, dropped


def _in_episode_order(
    table: pa.Table, order: np.ndarray, action_type: ActionType
) -> dict[str, pa.Array]:
    """The input columns the output copies, gathered once into episode order.

    Every later take then reads memory in order (a next row is the neighbour), which is what
    keeps shuffled input fast. Columns are gathered on a thread pool, as Arrow releases the GIL.
    Discrete actions and rewards travel as numpy arrays, so their columns are not gathered.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    names = ["ds", "mdp_id", "state_features", "action_probability", "metrics"]
    if action_type is not ActionType.DISCRETE:
        names.append("action")
    if action_type is ActionType.PARAMETRIC:
        names.append("possible_actions")
    columns = [_single_array(table[name]) for name in names]
    if not np.array_equal(order, np.arange(table.num_rows)):
        indices = pa.array(order)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            columns = list(pool.map(lambda column: column.take(indices), columns))
    return dict(zip(names, columns, strict=True))


@dataclass
class _DiscreteActions:
    """Discrete actions of every input row: index into ``actions`` and the possible-action mask."""

    index: np.ndarray
    masks: np.ndarray


@dataclass
class _Episodes:
    """Episode structure of rows sorted by (mdp_id, sequence_number): per sorted position."""

    codes: np.ndarray
    sequence: np.ndarray
    episode: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    has_next: np.ndarray
    cut: np.ndarray
    """The last row of an episode that a time limit cut short (``truncated``): not terminal,
    and without a next state, so it is dropped and n-step windows end before it."""

    @classmethod
    def of(cls, codes: np.ndarray, sequence: np.ndarray, truncated: np.ndarray) -> _Episodes:
        first = np.ones(len(codes), dtype=bool)
        first[1:] = codes[1:] != codes[:-1]
        starts = np.flatnonzero(first)
        lengths = np.diff(np.append(starts, len(codes)))
        has_next = np.append(~first[1:], False) if len(codes) else first
        cut = truncated & ~has_next
        return cls(codes, sequence, np.cumsum(first) - 1, starts, lengths, has_next, cut)

    @property
    def rows(self) -> int:
        return len(self.sequence)

    @property
    def ordinal(self) -> np.ndarray:
        return np.arange(self.rows) - self.starts[self.episode] + 1

    @property
    def time_since_first(self) -> np.ndarray:
        return self.sequence - self.sequence[self.starts[self.episode]]

    @property
    def time_diff(self) -> np.ndarray:
        time_diff = np.zeros(self.rows, dtype=np.int64)
        time_diff[self.has_next] = np.diff(self.sequence)[self.has_next[:-1]]
        return time_diff


class _TimelineRows:
    """Builds output rows for any set of positions in the episode-sorted input.

    The input is sorted by (mdp_id, sequence_number), so the next row of position p, where the
    episode goes on, is p + 1, and every column is one ``take`` in increasing order.
    """

    def __init__(
        self,
        columns: dict[str, pa.Array],
        action_type: ActionType,
        n_step: int,
        episodes: _Episodes,
        reward: np.ndarray,
        actions: _DiscreteActions | None,
    ) -> None:
        self.columns = columns
        self.action_type = action_type
        self.n_step = n_step
        self.episodes = episodes
        self.reward = reward
        self.actions = actions
        self.schema = timeline_schema(action_type, n_step)
        self.ordinal = episodes.ordinal
        self.time_since_first = episodes.time_since_first
        self.time_diff = episodes.time_diff

    def rows_at(self, positions: np.ndarray) -> pa.Table:
        import pyarrow as pa

        indices = pa.array(positions)
        columns = {
            name: self.columns[name].take(indices)
            for name in ("ds", "mdp_id", "state_features", "action_probability", "metrics")
        }
        columns |= {
            "sequence_number": pa.array(self.episodes.sequence[positions]),
            "reward": pa.array(self.reward[positions]),
            "sequence_number_ordinal": pa.array(self.ordinal[positions]),
            "time_since_first": pa.array(self.time_since_first[positions]),
            "time_diff": pa.array(self.time_diff[positions]),
            "not_terminal": pa.array(self.episodes.has_next[positions]),
            "next_state_features": self._next_states(positions),
        }
        columns |= self._action_columns(positions, indices)
        if self.n_step > 1:
            columns |= self._n_step_columns(positions)
        return pa.Table.from_arrays(
            [columns[field.name].cast(field.type) for field in self.schema], schema=self.schema
        )

    def _following(self, positions: np.ndarray) -> pa.Array:
        """Indices of the next rows; null where the episode ends."""
        import pyarrow as pa

        return pa.array(positions + 1, mask=~self.episodes.has_next[positions])

    def _next_states(self, positions: np.ndarray) -> pa.Array:
        return _empty_where_null(self.columns["state_features"].take(self._following(positions)))

    def _next_masks(self, positions: np.ndarray) -> np.ndarray:
        following = np.minimum(positions + 1, self.episodes.rows - 1)
        masks = self.actions.masks[following]
        masks[~self.episodes.has_next[positions]] = 0
        return masks

    def _action_columns(self, positions: np.ndarray, indices: pa.Array) -> dict[str, pa.Array]:
        import pyarrow as pa

        if self.action_type is ActionType.DISCRETE:
            following = np.minimum(positions + 1, self.episodes.rows - 1)
            return {
                "action": pa.array(self.actions.index[positions]),
                "possible_actions": _masks(self.actions.masks[positions]),
                "next_action": pa.array(
                    self.actions.index[following], mask=~self.episodes.has_next[positions]
                ),
                "possible_next_actions": _masks(self._next_masks(positions)),
            }
        following = self._following(positions)
        columns = {
            "action": self.columns["action"].take(indices),
            "next_action": self.columns["action"].take(following),
        }
        if self.action_type is ActionType.PARAMETRIC:
            possible = self.columns["possible_actions"]
            columns["possible_actions"] = possible.take(indices)
            columns["possible_next_actions"] = _empty_where_null(possible.take(following))
        return columns

    def _n_step_columns(self, positions: np.ndarray) -> dict[str, pa.Array]:
        """Arrays of the values of rows t .. t+n-1 of the episode (fewer near its end)."""
        import pyarrow as pa

        episodes = self.episodes
        # A cut episode's last row is no step of a window: its next state was never observed.
        usable = episodes.lengths - episodes.cut[episodes.starts + episodes.lengths - 1]
        remaining = usable[episodes.episode[positions]] - (self.ordinal[positions] - 1)
        counts = np.minimum(remaining, self.n_step)
        offsets = np.zeros(len(positions) + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        flat = np.repeat(positions, counts) + (
            np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
        )
        arrays = pa.array(offsets)
        columns = {
            "next_n_rewards": pa.array(self.reward[flat]),
            "next_n_time_diffs": pa.array(self.time_diff[flat]),
            "next_n_state_features": self._next_states(flat),
            "next_n_not_terminal": pa.array(episodes.has_next[flat]),
        }
        if self.action_type is ActionType.DISCRETE:
            columns["next_n_possible_next_actions"] = _masks(self._next_masks(flat))
        elif self.action_type is ActionType.PARAMETRIC:
            possible = self.columns["possible_actions"].take(self._following(flat))
            columns["next_n_possible_next_actions"] = _empty_where_null(possible)
        return {name: pa.ListArray.from_arrays(arrays, values) for name, values in columns.items()}


def _truncated(table: pa.Table) -> np.ndarray:
    """Each input row's ``truncated`` flag (false where absent: rows from before the field)."""
    if "truncated" not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    flags = _single_array(table["truncated"]).fill_null(False)
    return flags.to_numpy(zero_copy_only=False).astype(bool)


def _single_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without the copy ``combine_chunks`` makes of a single chunk."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _masks(matrix: np.ndarray) -> pa.Array:
    """An [rows, actions] 0/1 matrix as a list<int8> column."""
    import pyarrow as pa

    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel(), pa.int8()))


def _empty_where_null(array: pa.Array) -> pa.Array:
    """The same map or list column with null entries made empty (a terminal row's values)."""
    import pyarrow as pa

    offsets = array.offsets
    if isinstance(array, pa.MapArray):
        start = offsets[0].as_py()
        length = offsets[-1].as_py() - start
        return pa.MapArray.from_arrays(
            pa.array(offsets.to_numpy() - start),
            array.keys.slice(start, length),
            array.items.slice(start, length),
        )
    _, values = list_entries(array)
    start = offsets[0].as_py()
    return pa.ListArray.from_arrays(pa.array(offsets.to_numpy() - start), values)


@hookimpl
def horizon_register_transforms(register: Callable[[type], None]) -> None:
    register(LocalTimeline)
