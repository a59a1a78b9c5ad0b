"""Which files a source's configured ``path`` stands for: one rule for every file source.

A path is a file, a folder or a glob pattern (or a list of them); a folder stands for its
files with the source's suffixes, leaving out what its writers mark as not data. The built-in
JSONL and Parquet sources read through it, and a third party's file source should too, so that
``path = "logs/"`` means the same files whichever source reads them.
"""

from __future__ import annotations

import glob
import stat
from collections.abc import Callable
from pathlib import Path

from horizon_engine.errors import HorizonError


def expand_paths(
    patterns: str | list[str], suffixes: tuple[str, ...], run_folder: Path | None = None
) -> list[Path]:
    """Files matching the configured paths or glob patterns, in a stable order, each once.

    A folder stands for the files under it whose names end in one of ``suffixes``, leaving out
    what lies under a name starting with ``.`` or ``_``, as Spark, Hive and Arrow's datasets
    do: temporary files, ``_SUCCESS`` markers, a join's ``_*.report.json``. A path that
    exists is taken as it is, even where its name holds glob characters such as ``[``.

    What lies in ``run_folder`` (the run's ``output_dir``) is left out: a source folder that
    holds the run's own folder would otherwise read its ``manifest.json``, quarantine and
    rows as logged rows. A path that is not a regular file (a FIFO, a device, a socket) is an
    error: reading one can wait forever.
    """
    patterns = [patterns] if isinstance(patterns, str) else patterns
    inside_run = _inside(run_folder)
    files: dict[Path, None] = {}
    for pattern in patterns:
        exists = Path(pattern).exists()
        matches = [pattern] if exists else sorted(glob.glob(pattern, recursive=True))
        found: list[Path] = []
        for match in map(Path, matches):
            if match.is_dir():
                found += sorted(
                    path
                    for path in match.rglob("*")
                    if path.name.endswith(suffixes)
                    and not _hidden(path.relative_to(match))
                    and path.is_file()
                )
            else:
                found.append(match)
        left_out = [path for path in found if inside_run(path)]
        found = [path for path in found if path not in left_out]
        if not found:
            kinds = ", ".join(f"*{suffix}" for suffix in suffixes)
            what = f"no {kinds} file under it" if exists else "no file or folder matches"
            if left_out:
                what = (
                    f"what it stands for lies in the run's own output_dir {run_folder}, "
                    "which is never read as rows (the run writes its files there)"
                )
            raise HorizonError(f"[source] path {pattern!r}: {what}")
        for path in found:
            _check_regular(path, pattern)
        files.update(dict.fromkeys(found))
    return list(files)


def _inside(run_folder: Path | None) -> Callable[[Path], bool]:
    """Whether a path lies in ``run_folder`` (compared resolved, so that ``./runs/x`` and
    ``runs/x/`` are one folder); never, where there is none."""
    if run_folder is None:
        return lambda path: False
    folder = run_folder.resolve()
    return lambda path: path.resolve().is_relative_to(folder)


NOT_REGULAR: list[tuple[Callable[[int], bool], str]] = [
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
]
"""The kinds of file a source refuses, as its error names them."""


def _check_regular(path: Path, pattern: str) -> None:
    """Refuse a path that is not a regular file (after links): opening a FIFO waits for a
    writer, and a device or socket holds no rows."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise HorizonError(f"[source] path {pattern!r}: {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in NOT_REGULAR if test(mode)), "not a regular file")
        raise HorizonError(
            f"[source] path {pattern!r}: {path} is {kind}; a source reads regular files only"
        )


def _hidden(relative: Path) -> bool:
    """Whether a path inside a folder is one its readers leave out (``expand_paths``)."""
    return any(part.startswith((".", "_")) for part in relative.parts)


def path_problems(patterns: str | list[str], suffixes: tuple[str, ...]) -> list[str]:
    """Why the configured paths would find nothing to read (each path that matches no file)."""
    problems = []
    for pattern in [patterns] if isinstance(patterns, str) else patterns:
        try:
            expand_paths(pattern, suffixes)
        except HorizonError as exc:
            problems.append(str(exc))
    return problems
