"""Running the ``[[evaluation]]`` estimators: after every training epoch, and as a stage.

Both read the eval split as ``EvaluationEpisodes`` (rows in episode and step order, each
metric's values, the trainer's evaluation models) and compute the evaluated policy's
``PolicyOutput`` under each entry's exploration. The stage restores the latest checkpoint and
writes ``evaluation.json``: each entry's estimates, by the entry's label (its ``kind``, with
``[i]`` added when two entries share one).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine.errors import HorizonError
from horizon_engine.run_context import StageReport

if TYPE_CHECKING:
    import torch

    from horizon_engine.config import Choice
    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.estimation import EstimatorBase, EvaluationEpisodes
    from horizon_engine.policies import ExplorationConfig, PolicyOutput
    from horizon_engine.run_context import RunContext
    from horizon_engine.schema import ActionType
    from horizon_engine.training import TrainerBase

EVALUATION_FILE = "evaluation.json"
"""The evaluation stage's output, in the run folder."""

POLICY_CHUNK_ROWS = 65_536
"""Rows the evaluated policy scores at once: bounded memory on a large eval split."""


def estimator_labels(choices: list[Choice]) -> list[str]:
    """Each entry's label: its kind, with ``[i]`` (its position) when two entries share one."""
    counts = Counter(choice.component.name for choice in choices)
    return [
        choice.component.name + (f"[{index}]" if counts[choice.component.name] > 1 else "")
        for index, choice in enumerate(choices)
    ]


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


class EpisodeEvaluation:
    """The configured estimators over one eval split, ready to run on any state of a trainer."""

    def __init__(
        self,
        choices: list[Choice],
        action_type: ActionType,
        data: TimelineTensors,
        metrics: dict[str, torch.Tensor],
    ) -> None:
        import torch

        self.action_type = action_type
        self.labels = estimator_labels(choices)
        self.choices = choices
        self.estimators: list[EstimatorBase] = [choice.create() for choice in choices]
        by_step = torch.argsort(data.step, stable=True)
        order = by_step[torch.argsort(data.episode_id[by_step], stable=True)]
        self.data = data.take(order)
        self.metrics = {
            name: values.to(order.device).index_select(0, order) for name, values in metrics.items()
        }
        _, lengths = torch.unique_consecutive(self.data.episode_id, return_counts=True)
        self.episode_starts = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        self.episode_starts = self.episode_starts.cpu()

    def run(
        self, trainer: TrainerBase, every_epoch_only: bool = False
    ) -> dict[str, dict[str, float]]:
        """Each entry's estimates for the trainer's current policy, by label (with
        ``every_epoch_only``, only the entries that run after every epoch)."""
        policy = trainer.policy()
        models = trainer.evaluation_models()
        results: dict[str, dict[str, float]] = {}
        outputs: dict[str, PolicyOutput] = {}
        for label, choice, estimator in zip(
            self.labels, self.choices, self.estimators, strict=True
        ):
            if every_epoch_only and not choice.config.every_epoch:
                continue
            key = choice.config.model_dump_json(include={"policy", "epsilon", "temperature"})
            if key not in outputs:
                outputs[key] = self._policy_output(policy, choice.config)
            episodes = self._episodes(outputs[key], models)
            results[label] = {
                name: float(value) for name, value in estimator.estimate(episodes).items()
            }
        return results

    def epoch_metrics(self, trainer: TrainerBase) -> dict[str, float]:
        """The per-epoch entries' estimates as epoch metrics, ``CPE/<label>/<estimate>``."""
        return {
            f"CPE/{label}/{name}": value
            for label, estimates in self.run(trainer, every_epoch_only=True).items()
            for name, value in estimates.items()
        }

    def _episodes(self, output: PolicyOutput, models: dict[str, Any]) -> EvaluationEpisodes:
        from horizon_engine.estimation import EvaluationEpisodes

        return EvaluationEpisodes(
            action_type=self.action_type,
            data=self.data,
            episode_starts=self.episode_starts,
            policy=output,
            metrics=self.metrics,
            models=models,
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


def run_evaluation_stage(run: RunContext, choices: list[Choice]) -> StageReport:
    """Run every ``[[evaluation]]`` estimator once on the eval split, for the latest
    checkpoint's policy; write ``evaluation.json``."""
    from horizon_engine.driver import load_split, restore_trainer, timeline_problem
    from horizon_engine.files import write_json
    from horizon_engine.training import resolve_device

    trainer_choice = run.spec.sections["trainer"]
    description, _ = timeline_problem(run)
    device = resolve_device(trainer_choice.config.device)
    trainer, _ = restore_trainer(
        run.output_dir, trainer_choice, description, run.plugins, device, "evaluation"
    )
    eval_split = load_split(run, description, "eval", device)
    if not len(eval_split):
        raise HorizonError(
            f"[[evaluation]] {run.output_dir / 'timeline' / 'eval'} holds no rows: the "
            "estimators need an eval split ([timeline] eval_fraction > 0)"
        )
    evaluation = EpisodeEvaluation(
        choices,
        description.action_type,
        eval_split,
        read_metrics(run.output_dir / "timeline" / "eval"),
    )
    estimates = evaluation.run(trainer)
    write_json(
        run.output_dir / EVALUATION_FILE,
        {
            "eval_rows": len(eval_split),
            "episodes": len(evaluation.episode_starts) - 1,
            "estimates": estimates,
        },
    )
    return StageReport(
        "evaluation",
        rows_in=len(eval_split),
        rows_out=len(eval_split),
        outputs=[EVALUATION_FILE],
        details={"episodes": len(evaluation.episode_starts) - 1, "estimates": estimates},
    )
