"""Who owns what in a run's output folder, and what an earlier run left behind there.

Several runs may write to one folder over time: a first full run, then ``--stages train`` with
new trainer options, then ``horizon export``. The folder's ``manifest.json`` is the record of
what the engine wrote there, and these rules keep it honest:

- Horizon removes or replaces only paths an earlier run's manifest lists among a stage's
  outputs. A path a stage would write that no run recorded (a user's own ``model.onnx``, their
  logs kept in ``source/``) stops the run before anything is written; a user's other files in
  the folder are never touched.
- A run of the whole pipeline (no ``--stages``) in a folder that holds another run's outputs
  is a new run: it refuses, naming ``--overwrite``, which removes the earlier run's recorded
  outputs first. ``--stages`` continues the folder's run: each stage run replaces its own
  earlier outputs (old checkpoints and event files included), and the others are carried over.
- A manifest that still says ``running`` belongs to a run that is either still going (its
  process is alive on this host: the new run refuses) or was interrupted (killed, machine
  lost). An interrupted run is reported, its temporary files (named with its process id, see
  ``horizon_engine.files``) are removed, and what its unfinished stage wrote counts as
  incomplete: a later stage that reads it refuses until that stage is run again.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizon_engine.errors import HorizonError
from horizon_engine.files import remove_path

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class EarlierRun:
    """The run recorded in a folder's manifest.json before this one started."""

    manifest: dict[str, Any]

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", "?"))

    @property
    def stages(self) -> dict[str, dict[str, Any]]:
        """Each stage's record: this run's own reports and the ones it carried over."""
        stages = self.manifest.get("stages")
        return stages if isinstance(stages, dict) else {}

    def outputs(self) -> set[str]:
        """Every path (relative to the folder) a recorded stage wrote."""
        return {
            str(path)
            for report in self.stages.values()
            if isinstance(report, dict)
            for path in report.get("outputs", [])
        }

    @property
    def running_stage(self) -> str | None:
        return self.manifest.get("running_stage")

    def incomplete_stages(self) -> dict[str, str]:
        """Stages whose outputs are partial, with why: the stage an interrupted run was in,
        and those an earlier run already found incomplete and nobody has run again since."""
        incomplete = self.manifest.get("incomplete_stages")
        found = dict(incomplete) if isinstance(incomplete, dict) else {}
        if self.unfinished and self.running_stage:
            found[self.running_stage] = f"{self.describe()} was interrupted during it"
        return found

    @property
    def unfinished(self) -> bool:
        return self.manifest.get("status") == "running"

    def still_running(self) -> bool:
        """True when the recorded process is alive on this host (it may be writing now)."""
        pid = self.manifest.get("pid")
        if not self.unfinished or not isinstance(pid, int) or pid == os.getpid():
            return False
        if self.manifest.get("host") != socket.gethostname():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def describe(self) -> str:
        started = self.manifest.get("started_at")
        return f"run {self.run_id}" + (f" (started {started})" if started else "")


def read_earlier_run(folder: Path) -> EarlierRun | None:
    """The run recorded in ``folder/manifest.json``, or None when there is none (or it is not
    a manifest: then nothing in the folder counts as the engine's)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return EarlierRun(manifest) if isinstance(manifest, dict) else None


def output_dir_problem(path: Path, where: str) -> str | None:
    """Why ``path`` cannot be a run's output folder (it, or a parent, is a file), or None."""
    for candidate in (path, *path.parents):
        if candidate.exists() and not candidate.is_dir():
            what = "is a file" if candidate == path else f"is under {candidate}, which is a file"
            return f"{where}: [pipeline] output_dir = {str(path)!r} {what}; name a folder"
    return None


def matches(path: str, claims: tuple[str, ...]) -> bool:
    """Whether a run-relative path is one of ``claims`` (glob patterns such as
    ``checkpoints/epoch-*.pt``, or a folder and everything under it)."""
    return any(fnmatch.fnmatch(path, claim) or path.startswith(f"{claim}/") for claim in claims)


def existing_claims(folder: Path, claims: tuple[str, ...]) -> list[str]:
    """The paths matching ``claims`` that exist in ``folder``, run-relative."""
    found: list[str] = []
    for claim in claims:
        found += sorted(str(path.relative_to(folder)) for path in folder.glob(claim))
    return found


def leftovers(folder: Path, pid: int) -> list[Path]:
    """Temporary files and folders of the process ``pid`` (``.NAME.tmp-PID``, ``.NAME.old-PID``)
    in ``folder`` and the folders directly under it: what a killed run left half-written."""
    pattern = re.compile(rf"^\..+\.(tmp|old)-{pid}$")
    places = [folder, *(entry for entry in folder.iterdir() if entry.is_dir())]
    return sorted(
        entry
        for place in places
        if place.is_dir()
        for entry in place.iterdir()
        if pattern.match(entry.name)
    )


def take_over(
    folder: Path,
    earlier: EarlierRun | None,
    claims: dict[str, tuple[str, ...]],
    selected: list[str],
    resuming: bool,
    overwrite: bool,
) -> list[str]:
    """Make ``folder`` ready for a run of the ``selected`` stages; ``claims`` maps every stage
    to the paths it writes (glob patterns allowed).

    Refuses (a ``HorizonError``) when another run is writing to the folder, when a stage would
    write over a path no run recorded, or when a new run would replace an earlier run's outputs
    without ``overwrite``. Removes an interrupted run's temporary files, and with ``overwrite``
    every output the earlier run recorded. Returns notes for the manifest's warnings.
    """
    notes: list[str] = []
    recorded = earlier.outputs() if earlier else set()
    partial = earlier.incomplete_stages() if earlier else {}
    partial_claims = tuple(path for stage in partial for path in claims.get(stage, ()))
    if earlier is not None and earlier.still_running():
        raise HorizonError(
            f"{folder}: {earlier.describe()} is still running (process "
            f"{earlier.manifest.get('pid')}); wait for it or choose another output_dir"
        )
    if earlier is not None and earlier.unfinished:
        pid = earlier.manifest.get("pid", -1)
        removed = [str(path.relative_to(folder)) for path in leftovers(folder, pid)]
        for path in removed:
            remove_path(folder / path)
        stage = earlier.running_stage
        notes.append(
            f"{earlier.describe()} was interrupted"
            + (f" during stage '{stage}'" if stage else "")
            + (f"; removed its temporary files {removed}" if removed else "")
        )
    unrecorded = [
        path
        for stage in selected
        for path in existing_claims(folder, claims[stage])
        if not matches(path, (*recorded, *partial_claims))
    ]
    if unrecorded:
        raise HorizonError(
            f"{folder} holds {', '.join(unrecorded)}, which this run would write, but no run "
            f"recorded in {folder / MANIFEST} wrote it; move it away or choose another "
            "output_dir (Horizon never deletes files it did not write)"
        )
    if earlier is None or resuming:
        return notes
    present = sorted(
        {path for path in recorded if (folder / path).exists()}
        | {path for claim in partial_claims for path in existing_claims(folder, (claim,))}
    )
    if present and not overwrite:
        shown = ", ".join(present[:6]) + (f" and {len(present) - 6} more" * (len(present) > 6))
        raise HorizonError(
            f"{folder} holds the outputs of an earlier run ({earlier.describe()} last wrote "
            f"{MANIFEST}): {shown}. Run with "
            "--overwrite to replace them (files Horizon did not write are kept), use --stages "
            "to continue that run, or choose another output_dir"
        )
    for path in present:
        remove_path(folder / path)
    if present:
        notes.append(
            f"--overwrite: replaced the outputs of an earlier run ({earlier.describe()} last "
            f"wrote {MANIFEST})"
        )
    return notes


def record_failure(
    manifest: dict[str, Any],
    exc: BaseException,
    stage: str | None,
    finish: Callable[[dict[str, Any]], None],
) -> None:
    """What a failed run records, for every host of a training: ``status`` "failed", the
    ``error`` (its message, or its type when it has none) and the ``failed_stage`` (when one
    was under way); then ``finish`` (the final manifest and ``horizon_on_run_end``), whose own
    failure is added to ``exc`` as a note instead of masking it. The caller re-raises."""
    manifest["status"] = "failed"
    manifest["error"] = str(exc) or type(exc).__name__
    if stage is not None:
        manifest["failed_stage"] = stage
    try:
        finish(manifest)
    except Exception as hook_error:
        exc.add_note(f"horizon_on_run_end also failed: {hook_error!r}")
