"""Writing outputs so that a crash never leaves a half-written file that looks whole.

Every output is written under a temporary name beside its final place and renamed into place
only once complete. A folder that already exists is moved aside first and removed after the
new one is in place. Temporary names end with the writing process's id (``.NAME.tmp-PID``,
``.NAME.old-PID``), so that what a killed run left behind can be told apart from anything
else in the folder (``horizon_engine.run_folder``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WRITE_REFUSED = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
)
"""Errors of a disk or folder that refuses a write (full, over quota, read-only, not ours):
the user's to fix, so the command line reports them in one line (``horizon_engine.cli``)."""


def _refusal_naming(exc: BaseException, temporary: Path, path: Path) -> OSError | None:
    """A refused write to ``temporary`` or that does not say where (a full disk met by a
    file's ``write`` or by Arrow has no file name) as the same error naming ``path``, the
    place the user knows; None for any other error."""
    if not isinstance(exc, OSError) or exc.errno not in WRITE_REFUSED:
        return None
    named = exc.filename
    if named is None or Path(os.fsdecode(named)).is_relative_to(temporary):
        return OSError(exc.errno, os.strerror(exc.errno), str(path))
    return None


def remove_path(path: Path) -> None:
    """Remove a file, link or folder (with its contents); nothing when there is none."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write a file or folder to; rename it to ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    remove_path(temporary)
    try:
        yield temporary
    except BaseException as exc:
        remove_path(temporary)
        named = _refusal_naming(exc, temporary, path)
        if named is not None:
            raise named from exc
        raise
    _move_into_place(temporary, path)


def _move_into_place(temporary: Path, path: Path) -> None:
    """Rename ``temporary`` to ``path``; a folder there is moved aside first, then removed."""
    if temporary.is_dir() and path.exists():
        retired = path.with_name(f".{path.name}.old-{os.getpid()}")
        remove_path(retired)
        os.replace(path, retired)
        os.replace(temporary, path)
        remove_path(retired)
    else:
        os.replace(temporary, path)


@contextmanager
def staged_outputs(folder: Path) -> Iterator[Path]:
    """Yield a temporary folder inside ``folder`` for several outputs written together.

    On success each entry written there is moved into ``folder``, replacing the entry of the
    same name; on failure none is. Anything else in ``folder`` (a user's own files) stays as it
    was, which renaming a whole temporary ``folder`` into place would not allow.
    """
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".staging.tmp-{os.getpid()}"
    remove_path(staging)
    staging.mkdir()
    try:
        yield staging
        for entry in sorted(staging.iterdir()):
            _move_into_place(entry, folder / entry.name)
    except BaseException as exc:
        named = _refusal_naming(exc, staging, folder)
        if named is not None:
            raise named from exc
        raise
    finally:
        remove_path(staging)
        if created and not any(folder.iterdir()):
            folder.rmdir()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_output(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
