"""The ``world_model`` trainer: the environment's dynamics, reward and episode ends, learned
from the logged transitions.

As ``[trainer] kind = "world_model"`` the core's driver trains it like any trainer (epochs of
shuffled rows, checkpoints, ``Training/<loss>`` and ``Evaluation/<loss>`` in TensorBoard); as
``[analysis]`` (``horizon check-mdp``) its ``analyze`` fits the models the MDP checks compare.
A world model chooses no action: its ``policy`` refuses, with the reason, to be exported,
evaluated or played.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine import (
    AnalyzesData,
    HorizonError,
    RunContext,
    StageReport,
    TimelineTensors,
    TrainerBase,
    TrainingProblem,
)
from horizon_plugins_worldmodel.config import WorldModelConfig

if TYPE_CHECKING:
    import torch

    from horizon_plugins_worldmodel.networks import NotAPolicy

EVAL_CHUNK_ROWS = 65_536
"""Rows evaluated at once."""


class WorldModelTrainer(TrainerBase, AnalyzesData):
    """A mixture-density world model (next state, reward, episode end) and the MDP checks."""

    name = "world_model"
    Config: ClassVar[type[WorldModelConfig]] = WorldModelConfig
    trains_policy: ClassVar[bool] = False
    config: WorldModelConfig

    def setup(self, problem: TrainingProblem) -> None:
        """Build the network (from ``problem.seed`` alone) and its optimizer."""
        import torch

        from horizon_engine import ForeachAdam
        from horizon_plugins_worldmodel.networks import WorldModelNetwork

        self.problem = problem
        action_width = len(problem.actions) or problem.action_width
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(problem.seed)
            self.network = WorldModelNetwork(
                problem.state_width,
                action_width,
                self.config.layers,
                self.config.num_gaussians,
            ).to(problem.device)
        self.optimizer = ForeachAdam(self.network.parameters(), lr=self.config.learning_rate)
        self.synced_network = problem.data_parallel(self.network)
        """The network as its training loss forwards it (``TrainingProblem.data_parallel``)."""

    def _losses(
        self, tensors: Mapping[str, torch.Tensor], synced: bool = False
    ) -> dict[str, torch.Tensor]:
        """The three mean losses on ``tensors``; ``synced``: through ``synced_network``, for
        the loss an update backpropagates."""
        import torch

        from horizon_plugins_worldmodel.data import transition_tensors
        from horizon_plugins_worldmodel.networks import mean_losses

        found = transition_tensors(self.problem, tensors)
        network = self.synced_network if synced else self.network
        prediction = network(found["state"], found["action"])
        weight = torch.ones_like(found["reward"])
        return mean_losses(
            prediction,
            found["next_state"],
            found["next_mask"],
            found["reward"],
            found["terminal"],
            weight,
        )

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One update on the sum of the three losses; returns ``next_state_nll`` (nats per
        transition, the next state normalized), ``termination_nll`` and ``reward_mse``."""
        if self.config.model != "mlp":
            raise HorizonError(
                "[trainer] kind = 'world_model' with model = 'gru' learns from whole episodes, "
                "which the training stage's shuffled rows are not: use it in [analysis] "
                "(horizon check-mdp)"
            )
        self.network.train()
        parts = self._losses(batch, synced=True)
        loss = parts["next_state_nll"] + parts["termination_nll"] + parts["reward_mse"]
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {name: float(value.detach()) for name, value in parts.items()}

    def evaluate(self, data: TimelineTensors) -> dict[str, float]:
        """The three losses on the eval split, the mean over its rows."""
        import torch

        self.network.eval()
        sums: dict[str, float] = {}
        with torch.no_grad():
            for start in range(0, len(data), EVAL_CHUNK_ROWS):
                index = torch.arange(start, min(start + EVAL_CHUNK_ROWS, len(data)))
                chunk = data.take(index.to(data.reward.device))
                for name, value in self._losses(chunk.tensors()).items():
                    sums[name] = sums.get(name, 0.0) + float(value) * len(index)
        return {name: total / len(data) for name, total in sums.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.network.load_state_dict(state["network"])
        except (KeyError, RuntimeError) as exc:
            raise HorizonError(
                f"the checkpoint does not fit this world model's options: {exc}"
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])

    def policy(self) -> NotAPolicy:
        """A frozen copy of the model that refuses, with the reason, to act as a policy: a
        world model scores no action, so it is not exported or evaluated as one."""
        from horizon_plugins_worldmodel.networks import NotAPolicy

        network = copy.deepcopy(self.network).eval().requires_grad_(False)
        return NotAPolicy(network)

    def analyze(
        self, run: RunContext, problem: TrainingProblem, splits: list[TimelineTensors]
    ) -> StageReport:
        """The ``analysis`` stage: the MDP checks on the rows of ``splits`` (each with the
        state preprocessor's output), written into the run folder."""
        from horizon_plugins_worldmodel.analysis import run_analysis

        return run_analysis(self.config, run, problem, splits)
