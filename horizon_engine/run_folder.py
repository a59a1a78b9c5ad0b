"""Who owns what in a run's output folder, and what an earlier run left behind there.

``RunFolder`` names every file a run writes and reads and writes the ones the engine reads
back (manifest, problem description, normalization, checkpoints, check rows, CPE files): no
other module spells a run-folder path, so a stage, a command and the gym runner cannot
disagree on where a file lives or what it holds.

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
- Nothing outside the folder is ever removed or written, whatever a manifest or a link inside
  the folder says. A manifest is input like any other (it may come from a copied folder or
  have been edited): every path it lists is checked by ``inside_path`` before it is acted on,
  and a stage's own paths are checked too (``check_claims_inside``), so that a link
  ``checkpoints -> /elsewhere`` cannot send a removal or a write out. A path that fails stops
  the run with an ``UnsafePathError`` naming the manifest, the entry and why.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.errors import HorizonError
from horizon_engine.files import (
    STAGING,
    UnsafePathError,
    held_folder,
    remove_path,
    retired_name,
    temporary_name,
    write_json,
)

if TYPE_CHECKING:
    import torch

    from horizon_engine.driver import Normalization, ProblemDescription
    from horizon_engine.plugins import PluginHost
    from horizon_engine.timeline import TimelineInfo


@dataclass(frozen=True)
class RunFolder:
    """A run's output folder: the name of every file a run writes there, and the typed reading
    and writing of those the engine reads back. Names are run-relative (what a manifest
    records and a stage claims); methods give paths under ``path``."""

    path: Path

    SOURCE_ROWS: ClassVar[str] = "source/rows.parquet"
    SOURCE_QUARANTINE: ClassVar[str] = "source/quarantine.jsonl"
    TIMELINE: ClassVar[str] = "timeline"
    TIMELINE_SPLITS: ClassVar[tuple[str, ...]] = ("timeline/train", "timeline/eval")
    TIMELINE_INFO: ClassVar[str] = "timeline/timeline.json"
    TIMELINE_QUARANTINE: ClassVar[str] = "timeline/quarantine"
    NORMALIZATION: ClassVar[str] = "normalization.json"
    CHECKPOINTS: ClassVar[str] = "checkpoints"
    LATEST_CHECKPOINT: ClassVar[str] = "checkpoints/latest.pt"
    EPOCH_CHECKPOINTS: ClassVar[str] = "checkpoints/epoch-*.pt"
    ONLINE_STATES: ClassVar[str] = "checkpoints/online-[0-9][0-9][0-9][0-9].pt"
    """The gym runner's state at each evaluation, kept for ``horizon gym train --resume``."""
    PROBLEM: ClassVar[str] = "problem.json"
    CHECK_ROWS: ClassVar[str] = "check_rows.pt"
    CPE: ClassVar[str] = "cpe.json"
    CPE_EPOCHS: ClassVar[str] = "cpe_epochs.json"
    TRAINING_EPOCHS: ClassVar[str] = "training_epochs.json"
    """Every epoch's training metrics (losses, mean Q per action), as the train stage ended."""
    REPORT: ClassVar[str] = "report.html"
    CPE_EVALUATE: ClassVar[str] = "cpe_evaluate.json"
    """``horizon evaluate``'s estimates without ``-o``: beside (never over) ``cpe.json``."""
    MANIFEST: ClassVar[str] = "manifest.json"
    MODEL: ClassVar[str] = "model.onnx"
    TENSORBOARD: ClassVar[str] = "tensorboard"
    TENSORBOARD_EVENTS: ClassVar[str] = "tensorboard/events.out.tfevents.*"
    ANALYSIS: ClassVar[str] = "analysis"

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    def held(self) -> AbstractContextManager[None]:
        """Hold the folder while a run writes in it (made if missing): its outputs are then
        written and removed from the folder opened once, never through a link
        (``horizon_engine.files.held_folder``)."""
        return held_folder(self.path)

    def file(self, name: str) -> Path:
        """The path of ``name``, one of the run-relative names above."""
        return self.path / name

    def split(self, split: str) -> Path:
        """The folder of one timeline split (``train`` or ``eval``)."""
        return self.path / self.TIMELINE / split

    @property
    def timeline(self) -> Path:
        return self.path / self.TIMELINE

    def manifest(self) -> dict[str, Any]:
        """The folder's ``manifest.json``, or an error saying it holds no run's manifest."""
        path = self.file(self.MANIFEST)
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise HorizonError(f"{path}: not a run's manifest ({exc})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
            raise HorizonError(f"{path}: not a run's manifest (no config in it)")
        pipeline = manifest["config"].get("pipeline", {})
        if not isinstance(pipeline, dict):
            raise HorizonError(
                f"{path}: config.pipeline is {json.dumps(pipeline)[:80]}, not a table of options"
            )
        return manifest

    def earlier_run(self) -> EarlierRun | None:
        """The run the folder's manifest records, which ``--resume`` continues; None where
        there is none (``read_earlier_run``)."""
        return read_earlier_run(self.path)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Replace ``manifest.json`` atomically."""
        write_json(self.file(self.MANIFEST), manifest)

    def start_manifest(
        self,
        run_id: str,
        seed: int,
        config_file: str,
        config: dict[str, Any],
        plugins: PluginHost,
        **fields: Any,
    ) -> dict[str, Any]:
        """Write and return the manifest of a run that starts now, for every command that
        runs in a folder (``horizon run``, ``horizon gym train``): ``"status": "running"``
        with the process and host (so that another run sees it is still going), the config,
        the plugins and their load failures, and the command's own ``fields``."""
        from horizon_engine import __version__

        manifest = {
            "horizon_version": __version__,
            "run_id": run_id,
            "status": "running",
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "seed": seed,
            "config_file": config_file,
            "config": config,
            "plugins": plugins.versions(),
            "plugin_failures": plugins.load_failures(),
            **fields,
        }
        self.write_manifest(manifest)
        return manifest

    def finish_manifest(
        self, manifest: dict[str, Any], on_run_end: Callable[[dict[str, Any]], None]
    ) -> None:
        """Write the final manifest, then tell the plugins (``on_run_end``: the run's
        ``horizon_on_run_end``)."""
        manifest["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.write_manifest(manifest)
        on_run_end(manifest)

    def finish_interrupted(
        self, manifest: dict[str, Any], on_run_end: Callable[[dict[str, Any]], None]
    ) -> None:
        """``finish_manifest`` for a run stopped by Ctrl-C (or SIGTERM): ``"status":
        "interrupted"``, which ``--resume`` continues."""
        manifest["status"] = "interrupted"
        manifest["error"] = "interrupted (Ctrl-C or SIGTERM); continue it with --resume"
        self.finish_manifest(manifest, on_run_end)

    def problem(self) -> ProblemDescription:
        """The problem description the run's training wrote (``problem.json``)."""
        from horizon_engine.driver import ProblemDescription

        return ProblemDescription.read(self.path)

    def timeline_info(self) -> TimelineInfo:
        """``timeline/timeline.json``: the timeline's action type, actions, n-step window,
        engine and rows per split, checked field by field."""
        from horizon_engine.timeline import TimelineInfo

        return TimelineInfo.read(self.timeline)

    def normalization(self, plugins: PluginHost | None = None) -> Normalization:
        """``normalization.json``: state (and action) features -> their parameters, each read
        through its type's model among ``plugins``' feature types (the process's by default)."""
        from horizon_engine.normalization import read_normalization

        return read_normalization(self.file(self.NORMALIZATION), plugins)

    def normalization_record(self) -> dict[str, Any]:
        """``normalization.json`` as the JSON it holds (what an exported model carries)."""
        path = self.file(self.NORMALIZATION)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise HorizonError(f"{path}: cannot read normalization parameters: {exc}") from None

    def write_normalization(self, normalization: Normalization) -> str:
        """Write ``normalization.json``; return its run-relative name (an output)."""
        from horizon_engine.normalization import write_normalization

        write_normalization(self.file(self.NORMALIZATION), normalization)
        return self.NORMALIZATION

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def latest_checkpoint(self) -> Path:
        return self.file(self.LATEST_CHECKPOINT)

    @classmethod
    def checkpoint_name(cls, epoch: int) -> str:
        """Epoch ``epoch``'s own checkpoint, run-relative (``checkpoints/epoch-0001.pt``)."""
        return f"{cls.CHECKPOINTS}/epoch-{epoch:04d}.pt"

    def checkpoint_path(self, epoch: int) -> Path:
        return self.file(self.checkpoint_name(epoch))

    def last_epoch_checkpoint(self) -> Path | None:
        """The highest-numbered ``epoch-NNNN.pt``: the last epoch whose checkpoint was written
        whole (each is renamed into place complete), or None when there is none."""
        found = sorted(self.checkpoints.glob("epoch-[0-9][0-9][0-9][0-9].pt"))
        return found[-1] if found else None

    def epoch_checkpoints(self) -> list[int]:
        """The epochs whose own checkpoints (``epoch-NNNN.pt``) the folder holds, ascending."""
        return sorted(
            int(path.stem.removeprefix("epoch-"))
            for path in self.checkpoints.glob("epoch-[0-9][0-9][0-9][0-9].pt")
        )

    def online_state_path(self, epoch: int) -> Path:
        """The gym runner's state at evaluation ``epoch`` (one of ``ONLINE_STATES``)."""
        return self.checkpoints / f"online-{epoch:04d}.pt"

    def online_states(self) -> list[Path]:
        return sorted(self.path.glob(self.ONLINE_STATES))

    def check_rows(self, description: ProblemDescription) -> dict[str, torch.Tensor]:
        """The rows the training kept to check an export on (``check_rows.pt``), checked
        against ``description``."""
        from horizon_engine.driver import read_check_rows

        return read_check_rows(self.path, description)

    def cpe(self) -> dict[str, Any]:
        """``cpe.json``: the evaluation stage's estimates."""
        return self._json(self.CPE)

    def cpe_epochs(self) -> list[Any]:
        """The per-epoch estimates the train stage recorded (``cpe_epochs.json``), or none."""
        if not self.file(self.CPE_EPOCHS).is_file():
            return []
        epochs = self._json(self.CPE_EPOCHS).get("epochs", [])
        return epochs if isinstance(epochs, list) else []

    def training_epochs(self) -> list[dict[str, Any]]:
        """Each epoch's training metrics (``training_epochs.json``): ``{"epoch", "metrics"}``
        records whose metrics are numbers; none where the file is absent (a run from before
        the file, or one that did not train). Anything else in the file is an error naming it."""
        path = self.file(self.TRAINING_EPOCHS)
        if not path.is_file():
            return []
        epochs = self._json(self.TRAINING_EPOCHS).get("epochs")
        valid = isinstance(epochs, list) and all(
            isinstance(entry, dict)
            and isinstance(entry.get("epoch"), int)
            and isinstance(entry.get("metrics"), dict)
            and all(
                isinstance(value, int | float) and not isinstance(value, bool)
                for value in entry["metrics"].values()
            )
            for entry in epochs
        )
        if not valid:
            raise HorizonError(
                f'{path}: expected {{"epochs": [{{"epoch": N, "metrics": {{name: number}}}}]}}'
            )
        return epochs

    def write_training_epochs(self, history: list[dict[str, float]]) -> str:
        """Write ``training_epochs.json`` from a driver's ``history`` (epoch 1 first); return
        its name."""
        epochs = [{"epoch": number, "metrics": found} for number, found in enumerate(history, 1)]
        return self.write_json(self.TRAINING_EPOCHS, {"epochs": epochs})

    def write_json(self, name: str, record: dict[str, Any]) -> str:
        """Write one of the run's JSON files (``CPE``, ``CPE_EPOCHS``, ``TRAINING_EPOCHS``)
        atomically; return ``name``."""
        write_json(self.file(name), record)
        return name

    def _json(self, name: str) -> dict[str, Any]:
        path = self.file(name)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise HorizonError(f"{path}: cannot be read ({exc})") from None
        if not isinstance(record, dict):
            raise HorizonError(f"{path}: holds no JSON object")
        return record


GLOB_CHARACTERS = frozenset("*?[")


def inside_path(folder: Path, entry: object, source: str) -> Path:
    """``folder / entry`` for a run-relative path ``entry``, once it is certain that removing or
    writing it touches only what lies inside ``folder``; otherwise an ``UnsafePathError``
    naming ``source`` (where the entry comes from: a manifest and its stage), the entry and
    why. Refused: anything but a non-empty string, a NUL byte, an absolute path, a ``..``
    component, the folder itself, and a path that a link (at any component, the last one
    included) takes outside the folder."""
    why = _unsafe_reason(folder, entry, _Resolver(folder))
    if why is None:
        return folder / str(entry)
    raise _unsafe(folder, entry, source, why)


def _unsafe(folder: Path, entry: object, source: str, why: str) -> UnsafePathError:
    return UnsafePathError(
        f"{source} lists {entry!r}, which {why}; Horizon removes and writes only inside "
        f"{folder}. Remove the entry (or the link), or choose another output_dir"
    )


class _Resolver:
    """Where paths inside one folder lead, for checking many of them with bounded work each:
    each parent folder is resolved once, and an entry's last component only when it is a
    link: linear in the entries, where one ``resolve()`` each took minutes for a million."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.root = folder.resolve()
        self._parents_inside: dict[Path, bool] = {}

    def leads_out(self, relative: Path) -> Path | None:
        """Where ``folder / relative`` leads when that is outside the folder or the folder
        itself; None when it is inside. An ``OSError`` or ``RuntimeError`` (a loop of links)
        when it cannot be followed."""
        inside = self._parents_inside.get(relative.parent)
        if inside is None:
            parent = (self.folder / relative.parent).resolve()
            inside = self._parents_inside[relative.parent] = parent.is_relative_to(self.root)
        path = os.path.join(self.folder, relative)
        if inside and not os.path.islink(path):
            return None
        resolved = Path(path).resolve()
        return None if resolved != self.root and resolved.is_relative_to(self.root) else resolved


def _unsafe_reason(folder: Path, entry: object, resolver: _Resolver) -> str | None:
    if not isinstance(entry, str) or not entry:
        return "is not a run-relative path"
    if "\x00" in entry:
        return "holds a NUL byte"
    relative = Path(entry)
    if relative.is_absolute():
        return "is an absolute path"
    if ".." in relative.parts:
        return "climbs out of the folder with '..'"
    if not relative.parts:
        return "is the run folder itself"
    try:
        resolved = resolver.leads_out(relative)
    except (OSError, RuntimeError):  # RuntimeError: a loop of links
        return "is a link that cannot be followed"
    return None if resolved is None else f"leads to {resolved} through a link"


def check_claims_inside(folder: Path, claims: dict[str, tuple[str, ...]]) -> None:
    """Refuse (``UnsafePathError``) when a stage's path (``claims``: stage -> run-relative glob
    patterns), or a folder on the way to it, is a link that leads out of ``folder``: the
    stage would write, or remove what it wrote, through it."""
    for stage, patterns in claims.items():
        for pattern in patterns:
            parts = Path(pattern).parts
            literal = next(
                (i for i, part in enumerate(parts) if GLOB_CHARACTERS & set(part)), len(parts)
            )
            places = [Path(*parts[: i + 1]) for i in range(literal)]
            places += [path.relative_to(folder) for path in folder.glob(pattern)]
            for place in places:
                if (folder / place).is_symlink() or (folder / place).exists():
                    inside_path(folder, str(place), f"stage '{stage}', which writes {pattern},")


def remove_inside(folder: Path, entry: object, source: str) -> None:
    """Remove the run-relative ``entry`` (a file, a link or a folder with its contents) once
    ``inside_path`` has checked it; a link is removed itself, never followed."""
    remove_path(inside_path(folder, entry, source))


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
        """Every path (relative to the folder, as ``a/b``) a recorded stage wrote."""
        return {
            Path(path).as_posix()
            for report in self.stages.values()
            if isinstance(report, dict)
            for path in report.get("outputs", [])
        }

    def owned_outputs(self, claims: Mapping[str, tuple[str, ...]]) -> set[str]:
        """The recorded outputs Horizon may remove: each one a path its stage claims
        (``claims``: stage -> patterns). A manifest is input: an entry naming a user's file
        under a stage that does not write it is not the stage's to remove."""
        return {
            Path(path).as_posix()
            for stage, report in self.stages.items()
            if isinstance(report, dict)
            for path in report.get("outputs", [])
            if matches(Path(path).as_posix(), claims.get(stage, ()))
        }

    def check_inside(self, folder: Path) -> None:
        """Refuse (``UnsafePathError``) a manifest whose stage records list an output that is
        not a path inside ``folder`` (``inside_path``), before any of them is acted on; and
        one listing more than ``MAX_RECORDED_OUTPUTS``, before checking any."""
        manifest = folder / RunFolder.MANIFEST
        listed = 0
        for stage, report in self.stages.items():
            if not isinstance(report, dict):
                continue
            outputs = report.get("outputs", [])
            source = f"{manifest}: stage {stage!r}"
            if not isinstance(outputs, list):
                raise UnsafePathError(
                    f"{source} lists outputs {outputs!r}, which is not a list of run-relative "
                    "paths; Horizon acts on no entry of a manifest it cannot read"
                )
            listed += len(outputs)
        if listed > MAX_RECORDED_OUTPUTS:
            raise UnsafePathError(
                f"{manifest} lists {listed} outputs, more than the {MAX_RECORDED_OUTPUTS} a run "
                "writes; Horizon acts on no entry of a manifest it cannot check. Remove the "
                "manifest (and the outputs it lists), or choose another output_dir"
            )
        resolver = _Resolver(folder)
        for stage, report in self.stages.items():
            if isinstance(report, dict):
                for entry in report.get("outputs", []):
                    why = _unsafe_reason(folder, entry, resolver)
                    if why is not None:
                        raise _unsafe(folder, entry, f"{manifest}: stage {stage!r}", why)

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
        """True when the recorded process is alive on this host (it may be writing now); a
        recorded pid that is no process id (``is_process_id``) is no process."""
        pid = self.manifest.get("pid")
        if not self.unfinished or not is_process_id(pid) or pid == os.getpid():
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

    def config_changes(
        self, resolved: Mapping[str, Any], neutral: frozenset[str] = frozenset()
    ) -> list[str]:
        """The dotted keys (``trainer.learning_rate``, ``evaluation[0].kind``) whose values
        differ between the config this run recorded and ``resolved``, but for ``neutral``
        ones; both compared as JSON. What ``--resume`` refuses: the continued run would not
        give the recorded run's result."""
        changes: list[str] = []

        def compare(before: Any, after: Any, key: str) -> None:
            if key in neutral:
                return
            if isinstance(before, dict) and isinstance(after, dict):
                for name in sorted({*before, *after}):
                    compare(before.get(name), after.get(name), f"{key}.{name}" if key else name)
            elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
                for index, (one, other) in enumerate(zip(before, after, strict=True)):
                    compare(one, other, f"{key}[{index}]")
            elif before != after:
                changes.append(key or "the whole config")

        compare(
            json.loads(json.dumps(self.manifest.get("config"), default=str)),
            json.loads(json.dumps(resolved, default=str)),
            "",
        )
        return changes


MAX_RECORDED_OUTPUTS = 100_000
"""The most outputs a manifest may list: a run's stages write a few dozen paths, plus a
checkpoint per epoch and an event file per run. Checking a manifest's entries is linear, so a
crafted one of millions would only be slow to refuse; past this one is refused outright."""


def is_process_id(pid: object) -> bool:
    """Whether ``pid`` (a manifest's, which is input) can be a process of this system: a
    positive integer below the system's limit (``/proc/sys/kernel/pid_max`` on Linux; the
    largest ``pid_t`` elsewhere). 0 and -1 would signal a group of processes, not one."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        limit = int(Path("/proc/sys/kernel/pid_max").read_text(encoding="ascii"))
    except (OSError, ValueError):
        limit = 2**31
    return pid < limit


def read_earlier_run(folder: Path) -> EarlierRun | None:
    """The run recorded in ``folder/manifest.json``, or None when there is none (or it is not
    a manifest: then nothing in the folder counts as the engine's). A manifest listing an
    output outside the folder is refused (``EarlierRun.check_inside``)."""
    try:
        manifest = json.loads((folder / RunFolder.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(manifest, dict):
        return None
    earlier = EarlierRun(manifest)
    earlier.check_inside(folder)
    return earlier


SYSTEM_FOLDERS = tuple(
    Path(name)
    for name in ("/proc", "/sys", "/dev", "/etc", "/boot", "/bin", "/sbin", "/lib", "/usr")
)
"""The operating system's folders: a run never writes in or under them."""


def output_dir_problem(path: Path, where: str) -> str | None:
    """Why ``path`` cannot be a run's output folder, or None.

    A run's folder is the run's own: its stages write their folders there and replace them
    when they run again. So it may not be a file (or under one); the filesystem's root or a
    folder directly under it (``/tmp``, ``/home``); a folder in or under the system's own
    (``SYSTEM_FOLDERS``: ``/proc``, ``/etc``, ...); the top of a git work tree or anything
    in a ``.git`` folder: the run's outputs would mix with a project's files; nor, unless it
    already holds a run's manifest (``horizon export .`` inside a run folder), the current
    folder or one above it. Its path must fit the filesystem (``_length_problem``), and may
    not start with ``~``: Horizon does not read it as the home folder, but some writers
    (Arrow) would, so the run's files would land in two places.
    """
    if str(path).startswith("~"):
        return (
            f"{where}: [pipeline] output_dir = {str(path)!r} starts with '~', which Horizon "
            "does not expand to a home folder; write the folder out (such as "
            '"/home/me/runs/pipeline"), or give a path relative to the current folder'
        )
    too_long = _length_problem(path)
    if too_long is not None:
        return f"{where}: [pipeline] output_dir = {str(path)!r} {too_long}; name a shorter one"
    for candidate in (path, *path.parents):
        if candidate.exists() and not candidate.is_dir():
            what = "is a file" if candidate == path else f"is under {candidate}, which is a file"
            return f"{where}: [pipeline] output_dir = {str(path)!r} {what}; name a folder"
    why = _shared_folder(path)
    if why is None:
        return None
    return (
        f"{where}: [pipeline] output_dir = {str(path)!r} {why}; name a folder of the run's "
        'own, such as "runs/pipeline"'
    )


RUN_PATH_ROOM = 256
"""Bytes kept free below ``PATH_MAX`` for the paths a run writes under its folder: the
longest, a TensorBoard event file's (``tensorboard/events.out.tfevents.TIME.HOST.RUN``),
is under 150 with a host name of 64 bytes, the most a host name has."""


def _length_problem(path: Path) -> str | None:
    """Why ``path`` is too long for its filesystem, or None: a component longer than
    ``NAME_MAX`` bytes, or a whole path that leaves less than ``RUN_PATH_ROOM`` bytes below
    ``PATH_MAX`` (both asked of the nearest existing folder; 255 and 4096 where it cannot
    say, the usual limits)."""
    nearest = next(
        (candidate for candidate in (path, *path.parents) if os.path.isdir(candidate)), Path()
    )
    name_max = _path_limit(nearest, "PC_NAME_MAX", 255)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max and part != path.anchor:
            shown = part if len(part) <= 40 else f"{part[:40]}..."
            return (
                f"has a component of {size} bytes ({shown!r}), longer than the {name_max} a "
                "file name may have there"
            )
    size = len(os.fsencode(os.path.abspath(path)))
    path_max = _path_limit(nearest, "PC_PATH_MAX", 4096)
    if size + RUN_PATH_ROOM >= path_max:
        return (
            f"is {size} bytes long: with the {RUN_PATH_ROOM} bytes the run's own paths below "
            f"it need, longer than the {path_max} a path may have there"
        )
    return None


def _path_limit(folder: Path, name: str, usual: int) -> int:
    """``os.pathconf(folder, name)``, or ``usual`` when the system does not say."""
    try:
        limit = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return usual
    return limit if limit > 0 else usual


def _holds_a_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run's manifest (one with its stages)."""
    try:
        manifest = json.loads((folder / RunFolder.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("stages"), dict)


def _current_and_above() -> tuple[Path, ...]:
    """The current folder and the folders above it; none when the current folder was removed
    (a process may outlive the folder it started in)."""
    try:
        current = Path.cwd()
    except FileNotFoundError:
        return ()
    return (current, *current.parents)


def _shared_folder(path: Path) -> str | None:
    """Why ``path`` is a folder a run may not take over, or None."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a loop of links
        return "cannot be followed to a folder"
    shown = "" if str(resolved) == str(path) else f"(that is {resolved}) "
    if len(resolved.parts) <= 2:
        return f"{shown}is the filesystem's root or a folder directly under it"
    system = next((folder for folder in SYSTEM_FOLDERS if resolved.is_relative_to(folder)), None)
    if system is not None:
        return f"{shown}is in {system}, a folder of the operating system"
    if ".git" in path.parts or ".git" in resolved.parts:
        return f"{shown}is in a .git folder (a git repository's own files)"
    if (resolved / ".git").exists():
        return f"{shown}is the top of a git work tree (a project's checkout)"
    if _holds_a_run(path):
        return None
    if resolved in _current_and_above():
        return f"{shown}is the current folder or one above it"
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


def leftovers(folder: Path, pid: object, claims: Iterable[str]) -> list[Path]:
    """The temporary files and folders the process ``pid`` would have made while writing the
    run's outputs (``claims``: run-relative patterns), which a killed run left half-written:
    ``.NAME.tmp-PID`` and ``.NAME.old-PID`` for each claimed path and each folder on the way
    to it, ``.staging.tmp-PID`` in each such folder, ``.manifest.json.tmp-PID`` (the names
    ``horizon_engine.files`` makes). A user's file with another name is none, whatever
    process id it ends with; a ``pid`` that is not a process id (``is_process_id``: the
    manifest's is input) has none; and no folder reached through a link is looked into."""
    if not is_process_id(pid):
        return []
    names: dict[Path, set[str]] = {Path(): {temporary_name(RunFolder.MANIFEST, pid)}}
    for claim in claims:
        parts = Path(claim).parts
        for depth in range(1, len(parts) + 1):
            place, name = Path(*parts[: depth - 1]), parts[depth - 1]
            names.setdefault(place, set()).update(
                (temporary_name(name, pid), retired_name(name, pid), temporary_name(STAGING, pid))
            )
    found: list[Path] = []
    for place, patterns in names.items():
        if any(GLOB_CHARACTERS & set(part) for part in place.parts) or _through_link(folder, place):
            continue
        try:
            entries = os.listdir(folder / place)
        except OSError:
            continue
        found += [
            folder / place / entry
            for entry in entries
            if any(fnmatch.fnmatchcase(entry, pattern) for pattern in patterns)
        ]
    return sorted(found)


def _through_link(folder: Path, place: Path) -> bool:
    """Whether a component of ``place`` (run-relative) in ``folder`` is a link."""
    return any(
        (folder / Path(*place.parts[: depth + 1])).is_symlink() for depth in range(len(place.parts))
    )


def _recorded(path: str, recorded: set[str]) -> bool:
    """Whether the run-relative ``path`` is one of the ``recorded`` outputs or inside one (a
    recorded folder): compared as paths, never as patterns, since a manifest is input."""
    parts = Path(path).parts
    return any(Path(*parts[:depth]).as_posix() in recorded for depth in range(1, len(parts) + 1))


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
    write over a path no run recorded, or through a link out of the folder, or when a new run
    would replace an earlier run's outputs without ``overwrite``. Removes an interrupted run's
    temporary files, and with ``overwrite`` every output the earlier run recorded. Returns
    notes for the manifest's warnings.
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
    check_claims_inside(folder, {stage: claims[stage] for stage in selected})
    if earlier is not None and earlier.unfinished:
        written = [pattern for patterns in claims.values() for pattern in patterns]
        removed = [
            str(path.relative_to(folder))
            for path in leftovers(folder, earlier.manifest.get("pid"), written)
        ]
        for path in removed:
            remove_inside(folder, path, f"{folder}: the interrupted run's temporary file")
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
        if not (_recorded(path, recorded) or matches(path, partial_claims))
    ]
    if unrecorded:
        raise HorizonError(
            f"{folder} holds {', '.join(unrecorded)}, which this run would write, but no run "
            f"recorded in {folder / RunFolder.MANIFEST} wrote it; move it away or choose another "
            "output_dir (Horizon never deletes files it did not write)"
        )
    if earlier is None or resuming:
        return notes
    present = sorted(
        {path for path in earlier.owned_outputs(claims) if (folder / path).exists()}
        | {path for claim in partial_claims for path in existing_claims(folder, (claim,))}
    )
    if present and not overwrite:
        shown = ", ".join(present[:6]) + (f" and {len(present) - 6} more" * (len(present) > 6))
        raise HorizonError(
            f"{folder} holds the outputs of an earlier run ({earlier.describe()} last wrote "
            f"{RunFolder.MANIFEST}): {shown}. Run with "
            "--overwrite to replace them (files Horizon did not write are kept), use --stages "
            "to continue that run, or choose another output_dir"
        )
    for path in present:
        remove_inside(folder, path, f"{folder / RunFolder.MANIFEST}: an earlier run's outputs")
    if present:
        notes.append(
            f"--overwrite: replaced the outputs of an earlier run ({earlier.describe()} last "
            f"wrote {RunFolder.MANIFEST})"
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
