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
from typing import TYPE_CHECKING, Any

import numpy as np

from horizon_engine.errors import BAD_ROWS_SHOWN
from horizon_engine.hookspecs import hookimpl
from horizon_engine.schema import ActionType, BadRow, list_entries
from horizon_engine.timeline import (
    TimelineConfig,
    TimelineResult,
    TimelineTransform,
    episode_order,
    eval_episodes,
    timeline_schema,
    weighted_reward,
    write_split,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from horizon_engine.pipeline import RunContext


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
        import pyarrow as pa
        import pyarrow.parquet as pq

        config = self.config
        table = pq.read_table(rows)
        rows_in = table.num_rows
        rejections = _Rejections.none(rows_in)
        reward = self._reward(table, rejections)
        if action_type is ActionType.DISCRETE:
            action, possible = self._discrete_actions(table, rejections)
        else:
            action = table["action"].combine_chunks()
            possible = (
                table["possible_actions"].combine_chunks()
                if action_type is ActionType.PARAMETRIC
                else None
            )
        examples = self._examples(rows, table, rejections, quarantine, output)
        rejected = dict(zip(*np.unique(rejections.kinds[rejections.mask], return_counts=True)))
        keep = ~rejections.mask
        sequence = table["sequence_number"].to_numpy()[keep]
        kept = table.filter(pa.array(keep))
        order = episode_order(kept["mdp_id"], sequence)
        take = pa.array(order)
        columns = {
            name: kept[name].combine_chunks().take(take)
            for name in ("ds", "mdp_id", "state_features", "action_probability", "metrics")
        }
        columns["action"] = action.filter(pa.array(keep)).take(take)
        columns["reward"] = pa.array(reward[keep][order])
        if possible is not None:
            columns["possible_actions"] = possible.filter(pa.array(keep)).take(take)
        episodes = _Episodes.of(columns["mdp_id"], sequence[order])
        columns.update(episodes.next_row_columns(columns, action_type, len(config.actions or [])))
        if config.n_step > 1:
            columns.update(episodes.n_step_columns(columns, config.n_step, action_type))
        survives, dropped = self._filters(episodes)
        schema = timeline_schema(action_type, config.n_step)
        timeline = pa.Table.from_arrays(
            [columns[field.name].cast(field.type) for field in schema], schema=schema
        ).filter(pa.array(survives))
        encoded = episodes.encoded
        eval_episode = eval_episodes(run.seed, encoded.dictionary.to_pylist(), config.eval_fraction)
        is_eval = eval_episode[encoded.indices.to_numpy()][survives]
        train_rows, eval_rows = write_split(timeline, is_eval, output)
        surviving_episodes = np.unique(encoded.indices.to_numpy()[survives])
        eval_count = int(eval_episode[surviving_episodes].sum())
        return TimelineResult(
            rows_in=rows_in,
            train_rows=train_rows,
            eval_rows=eval_rows,
            train_episodes=len(surviving_episodes) - eval_count,
            eval_episodes=eval_count,
            dropped=dropped,
            rejected={str(kind): int(count) for kind, count in rejected.items()},
            examples=examples,
        )

    def _reward(self, table: pa.Table, rejections: _Rejections) -> np.ndarray:
        if self.config.reward is not None:
            return weighted_reward(table["metrics"].combine_chunks(), self.config.reward)
        logged = table["reward"].combine_chunks()
        missing = logged.is_null().to_numpy(zero_copy_only=False)
        rejections.add(
            missing,
            "missing_reward",
            lambda row: "no 'reward', and [timeline] has no reward weights to compute it from",
        )
        return logged.fill_null(0.0).to_numpy(zero_copy_only=False)

    def _discrete_actions(
        self, table: pa.Table, rejections: _Rejections
    ) -> tuple[pa.Array, pa.Array]:
        """Action names -> indices into ``actions``; possible action names -> 0/1 masks."""
        import pyarrow as pa
        import pyarrow.compute as pc

        actions = self.config.actions or []
        names = pa.array(actions, pa.string())
        logged = table["action"].combine_chunks()
        index = pc.index_in(logged, value_set=names)
        unknown = index.is_null().to_numpy(zero_copy_only=False)
        rejections.add(
            unknown,
            "unknown_action",
            lambda row: f"action {logged[row].as_py()!r} is not in [timeline] actions {actions}",
        )
        possible = table["possible_actions"].combine_chunks()
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
        mask = np.zeros((len(possible), len(actions)), dtype=np.int8)
        mask[possible.is_null().to_numpy(zero_copy_only=False)] = 1
        known = ~unknown_possible
        mask[parents[known], possible_index.to_numpy(zero_copy_only=False)[known].astype(int)] = 1
        return index.cast(pa.int64()).fill_null(-1), _masks(mask)

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
            BadRow(
                f"{rows}:row {row}", rejections.reasons[int(row)], rejections.kinds[row], content
            )
            for row, content in zip(chosen, contents, strict=True)
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
        """Rows that survive the outlier, time-window and terminal-row filters; drops by reason."""
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
        if not config.add_terminal_state_row:
            drop(~episodes.has_next, "terminal_row")
        return survives, dropped


@dataclass
class _Episodes:
    """Episode structure of rows sorted by (mdp_id, sequence_number)."""

    encoded: Any
    sequence: np.ndarray
    episode: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    has_next: np.ndarray

    @classmethod
    def of(cls, mdp_ids: pa.Array, sequence: np.ndarray) -> _Episodes:
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(mdp_ids)
        codes = encoded.indices.to_numpy()
        first = np.ones(len(codes), dtype=bool)
        first[1:] = codes[1:] != codes[:-1]
        starts = np.flatnonzero(first)
        lengths = np.diff(np.append(starts, len(codes)))
        has_next = np.append(~first[1:], False)
        return cls(encoded, sequence, np.cumsum(first) - 1, starts, lengths, has_next)

    @property
    def rows(self) -> int:
        return len(self.sequence)

    @property
    def ordinal(self) -> np.ndarray:
        return np.arange(self.rows) - self.starts[self.episode] + 1

    @property
    def time_since_first(self) -> np.ndarray:
        return self.sequence - self.sequence[self.starts[self.episode]]

    def next_row_columns(
        self, columns: dict[str, pa.Array], action_type: ActionType, action_count: int
    ) -> dict[str, pa.Array]:
        """Columns describing the next row of the episode; terminal values on the last row."""
        import pyarrow as pa

        following = pa.array(np.arange(1, self.rows + 1), mask=~self.has_next)
        time_diff = np.zeros(self.rows, dtype=np.int64)
        time_diff[self.has_next] = np.diff(self.sequence)[self.has_next[:-1]]
        result = {
            "sequence_number": pa.array(self.sequence),
            "sequence_number_ordinal": pa.array(self.ordinal),
            "time_since_first": pa.array(self.time_since_first),
            "next_state_features": _empty_where_null(columns["state_features"].take(following)),
            "next_action": columns["action"].take(following),
            "time_diff": pa.array(time_diff),
            "not_terminal": pa.array(self.has_next),
        }
        if action_type is ActionType.DISCRETE:
            masks = _mask_matrix(columns["possible_actions"], action_count)
            next_masks = np.zeros_like(masks)
            next_masks[self.has_next] = masks[1:][self.has_next[:-1]]
            result["possible_next_actions"] = _masks(next_masks)
        elif action_type is ActionType.PARAMETRIC:
            result["possible_next_actions"] = _empty_where_null(
                columns["possible_actions"].take(following)
            )
        return result

    def n_step_columns(
        self, columns: dict[str, pa.Array], n_step: int, action_type: ActionType
    ) -> dict[str, pa.Array]:
        """Arrays of the values of rows t .. t+n-1 of the episode (fewer near its end)."""
        import pyarrow as pa

        remaining = self.lengths[self.episode] - (self.ordinal - 1)
        counts = np.minimum(remaining, n_step)
        offsets = np.zeros(self.rows + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        flat = np.repeat(np.arange(self.rows), counts) + (
            np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
        )
        indices = pa.array(flat)
        pa_offsets = pa.array(offsets)

        def arrays(values: pa.Array) -> pa.Array:
            return pa.ListArray.from_arrays(pa_offsets, values.take(indices))

        sources = {
            "next_n_rewards": columns["reward"],
            "next_n_time_diffs": columns["time_diff"],
            "next_n_state_features": columns["next_state_features"],
            "next_n_not_terminal": columns["not_terminal"],
        }
        if action_type is not ActionType.CONTINUOUS:
            sources["next_n_possible_next_actions"] = columns["possible_next_actions"]
        return {name: arrays(values) for name, values in sources.items()}


def _masks(matrix: np.ndarray) -> pa.Array:
    """An [rows, actions] 0/1 matrix as a list<int8> column."""
    import pyarrow as pa

    rows, width = matrix.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel(), pa.int8()))


def _mask_matrix(masks: pa.Array, width: int) -> np.ndarray:
    """A list<int8> column of equal-length masks back to an [rows, width] matrix."""
    _, values = list_entries(masks)
    return values.to_numpy(zero_copy_only=False).reshape(len(masks), width)


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
