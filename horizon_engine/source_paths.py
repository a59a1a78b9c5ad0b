"""Which files a source's configured ``path`` stands for: one rule for every file source.

A path is a file, a folder or a glob pattern (or a list of them); a folder stands for its
files with the source's suffixes, leaving out what its writers mark as not data. The built-in
JSONL and Parquet sources read through it, and a third party's file source should too, so that
``path = "logs/"`` means the same files whichever source reads them.
"""

from __future__ import annotations

import glob
from pathlib import Path

from horizon_engine.errors import HorizonError


def expand_paths(patterns: str | list[str], suffixes: tuple[str, ...]) -> list[Path]:
    """Files matching the configured paths or glob patterns, in a stable order, each once.

    A folder stands for the files under it whose names end in one of ``suffixes``, leaving out
    what lies under a name starting with ``.`` or ``_``, as Spark, Hive and Arrow's datasets
    do: temporary files, ``_SUCCESS`` markers, a join's ``_*.report.json``. A path that
    exists is taken as it is, even where its name holds glob characters such as ``[``.
    """
    patterns = [patterns] if isinstance(patterns, str) else patterns
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
        if not found:
            kinds = ", ".join(f"*{suffix}" for suffix in suffixes)
            what = f"no {kinds} file under it" if exists else "no file or folder matches"
            raise HorizonError(f"[source] path {pattern!r}: {what}")
        files.update(dict.fromkeys(found))
    return list(files)


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
