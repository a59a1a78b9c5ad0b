"""Writing outputs so that a crash never leaves a half-written file that looks whole.

Every output is written under a temporary name beside its final place and renamed into place
only once complete. A folder that already exists is moved aside first and removed after the
new one is in place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _remove(path: Path) -> None:
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
    _remove(temporary)
    try:
        yield temporary
    except BaseException:
        _remove(temporary)
        raise
    if temporary.is_dir() and path.exists():
        retired = path.with_name(f".{path.name}.old-{os.getpid()}")
        _remove(retired)
        os.replace(path, retired)
        os.replace(temporary, path)
        _remove(retired)
    else:
        os.replace(temporary, path)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically."""
    with atomic_output(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
