"""The Timeline transform's contract, shared by every engine that builds it.

Horizon's Timeline job turns logged decisions into the rows RL training needs. Engines (the
built-in local one, the Spark plugin's) subclass ``TimelineEngine`` and must build the same
table; this module holds what makes that possible: the one config model, the output schema,
and the train/eval split, defined by a hash any engine can compute.

Semantics, per episode (``mdp_id``) ordered by ``sequence_number``:

- ``next_state_features``, ``next_action``, ``possible_next_actions``: the next row's values;
- ``sequence_number_ordinal``: 1-based rank; ``time_diff``: next sequence_number - this one;
  ``time_since_first``: sequence_number - the episode's first;
- the last row of an episode is terminal: with ``add_terminal_state_row`` it is kept with an
  empty next state, a null ``next_action``, ``possible_next_actions`` all zero (discrete) or
  empty (parametric), ``time_diff`` 0 and ``not_terminal`` false; otherwise it is dropped;
- unless that last row says ``truncated = true`` (a time limit cut the episode short, as
  ``horizon gym collect`` logs it): then the episode did not end, its next state was never
  observed, and the row is dropped (counted as ``truncated``), so no terminal row is made for
  it; the row before it keeps its real next state and stays non-terminal, and n-step windows
  stop before it. ``truncated`` on any other row is ignored, and rows without the field
  (Horizon's) keep Horizon's meaning;
- ``reward`` is ``dot(metrics, weights)`` when ``reward`` weights are configured (a metric a
  row lacks counts as 0), else the logged reward; ``metrics`` is kept;
- discrete actions become indices into ``actions``; ``possible_actions`` become 0/1 masks over
  ``actions`` (a row without ``possible_actions``, or with an empty list, did not record them
  and may take any action, as the row checks treat it);
- ``outlier_episode_length_percentile`` drops episodes longer than that percentile (linear
  interpolation, as numpy's and Spark's exact ``percentile``) of episode length;
  ``time_window_limit`` drops rows with ``time_since_first`` above it. Both are applied after
  the next-row columns are computed, so a kept row keeps its real next state;
- ``n_step = k > 1`` (by default 3, ``DEFAULT_N_STEP``) adds, for j = 0..k-1 while the
  episode lasts, the values of row t+j:
  ``next_n_rewards``, ``next_n_time_diffs``, ``next_n_state_features``, ``next_n_not_terminal``
  and (discrete, parametric) ``next_n_possible_next_actions``, so n-step returns can be
  computed for any gamma at training time;
- the train/eval split is by episode: ``eval_split_value(seed, mdp_id) < eval_fraction``.

Rows are written sorted by (mdp_id, sequence_number) to ``timeline/train`` and
``timeline/eval`` (any number of Parquet files each), with ``timeline/timeline.json`` describing
them.
"""

from __future__ import annotations

import hashlib
import json
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from horizon_engine.components import Component, ComponentConfig, DistinctNames, MetricWeights

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np
    import pyarrow as pa

    from horizon_engine.run_context import RunContext
    from horizon_engine.schema import ActionType, BadRow

N_STEP_COLUMNS = (
    "next_n_rewards",
    "next_n_time_diffs",
    "next_n_state_features",
    "next_n_not_terminal",
    "next_n_possible_next_actions",
)
"""The n-step array columns, in schema order; the last one only for discrete and parametric."""

DEFAULT_N_STEP = 3
"""The n-step window of a timeline whose ``n_step`` is not set. The Q-learning trainers' default
takes the timeline's window, and 3-step returns learned offline CartPole from random play
better than one step, with CQL and without (measured: docs/measurements.md#timeline_n_step)."""

TIMELINE_INFO = "timeline.json"
"""The file beside ``train/`` and ``eval/`` saying what the Parquet files hold."""


class TimelineConfig(ComponentConfig):
    """The ``[timeline]`` section, the same for every engine."""

    actions: DistinctNames | None = Field(default=None, min_length=1)
    """Discrete action names; the index of a name is the action's number in the timeline."""
    reward: MetricWeights | None = None
    """Metric weights: reward = dot(metrics, weights). None keeps the logged reward."""
    add_terminal_state_row: bool = True
    """Keep each episode's last row as a terminal transition (else drop it)."""
    outlier_episode_length_percentile: float | None = Field(default=None, gt=0, le=100)
    """Drop episodes longer than this percentile of episode length."""
    time_window_limit: int | None = Field(default=None, ge=0)
    """Keep only rows whose time_since_first is at most this."""
    n_step: int | None = Field(default=None, ge=1)
    """Add arrays of the next n rows' rewards, next states and time_diffs (1 = none). Not set:
    3 (``DEFAULT_N_STEP``) for logged decisions, none for Horizon's timeline rows, which
    cannot hold them; the trainers' default n_step follows whichever was built."""
    eval_fraction: float = Field(default=0.1, ge=0, lt=1)
    """Share of episodes held out for evaluation, chosen by a hash of mdp_id and the seed."""

    @property
    def window(self) -> int:
        """The n-step window to build from pre-timeline rows."""
        return DEFAULT_N_STEP if self.n_step is None else self.n_step


@dataclass
class TimelineResult:
    """What an engine reports after writing the timeline."""

    rows_in: int
    train_rows: int
    eval_rows: int
    train_episodes: int
    eval_episodes: int
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows the configured filters dropped, by reason (outlier_episode, time_window, ...)."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Rows the transform could not use (unknown_action, missing_reward), by kind."""
    examples: list[BadRow] = field(default_factory=list)
    """The first rejected rows (at most ``BAD_ROWS_SHOWN``), for the error message."""
    n_step: int | None = None
    """The n-step window the rows were built with (1: none); None leaves it to the config."""


class TimelineEngine(Component):
    """Builds the timeline table from validated pre-timeline rows (``source/rows.parquet``).

    Registered through ``horizon_register_timeline_engines``; its ``name`` is what
    ``[timeline] engine`` selects (``local``, ``spark``)."""

    family = "timeline_engines"
    Config: ClassVar[type[ComponentConfig]] = TimelineConfig

    @abstractmethod
    def build(
        self,
        run: RunContext,
        rows: Path,
        output: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> TimelineResult:
        """Write ``output/train`` and ``output/eval``; ``output`` is a fresh temporary folder.

        Rows the transform cannot use (an action not in ``actions``, no reward) are left out
        and counted in ``rejected`` with a few ``examples``; with ``quarantine`` they are also
        written, with their reasons, under ``output/quarantine`` (JSON lines). Without it the
        stage stops the run when any were rejected, so an engine may skip writing them.
        """


def timeline_schema(action_type: ActionType, n_step: int) -> pa.Schema:
    """The schema every engine writes: Horizon's timeline columns, then the n-step arrays."""
    import pyarrow as pa

    from horizon_engine.schema import FEATURES, ActionType, RowFormat, RowLayout

    schema = RowLayout(RowFormat.TIMELINE, action_type).schema
    if n_step <= 1:
        return schema
    extra = [
        pa.field("next_n_rewards", pa.list_(pa.float64())),
        pa.field("next_n_time_diffs", pa.list_(pa.int64())),
        pa.field("next_n_state_features", pa.list_(FEATURES)),
        pa.field("next_n_not_terminal", pa.list_(pa.bool_())),
    ]
    if action_type is not ActionType.CONTINUOUS:
        possible = schema.field("possible_next_actions").type
        extra.append(pa.field("next_n_possible_next_actions", pa.list_(possible)))
    return pa.schema([*schema, *extra], metadata=schema.metadata)


def eval_split_value(seed: int, mdp_id: str) -> float:
    """A number in [0, 1) fixed by the seed and the episode id; below eval_fraction = eval.

    The first 8 hex digits of md5("<seed>:<mdp_id>"), so Spark computes the same value with
    ``conv(substr(md5(...), 1, 8), 16, 10) / 2**32``. One hash decides both splits, so they are
    disjoint by construction (Horizon used two independent hashes, which let them overlap).
    """
    digest = hashlib.md5(f"{seed}:{mdp_id}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16) / 2**32


@dataclass(frozen=True)
class TimelineInfo:
    """What ``timeline/timeline.json`` records about the Parquet files beside it."""

    action_type: str
    actions: list[str] | None
    n_step: int
    engine: str
    train_rows: int
    eval_rows: int

    def write(self, folder: Path) -> None:
        (folder / TIMELINE_INFO).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, folder: Path) -> TimelineInfo:
        """``folder``'s ``timeline.json``, checked field by field: a run folder may come from
        elsewhere, so a missing, unknown or ill-typed field is a ``HorizonError`` naming the
        file and the field, never a half-read record."""
        from horizon_engine.errors import HorizonError

        path = folder / TIMELINE_INFO
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise HorizonError(f"{path}: no timeline here; run the timeline stage") from None
        except (OSError, ValueError, RecursionError) as exc:
            raise HorizonError(f"{path}: not a timeline's description ({exc})") from None
        if not isinstance(record, dict):
            raise HorizonError(f"{path}: not a timeline's description (expected an object)")
        problems = [f"unknown field {key!r}" for key in record if key not in _INFO_FIELDS]
        for key, (kind, valid) in _INFO_FIELDS.items():
            if key not in record:
                problems.append(f"no {key!r}")
            elif not valid(record[key]):
                problems.append(f"{key!r} is not {kind}: {record[key]!r}")
        if problems:
            raise HorizonError(f"{path}: {'; '.join(problems)}")
        return cls(**record)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_INFO_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "action_type": (
        "discrete, parametric or continuous",
        lambda value: value in ("discrete", "parametric", "continuous"),
    ),
    "actions": (
        "null or a list of action names",
        lambda value: (
            value is None
            or (isinstance(value, list) and all(isinstance(name, str) for name in value))
        ),
    ),
    "n_step": ("a window of 1 or more steps", lambda value: _count(value) and value >= 1),
    "engine": ("an engine's name", lambda value: isinstance(value, str) and bool(value)),
    "train_rows": ("a count of rows", _count),
    "eval_rows": ("a count of rows", _count),
}
"""``timeline.json``'s fields: what each must be, and the check."""


def weighted_reward(metrics: pa.Array, weights: dict[str, float]) -> np.ndarray:
    """``dot(metrics, weights)`` per row, a metric a row lacks (or holds as null) counting as 0.

    Summed in the order of ``weights``, starting from 0.0, so that every engine adds the same
    terms in the same order and gets the same float.
    """
    import numpy as np

    from horizon_engine.schema import map_entries

    parents, keys, values = map_entries(metrics)
    keys = np.asarray(keys.to_numpy(zero_copy_only=False), dtype=object)
    values = values.fill_null(0.0).to_numpy(zero_copy_only=False)
    reward = np.zeros(len(metrics), dtype=np.float64)
    for name, weight in weights.items():
        metric = np.zeros(len(metrics), dtype=np.float64)
        chosen = keys == name
        metric[parents[chosen]] = values[chosen]
        reward = reward + metric * weight
    return reward


def eval_episodes(seed: int, mdp_ids: Iterable[str], eval_fraction: float) -> np.ndarray:
    """Which of the given episodes go to the eval split (a boolean per id).

    ``eval_split_value`` of each id, computed for many at once: the hash of the seed's prefix
    is copied rather than redone, and the first 4 bytes of each digest (its first 8 hex
    digits) are read as one big-endian array, in about half the time for an episode of one
    row (contextual bandits: one hash per row).
    """
    import numpy as np

    prefix = hashlib.md5(f"{seed}:".encode(), usedforsecurity=False)
    digests = []
    for mdp_id in mdp_ids:
        digest = prefix.copy()
        digest.update(mdp_id.encode())
        digests.append(digest.digest()[:4])
    values = np.frombuffer(b"".join(digests), dtype=">u4") / 2**32
    return values < eval_fraction


def episode_order(mdp_ids: pa.Array, sequence_numbers: np.ndarray) -> np.ndarray:
    """Row order sorting by (mdp_id, sequence_number), mdp_id compared as a string.

    mdp_id is dictionary-encoded and the dictionary ranked once, so the sort is over integers
    rather than a string sort of every row.
    """
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(mdp_ids)
    rank = pc.rank(encoded.dictionary, sort_keys="ascending").to_numpy(zero_copy_only=False)
    return sort_episodes(rank[encoded.indices.to_numpy()], sequence_numbers)


def sort_episodes(episode_rank: np.ndarray, sequence_numbers: np.ndarray) -> np.ndarray:
    """Order by (episode rank, sequence number): one int64 key when both fit, else lexsort.

    (mdp_id, sequence_number) is unique in validated rows, so every sort of the unique key
    gives the same order, and several times faster than a two-key lexsort.
    """
    import numpy as np

    if not len(sequence_numbers):
        return np.zeros(0, dtype=np.int64)
    low = int(sequence_numbers.min())
    span = int(sequence_numbers.max()) - low + 1
    if int(episode_rank.max()) * span + span < 2**63:
        keys = episode_rank.astype(np.int64)  # a copy, changed in place: fewer temporaries
        keys *= span
        keys += sequence_numbers - low
        return _radix_argsort(keys)
    return np.lexsort((sequence_numbers, episode_rank))


def _radix_argsort(keys: np.ndarray) -> np.ndarray:
    """The order sorting non-negative int64 ``keys``, 16 bits at a time from the lowest.

    numpy's stable sort of 16-bit integers is a radix sort, so each pass is linear in the rows,
    and keys of up to 32 bits (a million episodes of up to 4,000 steps) take two passes: a
    third of ``argsort``'s time at 10^6 shuffled keys and under half at 10^7 (2 cores, loaded),
    where a comparison sort's n log n and its random reads grow faster than the rows.
    """
    import numpy as np

    order = None
    for shift in range(0, max(int(keys.max()).bit_length(), 1), 16):
        digits = (keys if order is None else keys[order]) >> shift
        step = np.argsort(digits.astype(np.uint16), kind="stable")
        order = step if order is None else order[step]
    return order


PART_ROWS = 250_000
"""Rows per Parquet file: files are built and written in parallel, one thread per core."""

ROW_GROUP_ROWS = 65_536
"""Rows per row group: a file is built and written a row group at a time, so what a thread
holds is one row group's columns, and the memory of one serves the next."""


def write_split(
    rows_at: Callable[[np.ndarray], pa.Table],
    train: np.ndarray,
    evaluation: np.ndarray,
    output: Path,
) -> None:
    """Write the rows at the ``train`` and ``evaluation`` positions, in that order, as Parquet.

    ``rows_at(positions)`` builds the table of those rows. Each split is cut into files of
    about ``PART_ROWS`` rows (at least one, so an empty split still has a file with the
    schema), written on a thread pool, since Parquet encoding is single-threaded per file and
    releases the GIL; a file is built and written in row groups of ``ROW_GROUP_ROWS``.
    Dictionary encoding is kept for the repetitive id columns only, and min/max statistics
    for the flat columns, where they serve row-group filtering; for the nested feature
    columns both cost time and serve little.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    jobs = []
    for split, positions in (("train", train), ("eval", evaluation)):
        (output / split).mkdir()
        parts = max(1, -(-len(positions) // PART_ROWS))
        for number, chunk in enumerate(np.array_split(positions, parts)):
            jobs.append((output / split / f"part-{number:05d}.parquet", chunk))

    def write(job: tuple[Path, np.ndarray]) -> None:
        # The file is opened here, not by the writer: a writer whose close fails (a full disk)
        # leaves the file it opened open, and a deleted file's space is not freed while it is,
        # so the manifest could not record the failure.
        path, positions = job
        groups = max(1, -(-len(positions) // ROW_GROUP_ROWS))
        writer = None
        with pa.OSFile(str(path), "wb") as sink:
            try:
                for group in np.array_split(positions, groups):
                    table = rows_at(group)
                    if writer is None:
                        flat = [field.name for field in table.schema if not _is_nested(field.type)]
                        writer = pq.ParquetWriter(
                            sink,
                            table.schema,
                            use_dictionary=["ds", "mdp_id"],
                            write_statistics=flat,
                        )
                    writer.write_table(table)
            finally:
                if writer is not None:
                    writer.close()

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(write, jobs))


def _is_nested(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_nested(data_type)


def split_timeline_rows(
    rows: Path, output: Path, config: TimelineConfig, seed: int
) -> TimelineResult:
    """Split rows that are timeline rows already (Horizon's output) into train and eval.

    Only the configured reward weights apply; next-row columns are the logger's. n-step arrays
    need the episode's rows in order, which Horizon's output does not promise, so they are
    refused here.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from horizon_engine.errors import HorizonError

    if config.n_step is not None and config.n_step > 1:
        raise HorizonError(
            f"[timeline] n_step = {config.n_step}: the source rows are timeline rows already "
            "and have no n-step arrays; give pre-timeline rows, or n_step = 1"
        )
    table = pq.read_table(rows).combine_chunks()
    sequence_numbers = table["sequence_number"].to_numpy()
    order = episode_order(table["mdp_id"].combine_chunks(), sequence_numbers)
    table = table.take(pa.array(order))
    if config.reward is not None:
        reward = weighted_reward(table["metrics"].combine_chunks(), config.reward)
        table = table.set_column(
            table.schema.get_field_index("reward"), table.schema.field("reward"), pa.array(reward)
        )
    encoded = pc.dictionary_encode(table["mdp_id"]).combine_chunks()
    episodes = encoded.dictionary.to_pylist()
    eval_episode = eval_episodes(seed, episodes, config.eval_fraction)
    is_eval = eval_episode[encoded.indices.to_numpy()]
    train, evaluation = np.flatnonzero(~is_eval), np.flatnonzero(is_eval)
    write_split(lambda positions: table.take(positions), train, evaluation, output)
    return TimelineResult(
        rows_in=table.num_rows,
        train_rows=len(train),
        eval_rows=len(evaluation),
        train_episodes=int((~eval_episode).sum()),
        eval_episodes=int(eval_episode.sum()),
        n_step=1,
    )
