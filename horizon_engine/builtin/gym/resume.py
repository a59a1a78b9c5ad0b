"""What ``horizon gym train --resume`` reads and checks: the earlier run, the runner's own
state beside each evaluation's checkpoint, and the ``-f`` rows file written so far.

The training driver's epoch checkpoint (``checkpoints/epoch-NNNN.pt``) holds the trainer, torch's
generators and the metrics; the runner's state of the same evaluation is a file of its own,
``checkpoints/online-NNNN.pt``, written just before it: it holds the replay buffer, which can be
far larger than the networks, and an export or a warm start reading ``latest.pt`` should not
load it. Only the last complete evaluation's online file is kept (the one before it until the
new epoch checkpoint is written), and none once the run has succeeded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from horizon_engine import (
    WRITE_REFUSED,
    EarlierRun,
    HorizonError,
    NothingToResume,
    RunFolder,
    atomic_output,
    read_checkpoint,
    remove_path,
)

if TYPE_CHECKING:
    from horizon_engine.builtin.gym.config import GymSpec


NEUTRAL_KEYS = frozenset({"gym.output_dir"})
"""Resolved config keys that may differ on ``--resume``: the folder is the run's own."""


@dataclass(frozen=True)
class Position:
    """Where the run stood when an evaluation's checkpoint was written: ``step`` steps into
    training episode ``episode`` (its row written), the episode ``ended`` or not, or the run
    ``stopped`` (the score bar reached, or every episode played). ``state`` is the observation
    the next step starts from and ``action`` (with its ``probability``) the action already
    chosen for it; ``actions`` are the episode's actions so far and ``env_random`` the
    environment's generator state before the episode's reset (JSON; None for episode 1, reset
    with the seed): replaying them brings a fresh environment to ``state``."""

    episode: int
    step: int
    ended: bool
    stopped: bool
    state: list[float]
    action: Any
    probability: float
    actions: list[Any]
    env_random: str | None


def save_online_state(output_dir: Path, epoch: int, state: dict[str, Any]) -> None:
    """Write evaluation ``epoch``'s runner state atomically, before its epoch checkpoint."""
    import torch

    path = RunFolder(output_dir).online_state_path(epoch)
    with atomic_output(path) as temporary:
        torch.save(state, temporary)


def prune_online_states(output_dir: Path, keep: int | None) -> None:
    """Remove the runner state files but evaluation ``keep``'s (every one for None)."""
    folder = RunFolder(output_dir)
    kept = folder.online_state_path(keep) if keep is not None else None
    for path in folder.online_states():
        if path != kept:
            remove_path(path)


def read_online_state(output_dir: Path, epoch: int) -> dict[str, Any]:
    """Evaluation ``epoch``'s runner state, read as data (``weights_only``)."""
    path = RunFolder(output_dir).online_state_path(epoch)
    if not path.is_file():
        raise HorizonError(
            f"--resume: {path} does not exist beside its evaluation's checkpoint: the run was "
            "written by a version of horizon gym train that did not record what resuming "
            "needs; train again without --resume"
        )
    state = read_checkpoint(path, "--resume")
    if not isinstance(state, dict) or not isinstance(state.get("position"), dict):
        raise HorizonError(f"--resume: {path} holds no runner state of horizon gym train")
    return state


def check_resumable(spec: GymSpec) -> EarlierRun:
    """The folder's earlier run, which ``--resume`` continues: refused when there is none, when
    it is not a ``horizon gym train`` run, while its process is still running on this host
    (the manifest records it, as every run's does), when the config differs in a key that may change
    results (named), and with ``NothingToResume`` when it succeeded."""
    from horizon_engine.builtin.gym.runner import GYM_COMMAND

    output_dir = Path(spec.gym.output_dir)
    earlier = RunFolder(output_dir).earlier_run()
    if earlier is None:
        raise HorizonError(
            f"--resume: {output_dir} holds no run to resume (no readable "
            f"{RunFolder.MANIFEST}); run without --resume to start one"
        )
    command = earlier.manifest.get("command") or "horizon run"
    if command != GYM_COMMAND:
        raise HorizonError(
            f"--resume: {output_dir} holds a run of `{command}`, not of {GYM_COMMAND}; "
            "resume it with that command"
        )
    if earlier.still_running():
        raise HorizonError(
            f"--resume: {earlier.describe()} is still running (process "
            f"{earlier.manifest.get('pid')}); wait for it to end, or stop it first"
        )
    changed = earlier.config_changes(spec.resolved(), NEUTRAL_KEYS)
    if changed:
        raise HorizonError(
            f"--resume: the config differs from the one {earlier.describe()} recorded in "
            f"{output_dir / RunFolder.MANIFEST}, in {', '.join(changed)}; resuming would not "
            "give that run's result. Undo the change (the same file, --set and --score-bar "
            "options), or start a new run in another output_dir"
        )
    if earlier.manifest.get("status") == "succeeded":
        raise NothingToResume(
            f"nothing to resume: {earlier.describe()} finished its training; see "
            f"{output_dir / RunFolder.MANIFEST}"
        )
    return earlier


class RowsWriter:
    """The ``-f`` rows, one JSON line per transition, written to ``.NAME.partial`` beside the
    file and renamed to it when training ends: the file appears complete or not at all, and
    an interrupted run's rows stay for ``--resume``, which cuts them back to the byte its
    checkpoint counted (``offset``) and appends."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle

    def write(self, row: str) -> None:
        self.handle.write(row.encode("utf-8") + b"\n")

    def offset(self) -> int:
        """Bytes written so far, flushed: what a checkpoint records."""
        self.handle.flush()
        return self.handle.tell()


def partial_rows_path(rows: Path) -> Path:
    return rows.with_name(f".{rows.name}.partial")


@contextmanager
def rows_writer(rows: Path | None, offset: int | None) -> Iterator[RowsWriter | None]:
    """A ``RowsWriter`` for ``rows`` (None without ``-f``): a new file for ``offset`` None,
    else the partial file of an interrupted run cut back to ``offset`` bytes."""
    if rows is None:
        yield None
        return
    rows = Path(rows)
    partial = partial_rows_path(rows)
    partial.parent.mkdir(parents=True, exist_ok=True)
    if offset is None:
        handle = partial.open("wb")
    else:
        size = partial.stat().st_size if partial.is_file() else None
        if size is None or size < offset:
            found = "does not exist" if size is None else f"holds {size} bytes"
            raise HorizonError(
                f"--resume: {partial}, the -f rows written so far, {found}; the checkpoint "
                f"counted {offset} bytes. Train again without --resume"
            )
        handle = partial.open("r+b")
        handle.truncate(offset)
        handle.seek(offset)
    try:
        with handle:
            yield RowsWriter(handle)
    except OSError as exc:
        # A full or read-only disk met by a write names no file: name the one the user gave.
        if exc.errno in WRITE_REFUSED and exc.filename in (None, str(partial)):
            raise OSError(exc.errno, os.strerror(exc.errno), str(rows)) from exc
        raise
    os.replace(partial, rows)
