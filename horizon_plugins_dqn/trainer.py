"""The ``dqn`` trainer: discrete-action DQN from logged decisions.

Double Q, dueling, n-step and SARSA as in Horizon's DQN trainer, plus the two guards against
extrapolation error that matter most when learning from logs without exploring: conservative
Q-learning (``cql_alpha``) and discrete BCQ (``bcq_threshold``).

torch is imported inside the methods (and by the modules they import), so that listing the
plugin's options does not load it.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.errors import HorizonError
from horizon_engine.schema import ActionType
from horizon_engine.training import TrainerBase, TrainingProblem
from horizon_plugins_dqn.config import DqnConfig

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import TimelineTensors
    from horizon_plugins_dqn.networks import DqnPolicy

EVAL_CHUNK_ROWS = 65_536
"""Rows scored at once during evaluation, bounding its memory on a large eval split."""


class DqnTrainer(TrainerBase):
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
        timeline_n_step = problem.extra.get("n_step")
        if config.n_step > 1 and timeline_n_step is not None and timeline_n_step != config.n_step:
            raise HorizonError(_n_step_mismatch(config.n_step, f"n_step = {timeline_n_step}"))
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
        self.target_network = copy.deepcopy(self.q_network).requires_grad_(False)
        self.preprocessor = problem.state_preprocessor
        self.optimizer = self._optimizer(self.q_network)
        self.behaviour_optimizer = (
            self._optimizer(self.behaviour) if self.behaviour is not None else None
        )
        self.reward_boost = torch.tensor(
            [config.reward_boost.get(action, 0.0) for action in self.actions], device=device
        )
        self.steps = 0

    def _optimizer(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        import torch

        kind = torch.optim.SGD if self.config.optimizer == "sgd" else torch.optim.Adam
        return kind(module.parameters(), lr=self.config.learning_rate, weight_decay=self.config.l2)

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One update of the Q-network (and of the behaviour model), then the soft target update.

        Returns ``td_loss`` (the configured loss), ``cql_loss`` (the regularizer before its
        weight) with ``cql_alpha > 0`` and ``bcq_loss`` (the behaviour model's cross-entropy)
        with ``bcq_threshold > 0``.
        """
        import torch
        import torch.nn.functional as F

        config = self.config
        state = self.preprocessor(batch["state"], batch["state_presence"])
        metrics: dict[str, float] = {}
        if self.behaviour is not None:
            metrics["bcq_loss"] = self._train_behaviour(state, batch)
        target = self.td_target(batch)
        scores = self.q_network(state)
        action = batch["action"]
        logged = scores.gather(1, action.unsqueeze(1)).squeeze(1)
        if config.loss == "mse":
            td_loss = F.mse_loss(logged, target)
        else:
            td_loss = F.smooth_l1_loss(logged, target)
        loss = td_loss
        if config.cql_alpha > 0:
            from horizon_plugins_dqn.targets import cql_regularizer

            cql_loss = cql_regularizer(scores, action, batch["possible_actions"])
            loss = loss + config.cql_alpha * cql_loss
            metrics["cql_loss"] = float(cql_loss.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            for target_parameter, parameter in zip(
                self.target_network.parameters(), self.q_network.parameters(), strict=True
            ):
                target_parameter.lerp_(parameter, config.target_update_rate)
        self.steps += 1
        if config.lr_decay < 1 and self.steps % config.lr_decay_steps == 0:
            self._set_learning_rate()
        metrics["td_loss"] = float(td_loss.detach())
        return metrics

    def _train_behaviour(self, state: torch.Tensor, batch: dict[str, torch.Tensor]) -> float:
        """One cross-entropy step of the behaviour model on the logged actions."""
        import torch.nn.functional as F

        from horizon_engine.policies import masked_scores

        logits = masked_scores(self.behaviour(state), batch["possible_actions"])
        loss = F.cross_entropy(logits, batch["action"])
        self.behaviour_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.behaviour_optimizer.step()
        return float(loss.detach())

    def td_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``reward + discount * value(next state)``, one step or n steps, without gradient."""
        import torch

        from horizon_plugins_dqn.networks import bcq_allowed
        from horizon_plugins_dqn.targets import (
            max_next_value,
            n_step_return,
            one_step_discount,
            sarsa_next_value,
        )

        config = self.config
        boost = self.reward_boost[batch["action"]]
        with torch.no_grad():
            if config.n_step > 1:
                rewards = self._n_step_window(batch)
                returns, discount = n_step_return(
                    rewards,
                    batch["next_n_time_diffs"],
                    batch["next_n_not_terminal"],
                    batch["next_n_length"],
                    config.gamma,
                    config.use_time_diff,
                )
                returns = returns + boost
                next_values, next_presence = batch["next_n_state"], batch["next_n_state_presence"]
                possible = batch["next_n_possible_next_actions"]
            else:
                returns = batch["reward"] + boost
                discount = one_step_discount(
                    batch["not_terminal"], batch["time_diff"], config.gamma, config.use_time_diff
                )
                next_values, next_presence = batch["next_state"], batch["next_state_presence"]
                possible = batch["possible_next_actions"]
            next_state = self.preprocessor(next_values, next_presence)
            target_scores = self.target_network(next_state)
            if not config.maxq_learning:
                value = sarsa_next_value(target_scores, batch["next_action"])
            else:
                if self.behaviour is not None:
                    logits = self.behaviour(next_state)
                    possible = bcq_allowed(logits, possible, config.bcq_threshold)
                online = self.q_network(next_state) if config.double_q else None
                value = max_next_value(target_scores, online, possible)
            return returns + discount * value

    def _n_step_window(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The batch's n-step rewards, checked against ``n_step``."""
        n_step = self.config.n_step
        if "next_n_rewards" not in batch:
            raise HorizonError(_n_step_mismatch(n_step, "no n-step arrays (n_step = 1)"))
        rewards = batch["next_n_rewards"]
        if rewards.shape[1] > n_step:
            raise HorizonError(
                _n_step_mismatch(n_step, f"windows of up to {rewards.shape[1]} steps")
            )
        return rewards

    def _set_learning_rate(self) -> None:
        """``learning_rate * lr_decay ** (steps // lr_decay_steps)``, for both optimizers."""
        decays = self.steps // self.config.lr_decay_steps
        rate = self.config.learning_rate * self.config.lr_decay**decays
        for optimizer in filter(None, (self.optimizer, self.behaviour_optimizer)):
            for group in optimizer.param_groups:
                group["lr"] = rate

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

        from horizon_engine.policies import masked_scores
        from horizon_plugins_dqn.networks import bcq_allowed
        from horizon_plugins_dqn.targets import discounted_returns, episode_ends

        config = self.config
        if len(data) == 0:
            return {}
        count = len(self.actions)
        q_sums = torch.zeros(count, dtype=torch.float64, device=data.reward.device)
        chosen = torch.zeros_like(q_sums)
        squared_error = torch.zeros((), dtype=torch.float64, device=data.reward.device)
        ends = episode_ends(
            data.not_terminal,
            data.state,
            data.state_presence,
            data.next_state,
            data.next_state_presence,
        )
        discount = (
            torch.pow(config.gamma, data.time_diff)
            if config.use_time_diff
            else torch.full_like(data.reward, config.gamma)
        )
        reward = data.reward + self.reward_boost[data.action]
        returns = discounted_returns(reward.double(), discount.double(), ends.double())
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
        ``horizon_engine.policies`` (greedy, softmax) leave them out as training did."""
        from horizon_plugins_dqn.networks import DqnPolicy

        live = DqnPolicy(
            self.preprocessor, self.q_network, self.behaviour, self.config.bcq_threshold
        )
        return copy.deepcopy(live).eval().requires_grad_(False)

    def state_dict(self) -> dict[str, Any]:
        """Networks, target network, optimizers and the update counter (which sets the
        decayed learning rate); the preprocessor is rebuilt from normalization.json."""
        state: dict[str, Any] = {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
        }
        if self.behaviour is not None:
            state["behaviour"] = self.behaviour.state_dict()
            state["behaviour_optimizer"] = self.behaviour_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output; a checkpoint of another architecture is an error
        naming the mismatch, not a shape traceback. A checkpoint without a behaviour model
        leaves a fresh one to learn (BCQ switched on at a warm start)."""
        try:
            self.q_network.load_state_dict(state["q_network"])
            self.target_network.load_state_dict(state["target_network"])
            if self.behaviour is not None and "behaviour" in state:
                self.behaviour.load_state_dict(state["behaviour"])
        except (KeyError, RuntimeError) as exc:
            raise HorizonError(
                "the checkpoint does not fit this [trainer] (layers, dueling, actions and "
                f"features must be the same as when it was written): {exc}"
            ) from None
        self.optimizer.load_state_dict(state["optimizer"])
        if self.behaviour_optimizer is not None and "behaviour_optimizer" in state:
            self.behaviour_optimizer.load_state_dict(state["behaviour_optimizer"])
        self.steps = int(state["steps"])
        self._set_learning_rate()


def _n_step_mismatch(n_step: int, found: str) -> str:
    return (
        f"[trainer] n_step = {n_step} needs a timeline built with [timeline] n_step = {n_step}, "
        f"which holds each row's next {n_step} steps and the state where they end; this "
        f"timeline has {found}. Rebuild the timeline (--stages timeline,normalization,train)"
    )
