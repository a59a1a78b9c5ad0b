"""Where a command's output may go: never onto, into or over one of its own inputs.

``horizon join -o rew.jsonl`` once replaced the rewards it read with the joined rows, and
``horizon score -o rows.jsonl`` the rows it scored with its decisions; ``horizon gym collect``,
``horizon gym train`` and ``horizon serve`` check their outputs the same way. An output is compared
with each input however it is spelt: a relative or absolute path, one through ``..`` or a link
(paths compared resolved), a hard link or a bind mount (compared by device and inode where
both exist). A folder given as an input holds every path inside it; an output folder (a
Parquet log) holds what is inside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from horizon_engine.errors import HorizonError


def refuse_output_over_inputs(
    label: str,
    place: Path,
    inputs: Mapping[str, Path],
    command: str,
    written: str,
    appends: bool = False,
) -> None:
    """Refuse (``HorizonError``), before anything is written, an output ``place`` (shown as
    ``label``, such as ``-o PATH``) that is, lies inside or holds one of ``inputs`` (by what
    each is, e.g. ``"rewards file"``); ``command`` and ``written`` (what it writes) word the
    message, and ``appends`` says the output is appended to (a served decision log) rather
    than replaced."""
    for what, source in inputs.items():
        problem = overlap(place, source)
        if problem is not None:
            action = "replace" if not appends else "append to"
            action = "write into" if problem == "lies inside" else action
            raise HorizonError(
                f"{label} {problem} the {what} {source}: the {command} would {action} it. "
                f"Nothing was written; write the {written} elsewhere"
            )


def overlap(place: Path, source: Path) -> str | None:
    """How an output ``place`` meets an input ``source``: ``is``, ``lies inside`` (a folder),
    ``holds`` (a folder replaced), or None."""
    inside, holds = _within(place, source), _within(source, place)
    if inside and holds:
        return "is"
    if inside:
        return "lies inside"
    return "holds" if holds else None


def _same(first: Path, second: Path) -> bool:
    """Whether two paths name one file or folder: the same resolved path, or the same device
    and inode (a hard link, a bind mount)."""
    if first.resolve() == second.resolve():
        return True
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist
        return False


def _within(inner: Path, outer: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies inside it, links followed."""
    resolved = inner.resolve()
    return any(_same(place, outer) for place in (resolved, *resolved.parents))
