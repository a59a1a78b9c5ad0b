"""The ``small_q`` trainer: one-step Q-learning of discrete actions with a small network.

Small but real: a network of one hidden layer (or a linear one) fits
``reward + discount ** time_diff * max Q_target(next state)`` over the possible next actions,
and a target copy follows it slowly. It reads only the batch schema's one-step tensors, so it
trains the same on the timeline in ``horizon run`` and on the replay buffer in
``horizon gym train``. torch is imported inside the methods (and by ``q_network``, which they
import), so ``horizon plugins`` lists the trainer without loading torch.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from pydantic import Field

from horizon_engine import (
    ActionType,
    HorizonError,
    TrainerBase,
    TrainerConfig,
    TrainingProblem,
    masked_scores,
)

if TYPE_CHECKING:
    import torch

    from horizon_engine import TimelineTensors


class SmallQConfig(TrainerConfig):
    """Options of ``[trainer] kind = "small_q"``, besides every trainer's."""

    hidden: int = Field(32, ge=0)
    """Units of the one hidden layer (ReLU); 0 makes the Q-function linear in the features."""
    learning_rate: float = Field(1e-3, gt=0)
    """Adam's step size."""
    discount: float = Field(0.9, ge=0, le=1)
    """What a reward one step later is worth now."""
    target_update_rate: float = Field(0.05, gt=0, le=1)
    """How far the target network moves towards the trained one after each update."""


class SmallQ(TrainerBase):
    """One-step Q-learning of discrete actions with a one-hidden-layer network."""

    name = "small_q"
    Config = SmallQConfig
    config: SmallQConfig

    def setup(self, problem: TrainingProblem) -> None:
        """Build the network from the problem's state width and actions, its target copy and
        the optimizer; the weights depend on ``problem.seed`` alone."""
        import torch

        from horizon_plugin_constant.q_network import q_network

        if problem.action_type is not ActionType.DISCRETE:
            raise HorizonError(
                "[trainer] kind = 'small_q' learns discrete actions; the timeline's are "
                f"{problem.action_type.value}"
            )
        self.preprocessor = problem.state_preprocessor
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(problem.seed)
            self.network = q_network(
                problem.state_width, len(problem.actions), self.config.hidden
            ).to(problem.device)
        self.target = copy.deepcopy(self.network).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=self.config.learning_rate)
        self.updates = 0

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One gradient step on the squared TD error, then the target's soft update."""
        import torch

        loss = self._td_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            rate = self.config.target_update_rate
            for target, trained in zip(
                self.target.parameters(), self.network.parameters(), strict=True
            ):
                target.lerp_(trained, rate)
        self.updates += 1
        return {"td_loss": float(loss.detach())}

    def evaluate(self, data: TimelineTensors) -> dict[str, float]:
        """The TD loss on the eval split, the model unchanged."""
        import torch

        if len(data) == 0:
            return {}
        with torch.no_grad():
            return {"td_loss": float(self._td_loss(data.tensors()))}

    def _td_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean squared difference between Q(state, logged action) and the one-step target."""
        import torch

        with torch.no_grad():
            next_state = self.preprocessor(batch["next_state"], batch["next_state_presence"])
            possible = masked_scores(self.target(next_state), batch["possible_next_actions"])
            ahead = torch.where(batch["not_terminal"] > 0, possible.max(dim=1).values, 0.0)
            discount = self.config.discount ** batch["time_diff"]
            target = batch["reward"] + discount * ahead
        state = self.preprocessor(batch["state"], batch["state_presence"])
        logged = self.network(state).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
        return torch.nn.functional.mse_loss(logged, target)

    def state_dict(self) -> dict[str, Any]:
        """Both networks, the optimizer and the update count: tensors and plain data only, as
        checkpoints are loaded with ``weights_only``."""
        return {
            "network": self.network.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]

    def policy(self) -> torch.nn.Module:
        """A frozen copy of the trained network behind the state preprocessor, in eval mode:
        training on never changes a policy already handed out."""
        from horizon_plugin_constant.q_network import QPolicy

        live = QPolicy(self.preprocessor, self.network)
        return copy.deepcopy(live).eval().requires_grad_(False)
