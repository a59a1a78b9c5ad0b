"""The local Timeline engine: pyarrow and numpy, in-process, the embedded default.

Every step is a whole-column operation, and no Python runs per row:

- the rows are ordered by one radix sort of an int64 key (split, episode, sequence number),
  the id columns read as dictionary codes; episode boundaries and filters are numpy masks over
  the sorted positions;
- each split is then one run of sorted positions, written in files of row groups, a file per
  thread; a row group gathers its rows from the input once (with the few after it that its
  next states and n-step windows reach), so next-row columns are shifted slices and n-step
  arrays list arrays over a flat index, and the one random read of a shuffled input is spread
  over the writing threads;
- feature maps with the same keys in every row (dense features) travel as value matrices.

A source whose build would take more than ``[timeline] max_memory_gb`` is built out of core:
cut, a batch at a time, into buckets of whole episodes by ranges of ``mdp_id``, each bucket
then built as above, alone, into the same output (``LocalTimeline._build_buckets``).

The semantics are those of ``horizon_engine.timeline``; the Spark engine builds the same table.
``benchmarks/timeline.py`` measures it against a plain pyarrow/numpy script.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
from pydantic import Field

from horizon_engine import (
    BAD_ROWS_SHOWN,
    FEATURES,
    ActionType,
    BadRow,
    HorizonError,
    Reservoir,
    TimelineConfig,
    TimelineEngine,
    TimelineResult,
    eval_episodes,
    hookimpl,
    rows_as_dicts,
    sort_episodes,
    timeline_schema,
    weighted_reward,
    write_split,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from horizon_engine import RunContext


DROP_REASONS = ("outlier_episode", "time_window", "truncated", "terminal_row")
"""The filters' reasons for dropping a row, in the order the filters apply."""

QUARANTINE_FILE = "part-00000.jsonl"

DEFAULT_MEMORY_SHARE = 0.25
"""Share of the machine's memory a build may take when ``max_memory_gb`` is not set: other
processes (a trainer, Spark, other runs) keep the rest."""

BUILD_MEMORY_PER_SOURCE_BYTE = 8
"""Peak memory a build takes per byte of its rows' uncompressed size in the source's Parquet
metadata, above ``BUILD_MEMORY_FIXED_BYTES``: 6.5 measured for shuffled CartPole rows (4
features, 3-step windows) between 1 and 14 buckets of 10^6 rows, with room for wider rows."""

BUILD_MEMORY_FIXED_BYTES = 256 * 2**20
"""Peak memory a bucketed build takes whatever its buckets' size: a source row group and its
copies while cutting, the write threads' row groups, and what the allocators keep between
buckets (measured: 190 MB)."""


@dataclass
class _Rejections:
    """Rows the transform cannot use: a mask over the input, and each such row's kind and
    reason (the first one found)."""

    mask: np.ndarray
    kinds: dict[int, str]
    reasons: dict[int, str]

    @classmethod
    def none(cls, rows: int) -> _Rejections:
        return cls(np.zeros(rows, dtype=bool), {}, {})

    def add(self, rows: np.ndarray, kind: str, reason: Callable[[int], str]) -> None:
        for row in np.flatnonzero(rows & ~self.mask).tolist():
            self.kinds[row] = kind
            self.reasons[row] = reason(row)
        self.mask |= rows

    def counts(self) -> dict[str, int]:
        """Rejected rows by kind, kinds in alphabetical order."""
        return dict(sorted(Counter(self.kinds.values()).items()))


class LocalTimelineConfig(TimelineConfig):
    """The ``[timeline]`` section for the local engine: the shared fields and its memory."""

    max_memory_gb: float | None = Field(default=None, gt=BUILD_MEMORY_FIXED_BYTES / 2**30)
    """Memory the build may take. A source whose build would need more is cut into buckets of
    whole episodes (by ranges of ``mdp_id``), built one after another into the same output;
    more than 0.25 GB, what a build takes whatever its size (``BUILD_MEMORY_FIXED_BYTES``).
    None: a quarter of this machine's memory (``DEFAULT_MEMORY_SHARE``)."""


class LocalTimeline(TimelineEngine):
    """Builds the timeline in-process with pyarrow and numpy (the default engine)."""

    name = "local"
    Config = LocalTimelineConfig
    config: LocalTimelineConfig

    def __init__(self, config: TimelineConfig) -> None:
        # A caller that builds with any engine holds the shared section (the benchmarks, the
        # parity tests): it is read as this engine's, with the default memory.
        if not isinstance(config, LocalTimelineConfig):
            config = LocalTimelineConfig.model_validate(config.model_dump())
        super().__init__(config)

    def build(
        self,
        run: RunContext,
        rows: Path,
        output: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> TimelineResult:
        import pyarrow.parquet as pq

        # The id columns are read as the dictionary codes the source stage's Parquet holds
        # them as: several times faster than reading their strings, and not hashed again. One
        # chunk per column: Arrow's take on a many-chunked column resolves chunks per row;
        # ParquetFile.read makes one (but one per row group of a dictionary column: combined
        # with their dictionaries unified), where read_table makes one per 128k rows. The file
        # is mapped, not pre-buffered: that would first copy it into fresh memory (at 10^7
        # rows, a quarter of the read's time on this VM).
        buckets = bucket_count(pq.read_metadata(rows), self.config.max_memory_gb)
        if buckets == 1:
            table = _parquet_file(rows, action_type, memory_map=True).read().combine_chunks()
            return self._build_table(run, rows, table, output, action_type, quarantine, None)
        scratch = output / "_buckets"
        scratch.mkdir()
        try:
            return self._build_buckets(run, rows, buckets, scratch, action_type, quarantine)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _build_buckets(
        self,
        run: RunContext,
        rows: Path,
        buckets: int,
        scratch: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> TimelineResult:
        """Build a source larger than the memory allowed: its episodes are cut into buckets by
        ranges of ``mdp_id`` (files under ``scratch``), and each bucket is built alone.

        Ranges rather than hashes of ``mdp_id``: the buckets' outputs, one after the other,
        are then the in-memory build's rows in its order (by split, ``mdp_id``, then
        ``sequence_number``) with no merge. The bounds are quantiles of a seeded sample of the
        rows' ``mdp_id``, so the buckets hold about as many rows each, and the same source
        gives the same bounds in any process on any machine. The checks that reject rows look
        at one row at a time, so they run while the rows are cut, in the source's order: the
        quarantine and the examples are the in-memory build's. Only the outlier filter needs
        every episode: its percentile is taken over the episode lengths of all buckets first.
        """
        output = scratch.parent
        # Not mapped: a mapped file's pages count in the process's memory while it is open.
        file = _parquet_file(rows, action_type, memory_map=False)
        bounds = _bucket_bounds(file, buckets, run.seed)
        paths, rejected = self._partition(rows, file, bounds, scratch, action_type, quarantine)
        length_limit = None
        if self.config.outlier_episode_length_percentile is not None:
            length_limit = self._length_limit(_episode_lengths(paths))
        parts = _SplitParts(output, timeline_schema(action_type, self.config.window))
        results = []
        for path in paths:
            folder = path.with_suffix("")
            folder.mkdir()
            table = _parquet_file(path, action_type, memory_map=False).read().combine_chunks()
            result = self._build_table(
                run, rows, table, folder, action_type, quarantine, length_limit
            )
            del table
            path.unlink()
            parts.take(folder)
            results.append(result)
        parts.finish()
        return TimelineResult(
            rows_in=file.metadata.num_rows,
            train_rows=sum(result.train_rows for result in results),
            eval_rows=sum(result.eval_rows for result in results),
            train_episodes=sum(result.train_episodes for result in results),
            eval_episodes=sum(result.eval_episodes for result in results),
            dropped=_summed([result.dropped for result in results]),
            rejected=dict(sorted(rejected.counts.items())),
            examples=rejected.examples,
            n_step=self.config.window,
        )

    def _partition(
        self,
        rows: Path,
        file: pq.ParquetFile,
        bounds: np.ndarray,
        scratch: Path,
        action_type: ActionType,
        quarantine: bool,
    ) -> tuple[list[Path], _Rejected]:
        """Write the rows the transform can use to a file per bucket (the ones with rows, in
        bucket order), a batch of the source at a time; count and quarantine the others."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        paths = [scratch / f"bucket-{number:05d}.parquet" for number in range(len(bounds) + 1)]
        rejected = _Rejected(scratch.parent / "quarantine" if quarantine else None)
        writers: dict[int, pq.ParquetWriter] = {}
        first_row = 0
        with contextlib.ExitStack() as stack:
            stack.callback(rejected.close)
            for batch in file.iter_batches(batch_size=PARTITION_BATCH_ROWS):
                table = pa.Table.from_batches([batch])
                rejections = self._checked(table, action_type)[0]
                if rejections.mask.any():
                    rejected.add(rows, table, rejections, first_row)
                    table = table.filter(pa.array(~rejections.mask))
                first_row += batch.num_rows
                # One gather puts each bucket's rows together; each bucket's are then a slice.
                bucket = _bucket_of(table["mdp_id"], bounds)
                by_bucket = np.argsort(bucket, kind="stable")
                table = table.take(pa.array(by_bucket))
                numbers, starts, counts = np.unique(
                    bucket[by_bucket], return_index=True, return_counts=True
                )
                for number, start, count in zip(numbers.tolist(), starts, counts, strict=True):
                    if number not in writers:
                        # Scratch, read once: no compression, and statistics nothing reads.
                        writers[number] = pq.ParquetWriter(
                            paths[number],
                            table.schema,
                            compression="none",
                            use_dictionary=_id_columns(action_type),
                            write_statistics=False,
                        )
                        stack.callback(writers[number].close)
                    writers[number].write_table(table.slice(start, count))
        return [paths[number] for number in sorted(writers)], rejected

    def _build_table(
        self,
        run: RunContext,
        rows: Path,
        table: pa.Table,
        output: Path,
        action_type: ActionType,
        quarantine: bool,
        length_limit: float | None,
    ) -> TimelineResult:
        """Build the timeline of ``table`` (the rows of ``rows``, or a bucket of them) in memory.

        ``length_limit``: the longest episode kept, where ``outlier_episode_length_percentile``
        is set and the percentile is over more episodes than the table's; None computes it here.
        """
        from concurrent.futures import ThreadPoolExecutor

        import pyarrow.compute as pc

        config = self.config
        # Three independent pieces of work, two on a pool and one here (Arrow and numpy release
        # the GIL): the rows the transform cannot use, the columns the output copies, and the
        # order of every row by (split, episode, sequence number), rejected rows left out after.
        with ThreadPoolExecutor(max_workers=2) as pool:
            checked = pool.submit(self._checked, table, action_type)
            mdp_ids = _dictionary_encoded(table["mdp_id"])
            copied = pool.submit(_CopiedColumns.of, table, action_type, mdp_ids)
            codes = mdp_ids.indices.to_numpy()
            episode_names = mdp_ids.dictionary
            rank = pc.rank(episode_names, sort_keys="ascending").to_numpy(zero_copy_only=False)
            eval_episode = eval_episodes(run.seed, episode_names.to_pylist(), config.eval_fraction)
            # Eval episodes sort after every train episode, so each split is one run of sorted
            # positions and a row group's rows lie between its first and last position.
            split_rank = rank.astype(np.int64) + eval_episode * len(rank)
            sequence = table["sequence_number"].to_numpy()
            every_row = sort_episodes(split_rank[codes], sequence)
            rejections, reward, actions = checked.result()
            columns = copied.result()
        examples = self._examples(rows, table, rejections, quarantine, output)
        # Each of these gathers reads memory at random, which costs more per row the more rows
        # there are: the ones that would change nothing are skipped.
        order = every_row[~rejections.mask[every_row]] if rejections.mask.any() else every_row
        truncated = _truncated(table)
        cut = truncated[order] if truncated.any() else np.zeros(len(order), dtype=bool)
        episodes = _Episodes.of(codes[order], sequence[order], cut)
        if length_limit is None:
            length_limit = self._length_limit(episodes.lengths)
        survives, dropped = self._filters(episodes, length_limit)
        is_eval = eval_episode[episodes.codes]
        builder = _TimelineRows(
            columns, order, action_type, config.window, episodes, reward, actions
        )
        train = np.flatnonzero(survives & ~is_eval)
        evaluation = np.flatnonzero(survives & is_eval)
        write_split(builder.rows_at, train, evaluation, output)
        return TimelineResult(
            rows_in=table.num_rows,
            train_rows=len(train),
            eval_rows=len(evaluation),
            train_episodes=episodes.count(train),
            eval_episodes=episodes.count(evaluation),
            dropped=dropped,
            rejected=rejections.counts(),
            examples=examples,
            n_step=config.window,
        )

    def _checked(
        self, table: pa.Table, action_type: ActionType
    ) -> tuple[_Rejections, np.ndarray, _DiscreteActions | None]:
        """The rows the transform cannot use, each row's reward, and discrete actions."""
        rejections = _Rejections.none(table.num_rows)
        reward = self._reward(table, rejections)
        actions = (
            self._discrete_actions(table, rejections)
            if action_type is ActionType.DISCRETE
            else None
        )
        return rejections, reward, actions

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
        offsets = possible.offsets.to_numpy(zero_copy_only=False)
        lengths = np.diff(offsets)
        logged_names = possible.values.slice(offsets[0], offsets[-1] - offsets[0])
        possible_index = pc.index_in(logged_names, value_set=names)
        # Lists of one length in every row (every action listed, as loggers mostly write them)
        # need no row number per name: their names reshape to [rows, length].
        width = int(lengths[0]) if len(lengths) else 0
        same_length = width > 0 and not possible.null_count and bool(np.all(lengths == width))
        parents = None if same_length else np.repeat(np.arange(len(possible)), lengths)
        if possible_index.null_count:
            unknown = possible_index.is_null().to_numpy(zero_copy_only=False)
            if same_length:
                naming_unknown = unknown.reshape(-1, width).any(axis=1)
            else:
                naming_unknown = np.zeros(len(possible), dtype=bool)
                naming_unknown[parents[unknown]] = True
            rejections.add(
                naming_unknown,
                "unknown_action",
                lambda row: (
                    f"possible_actions {possible[row].as_py()!r} name an action not in "
                    f"[timeline] actions {actions}"
                ),
            )
        # A rejected row's mask is never read, so an unknown name may mark action 0 there.
        slots = possible_index.fill_null(0).to_numpy()
        masks = np.zeros((len(possible), len(actions)), dtype=np.int8)
        if same_length:
            np.put_along_axis(masks, slots.reshape(-1, width), 1, axis=1)
        else:
            unrecorded = possible.is_null().to_numpy(zero_copy_only=False) | (lengths == 0)
            masks[unrecorded] = 1
            masks[parents, slots] = 1
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
        if not rejections.mask.any():
            return []
        bad_rows = _bad_rows(rows, table, rejections, 0, None if quarantine else BAD_ROWS_SHOWN)
        if quarantine:
            folder = output / "quarantine"
            folder.mkdir()
            with (folder / QUARANTINE_FILE).open("w", encoding="utf-8") as handle:
                _write_quarantine(handle, bad_rows)
        return bad_rows[:BAD_ROWS_SHOWN]

    def _length_limit(self, lengths: np.ndarray) -> float | None:
        """The longest episode the outlier filter keeps, of episodes of these ``lengths``."""
        percentile = self.config.outlier_episode_length_percentile
        if percentile is None or not len(lengths):
            return None
        return float(np.percentile(lengths, percentile))

    def _filters(
        self, episodes: _Episodes, length_limit: float | None
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Rows that survive the outlier (episodes longer than ``length_limit``), time-window,
        truncation and terminal-row filters; drops by reason."""
        config = self.config
        survives = np.ones(episodes.rows, dtype=bool)
        dropped: dict[str, int] = {}

        def drop(rows: np.ndarray, reason: str) -> None:
            newly = rows & survives
            if newly.any():
                dropped[reason] = int(newly.sum())
            survives[newly] = False

        if length_limit is not None:
            drop(episodes.lengths[episodes.episode] > length_limit, "outlier_episode")
        if config.time_window_limit is not None:
            time_since_first = episodes.time_since_first(0, episodes.rows)
            drop(time_since_first > config.time_window_limit, "time_window")
        drop(episodes.cut, "truncated")
        if not config.add_terminal_state_row:
            drop(~episodes.has_next, "terminal_row")
        return survives, dropped


PARTITION_BATCH_ROWS = 65_536
"""Source rows read, checked and cut into buckets at a time."""

BOUNDS_SAMPLE_ROWS = 100_000
"""Sampled ``mdp_id`` values the bucket bounds are quantiles of: a bucket then holds its share
of the rows to within about a percent (binomial error of 10^5 draws), for 20 bytes a value."""


def bucket_count(metadata: pq.FileMetaData, max_memory_gb: float | None) -> int:
    """Buckets a source needs so that building one takes at most ``max_memory_gb``."""
    import math
    import os

    source_bytes = sum(
        metadata.row_group(group).total_byte_size for group in range(metadata.num_row_groups)
    )
    if max_memory_gb is None:
        machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        bound = DEFAULT_MEMORY_SHARE * machine
    else:
        bound = max_memory_gb * 2**30
    needed = source_bytes * BUILD_MEMORY_PER_SOURCE_BYTE
    if needed + BUILD_MEMORY_FIXED_BYTES <= bound:
        return 1
    if bound <= BUILD_MEMORY_FIXED_BYTES:
        raise HorizonError(
            f"[timeline] max_memory_gb is not set, and a quarter of this machine's memory, "
            f"{bound / 2**30:.3g} GB, is less than a build in buckets takes besides its buckets "
            f"({BUILD_MEMORY_FIXED_BYTES / 2**30:g} GB); set it"
        )
    return math.ceil(needed / (bound - BUILD_MEMORY_FIXED_BYTES))


def _parquet_file(path: Path, action_type: ActionType, memory_map: bool) -> pq.ParquetFile:
    """Pre-timeline rows with the id columns read as dictionary codes (see ``build``)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(
        path, memory_map=memory_map, pre_buffer=False, read_dictionary=_id_columns(action_type)
    )


def _id_columns(action_type: ActionType) -> list[str]:
    """The string columns of few distinct values, held as dictionary codes."""
    return ["ds", "mdp_id", *(["action"] if action_type is ActionType.DISCRETE else [])]


def _bucket_bounds(file: pq.ParquetFile, buckets: int, seed: int) -> np.ndarray:
    """The ``mdp_id`` values that start each bucket after the first (increasing, distinct):
    quantiles of a seeded sample of the rows' ``mdp_id``."""
    import pyarrow as pa

    reservoir = Reservoir(BOUNDS_SAMPLE_ROWS, seed)
    for batch in file.iter_batches(batch_size=PARTITION_BATCH_ROWS, columns=["mdp_id"]):
        ids = batch.column(0)
        if pa.types.is_dictionary(ids.type):
            ids = ids.dictionary_decode()
        reservoir.add(pa.table({"mdp_id": ids}))
    sample = reservoir.sample(pa.schema([("mdp_id", pa.string())]))["mdp_id"].to_pylist()
    ordered = np.sort(np.array(sample, dtype=object))
    positions = np.arange(1, buckets) * len(ordered) // buckets
    return np.unique(ordered[positions]) if len(ordered) else ordered


def _bucket_of(mdp_ids: pa.ChunkedArray, bounds: np.ndarray) -> np.ndarray:
    """Each row's bucket: how many bounds its ``mdp_id`` is at or after (string order, as
    Arrow sorts them: by code point)."""
    encoded = _dictionary_encoded(mdp_ids)
    names = np.array(encoded.dictionary.to_pylist(), dtype=object)
    return np.searchsorted(bounds, names, side="right")[encoded.indices.to_numpy()]


def _episode_lengths(paths: list[Path]) -> np.ndarray:
    """Rows per episode of the bucket files (an episode lies in one bucket)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lengths = [
        pc.value_counts(pq.read_table(path, columns=["mdp_id"])["mdp_id"])
        .field("counts")
        .to_numpy()
        for path in paths
    ]
    return np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    """Counts by reason added up, the reasons in ``DROP_REASONS`` order."""
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return {reason: total[reason] for reason in DROP_REASONS if total[reason]}


class _Rejected:
    """Rows a bucketed build rejected: counts by kind, the first few as examples, and, with a
    quarantine folder, all of them written there in the source's order."""

    def __init__(self, quarantine: Path | None) -> None:
        self.quarantine = quarantine
        self.counts: Counter[str] = Counter()
        self.examples: list[BadRow] = []
        self.handle: TextIO | None = None

    def add(self, rows: Path, table: pa.Table, rejections: _Rejections, first_row: int) -> None:
        self.counts.update(rejections.kinds.values())
        wanted = None if self.quarantine else BAD_ROWS_SHOWN - len(self.examples)
        bad_rows = _bad_rows(rows, table, rejections, first_row, wanted)
        self.examples += bad_rows[: BAD_ROWS_SHOWN - len(self.examples)]
        if self.quarantine is not None:
            if self.handle is None:
                self.quarantine.mkdir()
                self.handle = (self.quarantine / QUARANTINE_FILE).open("w", encoding="utf-8")
            _write_quarantine(self.handle, bad_rows)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


class _SplitParts:
    """The output's ``train`` and ``eval`` files, gathered from the buckets' in bucket order
    and numbered on; a bucket's file without rows is left out, but a split keeps a file."""

    def __init__(self, output: Path, schema: pa.Schema) -> None:
        self.output = output
        self.schema = schema
        self.counts = {split: 0 for split in ("train", "eval")}
        for split in self.counts:
            (output / split).mkdir()

    def take(self, bucket: Path) -> None:
        """Move the files of the bucket built in ``bucket`` into the output."""
        import pyarrow.parquet as pq

        for split in self.counts:
            for path in sorted((bucket / split).glob("*.parquet")):
                if pq.read_metadata(path).num_rows:
                    path.rename(self.output / split / f"part-{self.counts[split]:05d}.parquet")
                    self.counts[split] += 1

    def finish(self) -> None:
        """Give a split that no bucket had rows for its file of no rows."""
        import pyarrow.parquet as pq

        for split, count in self.counts.items():
            if not count:
                pq.write_table(
                    self.schema.empty_table(), self.output / split / "part-00000.parquet"
                )


def _bad_rows(
    rows: Path, table: pa.Table, rejections: _Rejections, first_row: int, limit: int | None
) -> list[BadRow]:
    """The rejected rows of ``table`` (the first ``limit`` of them), located in ``rows``,
    whose row number ``first_row`` is the table's first."""
    chosen = np.flatnonzero(rejections.mask)[:limit]
    contents = rows_as_dicts(table.take(chosen))
    return [
        BadRow(
            f"{rows}:row {first_row + row}",
            rejections.reasons[row],
            rejections.kinds[row],
            content,
        )
        for row, content in zip(chosen.tolist(), contents, strict=True)
    ]


def _write_quarantine(handle: TextIO, bad_rows: list[BadRow]) -> None:
    """One JSON line per rejected row: where it was, why, and its values."""
    for bad in bad_rows:
        record = {"location": bad.location, "kind": bad.kind, "reason": bad.reason}
        handle.write(json.dumps({**record, "row": bad.row}, default=str) + "\n")


@dataclass
class _DiscreteActions:
    """Discrete actions of every input row: index into ``actions`` and the possible-action mask."""

    index: np.ndarray
    masks: np.ndarray

    def take(self, rows: np.ndarray) -> _DiscreteActions:
        return _DiscreteActions(self.index[rows], np.take(self.masks, rows, axis=0))


@dataclass
class _Episodes:
    """Episode structure of the sorted rows (split, mdp_id, sequence_number), by position."""

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

    def count(self, positions: np.ndarray) -> int:
        """How many episodes have a row at ``positions`` (increasing)."""
        episode = self.episode[positions]
        return int(len(episode) > 0) + int(np.count_nonzero(episode[1:] != episode[:-1]))

    # The per-row columns below are computed for a range of positions, by the row group that
    # writes them (on its thread), rather than for every row up front.

    def ordinal(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop) - self.starts[self.episode[start:stop]] + 1

    def time_since_first(self, start: int, stop: int) -> np.ndarray:
        first = self.sequence[self.starts[self.episode[start:stop]]]
        return self.sequence[start:stop] - first

    def time_diff(self, start: int, stop: int) -> np.ndarray:
        """The next row's sequence number minus this one's; 0 where the episode ends."""
        time_diff = np.zeros(stop - start, dtype=np.int64)
        following = self.sequence[start + 1 : stop + 1]
        ends = len(following)
        time_diff[:ends] = following - self.sequence[start : start + ends]
        time_diff[~self.has_next[start:stop]] = 0
        return time_diff


class _Strings:
    """A string column as dictionary codes, so a gather moves four bytes a row, and a row
    group's strings are then read from the small dictionary."""

    def __init__(self, dictionary: pa.Array, codes: pa.Array) -> None:
        self.dictionary = dictionary
        self.codes = codes

    def take(self, rows: np.ndarray) -> _Strings:
        return _Strings(self.dictionary, self.codes.take(rows))

    def rows(self, start: int, stop: int) -> pa.Array:
        return self.dictionary.take(self.codes.slice(start, stop - start))


class _Column:
    """A flat, list or map column as Arrow holds it (the general case)."""

    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def take(self, rows: np.ndarray) -> _Column:
        return _Column(self.array.take(rows))

    def rows(self, start: int, stop: int) -> pa.Array:
        return self.array.slice(start, stop - start)

    def gather(self, rows: np.ndarray, present: np.ndarray, empty: bool = True) -> pa.Array:
        """The values of ``rows``; where not ``present``, empty (a list or map column) or,
        without ``empty``, null."""
        import pyarrow as pa

        taken = self.array.take(pa.array(rows, mask=~present))
        return _empty_where_null(taken) if empty else taken


class _RepeatedNames:
    """The keys of a dense map column repeated, shared by every row group's columns: grown by
    doubling when one needs more, so the keys of any of them are a slice."""

    def __init__(self, names: pa.Array) -> None:
        self.names = names
        self.repeated = names

    def first(self, count: int) -> pa.Array:
        import pyarrow as pa

        repeated = self.repeated
        if len(repeated) < count:
            times = max(count, 2 * len(repeated)) // len(self.names)
            indices = np.tile(np.arange(len(self.names), dtype=np.int32), times)
            repeated = self.repeated = self.names.take(pa.array(indices))
        return repeated.slice(0, count)


class _DenseMaps:
    """A map column whose rows all hold the same keys in the same order (dense features, as
    the gym source and most loggers write them): a [rows, keys] value matrix and the keys once,
    so gathering rows moves only their values, a row at a time (``np.take`` along the rows:
    several times faster than indexing a 2-D array with an index array, which the possible
    action masks use too)."""

    def __init__(self, names: _RepeatedNames, values: np.ndarray) -> None:
        self.names = names
        self.values = values

    @classmethod
    def of(cls, array: pa.Array) -> _DenseMaps | None:
        """The column as dense maps, if its rows are dense maps of string ids to floats."""
        import pyarrow as pa

        if (
            not isinstance(array, pa.MapArray)
            or array.type != FEATURES
            or not len(array)
            or array.null_count
        ):
            return None
        offsets = array.offsets.to_numpy()
        width = int(offsets[1] - offsets[0])
        first, count = int(offsets[0]), int(offsets[-1] - offsets[0])
        keys, items = array.keys.slice(first, count), array.items.slice(first, count)
        if width == 0 or items.null_count or not _steps_by(offsets, width):
            return None
        if not _same_strings_every(keys, width):
            return None
        return cls(_RepeatedNames(keys.slice(0, width)), items.to_numpy().reshape(-1, width))

    def take(self, rows: np.ndarray) -> _DenseMaps:
        return _DenseMaps(self.names, np.take(self.values, rows, axis=0))

    def _maps(self, values: np.ndarray, lengths: np.ndarray, null: np.ndarray | None) -> pa.Array:
        import pyarrow as pa

        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        return pa.MapArray.from_arrays(
            pa.array(offsets),
            self.names.first(len(values)),
            pa.array(values),
            mask=None if null is None else pa.array(null),
        )

    def rows(self, start: int, stop: int) -> pa.Array:
        values = self.values[start:stop]
        return self._maps(values.ravel(), np.full(len(values), values.shape[1]), None)

    def gather(self, rows: np.ndarray, present: np.ndarray, empty: bool = True) -> pa.Array:
        """As ``_Column.gather``."""
        values = np.take(self.values, rows[present], axis=0).ravel()
        lengths = present * self.values.shape[1]
        return self._maps(values, lengths, None if empty else ~present)


CHECKED_AT_ONCE = 1 << 16
"""Rows the dense-map checks compare at a time: their temporaries stay in the cache, where
whole-column ones would be fresh memory as large as the column."""


def _steps_by(offsets: np.ndarray, step: int) -> bool:
    """Whether each of ``offsets`` is ``step`` more than the one before."""
    for start in range(0, len(offsets) - 1, CHECKED_AT_ONCE):
        if np.any(np.diff(offsets[start : start + CHECKED_AT_ONCE + 1]) != step):
            return False
    return True


def _same_strings_every(keys: pa.Array, width: int) -> bool:
    """Whether ``keys`` (a string array) repeats its first ``width`` strings throughout.

    Compared on the raw offsets and bytes, a block of rows at a time, rather than against a
    column of the expected keys built for the purpose.
    """
    import pyarrow as pa

    if keys.type != pa.string() or keys.null_count:
        return False
    _, offsets_buffer, data_buffer = keys.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[keys.offset :][: len(keys) + 1]
    lengths = np.diff(offsets[: width + 1])
    row_bytes = int(lengths.sum())
    if not _steps_by(offsets[::width], row_bytes):
        return False
    if row_bytes == 0:
        return True
    data = np.frombuffer(data_buffer, dtype=np.uint8)
    first_row = data[offsets[0] : offsets[0] + row_bytes]
    entries = CHECKED_AT_ONCE * width
    for start in range(0, len(offsets) - 1, entries):
        block = offsets[start : start + entries + 1]
        if np.any(np.diff(block).reshape(-1, width) != lengths):
            return False
        if np.any(data[block[0] : block[-1]].reshape(-1, row_bytes) != first_row):
            return False
    return True


@dataclass
class _CopiedColumns:
    """The input columns the output copies, in a form each row group gathers its rows from.

    A row group gathers its rows once, into its own sorted columns (``take``), and reads
    them in order from then on: a next row is the neighbour. So the one random read of a
    shuffled input happens in the row groups, on the writing threads, and no sorted copy of
    the whole input is made. Discrete actions and rewards travel as numpy arrays apart.
    """

    ds: _Strings
    mdp_id: _Strings
    state_features: _Column | _DenseMaps
    action_probability: _Column
    metrics: _Column | _DenseMaps
    action: _Column | _DenseMaps | None
    possible_actions: _Column | None

    @classmethod
    def of(
        cls, table: pa.Table, action_type: ActionType, mdp_ids: pa.DictionaryArray
    ) -> _CopiedColumns:
        def maps(name: str) -> _Column | _DenseMaps:
            column = _single_array(table[name])
            return _DenseMaps.of(column) or _Column(column)

        ds = _dictionary_encoded(table["ds"])
        return cls(
            ds=_Strings(ds.dictionary, ds.indices),
            mdp_id=_Strings(mdp_ids.dictionary, mdp_ids.indices),
            state_features=maps("state_features"),
            action_probability=_Column(_single_array(table["action_probability"])),
            metrics=maps("metrics"),
            action=maps("action") if action_type is not ActionType.DISCRETE else None,
            possible_actions=(
                _Column(_single_array(table["possible_actions"]))
                if action_type is ActionType.PARAMETRIC
                else None
            ),
        )

    def take(self, rows: np.ndarray) -> _CopiedColumns:
        """These columns at input ``rows``, in that order."""
        return _CopiedColumns(
            **{
                name: None if column is None else column.take(rows)
                for name, column in vars(self).items()
            }
        )


@dataclass
class _GroupInput:
    """What a row group reads: its rows and, after them, the rows its next states and n-step
    windows reach, in sorted order, numbered from the group's first row (0)."""

    columns: _CopiedColumns
    reward: np.ndarray
    actions: _DiscreteActions | None
    has_next: np.ndarray
    time_diff: np.ndarray


class _TimelineRows:
    """Builds output rows for any set of positions in the sorted input.

    The input is sorted by (split, mdp_id, sequence_number), so the next row of position p,
    where the episode goes on, is p + 1, and the rows of a row group of a split lie between
    its first and last position: its columns are built for that range, and only filtered rows
    are then left out.
    """

    def __init__(
        self,
        columns: _CopiedColumns,
        order: np.ndarray,
        action_type: ActionType,
        n_step: int,
        episodes: _Episodes,
        reward: np.ndarray,
        actions: _DiscreteActions | None,
    ) -> None:
        self.columns = columns
        self.order = order
        """The input row at each sorted position; ``reward`` and ``actions`` are by input row."""
        self.action_type = action_type
        self.n_step = n_step
        self.episodes = episodes
        self.reward = reward
        self.actions = actions
        self.schema = timeline_schema(action_type, n_step)

    def rows_at(self, positions: np.ndarray) -> pa.Table:
        import pyarrow as pa

        start = int(positions[0]) if len(positions) else 0
        stop = int(positions[-1]) + 1 if len(positions) else 0
        table = self._rows_between(start, stop)
        if len(positions) < stop - start:
            table = table.take(pa.array(positions - start))
        return table

    def _rows_between(self, start: int, stop: int) -> pa.Table:
        """The rows at sorted positions ``start`` to ``stop``."""
        import pyarrow as pa

        reach = min(stop + self.n_step, len(self.order))
        read = self.order[start:reach]
        episodes = self.episodes
        group = _GroupInput(
            self.columns.take(read),
            self.reward[read],
            self.actions and self.actions.take(read),
            episodes.has_next[start:reach],
            episodes.time_diff(start, reach),
        )
        rows = stop - start
        has_next = group.has_next[:rows]
        state = group.columns.state_features
        columns = {
            "ds": group.columns.ds.rows(0, rows),
            "mdp_id": group.columns.mdp_id.rows(0, rows),
            "sequence_number": pa.array(episodes.sequence[start:stop]),
            "state_features": state.rows(0, rows),
            "action_probability": group.columns.action_probability.rows(0, rows),
            "reward": pa.array(group.reward[:rows]),
            "metrics": group.columns.metrics.rows(0, rows),
            "sequence_number_ordinal": pa.array(episodes.ordinal(start, stop)),
            "time_since_first": pa.array(episodes.time_since_first(start, stop)),
            "time_diff": pa.array(group.time_diff[:rows]),
            "not_terminal": pa.array(has_next),
            "next_state_features": state.gather(np.arange(1, rows + 1), has_next),
        }
        columns |= self._action_columns(group, rows)
        if self.n_step > 1:
            columns |= self._n_step_columns(group, start, stop)
        return pa.Table.from_arrays(
            [columns[field.name].cast(field.type) for field in self.schema], schema=self.schema
        )

    def _action_columns(self, group: _GroupInput, rows: int) -> dict[str, pa.Array]:
        import pyarrow as pa

        has_next = group.has_next[:rows]
        following = np.arange(1, rows + 1)
        if self.action_type is ActionType.DISCRETE:
            index, masks = group.actions.index, group.actions.masks
            return {
                "action": pa.array(index[:rows]),
                "possible_actions": _masks(masks[:rows]),
                "next_action": pa.array(
                    index[np.minimum(following, len(index) - 1)], mask=~has_next
                ),
                "possible_next_actions": _masks(_next_masks(group, np.arange(rows))),
            }
        action = group.columns.action
        columns = {
            "action": action.rows(0, rows),
            "next_action": action.gather(following, has_next, empty=False),
        }
        if self.action_type is ActionType.PARAMETRIC:
            possible = group.columns.possible_actions
            columns["possible_actions"] = possible.rows(0, rows)
            columns["possible_next_actions"] = possible.gather(following, has_next)
        return columns

    def _n_step_columns(self, group: _GroupInput, start: int, stop: int) -> dict[str, pa.Array]:
        """Arrays of the values of rows t .. t+n-1 of the episode (fewer near its end)."""
        import pyarrow as pa

        episodes = self.episodes
        # A cut episode's last row is no step of a window: its next state was never observed.
        usable = episodes.lengths - episodes.cut[episodes.starts + episodes.lengths - 1]
        remaining = usable[episodes.episode[start:stop]] - (episodes.ordinal(start, stop) - 1)
        counts = np.minimum(remaining, self.n_step)
        offsets = np.zeros(stop - start + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        flat = np.repeat(np.arange(stop - start), counts) + (
            np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
        )
        has_next = group.has_next[flat]
        arrays = pa.array(offsets)
        columns = {
            "next_n_rewards": pa.array(group.reward[flat]),
            "next_n_time_diffs": pa.array(group.time_diff[flat]),
            "next_n_state_features": group.columns.state_features.gather(flat + 1, has_next),
            "next_n_not_terminal": pa.array(has_next),
        }
        if self.action_type is ActionType.DISCRETE:
            columns["next_n_possible_next_actions"] = _masks(_next_masks(group, flat))
        elif self.action_type is ActionType.PARAMETRIC:
            possible = group.columns.possible_actions
            columns["next_n_possible_next_actions"] = possible.gather(flat + 1, has_next)
        return {name: pa.ListArray.from_arrays(arrays, values) for name, values in columns.items()}


def _next_masks(group: _GroupInput, positions: np.ndarray) -> np.ndarray:
    """The possible-action masks of the rows after ``positions``; all zero where none is."""
    masks = group.actions.masks
    following = np.minimum(positions + 1, len(masks) - 1)
    next_masks = np.take(masks, following, axis=0)
    next_masks[~group.has_next[positions]] = 0
    return next_masks


def _truncated(table: pa.Table) -> np.ndarray:
    """Each input row's ``truncated`` flag (false where absent: rows from before the field)."""
    if "truncated" not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    flags = _single_array(table["truncated"]).fill_null(False)
    return flags.to_numpy(zero_copy_only=False).astype(bool)


def _dictionary_encoded(column: pa.ChunkedArray) -> pa.DictionaryArray:
    """A string column as one dictionary array holding each of its strings once.

    Chunks read with different dictionaries are combined with one dictionary of them all,
    but chunks with equal ones as they are, and a Parquet dictionary may repeat a string:
    two codes for one ``mdp_id`` would cut its episode in two.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    array = _single_array(column)
    if pa.types.is_dictionary(array.type):
        if len(pc.unique(array.dictionary)) == len(array.dictionary):
            return array
        array = array.dictionary_decode()
    return pc.dictionary_encode(array)


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
    start = offsets[0].as_py()
    values = array.values.slice(start, offsets[-1].as_py() - start)
    return pa.ListArray.from_arrays(pa.array(offsets.to_numpy() - start), values)


@hookimpl
def horizon_register_timeline_engines(register: Callable[[type], None]) -> None:
    register(LocalTimeline)
