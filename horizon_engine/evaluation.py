"""Running the ``[[evaluation]]`` estimators: after every training epoch, and as a stage.

Both read the eval split as ``EvaluationEpisodes`` (rows in episode and step order, each
metric's values, the trainer's evaluation models, its discount and the run's seed) and compute
the evaluated policy's ``PolicyOutput`` under each entry's exploration. Each entry is known by
its label: its ``kind``, with ``[i]`` added when two entries share one.

An estimator returns ``Estimate``s by metric (the counterfactual ones) or plain floats
(``logged_value``). As epoch metrics, an ``Estimate`` of metric ``m`` by entry ``L`` is
``CPE/<m>/<L>``, its value relative to the logged policy's (the raw value when there is no
relative one), and ``CPE/<m>/<L>/raw``; a float ``x`` named ``n`` is ``CPE/<L>/<n>``.

The files, each written whole (temporary name, then rename) and owned by one stage:

- ``cpe_epochs.json``, the train stage's: every epoch's estimates, rewritten as epochs end
  (at most once every ``EPOCHS_WRITE_SECONDS``, and when training ends: rewriting a growing
  file after every short epoch was more than half of per-epoch CPE's cost on the CartPole
  example), so a long training can be watched and a killed one keeps its record;
- ``cpe.json``, the evaluation stage's: what a user reads, ``{"eval_rows", "episodes",
  "entries", "final", "epochs"}``. ``entries`` gives each label's kind, options as configured,
  the details the estimator recorded (the options in force: the discount it resolved,
  clipping, floor) and, for an estimator that cannot apply to the data, ``not_applicable``
  with the reason; ``final`` the latest checkpoint's estimates by label; ``epochs`` a copy of
  ``cpe_epochs.json``'s epochs, so one file holds the whole story. Two stages never write one
  file: a later ``--stages train`` run replaces ``cpe_epochs.json`` and marks ``cpe.json``
  stale, as for any output read from a replaced one.

The evaluation stage and ``evaluate_run`` (``horizon evaluate``) live in
``horizon_engine.evaluation_stage``; ``estimates_table`` prints estimates for people.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine.errors import HorizonError

if TYPE_CHECKING:
    import torch

    from horizon_engine.capabilities import EvaluationModels
    from horizon_engine.config import Choice
    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.estimation import Estimate, EstimatorBase, EvaluationEpisodes
    from horizon_engine.policies import ExplorationConfig, PolicyOutput
    from horizon_engine.schema import ActionType
    from horizon_engine.training import TrainerBase

EPOCHS_WRITE_SECONDS = 1.0
"""Least time between two rewrites of ``cpe_epochs.json`` while training."""

POLICY_CHUNK_ROWS = 65_536
"""Rows the evaluated policy scores at once: bounded memory on a large eval split."""

Results = dict[str, dict[str, "Estimate | float"]]
"""Each entry's estimates by label, each by name."""


def estimator_labels(choices: list[Choice]) -> list[str]:
    """Each entry's label: its ``label``, else its kind, with ``[i]`` (its position) when two
    entries share one."""
    names = [getattr(choice.config, "label", None) or choice.component.name for choice in choices]
    counts = Counter(names)
    return [name + (f"[{index}]" if counts[name] > 1 else "") for index, name in enumerate(names)]


def read_metrics(split: Path) -> dict[str, torch.Tensor]:
    """Each metric the split's rows carry, as ``[rows]`` float32 in the order ``load_timeline``
    reads the rows (0 where a row lacks the metric); none when no row carries one."""
    import pyarrow.parquet as pq
    import torch

    from horizon_engine.dataset import dense_features
    from horizon_engine.schema import map_entries

    if "metrics" not in pq.read_schema(next(iter(sorted(split.glob("*.parquet"))))).names:
        return {}
    column = pq.read_table(split, columns=["metrics"])["metrics"].combine_chunks()
    _, keys, _ = map_entries(column)
    names = sorted(set(keys.to_pylist()))
    values, _ = dense_features(column, names)
    return {name: torch.from_numpy(values[:, i].copy()) for i, name in enumerate(names)}


def logged_horizon(splits: list[Path]) -> int | None:
    """The most rows any episode has in the timeline ``splits`` (train and eval): the
    horizon a return per episode is counted over (``EvaluationEpisodes.horizon``); None
    when they hold no rows. Read from the ``mdp_id`` column alone."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    longest = 0
    for split in splits:
        files = sorted(split.glob("*.parquet"))
        if not files:
            continue
        ids = pa.concat_arrays(
            [pq.read_table(path, columns=["mdp_id"])["mdp_id"].combine_chunks() for path in files]
        )
        if len(ids):
            longest = max(longest, int(pc.max(pc.value_counts(ids).field("counts")).as_py()))
    return longest or None


def results_json(results: Results) -> dict[str, dict[str, Any]]:
    """``results`` as JSON: an ``Estimate`` as its fields, a float as it is (null when it is
    not finite)."""
    from horizon_engine.estimation import Estimate

    return {
        label: {
            name: value.to_json()
            if isinstance(value, Estimate)
            else (value if math.isfinite(value) else None)
            for name, value in estimates.items()
        }
        for label, estimates in results.items()
    }


def epoch_metric_values(results: Results) -> dict[str, float]:
    """``results`` as epoch metrics: ``CPE/<metric>/<label>`` (relative, else raw) and
    ``CPE/<metric>/<label>/raw`` for an ``Estimate``, ``CPE/<label>/<name>`` for a float."""
    from horizon_engine.estimation import Estimate

    metrics: dict[str, float] = {}
    for label, estimates in results.items():
        for name, value in estimates.items():
            if isinstance(value, Estimate):
                shown = value.relative if value.relative is not None else value.value
                metrics[f"CPE/{name}/{label}"] = float(shown)
                metrics[f"CPE/{name}/{label}/raw"] = float(value.value)
            else:
                metrics[f"CPE/{label}/{name}"] = float(value)
    return metrics


@contextmanager
def blas_threads() -> Iterator[None]:
    """numpy's and scipy's BLAS (OpenBLAS, MKL) limited to torch's thread count inside (the
    driver's ``torch_threads`` while training), by threadpoolctl.

    The estimators' linear algebra is on matrices of a few hundred rows, where BLAS threads
    cost more than they give, ruinously on a busy machine: on the CartPole example (2 cores
    under load), bounded FQE on all 64 hidden units took 494 ms with OpenBLAS's threads and
    37 ms on one."""
    import torch
    from threadpoolctl import ThreadpoolController

    global _BLAS_CONTROLLER
    modules = len(sys.modules)
    if _BLAS_CONTROLLER is None or _BLAS_CONTROLLER[0] != modules:
        # Finding the loaded libraries reads the process's maps (2 ms): again only when
        # modules were imported since (scipy brings its own OpenBLAS).
        _BLAS_CONTROLLER = (modules, ThreadpoolController())
    with _BLAS_CONTROLLER[1].limit(limits=torch.get_num_threads(), user_api="blas"):
        yield


_BLAS_CONTROLLER: tuple[int, Any] | None = None
"""The number of modules imported when threadpoolctl's controller of the loaded BLAS
libraries was made, and the controller."""


class EpisodeEvaluation:
    """The configured estimators over one eval split, ready to run on any state of a trainer.

    ``seed`` is the run's (estimators' bootstrap draws); with ``epochs_file``,
    ``epoch_metrics`` also rewrites that file with every epoch's estimates so far (at most
    once every ``EPOCHS_WRITE_SECONDS``; ``write_epochs`` writes it at the end).
    """

    def __init__(
        self,
        choices: list[Choice],
        action_type: ActionType,
        data: TimelineTensors,
        metrics: dict[str, torch.Tensor],
        seed: int | None = None,
        epochs_file: Path | None = None,
        horizon: int | None = None,
    ) -> None:
        import torch

        self.action_type = action_type
        self.horizon = horizon
        """The longest logged episode's rows (``logged_horizon``), None when unknown."""
        self.labels = estimator_labels(choices)
        self.choices = choices
        self.estimators: list[EstimatorBase] = [choice.create() for choice in choices]
        self.seed = seed
        self.epochs_file = epochs_file
        self.epochs: list[dict[str, Any]] = []
        """Each ``epoch_metrics`` call's estimates, as ``cpe_epochs.json`` holds them."""
        self._written_at = -math.inf
        self._written_epochs = 0
        self.not_applicable: dict[str, str] = {}
        """Labels whose estimator cannot apply to this data, with its reason."""
        by_step = torch.argsort(data.step, stable=True)
        order = by_step[torch.argsort(data.episode_id[by_step], stable=True)]
        self.data = data.take(order)
        self.metrics = {
            name: values.to(order.device).index_select(0, order) for name, values in metrics.items()
        }
        _, lengths = torch.unique_consecutive(self.data.episode_id, return_counts=True)
        self.episode_starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        self.episode_starts = self.episode_starts.cpu()

    @property
    def episode_count(self) -> int:
        return len(self.episode_starts) - 1

    def run(self, trainer: TrainerBase, every_epoch_only: bool = False) -> Results:
        """Each entry's estimates for the trainer's current policy, by label (with
        ``every_epoch_only``, only the entries that run after every epoch). An entry whose
        estimator raised ``NotApplicable`` is left out and its reason kept in
        ``not_applicable``. numpy's and scipy's BLAS compute on as many threads as torch
        meanwhile (``blas_threads``)."""
        from horizon_engine.capabilities import (
            NO_EVALUATION_MODELS,
            Discounts,
            OffersEvaluationModels,
        )

        policy = trainer.policy()
        offers = isinstance(trainer, OffersEvaluationModels)
        models = trainer.evaluation_models() if offers else NO_EVALUATION_MODELS
        discount = trainer.discount() if isinstance(trainer, Discounts) else None
        results: Results = {}
        outputs: dict[str, PolicyOutput] = {}
        with blas_threads():
            self._run_entries(every_epoch_only, policy, models, discount, results, outputs)
        return results

    def _run_entries(
        self,
        every_epoch_only: bool,
        policy: torch.nn.Module,
        models: EvaluationModels,
        discount: float | None,
        results: Results,
        outputs: dict[str, PolicyOutput],
    ) -> None:
        from horizon_engine.estimation import Estimate, NotApplicable

        for label, choice, estimator in zip(
            self.labels, self.choices, self.estimators, strict=True
        ):
            if every_epoch_only and not choice.config.every_epoch:
                continue
            key = choice.config.model_dump_json(include={"policy", "epsilon", "temperature"})
            if key not in outputs:
                outputs[key] = self._policy_output(policy, choice.config)
            episodes = self._episodes(outputs[key], models, discount)
            try:
                found = estimator.estimate(episodes)
            except NotApplicable as exc:
                self.not_applicable[label] = str(exc)
                continue
            estimates: dict[str, Estimate | float] = {}
            for name, value in found.items():
                if isinstance(value, Estimate):
                    estimates[name] = value
                elif isinstance(value, int | float) or hasattr(value, "__float__"):
                    estimates[name] = float(value)
                else:
                    raise HorizonError(
                        f"[[evaluation]] {label}: estimate {name!r} is a "
                        f"{type(value).__name__}, expected an Estimate or a number"
                    )
            results[label] = estimates

    def epoch_metrics(self, trainer: TrainerBase) -> dict[str, float]:
        """The per-epoch entries' estimates as epoch metrics (see the module docstring),
        recorded in ``epochs`` and written to ``epochs_file`` when there is one."""
        import time

        results = self.run(trainer, every_epoch_only=True)
        self.epochs.append({"epoch": len(self.epochs) + 1, "estimates": results_json(results)})
        if time.monotonic() - self._written_at >= EPOCHS_WRITE_SECONDS:
            self.write_epochs()
        return epoch_metric_values(results)

    def resume_state(self) -> dict[str, Any]:
        """The epochs' record so far (each epoch's estimates, the labels found not
        applicable, the details each estimator recorded): kept in every checkpoint, so that a
        resumed training writes the ``cpe_epochs.json`` an uninterrupted one would."""
        details = {
            label: dict(getattr(estimator, "details", None) or {})
            for label, estimator in zip(self.labels, self.estimators, strict=True)
        }
        return {"epochs": self.epochs, "not_applicable": self.not_applicable, "details": details}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take up the record ``resume_state`` returned."""
        self.epochs = list(state["epochs"])
        self.not_applicable = dict(state["not_applicable"])
        for label, estimator in zip(self.labels, self.estimators, strict=True):
            if state["details"].get(label):
                estimator.details = dict(state["details"][label])

    def write_epochs(self) -> None:
        """Rewrite ``epochs_file`` (when there is one) with every epoch's estimates so far,
        whole (temporary name, then rename), as compact JSON."""
        import time

        from horizon_engine.files import atomic_output

        if self.epochs_file is None or self._written_epochs == len(self.epochs):
            return
        record = {"entries": self.entries(every_epoch_only=True), "epochs": self.epochs}
        with atomic_output(self.epochs_file) as temporary:
            temporary.write_text(json.dumps(record) + "\n", encoding="utf-8")
        self._written_at = time.monotonic()
        self._written_epochs = len(self.epochs)

    def entries(self, every_epoch_only: bool = False) -> dict[str, dict[str, Any]]:
        """Each entry's kind, options as configured, the details its estimator recorded (the
        options in force) and, when it cannot apply to this data, ``not_applicable``."""
        entries = {}
        for label, choice, estimator in zip(
            self.labels, self.choices, self.estimators, strict=True
        ):
            if every_epoch_only and not choice.config.every_epoch:
                continue
            entry: dict[str, Any] = {
                "kind": choice.component.name,
                "options": choice.config.model_dump(mode="json"),
                "details": dict(getattr(estimator, "details", None) or {}),
            }
            if label in self.not_applicable:
                entry["not_applicable"] = self.not_applicable[label]
            entries[label] = entry
        return entries

    def _episodes(
        self, output: PolicyOutput, models: EvaluationModels, discount: float | None
    ) -> EvaluationEpisodes:
        from horizon_engine.estimation import EvaluationEpisodes

        return EvaluationEpisodes(
            action_type=self.action_type,
            data=self.data,
            episode_starts=self.episode_starts,
            policy=output,
            metrics=self.metrics,
            models=models,
            discount=discount,
            seed=self.seed,
            horizon=self.horizon,
        )

    def _policy_output(
        self, policy: torch.nn.Module, exploration: ExplorationConfig
    ) -> PolicyOutput:
        """The policy's output on every row, computed in chunks and joined."""
        import torch

        from horizon_engine.policies import PolicyOutput, policy_output
        from horizon_engine.schema import ActionType

        data = self.data
        parts = []
        with torch.no_grad():
            for start in range(0, len(data), POLICY_CHUNK_ROWS):
                rows = slice(start, start + POLICY_CHUNK_ROWS)
                candidates = None
                if self.action_type is ActionType.PARAMETRIC:
                    candidates = (
                        data.possible_action_features[rows],
                        data.possible_action_presence[rows],
                    )
                parts.append(
                    policy_output(
                        policy,
                        self.action_type,
                        data.state[rows],
                        data.state_presence[rows],
                        exploration,
                        None if data.possible_actions is None else data.possible_actions[rows],
                        candidates,
                    )
                )
        fields = ("action", "scores", "probabilities", "log_density")
        joined = {
            name: torch.cat([getattr(part, name) for part in parts])
            if parts and getattr(parts[0], name) is not None
            else None
            for name in fields
        }
        return PolicyOutput(self.action_type, **joined)


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if abs(value) >= 10 ** (digits + 2) or (value != 0 and abs(value) < 10**-(digits)):
        return f"{value:.{digits}g}"
    return f"{value:.{digits}f}"


def _interval(value: float | None, low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return _number(value)
    return f"{_number(value)} [{_number(low)}, {_number(high)}]"


def estimates_table(record: Mapping[str, Any]) -> str:
    """``cpe.json`` (or ``evaluate_run``'s answer) as a table for people: per metric and
    estimator the value relative to the logged policy's with its interval, the raw value with
    its interval, the logged value and the effective sample size; then plain figures (such as
    ``logged_value``'s), notes, and the entries that could not apply with their reasons."""
    final: Mapping[str, Mapping[str, Any]] = record.get("final", {})
    entries: Mapping[str, Mapping[str, Any]] = record.get("entries", {})
    header = ("metric", "estimator", "relative [interval]", "raw [interval]", "logged", "ESS")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    plain: list[str] = []
    metrics: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for label, estimates in final.items():
        figures = []
        for name, value in estimates.items():
            if isinstance(value, Mapping):
                metrics.setdefault(name, []).append((label, value))
            else:
                whole = value is not None and float(value).is_integer() and abs(value) < 1e15
                figures.append(f"{name} {int(value) if whole else _number(value)}")
        if figures:
            plain.append(f"{label}: " + ", ".join(figures))
    for metric, found in metrics.items():
        for label, estimate in found:
            rows.append(
                (
                    metric,
                    label,
                    _interval(
                        estimate.get("relative"),
                        estimate.get("relative_low"),
                        estimate.get("relative_high"),
                    ),
                    _interval(estimate.get("value"), estimate.get("low"), estimate.get("high")),
                    _number(estimate.get("logged_value")),
                    _number(estimate.get("effective_sample_size"), 1),
                )
            )
            if estimate.get("note"):
                notes.append(f"{label} {metric}: {estimate['note']}")
    lines = [
        f"Counterfactual evaluation on {record.get('episodes', '?')} episodes "
        f"({record.get('eval_rows', '?')} rows); relative = estimate / logged policy's value "
        "(1.0 = parity)"
    ]
    if rows:
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
            lines.append("  ".join(cells).rstrip())
    lines += plain
    lines += [f"note: {note}" for note in notes]
    lines += [
        f"not applicable: {label}: {entry['not_applicable']}"
        for label, entry in entries.items()
        if entry.get("not_applicable")
    ]
    return "\n".join(lines)
