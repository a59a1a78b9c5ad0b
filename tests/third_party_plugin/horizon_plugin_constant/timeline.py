"""The ``one_step`` timeline engine: one-step transitions of discrete decisions, with pyarrow.

A smaller engine than the built-in ``local`` one, for data that needs no more: it pairs each
logged decision with the next one of its episode and builds no n-step windows (``n_step`` 1).
It takes the ``[timeline]`` options such data uses (``actions``, ``add_terminal_state_row``,
``eval_fraction``) and refuses the others when the config is loaded, so a pipeline never gets
a different table than it asked for. Where both engines apply it writes the same table as
``local`` with ``n_step = 1``: the same columns, rows and train/eval split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Self

from pydantic import model_validator

from horizon_engine import (
    BAD_ROWS_SHOWN,
    ActionType,
    BadRow,
    HorizonError,
    TimelineConfig,
    TimelineEngine,
    TimelineResult,
    eval_split_value,
    timeline_schema,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from horizon_engine import RunContext

REJECTION_REASONS = {
    "unknown_action": "action or possible_actions name an action not in [timeline] actions",
    "missing_reward": "no 'reward' (engine 'one_step' does not compute it from metrics)",
}
"""Why a row is rejected, by kind: the kinds the ``local`` engine counts such rows under."""


class OneStepTimelineConfig(TimelineConfig):
    """``[timeline]`` for ``engine = "one_step"``: the shared options, less those it lacks."""

    @model_validator(mode="after")
    def _supported(self) -> Self:
        unsupported = {
            "reward": self.reward is not None,
            "outlier_episode_length_percentile": self.outlier_episode_length_percentile is not None,
            "time_window_limit": self.time_window_limit is not None,
            "n_step": self.n_step not in (None, 1),
        }
        named = [option for option, given in unsupported.items() if given]
        if named:
            raise ValueError(
                f"engine 'one_step' does not support {', '.join(named)}; "
                "use engine = 'local' for them"
            )
        return self


class OneStepTimeline(TimelineEngine):
    """Pairs each discrete decision with its episode's next one (no n-step windows)."""

    name = "one_step"
    Config = OneStepTimelineConfig
    config: OneStepTimelineConfig

    def build(
        self,
        run: RunContext,
        rows: Path,
        output: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> TimelineResult:
        """Reject the rows it cannot use, sort the others by (episode, step), pair each with
        the next, drop what the options drop, and write the train and eval splits."""
        import numpy as np
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if action_type is not ActionType.DISCRETE:
            raise HorizonError(
                f"[timeline] engine = 'one_step' builds discrete actions, and the rows' are "
                f"{action_type.value}; use engine = 'local'"
            )
        table = pq.read_table(rows).combine_chunks()
        action, masks, kinds = self._actions(table)
        bad_rows = _rejected_rows(rows, table, kinds, quarantine, output)
        kept = np.flatnonzero(kinds == "")
        by_episode = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
        order = kept[pc.sort_indices(table.take(kept), sort_keys=by_episode).to_numpy()]
        table, action, masks = table.take(order), action[order], masks[order]

        episodes = pc.dictionary_encode(table["mdp_id"].combine_chunks())
        codes = episodes.indices.to_numpy()
        has_next = np.append(codes[1:] == codes[:-1], False)
        keep = np.ones(table.num_rows, dtype=bool)
        dropped: dict[str, int] = {}
        truncated = table["truncated"].fill_null(False).to_numpy(zero_copy_only=False)
        _drop(keep, truncated.astype(bool) & ~has_next, "truncated", dropped)
        if not self.config.add_terminal_state_row:
            _drop(keep, ~has_next, "terminal_row", dropped)

        fraction = self.config.eval_fraction
        names = episodes.dictionary.to_pylist()
        held_out = np.array([eval_split_value(run.seed, name) < fraction for name in names])
        is_eval = held_out[codes]
        splits = {"train": keep & ~is_eval, "eval": keep & is_eval}
        timeline = _transitions(table, action, masks, has_next)
        for split, chosen in splits.items():
            (output / split).mkdir()
            pq.write_table(timeline.filter(chosen), output / split / "part-00000.parquet")
        rejected, counts = np.unique(kinds[kinds != ""], return_counts=True)
        return TimelineResult(
            rows_in=len(kinds),
            train_rows=int(splits["train"].sum()),
            eval_rows=int(splits["eval"].sum()),
            train_episodes=len(np.unique(codes[splits["train"]])),
            eval_episodes=len(np.unique(codes[splits["eval"]])),
            dropped=dropped,
            rejected={str(kind): int(count) for kind, count in zip(rejected, counts, strict=True)},
            examples=bad_rows[:BAD_ROWS_SHOWN],
            n_step=1,
        )

    def _actions(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's action index, its possible-action mask ``[rows, actions]`` (every action
        where none were recorded), and each row's rejection kind ("" for a row kept)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        names = pa.array(self.config.actions or [], pa.string())
        index = pc.index_in(table["action"], value_set=names)
        possible = table["possible_actions"].combine_chunks()
        parents = pc.list_parent_indices(possible).to_numpy()
        slots = pc.index_in(pc.list_flatten(possible), value_set=names)
        known = ~slots.is_null().to_numpy(zero_copy_only=False)
        masks = np.zeros((table.num_rows, len(names)), dtype=np.int8)
        recorded = pc.fill_null(pc.list_value_length(possible), 0).to_numpy() > 0
        masks[~recorded] = 1
        masks[parents[known], slots.to_numpy(zero_copy_only=False)[known].astype(int)] = 1

        kinds = np.full(table.num_rows, "", dtype=object)
        kinds[table["reward"].is_null().to_numpy(zero_copy_only=False)] = "missing_reward"
        unknown = index.is_null().to_numpy(zero_copy_only=False)
        unknown[parents[~known]] = True
        kinds[unknown] = "unknown_action"
        return index.fill_null(-1).to_numpy(zero_copy_only=False), masks, kinds


def _rejected_rows(
    rows: Path, table: pa.Table, kinds: np.ndarray, quarantine: bool, output: Path
) -> list[BadRow]:
    """The rejected rows with their reasons (the first few, or all with ``quarantine``, when
    they are also written under ``output/quarantine`` as JSON lines, as the contract asks)."""
    import numpy as np

    positions = np.flatnonzero(kinds != "")
    if not quarantine:
        positions = positions[:BAD_ROWS_SHOWN]
    contents = table.take(positions).to_pylist(maps_as_pydicts="lossy")
    bad_rows = [
        BadRow(f"{rows}:row {position}", REJECTION_REASONS[kinds[position]], kinds[position], row)
        for position, row in zip(positions.tolist(), contents, strict=True)
    ]
    if quarantine and bad_rows:
        (output / "quarantine").mkdir()
        with (output / "quarantine" / "part-00000.jsonl").open("w", encoding="utf-8") as handle:
            for bad in bad_rows:
                record = {"location": bad.location, "kind": bad.kind, "reason": bad.reason}
                handle.write(json.dumps({**record, "row": bad.row}, default=str) + "\n")
    return bad_rows


def _drop(keep: np.ndarray, rows: np.ndarray, reason: str, dropped: dict[str, int]) -> None:
    """Drop the ``rows`` still kept, counting them under ``reason``."""
    newly = rows & keep
    if newly.any():
        dropped[reason] = int(newly.sum())
    keep[newly] = False


def _transitions(
    table: pa.Table, action: np.ndarray, masks: np.ndarray, has_next: np.ndarray
) -> pa.Table:
    """The timeline table (``timeline_schema`` with n_step 1) of episode-sorted rows.

    Next-row columns are one ``take`` each: row i's next row is i + 1 where the episode goes
    on; an episode's last row points one past the end, at an appended empty value (no next
    state, no possible next action, a null next action).
    """
    import numpy as np
    import pyarrow as pa

    count = table.num_rows
    positions = np.arange(count)
    following = np.where(has_next, positions + 1, count)
    first = np.ones(count, dtype=bool)
    first[1:] = ~has_next[:-1]
    starts = np.flatnonzero(first)[np.cumsum(first) - 1]
    sequence = table["sequence_number"].to_numpy()
    states = table["state_features"].combine_chunks()
    no_state = pa.array([[]], type=states.type)
    no_actions = np.zeros((1, masks.shape[1]), dtype=np.int8)
    columns = {
        name: table[name]
        for name in ("ds", "mdp_id", "sequence_number", "state_features", "reward", "metrics")
    }
    columns |= {
        "action_probability": table["action_probability"],
        "action": pa.array(action),
        "possible_actions": _mask_lists(masks),
        "sequence_number_ordinal": pa.array(positions - starts + 1),
        "time_since_first": pa.array(sequence - sequence[starts]),
        "next_state_features": pa.concat_arrays([states, no_state]).take(following),
        "next_action": pa.array(np.append(action, -1)[following], mask=~has_next),
        "time_diff": pa.array(np.where(has_next, np.append(sequence, 0)[following] - sequence, 0)),
        "not_terminal": pa.array(has_next),
        "possible_next_actions": _mask_lists(np.vstack([masks, no_actions])[following]),
    }
    schema = timeline_schema(ActionType.DISCRETE, 1)
    return pa.Table.from_arrays(
        [columns[field.name].cast(field.type) for field in schema], schema=schema
    )


def _mask_lists(masks: np.ndarray) -> pa.Array:
    """A ``[rows, actions]`` 0/1 matrix as the timeline's ``list<int8>`` column."""
    import numpy as np
    import pyarrow as pa

    rows, width = masks.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(masks.ravel(), pa.int8()))
