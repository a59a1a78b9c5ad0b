"""A timeline split larger than memory: read a Parquet row group at a time, shuffled in a buffer.

``StreamedTimeline`` is the ``EpochData`` the train stage uses when a split does not fit
``[trainer] max_memory_gb`` (``choose_data``). It never holds the split: an epoch reads the
split's row groups in an order drawn from the driver's ``data_order`` generator, converts each
with ``dataset.timeline_tensors`` (the in-memory split's conversion: the same tensors, the same
shapes, since lists are padded to the split's longest, found once from the list columns alone),
and passes the rows through a shuffle buffer of ``buffer_rows``: when the buffer is full it is
permuted (the same generator) and minibatches leave it until half remains, to be mixed with the
next row groups. An epoch holds every row of the split once, and a run is reproducible and
resumable from the generator's state alone, which every checkpoint already holds.

Reading and converting the slices, and on the CPU preprocessing them, runs on a background
thread up to ``READ_AHEAD`` slices ahead of training (``read_ahead.ReadAhead``): Arrow's decoding
and the conversion mostly release the GIL, so they overlap the updates on another core, and the
batches are the same, in the same order, as read in line, since the generator is drawn from on
the training thread alone. An epoch's first buffer of slices would leave training waiting (most
of what streaming cost on a split a few buffers long), so the next epoch's reading begins as
soon as this epoch's last shuffle is drawn: the next row group order is then drawn from a copy
of the generator, and the next epoch takes that reading if it starts from the same state.
The state preprocessor's output (the batch schema's ``*_preprocessed``) is computed for each
slice read (on a GPU, for each batch there), where the in-memory split computes it once; batches
move to the device one at a time (through pinned memory, without blocking, on a GPU).
``shard`` gives row group ``i`` to process ``i % world`` (with fewer row groups than processes,
a run of every group's rows to each) with the same number of minibatches on every process,
decided from the Parquet metadata alone. The eval split is read in whole episodes
(``episodes``) to be evaluated chunk by chunk (``evaluate_split``).

torch and pyarrow are imported where they are used.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from horizon_engine.errors import HorizonError
from horizon_engine.read_ahead import NextReading, ReadAhead
from horizon_engine.schema import ActionType

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from horizon_engine.dataset import Minibatch, TimelineTensors
    from horizon_engine.driver import Batch, ProblemDescription
    from horizon_engine.training import TrainerBase, TrainerConfig

READ_ROWS = 16_384
"""Most rows read from Parquet and converted at once: a row group (the local engine writes
65,536 rows) is read in slices, so a writer's larger row groups do not raise the peak."""

UNREAD_COLUMNS = frozenset({"ds", "metrics", "sequence_number_ordinal", "time_since_first"})
"""Timeline columns the conversion (``dataset.timeline_tensors``) never reads, which a streamed
split therefore does not decode: about a tenth of a CartPole row group's decoding, every epoch."""

READER_OPTIONS = {"buffer_size": 1 << 20, "pre_buffer": False}
"""How a streamed split's files are read: column chunks through 1 MiB buffered streams rather
than whole, and (``use_threads=False`` where read) on this thread only, since each of Arrow's
reading threads keeps memory of its own."""

READ_SHARE = 4
"""A slice read is at most the shuffle buffer's rows over this: converting rows from Parquet
takes several times their tensors' memory at its peak (Arrow's columns, the sparse maps'
entries, numpy's intermediates; measured: loading a 156,000-row CartPole split in memory grew
the process's peak by 73 to 82 MiB for 41 MiB of tensors, Arrow's memory included)."""

MEMORY_SHARE = 4
"""``[trainer] max_memory_gb = "auto"`` is the machine's memory over this: in memory, loading a
split peaks at about twice its tensors (the Arrow table and the tensors made from it), the
preprocessor's output adds a third of them again, and the timeline stage, other runs and the
system need their share of a shared machine."""

EVAL_SHARE = 0.5
"""The share of the memory budget the eval split may take in memory while the train split is
streamed (what is left holds the shuffle buffer): above it the eval split is streamed too."""

READ_AHEAD = 2
"""Slices converted and waiting for the training thread at most (``ReadAhead``), besides the
one the background thread is converting: enough to cover a slow slice, few enough that what
waits is half a shuffle buffer (``READ_AHEAD / READ_SHARE``)."""

BUFFER_COPIES = 6
"""Bytes of the budget per byte of a buffered row: the shuffle buffer holds up to three copies
of a row at its fullest (the rows read, their permutation, the slices read in); read ahead
while it drains (the next epoch's first slices while the last drains), the slice being
converted takes about one more (``READ_SHARE`` times a slice of a ``READ_SHARE``-th of the
buffer) and the slices waiting half of one (``READ_AHEAD``); the rest is left for the update's
tensors."""


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group of a split: where it is, its rows and its first episode's number."""

    path: Path
    index: int
    rows: int
    first_episode: int
    """The split-wide number (``episode_id``) of its first row's episode: episodes are numbered
    by first appearance in the split, as in memory, whatever order the groups are read in."""
    start: int = 0
    """The first of the group's rows read: a process's share of a group (``shard`` with fewer
    groups than processes) is the ``rows`` rows from here on; ``first_episode`` stays the
    group's first row's."""


@dataclass(frozen=True)
class StreamedTimeline:
    """One timeline split read from Parquet as needed (``open`` reads the metadata only)."""

    folder: Path
    groups: tuple[RowGroup, ...]
    """This process's row groups (all of them for ``shard(0, 1)``), in file order."""
    rows_by_rank: tuple[int, ...]
    """The rows of each of the processes' shares: every process knows every share's size."""
    rank: int
    action_type: ActionType
    feature_ids: tuple[str, ...]
    action_feature_ids: tuple[str, ...]
    actions: tuple[str, ...]
    widths: Mapping[str, int]
    """The split's longest lists (``dataset.padding_widths``)."""
    buffer_rows: int
    device: torch.device
    all_groups: tuple[RowGroup, ...] = ()
    preprocessor: torch.nn.Module | None = None
    read_ahead: int = READ_AHEAD
    """Slices an epoch reads ahead on a background thread; 0 reads them on the training thread."""
    _next_reading: NextReading[dict[str, torch.Tensor]] = field(
        default_factory=NextReading, init=False, repr=False, compare=False
    )
    """The next epoch's reading, begun by this one's end."""

    def __post_init__(self) -> None:
        weakref.finalize(self, self._next_reading.discard)

    @classmethod
    def open(
        cls,
        folder: Path,
        description: ProblemDescription,
        buffer_rows: int,
        device: torch.device,
    ) -> StreamedTimeline:
        """The split in ``folder`` (a timeline split's Parquet files), read from its metadata
        and its id and list columns; an unreadable file is an error naming it."""
        groups, widths = _survey(folder, description.action_type)
        return cls(
            folder=folder,
            groups=groups,
            rows_by_rank=(sum(group.rows for group in groups),),
            rank=0,
            action_type=description.action_type,
            feature_ids=tuple(description.feature_ids),
            action_feature_ids=tuple(description.action_feature_ids),
            actions=tuple(description.actions),
            widths=widths,
            buffer_rows=max(1, buffer_rows),
            device=device,
            all_groups=groups,
        )

    def __len__(self) -> int:
        return self.rows_by_rank[self.rank]

    def shard(self, rank: int, world: int) -> StreamedTimeline:
        """What process ``rank`` of ``world`` trains on: row group ``i`` when ``i % world`` is
        ``rank``; with fewer row groups than processes, the ``rank``-th of ``world`` nearly
        equal runs of every group's rows (each process then decodes every group, which a
        split this small affords). A split with fewer rows than processes is an error."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not one of {world} processes")
        if len(self.all_groups) >= world:
            shares = [self.all_groups[start::world] for start in range(world)]
        else:
            shares = [_rows_of_groups(self.all_groups, share, world) for share in range(world)]
        rows_by_rank = tuple(sum(group.rows for group in share) for share in shares)
        if not min(rows_by_rank):
            raise HorizonError(
                f"{self.folder}: {sum(rows_by_rank)} rows cannot be shared between {world} "
                "training processes; use fewer processes"
            )
        return replace(self, groups=tuple(shares[rank]), rows_by_rank=rows_by_rank, rank=rank)

    def with_preprocessed(self, preprocessor: torch.nn.Module) -> StreamedTimeline:
        """The split whose batches also hold ``preprocessor``'s output, computed per batch."""
        return replace(self, preprocessor=preprocessor)

    def batch_sizes(self, batch_size: int) -> list[int]:
        """This process's minibatch sizes in an epoch. One process: ``batch_size`` rows each,
        the last the rest, as in memory. Several: each global minibatch's share
        (``batch_size // world`` rows), as many minibatches on every process (as many as the
        smallest share makes), each process's rows spread evenly over them."""
        rows = len(self)
        if len(self.rows_by_rank) == 1:
            count = max(1, math.ceil(rows / batch_size))
            return [batch_size] * (count - 1) + [rows - batch_size * (count - 1)]
        share = max(1, batch_size // len(self.rows_by_rank))
        count = max(1, min(math.ceil(each / share) for each in self.rows_by_rank))
        base, extra = divmod(rows, count)
        return [base + 1] * extra + [base] * (count - extra)

    def minibatches(self, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """One epoch: the row groups in an order drawn from ``generator``, through the shuffle
        buffer, as minibatches of ``batch_sizes`` rows on the device. Once the last shuffle is
        drawn, the next epoch's order is known (drawn from a copy of ``generator``) and its
        first slices are read while this epoch's last batches train (``_next_reading``)."""
        import torch

        buffer = _ShuffleBuffer(generator, self.batch_sizes(batch_size)[::-1])
        begun = self._next_reading.take(generator)
        groups = self._epoch_groups(generator)
        parts = begun or self._reading(groups, whole_buffer=True)
        try:
            for part in parts:
                buffer.add(part)
                if buffer.rows >= self.buffer_rows:
                    buffer.shuffle()
                    for batch in buffer.take(keep=self.buffer_rows // 2):
                        yield self._on_device(batch)
        finally:
            parts.close()
        buffer.shuffle()
        if self.read_ahead > 0:
            predicted = torch.Generator().set_state(generator.get_state())
            reading = self._reading(self._epoch_groups(predicted), whole_buffer=False)
            self._next_reading.begin(generator.get_state(), reading)
        ended = False
        try:
            for batch in buffer.take(keep=0):
                yield self._on_device(batch)
            ended = True
        finally:
            if not ended:
                self._next_reading.discard()

    def _epoch_groups(self, generator: torch.Generator) -> list[RowGroup]:
        """The row groups in an epoch's order: the epoch's first draw from ``generator``."""
        import torch

        order = torch.randperm(len(self.groups), generator=generator).tolist()
        return [self.groups[position] for position in order]

    def _reading(
        self, groups: Sequence[RowGroup], whole_buffer: bool
    ) -> ReadAhead[dict[str, torch.Tensor]]:
        """``groups``' slices, read ``read_ahead`` ahead from now on by a copy of this split
        (which the reading thread holds: this one is left to be collected, closing what it
        began, ``__post_init__``). With ``whole_buffer``, a shuffle buffer's worth at first:
        an epoch that starts reading takes that many at once. Not for the next epoch's reading
        begun while this epoch's buffer drains: a whole second buffer beside the draining one
        took the stage's peak past its budget (tests/test_streamed.py's memory bound, 3 runs
        in 8), and an epoch that is the last reads it for nothing."""
        reader = replace(self)
        first = math.ceil(self.buffer_rows / self._slice_rows()) if whole_buffer else 0
        return ReadAhead(lambda: reader._prepared_parts(groups), self.read_ahead, first)

    def _slice_rows(self) -> int:
        """The rows read and converted at once: ``READ_ROWS``, or fewer for a small buffer."""
        return min(READ_ROWS, max(1, self.buffer_rows // READ_SHARE))

    def _prepared_parts(
        self, groups: Sequence[RowGroup]
    ) -> Generator[dict[str, torch.Tensor], None, None]:
        """``groups``' slices as the shuffle buffer takes them (preprocessed on the CPU). A
        failure names the file and row group: it reaches the training thread from another."""
        for group in groups:
            try:
                for part in self._read(group):
                    if self.preprocessor is not None and self.device.type == "cpu":
                        part = part.with_preprocessed(self.preprocessor)
                    yield part.tensors()
            except HorizonError:
                raise
            except Exception as exc:
                raise HorizonError(
                    f"{group.path}: row group {group.index}: cannot read the timeline split: {exc}"
                ) from exc

    def episodes(self, max_rows: int) -> Iterator[TimelineTensors]:
        """The split in file order, in chunks of whole episodes of about ``max_rows`` rows (an
        episode longer than that is a chunk of its own), on the CPU, episodes numbered as in
        memory."""
        pending: list[TimelineTensors] = []
        rows = 0
        for part in self.in_file_order():
            pending.append(part)
            rows += len(part)
            if rows < max_rows:
                continue
            whole = _concatenated(pending)
            last = whole.episode_id[-1]
            cut = int((whole.episode_id == last).nonzero()[0])
            if cut == 0:
                pending, rows = [whole], len(whole)
                continue
            yield whole.take(_arange(0, cut))
            tail = whole.take(_arange(cut, len(whole)))
            pending, rows = [tail], len(tail)
        if rows:
            yield _concatenated(pending)

    def first_rows(self, count: int) -> TimelineTensors:
        """The split's first ``count`` rows (all of them when it has fewer), reading only the
        row groups that hold them."""
        taken: list[TimelineTensors] = []
        rows = 0
        for part in self.in_file_order():
            taken.append(part)
            rows += len(part)
            if rows >= count:
                whole = _concatenated(taken)
                return whole.take(_arange(0, count))
        return _concatenated(taken)

    def in_file_order(self) -> Iterator[TimelineTensors]:
        """The split's rows in file order, a slice at a time, on the CPU, episodes numbered as
        in memory: what ``episodes``, ``first_rows`` and ``read_in_memory`` read."""
        for group in self.groups:
            yield from self._read(group)

    def _read(self, group: RowGroup) -> Iterator[TimelineTensors]:
        """A row group's ``group.rows`` rows from ``group.start`` on as tensors, ``READ_ROWS``
        rows at a time. Rows before ``start`` are read for their episodes only, to number the
        first one read as in memory."""
        import pyarrow as pa

        from horizon_engine.dataset import timeline_tensors

        episode = group.first_episode  # the current batch's first row's, then its last's
        previous_last: object = None
        position, stop = 0, group.start + group.rows
        for batch in _row_group_batches(group, self._slice_rows()):
            skipped = min(max(0, group.start - position), batch.num_rows)
            taken = min(batch.num_rows, stop - position) - skipped
            position += batch.num_rows
            ids = batch.column("mdp_id")
            if previous_last is not None and ids[0].as_py() != previous_last:
                episode += 1
            previous_last = ids[-1].as_py()
            if taken < batch.num_rows:
                first_taken = episode + _episode_changes(ids.slice(0, skipped + 1))
                episode += _episode_changes(ids)
            if taken <= 0:
                continue
            part = timeline_tensors(
                pa.Table.from_batches([batch.slice(skipped, taken)]),
                self.action_type,
                self.feature_ids,
                self.action_feature_ids,
                self.actions,
                self.widths,
            )
            if taken < batch.num_rows:
                part.episode_id += first_taken
            else:
                part.episode_id += episode
                episode = int(part.episode_id[-1])
            yield part
            if position >= stop:
                return

    def _on_device(self, batch: Minibatch) -> Batch:
        """``batch`` on the device with the state preprocessor's output for its states: on the
        CPU as it is (the output was computed for each slice read, many rows at once); on
        another device gathered, moved (through pinned memory without blocking on a GPU) and
        preprocessed there."""
        import torch

        from horizon_engine.batch_schema import PREPROCESSED_STATES

        if self.device.type == "cpu":
            return batch
        batch = dict(batch)
        if self.device.type == "cuda":
            batch = {
                name: tensor.pin_memory().to(self.device, non_blocking=True)
                for name, tensor in batch.items()
            }
        else:
            batch = {name: tensor.to(self.device) for name, tensor in batch.items()}
        if self.preprocessor is not None:
            with torch.no_grad():
                for name in PREPROCESSED_STATES:
                    if name in batch:
                        batch[f"{name}_preprocessed"] = self.preprocessor(
                            batch[name], batch[f"{name}_presence"]
                        )
        return batch


class _ShuffleBuffer:
    """Rows waiting to be batched: drawn in a random order when drained, so each batch mixes
    the rows of every row group read since the buffer was last half empty. ``sizes`` are the
    epoch's minibatch sizes, taken from the end. A batch is a ``Minibatch`` of the buffer's
    rows, gathering only the tensors a trainer reads, as in memory."""

    def __init__(self, generator: torch.Generator, sizes: list[int]) -> None:
        self.generator = generator
        self.sizes = sizes
        self.parts: list[dict[str, torch.Tensor]] = []
        self.rows = 0
        self.order: torch.Tensor | None = None

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        self.parts.append(tensors)
        self.rows += len(tensors["reward"])

    def shuffle(self) -> None:
        """Draw the order of the rows buffered (the generator's next draw, none when there
        are none), which ``take`` follows."""
        import torch

        if not self.rows:
            return
        self.order = torch.randperm(self.rows, generator=self.generator)
        if len(self.parts) > 1:
            names = self.parts[0].keys()
            self.parts = [{name: torch.cat([part[name] for part in self.parts]) for name in names}]

    def take(self, keep: int) -> Iterator[Minibatch]:
        """The next minibatches in the order drawn while at least ``keep`` rows would remain
        (every one for ``keep = 0``); the rest stay, in that order."""
        from horizon_engine.dataset import Minibatch

        if not self.rows:
            return
        rows, order = self.parts[0], self.order
        if order is None:
            raise ValueError("the buffer's order is taken before it is drawn")
        start = 0
        while self.sizes and self.rows - start - self.sizes[-1] >= keep:
            size = self.sizes.pop()
            yield Minibatch(rows, order[start : start + size])
            start += size
        rest = order[start:]
        self.parts = [{name: tensor.index_select(0, rest) for name, tensor in rows.items()}]
        self.rows -= start


def evaluate_split(
    trainer: TrainerBase, data: StreamedTimeline | TimelineTensors
) -> dict[str, float]:
    """``trainer.evaluate`` on ``data``: in memory at once; streamed chunk by chunk of whole
    episodes (returns to an episode's end need all of it), each metric the mean of the chunks'
    weighted by their rows (the trainers' metrics are means over rows; a mean over a subset of
    rows, such as a DQN's ``mean_q/<action>`` over the rows where the action is possible, is
    weighted by the chunk's rows, which approximates the split's mean)."""
    if not isinstance(data, StreamedTimeline):
        return trainer.evaluate(data)
    sums: dict[str, float] = {}
    weights: dict[str, int] = {}
    for chunk in data.episodes(data.buffer_rows):
        for name, value in trainer.evaluate(chunk.to(data.device)).items():
            sums[name] = sums.get(name, 0.0) + value * len(chunk)
            weights[name] = weights.get(name, 0) + len(chunk)
    return {name: total / weights[name] for name, total in sums.items()}


@dataclass(frozen=True)
class DataChoice:
    """How the train stage holds its data, and why (recorded in the manifest)."""

    train: Literal["memory", "streamed"]
    eval: Literal["memory", "streamed"]
    reason: str
    buffer_rows: int
    """The shuffle buffer's rows when streamed: the budget left by the eval split; also the
    rows of a streamed eval split evaluated at once."""
    eval_rows: int
    """The eval rows that fit ``EVAL_SHARE`` of the budget: the per-epoch estimators' sample
    of a streamed eval split."""


def memory_budget(setting: float | str, device: torch.device | None = None) -> int:
    """A ``max_memory_gb`` setting in bytes (``[trainer]``'s, ``horizon join``'s): "auto" is
    the machine's memory / ``MEMORY_SHARE``, and on a CUDA ``device`` no more than the device's
    memory / ``MEMORY_SHARE`` (a split held in memory is moved to the device whole, so it must
    fit there too)."""
    if setting != "auto":
        return int(float(setting) * 2**30)
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MEMORY_SHARE
    if device is not None and device.type == "cuda":
        import torch

        device_memory = torch.cuda.get_device_properties(device).total_memory
        budget = min(budget, device_memory // MEMORY_SHARE)
    return budget


def choose_data(
    config: TrainerConfig, train: StreamedTimeline, evaluation: StreamedTimeline
) -> DataChoice:
    """``[trainer] data`` applied to the two splits: "memory" and "streamed" as told, "auto"
    in memory when both splits' tensors (estimated from the Parquet metadata and the feature
    counts: ``row_bytes``) fit ``max_memory_gb``, streamed otherwise. Streamed, the eval split
    stays in memory when it fits ``EVAL_SHARE`` of the budget."""
    budget = memory_budget(config.max_memory_gb, train.device)
    train_bytes = len(train) * row_bytes(train)
    eval_bytes = len(evaluation) * row_bytes(evaluation)
    sizes = (
        f"the splits' tensors are about {_gib(train_bytes)} (train) + {_gib(eval_bytes)} "
        f"(eval); [trainer] max_memory_gb = {config.max_memory_gb} is {_gib(budget)}"
    )
    if config.data == "memory" or (config.data == "auto" and train_bytes + eval_bytes <= budget):
        how = "as [trainer] data = 'memory'" if config.data == "memory" else "they fit"
        reason = f"in memory: {how} ({sizes})"
        return DataChoice("memory", "memory", reason, 1, len(evaluation))
    eval_in_memory = eval_bytes <= EVAL_SHARE * budget
    left = budget - (eval_bytes if eval_in_memory else 0)
    buffer_rows = max(config.minibatch_size, left // (BUFFER_COPIES * row_bytes(train)))
    how = "as [trainer] data = 'streamed'" if config.data == "streamed" else "they do not fit"
    eval_held = "in memory" if eval_in_memory else "streamed in whole episodes"
    reason = (
        f"streamed: {how} ({sizes}); a shuffle buffer of {buffer_rows} rows, the eval split "
        f"{eval_held}"
    )
    eval_rows = max(1, int(EVAL_SHARE * budget) // row_bytes(evaluation))
    held = "memory" if eval_in_memory else "streamed"
    return DataChoice("streamed", held, reason, buffer_rows, eval_rows)


def episodes_within(
    split: Path, description: ProblemDescription, config: TrainerConfig, device: torch.device
) -> tuple[TimelineTensors, list[str]]:
    """A split for the estimators, which need it in memory: the whole of it when it fits
    ``EVAL_SHARE`` of ``[trainer] max_memory_gb`` (or ``data = "memory"``), else its first
    whole episodes that do, with a warning that says so. Those are read in slices of up to
    ``READ_ROWS`` (one row at a time, 3,000 rows took 4.0 s; now 0.02 s) and cut back to the
    whole episodes within the rows that fit."""
    data = StreamedTimeline.open(split, description, 1, device)
    rows = max(1, int(EVAL_SHARE * memory_budget(config.max_memory_gb, device)) // row_bytes(data))
    if config.data == "memory" or len(data) <= rows:
        return read_in_memory(split, description).to(device), []
    sample = next(replace(data, buffer_rows=rows * READ_SHARE).episodes(rows))
    if len(sample) > rows:
        first_left_out = (sample.episode_id == sample.episode_id[rows]).nonzero()[0]
        if int(first_left_out) > 0:
            sample = sample.take(_arange(0, int(first_left_out)))
    return sample.to(device), [sampled_warning(split, len(sample), len(data))]


def sampled_warning(split: Path, sample: int, rows: int) -> str:
    """The warning of estimators run on the first ``sample`` of a split's ``rows``."""
    return (
        f"{split} does not fit [trainer] max_memory_gb: the estimators ran on its first "
        f"{sample} rows (whole episodes) of {rows}"
    )


def row_bytes(data: StreamedTimeline) -> int:
    """The bytes one row's tensors take in memory, its preprocessed states included (taken as
    wide as the raw ones): 4-byte values, 8-byte indices."""
    states, actions = len(data.feature_ids), len(data.action_feature_ids)
    values = 6 * states + 4 + 2 * 2 * 4
    if data.action_type is ActionType.DISCRETE:
        values += 2 * len(data.actions)
    else:
        values += 4 * actions
    for name in ("possible_actions", "possible_next_actions", "next_n_possible_next_actions"):
        values += data.widths.get(name, 0) * (2 * actions + 1)
    if "next_n_rewards" in data.widths:
        values += 3 * data.widths["next_n_rewards"] + 2 + 3 * states
        if data.action_type is ActionType.DISCRETE:
            values += len(data.actions)
    return 4 * values


def _gib(size: int) -> str:
    return f"{size / 2**30:.3g} GiB"


def _survey(folder: Path, action_type: ActionType) -> tuple[tuple[RowGroup, ...], dict[str, int]]:
    """A split's row groups (rows, first episode's number) and padding widths, read from the
    metadata and the id and list columns."""
    import pyarrow.parquet as pq

    from horizon_engine.dataset import PADDED_COLUMNS, padding_widths

    paths = sorted(
        path
        for path in folder.glob("*.parquet")
        if path.is_file() and not path.name.startswith(("_", "."))
    )
    if not paths:
        raise HorizonError(f"{folder}: holds no Parquet files of a timeline split")
    groups: list[RowGroup] = []
    widths: dict[str, int] = {}
    episodes = 0
    last_episode: object = None
    for path in paths:
        try:
            file = pq.ParquetFile(path, **READER_OPTIONS)
            names = file.schema_arrow.names
            padded = PADDED_COLUMNS if action_type is ActionType.PARAMETRIC else ["next_n_rewards"]
            listed = [name for name in padded if name in names]
            for index in range(file.num_row_groups):
                table = file.read_row_group(index, ["mdp_id", *listed], use_threads=False)
                if not table.num_rows:
                    continue
                ids = table["mdp_id"]
                continues = ids[0].as_py() == last_episode
                first = episodes - 1 if continues else episodes
                distinct = len(ids.combine_chunks().unique())
                episodes = first + distinct
                last_episode = ids[-1].as_py()
                groups.append(RowGroup(path, index, table.num_rows, first))
                for name, width in padding_widths(table, action_type).items():
                    widths[name] = max(widths.get(name, 0), width)
        except (OSError, ValueError, KeyError) as exc:
            raise HorizonError(f"{path}: cannot read the timeline split: {exc}") from None
    return tuple(groups), widths


def _episode_changes(ids: pa.Array) -> int:
    """The rows of ``ids`` (a slice's ``mdp_id``) that start an episode after its first row."""
    import pyarrow.compute as pc

    return int(pc.sum(pc.not_equal(ids[1:], ids[:-1])).as_py() or 0)


def _row_group_batches(group: RowGroup, rows: int) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(group.path, **READER_OPTIONS)
        columns = [name for name in file.schema_arrow.names if name not in UNREAD_COLUMNS]
        yield from file.iter_batches(
            rows, row_groups=[group.index], columns=columns, use_threads=False
        )
    except (OSError, ValueError) as exc:
        raise HorizonError(f"{group.path}: cannot read the timeline split: {exc}") from None


def _rows_of_groups(groups: Sequence[RowGroup], share: int, shares: int) -> list[RowGroup]:
    """The ``share``-th of ``shares`` nearly equal runs of each of ``groups``' rows (the
    empty runs of a group with fewer rows than ``shares`` left out)."""
    runs = []
    for group in groups:
        start = group.start + group.rows * share // shares
        stop = group.start + group.rows * (share + 1) // shares
        if stop > start:
            runs.append(replace(group, start=start, rows=stop - start))
    return runs


def _concatenated(parts: Sequence[TimelineTensors]) -> TimelineTensors:
    import torch

    from horizon_engine.dataset import TimelineTensors

    first = parts[0]
    if len(parts) == 1:
        return first
    tensors = {
        name: torch.cat([part.tensors()[name] for part in parts]) for name in first.tensors()
    }
    return TimelineTensors(
        **tensors, feature_ids=first.feature_ids, action_feature_ids=first.action_feature_ids
    )


def _arange(start: int, stop: int) -> torch.Tensor:
    import torch

    return torch.arange(start, stop)


def read_in_memory(folder: Path, description: ProblemDescription) -> TimelineTensors:
    """A whole split in memory (on the CPU), read ``READ_ROWS`` rows at a time into tensors
    allocated once: its peak is the tensors and one slice's Arrow rows. Reading the whole table
    first, as ``dataset.load_timeline`` does, peaked at about ten times the tensors on rows of
    100 features (their feature maps, keys and all, before the dense conversion: 2.4 GB for a
    train epoch of 10^5 rows, ``benchmarks/scaling.py``), which "auto" did not count."""
    import torch

    from horizon_engine.dataset import TimelineTensors, load_timeline

    data = StreamedTimeline.open(folder, description, READ_ROWS * READ_SHARE, torch.device("cpu"))
    if not len(data):
        return load_timeline(
            folder,
            description.action_type,
            description.feature_ids,
            description.action_feature_ids,
            description.actions,
        )
    whole: dict[str, torch.Tensor] = {}
    start = 0
    for part in data.in_file_order():
        tensors = part.tensors()
        if not whole:
            whole = {
                name: torch.empty((len(data), *tensor.shape[1:]), dtype=tensor.dtype)
                for name, tensor in tensors.items()
            }
        for name, tensor in tensors.items():
            whole[name][start : start + len(part)] = tensor
        start += len(part)
    return TimelineTensors(
        **whole,
        feature_ids=list(description.feature_ids),
        action_feature_ids=list(description.action_feature_ids),
    )
