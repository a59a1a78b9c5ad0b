"""The ``dqn`` trainer: discrete-action DQN from logged decisions.

Double Q, dueling, n-step and SARSA as in Horizon's DQN trainer, plus the two guards against
extrapolation error that matter most when learning from logs without exploring: conservative
Q-learning (``cql_alpha``) and discrete BCQ (``bcq_threshold``).

torch is imported inside the methods (and by the modules they import), so that listing the
plugin's options does not load it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine import (
    ActionType,
    EvaluationModels,
    HorizonError,
    OffersEvaluationModels,
    TrainingProblem,
)
from horizon_plugins_dqn.config import DqnConfig
from horizon_plugins_dqn.q_learning import EVAL_CHUNK_ROWS, QLearningTrainer, checkpoint_mismatch

if TYPE_CHECKING:
    import torch

    from horizon_engine import ForeachOptimizer, TimelineTensors
    from horizon_plugins_dqn.networks import DqnPolicy


class DqnTrainer(QLearningTrainer, OffersEvaluationModels):
    """Discrete-action DQN (double Q, dueling, n-step, SARSA, CQL, discrete BCQ)."""

    name = "dqn"
    Config: ClassVar[type[DqnConfig]] = DqnConfig
    config: DqnConfig

    def setup(self, problem: TrainingProblem) -> None:
        """Build the Q-network, its target copy, the optimizer and, for BCQ, the behaviour model.

        Weights are initialized from ``problem.seed`` alone (under a forked RNG), so a run's
        networks do not depend on what drew random numbers before.
        """
        import torch

        from horizon_plugins_dqn.networks import QNetwork, behaviour_model

        config = self.config
        if problem.action_type is not ActionType.DISCRETE:
            raise HorizonError(
                f"[trainer] kind = 'dqn' trains on discrete actions; the timeline's actions "
                f"are {problem.action_type.value}"
            )
        self.check_n_step(problem.n_step)
        unknown = sorted(set(config.reward_boost) - set(problem.actions))
        if unknown:
            raise HorizonError(
                f"[trainer] reward_boost names action(s) {unknown} not among the timeline's "
                f"actions {problem.actions}"
            )
        self.actions = list(problem.actions)
        device = problem.device
        width, count = problem.state_width, len(problem.actions)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(problem.seed)
            self.q_network = QNetwork(
                width, count, config.layers, config.activations, config.dueling
            ).to(device)
            self.behaviour = (
                behaviour_model(width, count, config.layers, config.activations).to(device)
                if config.bcq_threshold > 0
                else None
            )
        self.preprocessor = problem.state_preprocessor
        self.finish_setup()
        self.synced_q_network = problem.data_parallel(self.q_network)
        self.behaviour_optimizer = (
            self.make_optimizer(self.behaviour) if self.behaviour is not None else None
        )
        self.synced_behaviour = (
            problem.data_parallel(self.behaviour) if self.behaviour is not None else None
        )
        self.reward_boost = torch.tensor(
            [config.reward_boost.get(action, 0.0) for action in self.actions], device=device
        )

    def optimizers(self) -> list[ForeachOptimizer]:
        return [self.optimizer, *filter(None, [self.behaviour_optimizer])]

    def boost(self, action: torch.Tensor) -> torch.Tensor | float:
        """``reward_boost`` of each row's logged ``action`` (0.0 without boosts)."""
        return self.reward_boost[action] if self.config.reward_boost else 0.0

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One update of the Q-network (and of the behaviour model), then the soft target update.

        Returns ``td_loss`` (the configured loss), the conservative penalty's metrics
        (``conservatism``) with ``cql_alpha > 0`` and ``bcq_loss`` (the behaviour model's
        cross-entropy) with ``bcq_threshold > 0``.
        """
        config = self.config
        state = self.state_input(batch, "state")
        metrics: dict[str, float] = {}
        if self.behaviour is not None:
            metrics["bcq_loss"] = self._train_behaviour(state, batch)
        target = self.td_target(batch)
        scores = self.synced_q_network(state)
        action = batch["action"]
        logged = scores.gather(1, action.unsqueeze(1)).squeeze(1)
        td_loss = self.td_loss(logged, target)
        loss = td_loss
        if config.cql_alpha > 0:
            penalty = self.conservatism(scores, logged, batch, metrics, keep_unweighted=False)
            if penalty is not None:
                loss = loss + penalty
        self.update(loss)
        metrics["td_loss"] = float(td_loss.detach())
        return metrics

    def _train_behaviour(self, state: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> float:
        """One cross-entropy step of the behaviour model on the logged actions."""
        import torch.nn.functional as F

        from horizon_engine import masked_scores

        logits = masked_scores(self.synced_behaviour(state), batch["possible_actions"])
        loss = F.cross_entropy(logits, batch["action"])
        self.behaviour_optimizer.zero_grad()
        loss.backward()
        self.behaviour_optimizer.step()
        return float(loss.detach())

    def td_target(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``reward + discount * value(next state)``, one step or n steps, without gradient."""
        import torch

        from horizon_plugins_dqn.networks import bcq_allowed
        from horizon_plugins_dqn.targets import max_next_value, sarsa_next_value

        config = self.config
        with torch.no_grad():
            ahead = self.bootstrap(batch, self.boost(batch["action"]))
            next_state = self.state_input(batch, ahead.state)
            target_scores = self.target_network(next_state)
            if not config.maxq_learning:
                value = sarsa_next_value(target_scores, batch["next_action"])
            else:
                possible = batch[f"{ahead.prefix}possible_next_actions"]
                if self.behaviour is not None:
                    logits = self.behaviour(next_state)
                    possible = bcq_allowed(logits, possible, config.bcq_threshold)
                online = self.q_network(next_state) if config.double_q else None
                value = max_next_value(target_scores, online, possible)
            return ahead.returns + ahead.discount * value

    def evaluate(self, data: TimelineTensors) -> dict[str, float]:
        """Metrics of the current model on the eval split; the model is not changed.

        - ``mc_loss``: mean squared difference between Q(s, logged action) and the logged
          discounted return to the end of the episode (discounted as training discounts,
          episodes found by ``targets.episode_ends``);
        - ``mean_q/<action>``: mean Q of the action over the rows where it is possible;
        - ``model_action_share/<action>``: share of rows where the greedy policy (the BCQ
          filter applied, impossible actions excluded) picks the action, beside
          ``logged_action_share/<action>``, the logging policy's share.
        """
        import torch

        from horizon_engine import masked_scores
        from horizon_plugins_dqn.networks import bcq_allowed

        config = self.config
        if len(data) == 0:
            return {}
        count = len(self.actions)
        q_sums = torch.zeros(count, dtype=torch.float64, device=data.reward.device)
        chosen = torch.zeros_like(q_sums)
        squared_error = torch.zeros((), dtype=torch.float64, device=data.reward.device)
        returns = self.logged_returns(data, data.reward + self.boost(data.action))
        with torch.no_grad():
            for start in range(0, len(data), EVAL_CHUNK_ROWS):
                rows = slice(start, start + EVAL_CHUNK_ROWS)
                state = self.preprocessor(data.state[rows], data.state_presence[rows])
                scores = self.q_network(state)
                possible = data.possible_actions[rows]
                logged = scores.gather(1, data.action[rows].unsqueeze(1)).squeeze(1)
                squared_error += ((logged.double() - returns[rows]) ** 2).sum()
                q_sums += (scores * possible).sum(dim=0).double()
                allowed = possible
                if self.behaviour is not None:
                    everything = torch.ones_like(scores)
                    logits = self.behaviour(state)
                    allowed = possible * bcq_allowed(logits, everything, config.bcq_threshold)
                best = masked_scores(scores, allowed).argmax(dim=1)
                chosen += torch.bincount(best, minlength=count).double()
        possible_rows = data.possible_actions.sum(dim=0).double()
        logged_rows = torch.bincount(data.action, minlength=count).double()
        metrics = {"mc_loss": float(squared_error) / len(data)}
        for index, action in enumerate(self.actions):
            if possible_rows[index] > 0:
                metrics[f"mean_q/{action}"] = float(q_sums[index] / possible_rows[index])
        for index, action in enumerate(self.actions):
            metrics[f"model_action_share/{action}"] = float(chosen[index]) / len(data)
            metrics[f"logged_action_share/{action}"] = float(logged_rows[index]) / len(data)
        return metrics

    def policy(self) -> DqnPolicy:
        """A frozen copy of the trained model in eval mode: raw ``(values, presence)`` ->
        Q scores ``[B, A]``, BCQ-filtered actions scored ``IMPOSSIBLE``, so that
        ``horizon_engine.policies`` (greedy, softmax) leave them out as training did. The
        preprocessor, fixed while training and without parameters, is shared rather than
        copied (``frozen_copy``: 0.9 against 0.4 ms a call on the example, every epoch)."""
        from horizon_plugins_dqn.networks import DqnPolicy, frozen_copy

        behaviour = None if self.behaviour is None else frozen_copy(self.behaviour)
        policy = DqnPolicy(
            self.preprocessor, frozen_copy(self.q_network), behaviour, self.config.bcq_threshold
        )
        policy.training = False
        return policy

    def evaluation_models(self) -> EvaluationModels:
        """``q_features``: a frozen copy of the Q-network's last hidden layer on raw states.
        The sequential CPE estimators fit the evaluated policy's Q linearly on it
        (``q_model = "network_fqe"``, their default where it is offered) rather than take
        the scores as Q: the scores of 20 epochs of conservative Q-learning from logs sit far
        below the greedy policy's value (mean Q about 13 on random CartPole, where the
        policy's discounted return is about 84)."""
        from horizon_plugins_dqn.networks import HiddenFeatures, frozen_copy

        # The preprocessor is fixed while training: shared, only the layers are copied.
        body = frozen_copy(self.q_network.body)
        return EvaluationModels(q_features=HiddenFeatures(self.preprocessor, body))

    def state_dict(self) -> dict[str, Any]:
        """The Q-learning state, plus the behaviour model and its optimizer with BCQ."""
        state = super().state_dict()
        if self.behaviour is not None:
            state["behaviour"] = self.behaviour.state_dict()
            state["behaviour_optimizer"] = self.behaviour_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output. A checkpoint without a behaviour model leaves a
        fresh one to learn (BCQ switched on at a warm start)."""
        super().load_state_dict(state)
        if self.behaviour is not None and "behaviour" in state:
            try:
                self.behaviour.load_state_dict(state["behaviour"])
            except RuntimeError as exc:
                raise checkpoint_mismatch(exc) from None
            self.behaviour_optimizer.load_state_dict(state["behaviour_optimizer"])
