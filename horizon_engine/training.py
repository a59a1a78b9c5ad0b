"""The contract a trainer implements, and the checkpoints every way of training writes.

The core owns what every trainer needs, once, in the training driver
(``horizon_engine.driver``): the problem a trainer is set up for, batches, epochs, seeds,
device choice, checkpoints after every epoch (written atomically, read back as data only and
checked field by field: ``read_epoch_checkpoint``, ``restore_trainer_state``),
warm start from an earlier run, and ``horizon_on_epoch_end`` with each epoch's metrics. A
trainer implements the math of one update (``train_step``), its evaluation on the eval split,
and the policy module that export and counterfactual evaluation use.

torch is imported where it is used: the trainers family is listed by ``horizon plugins``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import Field, field_validator, model_validator

from horizon_engine.components import ComponentConfig, Trainer
from horizon_engine.errors import HorizonError
from horizon_engine.run_folder import RunFolder

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.schema import ActionType

PARALLEL_UPDATE_WORK = 1_000_000_000
"""Rows times parameters of an update from which ``[trainer] threads = "auto"`` computes on
every core rather than on one: where two threads gain most when they gain and lose least when
the machine is busy (below it a second thread costs more than it gives). A busy shared machine
is better told ``threads = 1`` (measured: docs/measurements.md#parallel_update_work)."""


class TrainerConfig(ComponentConfig):
    """What every ``[trainer]`` section accepts besides the trainer's own options."""

    DEFAULT_PASSES: ClassVar[int] = 20
    """The passes ``epochs = "auto"`` starts from, before ``min_updates`` and ``max_updates``."""
    epochs: int | str = "auto"
    """Passes over the train split. "auto": ``DEFAULT_PASSES`` (the trainer's), but never fewer
    than make ``min_updates`` gradient updates nor more than make ``max_updates``, so a log of a
    few hundred rows still trains and one of millions does not train for days. The number
    chosen is printed and recorded in the manifest (the train stage's ``length``)."""
    min_updates: int = Field(default=200, ge=1)
    """The fewest gradient updates ``epochs = "auto"`` makes."""
    max_updates: int = Field(default=20_000, ge=1)
    """The most gradient updates ``epochs = "auto"`` makes (whole passes: at least one)."""
    minibatch_size: int = Field(default=1024, ge=1)
    """Rows per update."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: "auto" takes a CUDA device when there is one."""
    threads: int | str = "auto"
    """CPU threads torch computes with while training (the thread count is restored after).
    "auto": 1 for a small update (minibatch_size times the policy's parameters under 1e9, as
    every default network is) and on a GPU, torch's default (one per core) above."""
    warm_start_from: str | None = None
    """A run folder whose latest checkpoint (weights, optimizer and trainer state) to start from:
    the daily retraining of the Horizon paper."""
    data: Literal["auto", "memory", "streamed"] = "auto"
    """How the train stage holds the timeline: "memory" loads each split into tensors once;
    "streamed" reads the train split's Parquet row groups as it goes, through a shuffle
    buffer, and keeps the eval split in memory only when it fits half of ``max_memory_gb``
    (``horizon_engine.streamed``); "auto" streams when the splits' tensors, estimated from the
    Parquet metadata, exceed ``max_memory_gb``. The manifest says which was chosen and why."""
    max_memory_gb: float | str = "auto"
    """The memory the train stage's data may take, in GiB: it decides "auto" above, and
    bounds a streamed run's shuffle buffer and in-memory eval split. "auto": a quarter of the
    machine's memory (``streamed.MEMORY_SHARE`` says why)."""

    @model_validator(mode="after")
    def _updates_in_order(self) -> Self:
        """Bounds that cross would leave ``epochs = "auto"`` no length to choose."""
        if self.min_updates > self.max_updates:
            raise ValueError(
                f"min_updates = {self.min_updates} is above max_updates = {self.max_updates}"
            )
        return self

    @field_validator("epochs", mode="before")
    @classmethod
    def _epochs_or_auto(cls, epochs: Any) -> Any:
        """A whole number of passes (1 or more) or "auto"; checked before the type, so that
        2.5 or "20" is told what to give rather than which types the field takes."""
        number = isinstance(epochs, int | float) and not isinstance(epochs, bool)
        whole = number and float(epochs).is_integer() and epochs >= 1
        if epochs != "auto" and not whole:
            raise ValueError(f'epochs = {epochs!r}: give a number of passes (1 or more) or "auto"')
        return epochs

    @field_validator("max_memory_gb", mode="before")
    @classmethod
    def _memory_or_auto(cls, memory: Any) -> Any:
        """A finite size in GiB above 0 or "auto" (true, infinity and NaN are none); checked
        before the type, which would take true for 1."""
        number = isinstance(memory, int | float) and not isinstance(memory, bool)
        if memory != "auto" and not (number and 0 < memory < float("inf")):
            raise ValueError(f'max_memory_gb = {memory!r}: give a size in GiB above 0 or "auto"')
        return memory

    @field_validator("threads")
    @classmethod
    def _threads_or_auto(cls, threads: int | str) -> int | str:
        """A number of threads (1 or more) or "auto" (``int | str`` rather than a literal in
        the type, which ``horizon plugins`` shows as written)."""
        if threads != "auto" and not (isinstance(threads, int) and threads >= 1):
            raise ValueError(
                f'threads = {threads!r}: give a number of threads (1 or more) or "auto"'
            )
        return threads


@dataclass
class TrainingProblem:
    """What a trainer is told before training: the data's shape and where to run."""

    action_type: ActionType
    actions: list[str]
    """Discrete action names (their indices are the actions); empty otherwise."""
    state_preprocessor: torch.nn.Module
    """(values, presence) of the state features -> the network's state input."""
    state_width: int
    action_preprocessor: torch.nn.Module | None
    """The same for action features (parametric and continuous actions), else None."""
    action_width: int
    device: torch.device
    seed: int
    n_step: int | None = None
    """The data's n-step window: each row's next ``n_step`` steps are in the batch
    (``next_n_*``) when it is above 1. The timeline's ``[timeline] n_step`` offline, the
    replay buffer's ``[gym] n_step`` online; a trainer checks its own option against it. The
    driver always sets it; None (a problem built by hand) leaves the batches to tell."""
    online: bool = False
    """The trainer plays for its own data (the gym runner) instead of learning from logs."""
    processes: int = 1
    """The processes training this problem together (``horizon run --nproc``, torchrun): the
    training driver's world; 1 for a trainer set up to export or evaluate a run."""

    def data_parallel(self, module: torch.nn.Module) -> torch.nn.Module:
        """``module`` as a trainer forwards it for a loss it backpropagates: wrapped in
        ``DistributedDataParallel`` when several ``processes`` train (the gradients are
        averaged over them in backward), ``module`` itself in a single process.

        Forward the wrapped module once per backward, for the loss only; everything else
        (no-grad forwards, target networks, ``policy()``, ``state_dict``) uses ``module``, whose
        parameters the wrapper shares. A method that is not ``forward`` (an actor's ``sample``)
        is wrapped as the ``forward`` of a small module of its own."""
        from horizon_engine.distributed import data_parallel

        return data_parallel(module, self.device) if self.processes > 1 else module


class TrainerBase(Trainer):
    """A trainer the training driver can drive. Subclass it and register it as a trainer.

    The driver calls ``setup`` once, then ``train_step`` for every minibatch (a mapping of tensors
    named as the batch schema says, already on the device) and ``evaluate`` on the eval split
    after every epoch; ``state_dict``/``load_state_dict`` make checkpoints and warm
    starts; ``policy`` is the trained model for export and evaluation. What only some trainers
    can do (analyse data, explore online, offer models to the estimators, discount) is a
    capability a trainer adds by implementing its protocol (``horizon_engine.capabilities``).
    """

    Config: ClassVar[type[ComponentConfig]] = TrainerConfig
    trains_policy: ClassVar[bool] = True
    """Whether ``policy`` is a decision policy to export (a pipeline with this trainer and no
    ``[export]`` exports it as ONNX); false for a model of the data, such as the world model."""

    @abstractmethod
    def setup(self, problem: TrainingProblem) -> None:
        """Build networks and optimizers for ``problem``."""

    @abstractmethod
    def train_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One update from one minibatch (read-only); returns its metrics (e.g. ``td_loss``).

        A batch from the timeline also holds the state preprocessor's output for its states
        (``state_preprocessed``, ...: the batch schema), computed once for the split: using it
        rather than running the preprocessor again is what makes an update cheap."""

    def applied_options(self) -> dict[str, Any]:
        """Options whose value ``setup`` chose from the problem (an unset ``bc_weight``, the
        data's n-step window), as they applied: the manifest records them beside the config
        as written. No options by default."""
        return {}

    def evaluate(self, data: TimelineTensors) -> dict[str, float]:
        """Metrics on the eval split (e.g. ``mc_loss``), without changing the model; none by
        default (horizon gym train evaluates by playing, and never calls it)."""
        return {}

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint must hold to resume: weights, optimizer, trainer state."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (a warm start or a resume)."""

    @abstractmethod
    def policy(self) -> torch.nn.Module:
        """The trained model: raw ``(values, presence)`` of the state features (and for
        parametric actions each row's candidates' ``(values, presence)``) -> a score per action
        or candidate; for continuous actions -> the action vector in the user's units, or
        ``(action, log_density)`` for a stochastic policy. ``policy_output`` turns it into the
        ``PolicyOutput`` that export and the estimators read."""

    @classmethod
    def data_problems(cls, config: ComponentConfig, n_step: int, origin: str) -> dict[str, str]:
        """What is wrong with this trainer's ``config`` for data whose n-step window is
        ``n_step`` (``origin`` says where that is declared), found before a run starts:
        option name -> message, which the core prefixes with the option's file and line.
        Nothing by default; a trainer whose options must agree with the data says so here, so
        the core never reads another component's option by name."""
        return {}


def resolve_device(choice: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise HorizonError("[trainer] device = 'cuda', but torch sees no CUDA device here")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def resolve_threads(choice: int | str, device: torch.device, work: int) -> int:
    """``[trainer] threads``: a number as it is; "auto" -> 1 on a GPU (the CPU only launches
    its kernels) or when ``work`` (an update's rows times parameters) is under
    ``PARALLEL_UPDATE_WORK``, else the thread count torch has now (one per core by default)."""
    import torch

    if choice != "auto":
        return int(choice)
    if device.type != "cpu" or work < PARALLEL_UPDATE_WORK:
        return 1
    return torch.get_num_threads()


def save_checkpoint(folder: RunFolder, epoch: int, state: dict[str, Any]) -> Path:
    """Write the run's ``epoch-NNNN.pt`` and ``latest.pt`` atomically (temporary name, then
    rename), the state serialized once for both. ``epoch-NNNN.pt`` is written first: the
    highest epoch file is the last complete epoch, whatever moment a kill came at."""
    import io

    import torch

    from horizon_engine.files import atomic_output

    serialized = io.BytesIO()
    torch.save({"epoch": epoch, **state}, serialized)
    folder.checkpoints.mkdir(parents=True, exist_ok=True)
    path = folder.checkpoint_path(epoch)
    for target in (path, folder.latest_checkpoint):
        with atomic_output(target) as temporary:
            temporary.write_bytes(serialized.getvalue())
    return path


RESUME_STATE = "resume"
"""The key of an epoch checkpoint's state for resuming (generators, counts, metrics so far,
and the training it belongs to: ``TrainingDriver.resume`` reads it)."""


def load_checkpoint(run_folder: Path, purpose: str = "warm start") -> dict[str, Any]:
    """The latest checkpoint of a run, its structure checked (``read_epoch_checkpoint``): an
    earlier one for a warm start, or this one for an export (``purpose`` = "export"), named in
    the error when there is none."""
    path = RunFolder(run_folder).latest_checkpoint
    where = _checkpoint_use(run_folder, purpose)
    if not path.is_file():
        raise HorizonError(f"{where}: no checkpoint at {path}")
    return read_epoch_checkpoint(path, where)


def restore_latest(trainer: TrainerBase, run_folder: Path, purpose: str = "warm start") -> None:
    """Load a run's latest checkpoint (``load_checkpoint``) into ``trainer``
    (``restore_trainer_state``), every error naming the use, the file and the field."""
    path = RunFolder(run_folder).latest_checkpoint
    checkpoint = load_checkpoint(run_folder, purpose)
    restore_trainer_state(trainer, checkpoint, path, _checkpoint_use(run_folder, purpose))


def restore_epoch(trainer: TrainerBase, run_folder: Path, path: Path, purpose: str) -> None:
    """Load the epoch checkpoint ``path`` of a run (one of its ``epoch-NNNN.pt``: the one
    chosen to ship, or a candidate) into ``trainer``, every error naming the use, the file and
    the field; its ``epoch`` must be its file name's (a file renamed is another epoch's)."""
    where = _checkpoint_use(run_folder, purpose)
    if not path.is_file():
        raise HorizonError(f"{where}: no checkpoint at {path}")
    checkpoint = read_epoch_checkpoint(path, where)
    if path.name != Path(RunFolder.checkpoint_name(checkpoint["epoch"])).name:
        raise HorizonError(
            f"{where}: {path}: field 'epoch' is {checkpoint['epoch']}, not its file name's"
        )
    restore_trainer_state(trainer, checkpoint, path, where)


def _checkpoint_use(run_folder: Path, purpose: str) -> str:
    """How an error names the use of a run's checkpoint: the warm start's option, or the
    purpose (an export, an evaluation) and the run."""
    if purpose == "warm start":
        return f"[trainer] warm_start_from = {str(run_folder)!r}"
    return f"{purpose} of {run_folder}"


def read_checkpoint(path: Path, where: str) -> Any:
    """A file torch saved, read as data; ``where`` starts the error when it cannot be read.

    Checkpoints hold tensors and plain data only, and are read with ``weights_only``: a file
    from elsewhere (``warm_start_from`` may name any folder) is data, never code to run. What
    it holds is the caller's to check (``read_epoch_checkpoint`` for an epoch's checkpoint).
    """
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HorizonError(
            f"{where}: {path} holds more than tensors and plain data, and is not loaded "
            f"(it could run code): {reason}"
        ) from None
    except Exception as exc:  # torch raises untyped errors (EOFError, RuntimeError) for a file
        # that is not one it saved: an empty or cut file, another format, zip-like garbage
        reason = (str(exc) or type(exc).__name__).splitlines()[0]
        raise HorizonError(f"{where}: {path} is not a file torch saved ({reason})") from None


def read_epoch_checkpoint(path: Path, where: str) -> dict[str, Any]:
    """An epoch's checkpoint (``save_checkpoint``), its structure checked field by field: a
    mapping with ``epoch`` (a whole number from 1) and ``trainer`` (the trainer's state, by
    name); anything else stops with the file and the field named (``where`` starts it)."""
    checkpoint = read_checkpoint(path, where)
    if not isinstance(checkpoint, dict):
        raise HorizonError(
            f"{where}: {path} holds a {type(checkpoint).__name__}, not a checkpoint (a mapping "
            "with 'epoch' and 'trainer')"
        )
    epoch = checkpoint.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        found = f"{epoch!r:.80}" if "epoch" in checkpoint else "nothing"
        raise HorizonError(
            f"{where}: {path}: field 'epoch' is not an epoch number (1 or more); found {found}"
        )
    trainer = checkpoint.get("trainer")
    if not isinstance(trainer, dict) or not all(isinstance(key, str) for key in trainer):
        found = type(trainer).__name__ if "trainer" in checkpoint else "nothing"
        raise HorizonError(
            f"{where}: {path}: field 'trainer' is not a trainer's state (a mapping by name); "
            f"found {found}"
        )
    return checkpoint


LOAD_ERRORS = (LookupError, TypeError, ValueError, RuntimeError, AttributeError)
"""What a trainer's ``load_state_dict`` raises for a state that is not one it wrote: a missing
key, a tensor of another shape, a value of another type."""


def restore_trainer_state(
    trainer: TrainerBase, checkpoint: Mapping[str, Any], path: Path, where: str
) -> None:
    """Load ``checkpoint``'s ``trainer`` state (``read_epoch_checkpoint``'s) into ``trainer``;
    a state that does not fit it stops with the file and the field named, whatever the
    trainer's own ``load_state_dict`` raised."""
    try:
        trainer.load_state_dict(checkpoint["trainer"])
    except LOAD_ERRORS as exc:
        reason = (str(exc) or type(exc).__name__).splitlines()[0]
        raise HorizonError(
            f"{where}: {path}: field 'trainer' does not fit the [trainer] set up here "
            f"({type(exc).__name__}: {reason:.300})"
        ) from None
    except HorizonError as exc:
        if type(exc) is not HorizonError:
            raise
        raise HorizonError(f"{where}: {path}: field 'trainer': {exc}") from None
