"""Writing outputs so that a crash never leaves a half-written file that looks whole, and
nothing is written or removed through a link that the run did not make.

Every output is written under a temporary name beside its final place and renamed into place
only once complete. A folder that already exists is moved aside first and removed after the
new one is in place. Temporary names end with the writing process's id (``.NAME.tmp-PID``,
``.NAME.old-PID``: ``temporary_name``, ``retired_name``), so that what a killed run left
behind can be told apart from anything else in the folder (``horizon_engine.run_folder``).

A run holds its folder (``held_folder``): the folder is opened once, at the run's start, and
every path under it that these functions write or remove is reached from that open folder one
component at a time, never following a link. A folder of the run replaced by a link while a
stage writes (in a shared output folder, by anyone who can write there) then stops the stage
with an ``UnsafePathError`` instead of sending its removals and renames to where the link
leads. A writer is handed a temporary path that names the held folder itself
(``/proc/PID/fd/N/...`` on Linux), so a writer that opens files by path (Arrow,
``torch.save``) cannot be redirected either; elsewhere it is the plain path.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from horizon_engine.errors import HorizonError

WRITE_REFUSED = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
)
"""Errors of a disk or folder that refuses a write (full, over quota, read-only, not ours):
the user's to fix, so the command line reports them in one line (``horizon_engine.cli``)."""

STAGING = "staging"
"""The name ``staged_outputs`` makes its temporary folder from (``.staging.tmp-PID``)."""


class UnsafePathError(HorizonError):
    """A path a run folder's manifest lists, or one a stage would write, leads outside the
    folder (or is the folder itself), or passes through a link the run did not make: acting
    on it could remove or overwrite another file."""


def temporary_name(name: str, pid: int | str | None = None) -> str:
    """The name an output ``name`` is written under before it is renamed into place, by the
    process ``pid`` (this one by default); ``pid`` may be a glob pattern's text."""
    return f".{name}.tmp-{os.getpid() if pid is None else pid}"


def retired_name(name: str, pid: int | str | None = None) -> str:
    """The name a folder ``name`` is moved aside to while its replacement takes its place."""
    return f".{name}.old-{os.getpid() if pid is None else pid}"


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


def _user_naming(exc: BaseException, handed: Path, plain: Path) -> OSError | None:
    """An error naming a path under ``handed`` (the ``/proc`` path a writer was given) as the
    same error naming it under ``plain``, the user's spelling of that place; None for any
    other error."""
    if handed == plain or not isinstance(exc, OSError) or exc.filename is None:
        return None
    named = Path(os.fsdecode(exc.filename))
    if not named.is_relative_to(handed):
        return None
    return OSError(exc.errno, exc.strerror, str(plain / named.relative_to(handed)))


def _renamed_error(exc: BaseException, handed: Path, plain: Path, path: Path) -> None:
    """Raise ``exc`` as the user should read it (``_refusal_naming``, ``_user_naming``)."""
    named = _refusal_naming(exc, handed, path) or _user_naming(exc, handed, plain)
    if named is not None:
        raise named from exc


_FD_OPERATIONS = (
    {os.open, os.mkdir, os.rename, os.unlink, os.rmdir, os.stat, os.readlink} <= os.supports_dir_fd
    and os.stat in os.supports_follow_symlinks
    and shutil.rmtree.avoids_symlink_attacks
    and hasattr(os, "O_DIRECTORY")
    and hasattr(os, "O_NOFOLLOW")
)
"""Whether this system walks a folder from an open one without following links (Linux, BSD,
macOS): elsewhere a run folder is not held, and paths are used as they are. (``os.replace``
takes the folders ``os.rename`` takes, but is not listed.)"""

_FOLDER_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
"""How a folder under a held one is opened: as a folder, never through a link."""

_held: dict[Path, int] = {}
"""The held run folders (absolute paths, as the run named them) and their open folders."""


@contextmanager
def held_folder(path: Path) -> Iterator[None]:
    """Create ``path`` (a run's folder) if needed and hold it while the block runs: every
    output ``atomic_output`` and ``staged_outputs`` write and every path ``remove_path``
    removes under it is then reached from the folder opened here, without following a link
    (see the module's docstring). The folder's own path is followed once, here: it is the
    user's choice of folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    key = Path(os.path.abspath(path))
    if not _FD_OPERATIONS or key in _held:
        yield
        return
    _held[key] = os.open(path, _FOLDER_FLAGS & ~os.O_NOFOLLOW)
    try:
        yield
    finally:
        os.close(_held.pop(key))


def _locate(path: Path) -> tuple[int, Path, tuple[str, ...]] | None:
    """The held folder ``path`` lies under (its open folder and path) and ``path``'s
    components below it; None for a path under no held folder (or a held folder itself)."""
    absolute = Path(os.path.abspath(path))
    for root, fd in _held.items():
        if absolute != root and absolute.is_relative_to(root):
            return fd, root, absolute.relative_to(root).parts
    return None


def _handed(fd: int, plain: Path) -> Path:
    """The path a writer is given for the open folder ``fd`` (known to the user as
    ``plain``): one that leads to that folder whatever becomes of ``plain`` (Linux's
    ``/proc``), or ``plain`` where the system has none."""
    handed = Path(f"/proc/{os.getpid()}/fd/{fd}")
    return handed if handed.is_dir() else Path(os.path.abspath(plain))


def _refuse_link(dir_fd: int, name: str, path: Path) -> None:
    """Raise an ``UnsafePathError`` when ``name`` in the open folder ``dir_fd`` (the user's
    ``path``) is a link."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(found.st_mode):
        target = os.readlink(name, dir_fd=dir_fd)
        raise UnsafePathError(
            f"{path} is a link to {target}, which this run did not make: Horizon writes and "
            "removes nothing through a link in a run folder (someone replaced the run's "
            "folder while it ran?). Remove the link, or choose an output_dir only you can "
            "write to"
        )


def _open_folder(dir_fd: int, parts: tuple[str, ...], at: Path, create: bool) -> int:
    """A new open folder for ``parts`` below the open folder ``dir_fd`` (whose path is
    ``at``), each component opened without following a link (one is an ``UnsafePathError``)
    and, with ``create``, made when missing (else a missing one is a ``FileNotFoundError``)."""
    fd = os.dup(dir_fd)
    try:
        for part in parts:
            at = at / part
            try:
                child = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                child = _make_folder(fd, part, at)
            except OSError as exc:
                _refuse_link(fd, part, at)
                raise OSError(exc.errno, exc.strerror, str(at)) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_folder(dir_fd: int, name: str, at: Path) -> int:
    """Make the folder ``name`` (the user's ``at``) in the open folder ``dir_fd`` unless it
    is there, and open it without following a link."""
    try:
        with suppress(FileExistsError):
            os.mkdir(name, dir_fd=dir_fd)
        return os.open(name, _FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        _refuse_link(dir_fd, name, at)
        raise OSError(exc.errno, exc.strerror, str(at)) from None


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An error of an operation on a name in an open folder, which names only that name
    (``.staging.tmp-PID``), as the same error naming ``path``, the place the user knows."""
    try:
        yield
    except OSError as exc:
        named = exc.filename
        if named is None or os.sep in os.fsdecode(named):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _same_folder(fd: int, other: int) -> bool:
    one, two = os.fstat(fd), os.fstat(other)
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)


def _check_in_place(root_fd: int, root: Path, parts: tuple[str, ...], fd: int) -> None:
    """Refuse (``UnsafePathError``) to rename anything into the open folder ``fd`` unless it is
    still the folder at ``parts`` under the held run folder: one moved away or replaced
    during the stage would otherwise receive outputs its path no longer shows."""
    try:
        now = _open_folder(root_fd, parts, root, create=False)
    except FileNotFoundError:
        now = None
    if now is not None:
        try:
            if _same_folder(now, fd):
                return
        finally:
            os.close(now)
    path = root.joinpath(*parts)
    raise UnsafePathError(
        f"{path} was moved or replaced while this run wrote into it; Horizon renamed nothing "
        "into place. Make sure nothing else changes the run folder, then run the stage again"
    )


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _remove_entry(dir_fd: int, name: str) -> None:
    """Remove ``name`` in the open folder ``dir_fd``: a file, a link (never followed) or a
    folder with its contents; nothing when there is none."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(found.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _move_entry(from_fd: int, name: str, to_fd: int, target: str) -> None:
    """``_move_into_place`` between open folders: rename ``name`` in ``from_fd`` to ``target``
    in ``to_fd``; a folder replacing an entry moves it aside first, then removes it."""
    found = os.stat(name, dir_fd=from_fd, follow_symlinks=False)
    if stat.S_ISDIR(found.st_mode) and _exists(to_fd, target):
        retired = retired_name(target)
        _remove_entry(to_fd, retired)
        os.rename(target, retired, src_dir_fd=to_fd, dst_dir_fd=to_fd)
        os.rename(name, target, src_dir_fd=from_fd, dst_dir_fd=to_fd)
        _remove_entry(to_fd, retired)
    else:
        os.replace(name, target, src_dir_fd=from_fd, dst_dir_fd=to_fd)


def remove_path(path: Path) -> None:
    """Remove a file, link or folder (with its contents); nothing when there is none. Under a
    held run folder no link on the way to it is followed (``held_folder``)."""
    located = _locate(path)
    if located is not None:
        root_fd, root, parts = located
        try:
            parent = _open_folder(root_fd, parts[:-1], root, create=False)
        except FileNotFoundError:
            return
        try:
            with _naming(path):
                _remove_entry(parent, parts[-1])
        finally:
            os.close(parent)
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write a file or folder to; rename it to ``path`` on success."""
    path = Path(path)
    located = _locate(path)
    if located is None:
        yield from _plain_atomic_output(path)
        return
    root_fd, root, parts = located
    parent = _open_folder(root_fd, parts[:-1], root, create=True)
    name = temporary_name(parts[-1])
    with _closing(parent), _naming(path):
        _remove_entry(parent, name)
        handed = _handed(parent, path.parent) / name
        try:
            yield handed
            _check_in_place(root_fd, root, parts[:-1], parent)
            _move_entry(parent, name, parent, parts[-1])
        except BaseException as exc:
            _remove_entry(parent, name)
            _renamed_error(exc, handed, path.with_name(name), path)
            raise


def append_output(path: Path) -> BinaryIO:
    """``path`` opened to append bytes (created when missing, its folders too), for a file
    written over a run's course rather than whole (an event file). Under a held run folder
    it is reached without following a link, itself included (``held_folder``); once open, it
    is written whatever becomes of its path."""
    path = Path(path)
    located = _locate(path)
    if located is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("ab")
    root_fd, root, parts = located
    with _closing(_open_folder(root_fd, parts[:-1], root, create=True)) as parent:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, 0o644, dir_fd=parent)
        except OSError as exc:
            _refuse_link(parent, parts[-1], path)
            raise OSError(exc.errno, exc.strerror, str(path)) from None
    return os.fdopen(fd, "ab")


def _plain_atomic_output(path: Path) -> Iterator[Path]:
    """``atomic_output`` for a path under no held folder: by path. The temporary path is
    absolute, so that no writer reads a leading ``~`` as the home folder (Arrow does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(os.path.abspath(path.with_name(temporary_name(path.name))))
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
        retired = path.with_name(retired_name(path.name))
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
    located = _locate(folder)
    if located is None:
        yield from _plain_staged_outputs(folder)
        return
    root_fd, root, parts = located
    name = temporary_name(STAGING)
    with ExitStack() as opened, _naming(folder / name):
        parent = opened.enter_context(_closing(_open_folder(root_fd, parts[:-1], root, True)))
        created = not _exists(parent, parts[-1])
        above = root.joinpath(*parts[:-1])
        target = opened.enter_context(_closing(_open_folder(parent, parts[-1:], above, True)))
        _remove_entry(target, name)
        os.mkdir(name, dir_fd=target)
        staging = opened.enter_context(_closing(os.open(name, _FOLDER_FLAGS, dir_fd=target)))
        handed = _handed(staging, folder / name)
        try:
            yield handed
            _check_in_place(root_fd, root, parts, target)
            for entry in sorted(os.listdir(staging)):
                _move_entry(staging, entry, target, entry)
        except BaseException as exc:
            _renamed_error(exc, handed, folder / name, folder)
            raise
        finally:
            _remove_entry(target, name)
            if created and not os.listdir(target) and _still_named(parent, parts[-1], target):
                os.rmdir(parts[-1], dir_fd=parent)


@contextmanager
def _closing(fd: int) -> Iterator[int]:
    """Close the open file or folder ``fd`` when the block ends."""
    try:
        yield fd
    finally:
        os.close(fd)


def _still_named(dir_fd: int, name: str, fd: int) -> bool:
    """Whether ``name`` in the open folder ``dir_fd`` is still the open folder ``fd``."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _plain_staged_outputs(folder: Path) -> Iterator[Path]:
    """``staged_outputs`` for a folder under no held folder: by path."""
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(os.path.abspath(folder / temporary_name(STAGING)))
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
