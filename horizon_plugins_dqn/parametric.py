"""The ``parametric_dqn`` trainer: Q(s, a) on state and action features together.

For action spaces given as feature maps (a notification's attributes, a video's bitrate and
codec), where actions are too many or too changeable to be one output each, the network scores
the concatenated features of a state and one candidate action (Horizon paper, section 5.2).
Each row's possible next actions are its candidates: the max (Q-learning) or the logged next
action (SARSA) over them gives the target, with double Q, n-step returns and conservative
Q-learning as in ``dqn``.

torch is imported inside the methods, so that listing the plugin's options does not load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from horizon_engine import ActionType, HorizonError, TrainingProblem
from horizon_plugins_dqn.config import ParametricDqnConfig
from horizon_plugins_dqn.q_learning import EVAL_CHUNK_ROWS, QLearningTrainer

if TYPE_CHECKING:
    import torch

    from horizon_engine import TimelineTensors
    from horizon_plugins_dqn.networks import ParametricDqnPolicy


class ParametricDqnTrainer(QLearningTrainer):
    """Parametric-action DQN (double Q, dueling, n-step, SARSA, CQL over the candidates)."""

    name = "parametric_dqn"
    Config: ClassVar[type[ParametricDqnConfig]] = ParametricDqnConfig
    config: ParametricDqnConfig

    def setup(self, problem: TrainingProblem) -> None:
        """Build the Q-network on state and action features, its target copy and optimizer;
        weights come from ``problem.seed`` alone, as in ``dqn``."""
        import torch

        from horizon_plugins_dqn.networks import ParametricQNetwork

        config = self.config
        if problem.action_type is not ActionType.PARAMETRIC:
            raise HorizonError(
                f"[trainer] kind = 'parametric_dqn' trains on parametric actions (feature maps "
                f"with possible_actions); the timeline's actions are {problem.action_type.value}"
                + ("; use kind = 'dqn'" if problem.action_type is ActionType.DISCRETE else "")
            )
        if problem.action_preprocessor is None:
            raise HorizonError(
                "[trainer] kind = 'parametric_dqn' needs action features in normalization.json "
                "(action_features); rerun the normalization stage"
            )
        self.check_n_step(problem.n_step)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(problem.seed)
            self.q_network = ParametricQNetwork(
                problem.state_width,
                problem.action_width,
                config.layers,
                config.activations,
                config.dueling,
            ).to(problem.device)
        self.preprocessor = problem.state_preprocessor
        self.action_preprocessor = problem.action_preprocessor
        self.finish_setup()
        self.synced_q_network = problem.data_parallel(self.q_network)

    def candidates(self, batch: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """The preprocessed candidate actions ``[B, K, W]`` of ``name`` (e.g.
        ``possible_next_actions``), from the batch's ``*_features`` and ``*_presence``."""
        from horizon_plugins_dqn.networks import preprocess_candidates

        singular = name.replace("actions", "action")
        return preprocess_candidates(
            self.action_preprocessor, batch[f"{singular}_features"], batch[f"{singular}_presence"]
        )

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One update of the Q-network, then the soft target update. Returns ``td_loss`` and,
        with ``cql_alpha > 0``, the conservative penalty's metrics (``conservatism``)."""
        config = self.config
        state = self.state_input(batch, "state")
        action = self.action_preprocessor(batch["action"], batch["action_presence"])
        target = self.td_target(batch)
        logged = self.synced_q_network(state, action.unsqueeze(1)).squeeze(1)
        td_loss = self.td_loss(logged, target)
        loss = td_loss
        metrics: dict[str, float] = {}
        if config.cql_alpha > 0:
            scores = self.synced_q_network(state, self.candidates(batch, "possible_actions"))
            loss = loss + self.conservatism(scores, logged, batch, metrics)
        self.update(loss)
        metrics["td_loss"] = float(td_loss.detach())
        return metrics

    def td_target(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``reward + discount * value(next state)`` without gradient.

        The value is the max over the row's possible next actions (double Q: the online
        network picks, the target network values), or the logged next action's value (SARSA).
        A non-terminal row whose possible next actions were not recorded (an empty list)
        bootstraps from its logged next action, the one next action known; with n steps, such
        a row (its window ending in unrecorded candidates) takes its one-step target instead.
        """
        import torch

        with torch.no_grad():
            ahead = self.bootstrap(batch, 0.0)
            if not self.config.maxq_learning:
                return ahead.returns + ahead.discount * self._logged_next_value(batch)
            value, known = self._max_next_value(batch, ahead.state, ahead.prefix)
            if ahead.prefix:
                one_step = self._one_step_target(batch)
                return torch.where(known, ahead.returns + ahead.discount * value, one_step)
            value = torch.where(known, value, self._logged_next_value(batch))
            return ahead.returns + ahead.discount * value

    def _max_next_value(
        self, batch: Mapping[str, torch.Tensor], state_name: str, prefix: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Q-learning value over the candidates, and which rows had any candidate."""
        from horizon_plugins_dqn.targets import max_next_value

        name = f"{prefix}possible_next_actions"
        next_state = self.state_input(batch, state_name)
        candidates = self.candidates(batch, name)
        target_scores = self.target_network(next_state, candidates)
        online = self.q_network(next_state, candidates) if self.config.double_q else None
        possible = batch[name]
        return max_next_value(target_scores, online, possible), possible.sum(dim=1) > 0

    def _logged_next_value(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The target network's value of the logged next action in the next state (a terminal
        row's is multiplied by a discount of 0)."""
        next_state = self.state_input(batch, "next_state")
        action = self.action_preprocessor(batch["next_action"], batch["next_action_presence"])
        return self.target_network(next_state, action.unsqueeze(1)).squeeze(1)

    def _one_step_target(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        import torch

        from horizon_plugins_dqn.targets import one_step_discount

        config = self.config
        discount = one_step_discount(
            batch["not_terminal"], batch["time_diff"], config.gamma, config.use_time_diff
        )
        value, known = self._max_next_value(batch, "next_state", "")
        value = torch.where(known, value, self._logged_next_value(batch))
        return batch["reward"] + discount * value

    def evaluate(self, data: TimelineTensors) -> dict[str, float]:
        """Metrics of the current model on the eval split; the model is not changed.

        - ``mc_loss``: mean squared difference between Q(s, logged action) and the logged
          discounted return to the end of the episode;
        - ``mean_q``: mean Q over every row's possible actions;
        - ``model_action_feature/<id>`` beside ``logged_action_feature/<id>``: the mean value
          of each action feature in the greedy policy's choices and in the logged actions (0
          where absent). For one-hot action features these are the two action distributions.
        """
        import torch

        from horizon_engine import masked_scores

        if len(data) == 0:
            return {}
        device = data.reward.device
        width = len(data.action_feature_ids)
        squared_error = torch.zeros((), dtype=torch.float64, device=device)
        q_sum = torch.zeros((), dtype=torch.float64, device=device)
        chosen = torch.zeros(width, dtype=torch.float64, device=device)
        returns = self.logged_returns(data, data.reward)
        tensors = data.tensors()
        with torch.no_grad():
            for start in range(0, len(data), EVAL_CHUNK_ROWS):
                rows = {
                    name: tensor[start : start + EVAL_CHUNK_ROWS]
                    for name, tensor in tensors.items()
                }
                state = self.preprocessor(rows["state"], rows["state_presence"])
                action = self.action_preprocessor(rows["action"], rows["action_presence"])
                logged = self.q_network(state, action.unsqueeze(1)).squeeze(1)
                squared_error += (
                    (logged.double() - returns[start : start + len(logged)]) ** 2
                ).sum()
                scores = self.q_network(state, self.candidates(rows, "possible_actions"))
                possible = rows["possible_actions"]
                q_sum += (scores * possible).sum().double()
                best = masked_scores(scores, possible).argmax(dim=1)
                features = rows["possible_action_features"] * rows["possible_action_presence"]
                picked = features[torch.arange(len(best), device=device), best]
                has_candidates = (possible.sum(dim=1, keepdim=True) > 0).to(picked.dtype)
                chosen += (picked * has_candidates).sum(dim=0).double()
        candidates = float(data.possible_actions.sum())
        logged_features = (data.action * data.action_presence).double().sum(dim=0)
        metrics = {"mc_loss": float(squared_error) / len(data)}
        if candidates:
            metrics["mean_q"] = float(q_sum) / candidates
        for index, feature in enumerate(data.action_feature_ids):
            metrics[f"model_action_feature/{feature}"] = float(chosen[index]) / len(data)
            metrics[f"logged_action_feature/{feature}"] = float(logged_features[index]) / len(data)
        return metrics

    def policy(self) -> ParametricDqnPolicy:
        """A frozen copy of the trained model in eval mode: raw state and candidate action
        features -> Q scores ``[B, K]``."""
        from horizon_plugins_dqn.networks import ParametricDqnPolicy, frozen_copy

        policy = ParametricDqnPolicy(
            self.preprocessor, self.action_preprocessor, frozen_copy(self.q_network)
        )
        policy.training = False
        return policy
