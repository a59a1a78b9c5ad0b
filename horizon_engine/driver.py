"""The training driver: one way of driving a trainer, whatever the data comes from.

``horizon run``'s train stage and ``horizon gym train`` both train through it, so a
trainer cannot tell them apart and a run folder records training the same way. It is public
(``horizon_engine.TrainingDriver``, with ``ProblemDescription`` and ``SampledData``): a
plugin's command with its own source of data drives a trainer as the gym runner does.

- the problem: a ``ProblemDescription`` (action type, actions, feature ids, the data's n-step
  window, seed) and the normalization become the ``TrainingProblem`` a trainer is set up for
  (preprocessors on the device); a warm start then restores an earlier run's trainer state.
  The description is written into the run folder (``problem.json``), with the rows an
  exported model is checked on (``check_rows.pt``): a trained run folder describes itself,
  and export sets the trainer up again from it without reading the data.
- batches: ``train_batch`` is one update; its metrics are added to the epoch's, then each
  batch callback is called with the same batch (models trained beside the policy, such as a
  reward model for the estimators). Data comes in two shapes: ``EpochData`` (the timeline's
  ``TimelineTensors`` in memory, epochs of shuffled minibatches; ``StreamedTimeline``, read
  from Parquet a row group at a time), which
  ``train_epochs`` drives, and ``SampledData`` (the gym's replay buffer), which the host
  samples from between steps of play with ``train_sampled``. Normalization is fixed while
  training, so ``prepare`` runs the state preprocessor over epoch data once, and its batches
  carry the output beside the raw features (the batch schema's ``*_preprocessed``).
- threads: ``[trainer] threads`` (``resolve_threads``: one for a small network) is torch's CPU
  thread count while ``train_epochs`` runs (``torch_threads``); a host that trains between
  other work, as the gym runner does between steps of play, sets ``threads`` for its run.
- epochs: ``end_epoch`` averages the epoch's metrics (``Training/<name>``), evaluates the
  trainer on the eval data when there is some (``Evaluation/<name>``), runs the per-epoch
  estimators (``CPE/<label>/<estimate>``), writes a checkpoint and calls
  ``horizon_on_epoch_end``. ``train_epochs`` does all but the training metrics beside the
  next epoch's updates, on a copy of the trainer's state (``horizon_engine.epoch_ends``: the
  same figures and files, in epoch order). ``horizon gym train`` ends an "epoch" at each
  evaluation of its greedy policy, with that evaluation's figures, in line.
- divergence: a training whose figures stop being finite stops with a ``HorizonError``
  naming the epoch and the metric (the update too in a single process, where every update's
  metrics, floats the driver reads anyway, are checked) or the module whose parameters are
  not finite (checked at each epoch's end, before its checkpoint is written, with one sync):
  the train stage fails rather than export a model that scores NaN.
- resuming: an epoch's checkpoint holds everything the epochs after it depend on (the
  trainer's state; torch's CPU generator, and the device's; the data-order generator; the
  epochs' metrics and per-epoch estimates; the host's own plain data), and is written after
  ``horizon_on_epoch_end``, as the epoch's last act. ``resume`` restores the last one, so the
  epochs that follow are those of an uninterrupted run, to the bit on a CPU. A reporter may
  be told of an epoch twice (with the same figures) when a kill came between the hook and
  the checkpoint; never of an epoch the resumed run does not have.
  The checkpoint is input: its epoch must be its file's and within the run's epochs, and its
  ``training`` (a digest of the problem and the ``[trainer]`` options) this run's, so that a
  checkpoint copied from another run folder is refused.
- several processes (``horizon_engine.distributed``): each rank trains on its share of every
  minibatch (``data.shard(rank, world)``, called once) with the trainer's modules wrapped for
  DistributedDataParallel (``TrainingProblem.data_parallel``); ``end_epoch`` adds the
  metrics' sums and counts over the ranks, and only rank 0 evaluates, runs the estimators,
  reports the epoch and writes (problem, check rows, checkpoints): the other ranks write
  nothing. Weights start alike on every rank (seeded by the run's seed); rank ``r > 0`` draws
  its noise from ``seed + r``. A batch callback sees its rank's share of each minibatch: one
  that trains a model wraps it with ``TrainingProblem.data_parallel`` so that the ranks'
  copies stay equal (no built-in one trains a model).

torch is imported where it is used.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from horizon_engine import distributed
from horizon_engine.errors import HorizonError
from horizon_engine.run_folder import RunFolder
from horizon_engine.schema import ActionType
from horizon_engine.training import RESUME_STATE, resolve_threads

if TYPE_CHECKING:
    import torch

    from horizon_engine.config import Choice
    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.evaluation import EpisodeEvaluation
    from horizon_engine.normalization import FeatureParameters
    from horizon_engine.plugins import PluginHost
    from horizon_engine.run_context import RunContext, StageRun
    from horizon_engine.streamed import StreamedTimeline
    from horizon_engine.training import TrainerBase, TrainingProblem

Batch = Mapping[str, "torch.Tensor"]
"""A minibatch as the batch schema (``horizon_engine.batch_schema``) names its tensors: a dict,
or a ``Minibatch`` that gathers a tensor's rows when it is read."""

BatchCallback = Callable[[Batch], Mapping[str, float] | None]
"""Called with each batch after the trainer's update; metrics it returns are averaged into the
epoch's ``Training/<name>`` figures like the trainer's own."""

Normalization = dict[str, dict[str, "FeatureParameters"]]
"""``normalization.json`` as read: ``state_features`` (and ``action_features``) -> parameters."""

CHECK_FIELDS: dict[ActionType, tuple[str, ...]] = {
    ActionType.DISCRETE: ("state", "state_presence"),
    ActionType.CONTINUOUS: ("state", "state_presence"),
    ActionType.PARAMETRIC: (
        "state",
        "state_presence",
        "possible_action_features",
        "possible_action_presence",
        "possible_actions",
    ),
}
"""The batch-schema tensors a check row holds: the policy's inputs."""


class EpochData(Protocol):
    """Data a trainer passes over epoch by epoch: ``TimelineTensors`` in memory, or a
    ``StreamedTimeline`` read from Parquet as it goes (``horizon_engine.streamed``)."""

    def __len__(self) -> int: ...

    def minibatches(self, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
        """One epoch of minibatches, shuffled by ``generator``, already on the device."""
        ...

    def with_preprocessed(self, preprocessor: torch.nn.Module) -> EpochData:
        """The same data whose minibatches also hold ``preprocessor``'s output for their
        states (``state_preprocessed``, ...), computed once rather than per batch."""
        ...


class SampledData(Protocol):
    """Data sampled a batch at a time between steps of play: the gym's replay buffer."""

    def sample(self, batch_size: int) -> Batch:
        """``batch_size`` rows (on the CPU; the driver moves them to its device)."""
        ...


@dataclass(frozen=True)
class ProblemDescription:
    """What the data tells a trainer before training, recorded in the run's ``problem.json``.

    The data's own options (such as its n-step window) reach the trainer only through it, as
    ``TrainingProblem`` fields: no component reads them off another component's config.
    """

    action_type: ActionType
    actions: list[str]
    """The actions' names, in index order: the discrete actions (a parametric gym run's too,
    whose one-hot action features stand for them); empty otherwise."""
    feature_ids: list[str]
    """The state features, in the order of ``normalization.json`` (the network's inputs)."""
    action_feature_ids: list[str]
    """The action features (parametric and continuous actions), in the same order."""
    n_step: int
    """The data's n-step window (1: one step, no ``next_n_*`` tensors)."""
    seed: int
    max_feature_value: float
    """The preprocessors' clamp (``[normalization] max_feature_value``)."""
    online: bool = False
    """The trainer plays for its own data (``horizon gym train``'s replay buffer) rather than
    learning from logs; options meant to keep a policy near logged actions can then be off."""

    @classmethod
    def for_data(
        cls,
        action_type: ActionType,
        actions: list[str],
        normalization: Normalization,
        n_step: int,
        seed: int,
        max_feature_value: float,
        online: bool = False,
    ) -> ProblemDescription:
        """The one way a run's problem is built, by the pipeline (from its timeline) and by
        ``horizon gym train`` (from its environment) alike: the features are those of
        ``normalization``, in its order (the network's inputs follow it)."""
        description = cls(
            action_type=action_type,
            actions=list(actions),
            feature_ids=list(normalization.get("state_features", {})),
            action_feature_ids=list(normalization.get("action_features", {})),
            n_step=n_step,
            seed=seed,
            max_feature_value=max_feature_value,
            online=online,
        )
        malformed = description._malformed_field()
        if malformed:
            raise HorizonError(f"the run's problem is malformed: {malformed}")
        return description

    def problem(
        self,
        state: torch.nn.Module,
        action: torch.nn.Module | None,
        device: torch.device,
        processes: int = 1,
    ) -> TrainingProblem:
        """The ``TrainingProblem`` with these facts and the preprocessors built for them, for
        ``processes`` training together."""
        from horizon_engine.training import TrainingProblem

        return TrainingProblem(
            action_type=self.action_type,
            actions=self.actions if self.action_type is ActionType.DISCRETE else [],
            state_preprocessor=state,
            state_width=len(state.output_names),
            action_preprocessor=action,
            action_width=len(action.output_names) if action is not None else 0,
            device=device,
            seed=self.seed,
            n_step=self.n_step,
            online=self.online,
            processes=processes,
        )

    def write(self, run_dir: Path) -> str:
        """Write ``run_dir/problem.json`` atomically; return its run-relative path."""
        from horizon_engine.files import write_json

        data = {**asdict(self), "action_type": self.action_type.value}
        write_json(RunFolder(run_dir).file(RunFolder.PROBLEM), data)
        return RunFolder.PROBLEM

    @classmethod
    def read(cls, run_dir: Path) -> ProblemDescription:
        """The description a run folder's training wrote, or an error saying it has none."""
        path = RunFolder(run_dir).file(RunFolder.PROBLEM)
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
            description = cls(**{**found, "action_type": ActionType(found["action_type"])})
        except FileNotFoundError:
            raise HorizonError(
                f"{path} does not exist: {run_dir} holds no finished training of this version "
                "(run its training again)"
            ) from None
        except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
            raise HorizonError(f"{path}: not a problem description ({exc})") from None
        malformed = description._malformed_field()
        if malformed:
            raise HorizonError(f"{path}: not a problem description: {malformed}")
        return description

    def _malformed_field(self) -> str | None:
        """The first field whose value is not of its kind, described; None when all are (the
        file is input: a value of another type would fail far from it)."""
        for name in ("actions", "feature_ids", "action_feature_ids"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
                return f"field '{name}' is not a list of strings; found {value!r:.80}"
            repeated = next((item for item, count in Counter(value).items() if count > 1), None)
            if repeated is not None:
                # An index names one action (one input): a model with two alike is ambiguous.
                return f"field '{name}' lists {repeated!r:.80} more than once"
        for name in ("n_step", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                return f"field '{name}' is not a whole number; found {value!r:.80}"
        if self.n_step < 1:
            return f"field 'n_step' is below 1; found {self.n_step}"
        limit = self.max_feature_value
        if not isinstance(limit, int | float) or isinstance(limit, bool) or not limit > 0:
            return f"field 'max_feature_value' is not a number > 0; found {limit!r:.80}"
        if not isinstance(self.online, bool):
            return f"field 'online' is not true or false; found {self.online!r:.80}"
        return None


def set_up_trainer(
    choice: Choice,
    description: ProblemDescription,
    normalization: Normalization,
    plugins: PluginHost,
    device: torch.device,
    processes: int = 1,
) -> tuple[TrainerBase, TrainingProblem]:
    """The ``[trainer]`` component set up for ``description``: its preprocessors built from
    ``normalization`` on ``device``, its weights from the description's seed; for
    ``processes`` training together (data-parallel), 1 to export or evaluate."""
    import torch

    from horizon_engine.preprocessor import build_preprocessor

    trainer = choice.create()
    torch.manual_seed(description.seed)

    def preprocessor(name: str, feature_ids: list[str]) -> torch.nn.Module | None:
        if not feature_ids:
            return None
        parameters = normalization.get(name, {})
        if list(parameters) != feature_ids:
            raise HorizonError(
                f"normalization.json has {name} {list(parameters)}, but the trainer is set up "
                f"for {feature_ids}"
            )
        built = build_preprocessor(feature_ids, parameters, description.max_feature_value, plugins)
        return built.to(device)

    state = preprocessor("state_features", description.feature_ids)
    action = preprocessor("action_features", description.action_feature_ids)
    problem = description.problem(state, action, device, processes)
    try:
        trainer.setup(problem)
    except (MemoryError, RuntimeError) as exc:
        # The config check refuses layers beyond the machine's memory; this is the allocation
        # that failed anyway (memory taken by others, a GPU's smaller memory).
        if isinstance(exc, RuntimeError) and "allocate" not in str(exc):
            raise
        reason = (str(exc) or type(exc).__name__).splitlines()[0]
        raise HorizonError(
            f"[{choice.section}] kind = {choice.component.name!r}: its networks do not fit in "
            f"the memory of {device} ({reason}); use smaller layers"
        ) from None
    return trainer, problem


def restore_trainer(
    run_dir: Path,
    choice: Choice,
    description: ProblemDescription,
    plugins: PluginHost,
    device: torch.device,
    purpose: str,
    checkpoint: Path | None = None,
) -> tuple[TrainerBase, TrainingProblem]:
    """A run's trainer as its latest checkpoint (or the epoch ``checkpoint``) left it, set up
    on ``device`` from the run's normalization: for an export or an evaluation (``purpose``,
    named in errors)."""
    from horizon_engine.training import restore_epoch, restore_latest

    normalization = RunFolder(run_dir).normalization(plugins)
    trainer, problem = set_up_trainer(choice, description, normalization, plugins, device)
    if checkpoint is None or checkpoint == RunFolder(run_dir).latest_checkpoint:
        restore_latest(trainer, Path(run_dir), purpose)
    else:
        restore_epoch(trainer, Path(run_dir), checkpoint, purpose)
    return trainer, problem


def training_fingerprint(choice: Choice, description: ProblemDescription) -> str:
    """What a training's checkpoints belong to: a digest of its problem (``problem.json``'s
    facts: actions, features, n-step window, seed) and its ``[trainer]`` options. ``--resume``
    refuses a checkpoint of another (one copied from another run folder), whose weights and
    generators would continue a training this run is not."""
    import hashlib

    facts = {
        "problem": {**asdict(description), "action_type": description.action_type.value},
        "trainer": choice.resolved(),
    }
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def non_finite_parameters(state: Mapping[str, Any], device: torch.device) -> str | None:
    """The first module of a trainer's ``state`` (its ``state_dict``: each module's tensors by
    name, or a tensor) holding a value that is not finite, as ``parameters of <module>
    ('<tensor>')``; None when every one is finite. Optimizer states and counters are not
    parameters and are skipped. The tensors are checked on ``device`` with one sync."""
    import torch

    named: list[tuple[str, str | None, torch.Tensor]] = []
    for module, value in state.items():
        tensors: Mapping[str | None, Any] = {}
        if isinstance(value, torch.Tensor):
            tensors = {None: value}
        elif isinstance(value, Mapping) and all(
            isinstance(tensor, torch.Tensor) for tensor in value.values()
        ):
            tensors = value
        named += [
            (module, name, tensor)
            for name, tensor in tensors.items()
            if tensor.is_floating_point() and tensor.numel()
        ]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(tensor).all().to(device) for *_, tensor in named])
    if bool(finite.all()):
        return None
    module, name, _ = named[int((~finite).nonzero()[0, 0])]
    return f"parameters of {module}" + (f" ({name!r})" if name is not None else "")


DIVERGED_HINT = (
    "the updates diverged: lower the trainer's learning rate, or bring the rewards to a "
    "smaller scale"
)
"""What a training whose figures stopped being finite is told, unless its rewards are not."""


def timeline_problem(run: StageRun) -> tuple[ProblemDescription, Normalization]:
    """The description of a pipeline run's data: its ``timeline/timeline.json`` and
    ``normalization.json``, and the normalization itself."""
    folder = RunFolder(run.output_dir)
    info = folder.timeline_info()
    normalization = folder.normalization(run.plugins)
    max_feature_value = 6.0
    if "normalization" in run.spec.sections:
        max_feature_value = run.spec.sections["normalization"].config.max_feature_value
    description = ProblemDescription.for_data(
        ActionType(info.action_type),
        info.actions or [],
        normalization,
        info.n_step,
        run.seed,
        max_feature_value,
    )
    return description, normalization


def load_split(
    run: RunContext, description: ProblemDescription, split: str, device: torch.device
) -> TimelineTensors:
    """One split of a pipeline run's timeline as tensors on ``device``, its features those of
    ``description``, read a slice at a time (``streamed.read_in_memory``)."""
    from horizon_engine.streamed import read_in_memory

    return read_in_memory(RunFolder(run.output_dir).split(split), description).to(device)


def evaluation_metrics(
    trainer: TrainerBase, eval_data: TimelineTensors | StreamedTimeline | None
) -> dict[str, float]:
    """The trainer's evaluation on ``eval_data`` as epoch metrics (``Evaluation/<name>``);
    none when it has no rows."""
    if eval_data is None or not len(eval_data):
        return {}
    from horizon_engine.streamed import evaluate_split

    evaluation = evaluate_split(trainer, eval_data)
    return {f"Evaluation/{name}": value for name, value in evaluation.items()}


def read_check_rows(run_dir: Path, description: ProblemDescription) -> dict[str, torch.Tensor]:
    """The rows a run saved to check its exported model on (``check_rows.pt``): the policy's
    inputs its action type takes (``CHECK_FIELDS``), each a tensor of the shape
    ``description`` gives (as many features as it names, the same rows and candidates in
    every field). The file is input: it is loaded with ``weights_only`` (no code runs) and
    anything else in it stops the export with the file and the field named."""
    import torch

    path = RunFolder(run_dir).file(RunFolder.CHECK_ROWS)
    if not path.is_file():
        raise HorizonError(
            f"{path} does not exist: {run_dir} holds no finished training of this version "
            "(run its training again)"
        )
    try:
        rows = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises untyped errors for a file it cannot unpickle
        raise HorizonError(f"{path}: not check rows torch can load safely ({exc})") from None
    if not isinstance(rows, dict):
        raise HorizonError(f"{path}: holds a {type(rows).__name__}, not check rows by field")
    states, actions = len(description.feature_ids), len(description.action_feature_ids)
    shapes = {
        "state": ("rows", states),
        "state_presence": ("rows", states),
        "possible_action_features": ("rows", "candidates", actions),
        "possible_action_presence": ("rows", "candidates", actions),
        "possible_actions": ("rows", "candidates"),
    }
    sizes: dict[str, int] = {}
    for name in CHECK_FIELDS[description.action_type]:
        tensor = rows.get(name)
        wanted = shapes[name]
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            found = type(tensor).__name__ if name in rows else "nothing"
            raise HorizonError(f"{path}: field '{name}' is not a float tensor; found {found}")
        shape = list(tensor.shape)
        expected = [sizes.get(dim, dim) if isinstance(dim, str) else dim for dim in wanted]
        fits = len(shape) == len(wanted) and shape[0] > 0
        if not fits or any(
            isinstance(want, int) and want != size
            for want, size in zip(expected, shape, strict=True)
        ):
            raise HorizonError(
                f"{path}: field '{name}' has shape {shape}, expected {expected} for the "
                f"problem in {RunFolder.PROBLEM}"
            )
        named = zip(wanted, shape, strict=True)
        sizes.update({dim: size for dim, size in named if isinstance(dim, str)})
    return rows


@contextmanager
def resume_field(path: Path, name: str) -> Iterator[None]:
    """Inside: restoring field ``resume.<name>`` of the checkpoint ``path``; a value that does
    not fit (another type, a generator state of another size) stops ``--resume`` naming
    both."""
    from horizon_engine.training import LOAD_ERRORS

    try:
        yield
    except LOAD_ERRORS as exc:
        reason = (str(exc) or type(exc).__name__).splitlines()[0]
        raise HorizonError(
            f"--resume: {path}: field 'resume.{name}' cannot be restored ({reason:.200})"
        ) from None


def whole_number(value: Any) -> int:
    """``value`` when it is a whole number from 0 (not a bool), else a ``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"not a whole number from 0; found {value!r:.80}")
    return value


class TrainingDriver:
    """One trainer, set up for a run's problem and driven batch by batch and epoch by epoch.

    ``outputs`` lists what it wrote (run-relative): the problem description, the check rows
    and ``checkpoints/latest.pt``; ``checkpoints`` the epochs' own checkpoint files (a resumed
    training's earlier epochs' too); ``history`` each epoch's metrics.
    """

    CHECK_ROWS: ClassVar[int] = 1024
    """Rows kept to check an exported model on (all of them when the data has fewer): a host
    feeding its own data picks that many for ``save_check_rows``."""

    def __init__(
        self,
        run: RunContext,
        choice: Choice,
        description: ProblemDescription,
        normalization: Normalization,
        callbacks: Iterable[BatchCallback] = (),
        *,
        plugins: PluginHost | None = None,
    ) -> None:
        import torch

        from horizon_engine.plugins import get_plugin_host
        from horizon_engine.training import resolve_device, restore_latest

        self.run = run
        self.config = choice.config
        self.device = distributed.device_for_rank(resolve_device(self.config.device))
        self._set_up = (choice, description, normalization, plugins or get_plugin_host())
        """What the trainer was set up from: ``spare_trainer`` sets up another one alike."""
        self.trainer, self.problem = set_up_trainer(
            *self._set_up, self.device, distributed.world_size()
        )
        if distributed.rank() > 0:
            torch.manual_seed(description.seed + distributed.rank())
        if self.config.warm_start_from:
            restore_latest(self.trainer, Path(self.config.warm_start_from))
        self.training = training_fingerprint(choice, description)
        """What this training's checkpoints record: ``resume`` refuses another's."""
        self.callbacks = list(callbacks)
        self.folder = RunFolder(run.output_dir)
        self.outputs = [description.write(run.output_dir)] if distributed.is_writer() else []
        self.checkpoints: list[str] = []
        self.history: list[dict[str, float]] = []
        self.epoch = 0
        self.updates = 0
        self.data_order = torch.Generator().manual_seed(run.seed)
        """Shuffles the epochs' minibatches: its state is part of every checkpoint."""
        self.threads = resolve_threads(
            self.config.threads, self.device, self.config.minibatch_size * self._parameters()
        )
        """``[trainer] threads`` resolved: the CPU threads torch trains with."""
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._alone = distributed.world_size() == 1
        """A single process stops at the update whose figures are not finite; several stop
        together at the epoch's end (``training_metrics``), where they agree."""

    def _parameters(self) -> int:
        """The policy's parameters: what an update's work grows with."""
        return sum(parameter.numel() for parameter in self.trainer.policy().parameters())

    @contextmanager
    def torch_threads(self) -> Iterator[None]:
        """torch computes on ``self.threads`` CPU threads inside, on as many as before after;
        so do numpy's and scipy's BLAS (``evaluation.blas_threads``)."""
        import torch

        from horizon_engine.evaluation import blas_threads

        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with blas_threads():
                yield
        finally:
            torch.set_num_threads(before)

    def spare_trainer(self) -> TrainerBase:
        """A second trainer set up as this one is, for one process, leaving torch's generators
        as they were: ``EpochEnds`` loads an epoch's state into it to evaluate beside the next
        epoch's updates."""
        import torch

        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            trainer, _ = set_up_trainer(*self._set_up, self.device)
        return trainer

    def prepare(self, data: EpochData) -> EpochData:
        """``data`` as epochs train on it: its batches carry the state preprocessor's output,
        computed here once, beside the raw features."""
        return data.with_preprocessed(self.problem.state_preprocessor)

    def train_batch(self, batch: Batch) -> None:
        """One update on ``batch`` (on the device), then the batch callbacks."""
        metrics = self.trainer.train_step(batch)
        for callback in self.callbacks:
            metrics = {**metrics, **(callback(batch) or {})}
        if self._alone and not all(math.isfinite(value) for value in metrics.values()):
            self._stop_diverged(
                metrics, f"epoch {self.epoch + 1} (update {self.updates + 1})", batch
            )
        sums, counts = self._sums, self._counts
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
        self.updates += 1

    def train_sampled(self, data: SampledData, batches: int) -> None:
        """``batches`` updates, each on a minibatch sampled from ``data``."""
        for _ in range(batches):
            batch = data.sample(self.config.minibatch_size)
            if self.device.type != "cpu":
                batch = {name: tensor.to(self.device) for name, tensor in batch.items()}
            self.train_batch(batch)

    def train_epochs(
        self,
        data: EpochData,
        eval_data: TimelineTensors | None = None,
        estimators: EpisodeEvaluation | None = None,
    ) -> list[dict[str, float]]:
        """``[trainer] epochs`` passes over ``data`` (``prepare``d; minibatches shuffled by
        ``data_order``, seeded with the run's seed), each ended as ``end_epoch`` ends one but
        beside the next epoch's updates (``horizon_engine.epoch_ends``: the same figures and
        files), on ``self.threads`` CPU threads; returns each epoch's metrics once the last
        epoch's checkpoint is written. After ``resume`` the epochs after the restored one are
        trained."""
        from horizon_engine.epoch_ends import EpochEnds

        epochs = self.planned_epochs(data)
        progress = self.run.progress(f"training: {epochs} epochs", total=epochs)
        ends = EpochEnds(self, epochs, eval_data, estimators)
        with self.torch_threads(), progress as advance, ends:
            data = self.prepare(data.shard(distributed.rank(), distributed.world_size()))
            advance(self.epoch)
            while self.epoch < epochs:
                for batch in data.minibatches(self.config.minibatch_size, self.data_order):
                    self.train_batch(batch)
                ends.end_epoch()
                advance(1)
        return self.history

    def planned_epochs(self, data: EpochData) -> int:
        """``[trainer] epochs``, or for "auto" the trainer's ``DEFAULT_PASSES`` over ``data``
        within ``min_updates`` and ``max_updates`` gradient updates."""
        config = self.config
        if config.epochs != "auto":
            return config.epochs
        batches = self._batches(data)
        if config.DEFAULT_PASSES * batches < config.min_updates:
            return math.ceil(config.min_updates / batches)
        return max(1, min(config.DEFAULT_PASSES, config.max_updates // batches))

    def training_length(self, data: EpochData) -> str:
        """How long training on ``data`` is and why, for the user: printed by ``horizon run``
        and recorded in the manifest."""
        config = self.config
        epochs, batches = self.planned_epochs(data), self._batches(data)
        if config.epochs != "auto":
            chosen = "[trainer] epochs"
        elif epochs > config.DEFAULT_PASSES:
            chosen = f"epochs auto: min_updates = {config.min_updates}"
        elif epochs < config.DEFAULT_PASSES:
            chosen = f"epochs auto: max_updates = {config.max_updates}"
        else:
            chosen = f"epochs auto: the trainer's {config.DEFAULT_PASSES}"
        minibatches = f"{batches} minibatch" + ("es" if batches != 1 else "")
        return f"{epochs} epochs of {minibatches}, {epochs * batches} updates ({chosen})"

    def _batches(self, data: EpochData) -> int:
        """Minibatches in one pass over ``data``."""
        return max(1, math.ceil(len(data) / self.config.minibatch_size))

    def applied_options(self, data: EpochData) -> dict[str, Any]:
        """The training options as they applied: the threads and device ``auto`` chose, the
        epochs over ``data``, and what the trainer resolved (``applied_options``)."""
        return {
            "threads": self.threads,
            "device": str(self.device),
            "epochs": self.planned_epochs(data),
            **self.trainer.applied_options(),
        }

    def end_epoch(
        self,
        metrics: Mapping[str, float] | None = None,
        eval_data: TimelineTensors | None = None,
        estimators: EpisodeEvaluation | None = None,
        checkpoint: Mapping[str, Any] | None = None,
    ) -> dict[str, float]:
        """End an epoch: its metrics (the host's own ``metrics`` first, then the mean of each
        training metric since the last epoch, the evaluation on ``eval_data`` when it has
        rows, the per-epoch ``estimators``), ``horizon_on_epoch_end``, then a checkpoint holding
        the trainer's state, what resuming needs and ``checkpoint``'s plain data. Returns the
        metrics. With several processes the training metrics are over every rank's batches,
        and the rest is rank 0's alone."""
        found = self.training_metrics(metrics)
        if not distributed.is_writer():
            self.history.append(found)
            return found
        found |= evaluation_metrics(self.trainer, eval_data)
        if estimators is not None:
            found |= estimators.epoch_metrics(self.trainer)
        self.record_epoch(self.epoch, found, self.trainer.state_dict(), estimators, checkpoint)
        return found

    def training_metrics(self, metrics: Mapping[str, float] | None = None) -> dict[str, float]:
        """Count the epoch ended: ``metrics`` followed by the mean of each training metric
        since the last epoch (over every rank's batches), which start again from none."""
        self.epoch += 1
        found = dict(metrics or {})
        sums, counts = distributed.all_reduce_metrics(self._sums, self._counts)
        means = {name: total / counts[name] for name, total in sums.items()}
        if not all(math.isfinite(value) for value in means.values()):
            self._stop_diverged(means, f"epoch {self.epoch}")
        broken = non_finite_parameters(self.trainer.state_dict(), self.device)
        if broken is not None:
            raise HorizonError(
                f"training stopped at epoch {self.epoch}: the {broken} are not finite; "
                f"{DIVERGED_HINT}"
            )
        found |= {f"Training/{name}": value for name, value in means.items()}
        self._sums, self._counts = {}, {}
        return found

    def _stop_diverged(
        self, metrics: Mapping[str, float], when: str, batch: Batch | None = None
    ) -> None:
        """Stop the training ``when`` (the epoch, and the update when one is known) with a
        ``HorizonError`` naming the first training metric of ``metrics`` that is not finite,
        and why it may be: the ``batch``'s rewards (``reward``, ``next_n_rewards``) when they
        are not finite themselves (looked at only now), else the updates' divergence."""
        import torch

        name, value = next(
            (name, value) for name, value in metrics.items() if not math.isfinite(value)
        )
        why = DIVERGED_HINT
        rewards = {}
        if batch is not None:
            rewards = {name: batch[name] for name in batch if "reward" in name}
        for field, tensor in rewards.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                why = (
                    f"the batch's {field!r} holds values that are not finite: check the logged "
                    "rewards and the [timeline] reward weights"
                )
                break
        raise HorizonError(
            f"training stopped at {when}: the training metric {name!r} is {value}; {why}"
        )

    def record_epoch(
        self,
        epoch: int,
        found: dict[str, float],
        trainer_state: dict[str, Any],
        estimators: EpisodeEvaluation | None,
        checkpoint: Mapping[str, Any] | None = None,
        generators: dict[str, Any] | None = None,
    ) -> None:
        """Epoch ``epoch``'s last acts, rank 0's: its metrics ``found`` join ``history`` and
        reach ``horizon_on_epoch_end``, then its checkpoint is written with ``trainer_state``,
        what resuming needs (``generators``: ``generator_state()`` when the epoch ended, taken
        now when None) and ``checkpoint``'s plain data."""
        from horizon_engine.training import save_checkpoint

        self.history.append(found)
        self.run.emit_epoch_metrics(epoch, found)
        resume = {
            **(generators or self.generator_state()),
            "history": json.dumps(self.history),
            "training": self.training,
        }
        if estimators is not None:
            resume["estimators"] = json.dumps(estimators.resume_state())
        state = {"trainer": trainer_state, RESUME_STATE: resume, **(checkpoint or {})}
        save_checkpoint(self.folder, epoch, state)
        self.checkpoints.append(RunFolder.checkpoint_name(epoch))
        self._list_latest()

    def _list_latest(self) -> None:
        if RunFolder.LATEST_CHECKPOINT not in self.outputs:
            self.outputs.append(RunFolder.LATEST_CHECKPOINT)

    def generator_state(self) -> dict[str, Any]:
        """What the epochs after this moment draw from besides the trainer's state: torch's
        generators (the device's too), the data order, the update count."""
        import torch

        state: dict[str, Any] = {
            "torch_rng": torch.get_rng_state(),
            "data_order": self.data_order.get_state(),
            "updates": self.updates,
        }
        if self.device.type == "cuda":
            state["device_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def resume(
        self, estimators: EpisodeEvaluation | None = None, epochs: int | None = None
    ) -> dict[str, Any] | None:
        """Continue from the last complete epoch's checkpoint in the run folder: the trainer,
        the generators, the epoch and update counts, the metrics so far and the per-epoch
        ``estimators``' record, as they were when it was written; ``latest.pt`` is made that
        checkpoint again. Returns the checkpoint (the host's plain data is in it), or None when
        no epoch was complete (training then starts at epoch 1).

        The checkpoint is input, checked field by field: its epoch must be the one its name
        says and within the run's ``epochs`` (when the host knows them), and it must belong to
        this training (``training_fingerprint``), not be one copied from another run folder;
        anything else stops with the file and the field named."""
        import torch

        from horizon_engine.files import atomic_output
        from horizon_engine.training import read_epoch_checkpoint, restore_trainer_state

        path = self.folder.last_epoch_checkpoint()
        if path is None:
            return None
        checkpoint = read_epoch_checkpoint(path, "--resume")
        state = checkpoint.get(RESUME_STATE)
        if not isinstance(state, dict) or "training" not in state:
            raise HorizonError(
                f"--resume: {path} was written by a version of Horizon Engine that did not "
                "record what resuming needs; train again from epoch 1 (--stages train)"
            )
        epoch = checkpoint["epoch"]
        if path.name != Path(RunFolder.checkpoint_name(epoch)).name:
            raise HorizonError(
                f"--resume: {path}: field 'epoch' is {epoch}, not the epoch its name gives"
            )
        if epochs is not None and epoch > epochs:
            raise HorizonError(
                f"--resume: {path}: field 'epoch' is {epoch}, beyond the {epochs} epochs "
                "this run trains"
            )
        if state["training"] != self.training:
            raise HorizonError(
                f"--resume: {path} belongs to another training: its field 'resume.training' "
                f"is {state['training']!r:.40}, this run's training is {self.training!r} (a "
                "digest of the problem and the [trainer] options). A checkpoint copied from "
                "another run folder is not resumed; remove it, or train again from epoch 1 "
                "(--stages train)"
            )
        restore_trainer_state(self.trainer, checkpoint, path, "--resume")
        with resume_field(path, "torch_rng"):
            torch.set_rng_state(state["torch_rng"])
        if "device_rng" in state and self.device.type == "cuda":
            with resume_field(path, "device_rng"):
                torch.cuda.set_rng_state(state["device_rng"], self.device)
        with resume_field(path, "data_order"):
            self.data_order.set_state(state["data_order"])
        with resume_field(path, "updates"):
            self.updates = whole_number(state["updates"])
        with resume_field(path, "history"):
            self.history = json.loads(state["history"])
            if not isinstance(self.history, list) or len(self.history) != epoch:
                raise ValueError(f"not the metrics of {epoch} epochs")
        self.epoch = epoch
        if estimators is not None and "estimators" in state:
            with resume_field(path, "estimators"):
                estimators.restore(json.loads(state["estimators"]))
        self.checkpoints = [
            RunFolder.checkpoint_name(epoch)
            for epoch in range(1, self.epoch + 1)
            if self.folder.checkpoint_path(epoch).is_file()
        ]
        if not distributed.is_writer():
            return checkpoint
        with atomic_output(self.folder.latest_checkpoint) as temporary:
            temporary.write_bytes(path.read_bytes())
        self._list_latest()
        return checkpoint

    def save_check_rows(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Keep the first ``CHECK_ROWS`` rows of the policy's inputs among ``tensors``
        (batch-schema names) as ``check_rows.pt``, for checking an export (rank 0's task)."""
        import torch

        if not distributed.is_writer():
            return

        from horizon_engine.files import atomic_output

        rows = {
            name: tensors[name][: self.CHECK_ROWS].cpu().clone()
            for name in CHECK_FIELDS[self.problem.action_type]
        }
        with atomic_output(self.folder.file(RunFolder.CHECK_ROWS)) as temporary:
            torch.save(rows, temporary)
        self.outputs.append(RunFolder.CHECK_ROWS)
