"""What the Q-learning trainers share: optimizers, the update and its soft target step,
learning-rate decay, the bootstrap of one-step and n-step targets, checkpoints, and the logged
returns the eval split's ``mc_loss`` compares Q with.

``dqn`` and ``parametric_dqn`` differ only in how a network scores actions (one output per
named action, or one per candidate action's features); everything else is here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine import ComponentConfig, Discounts, HorizonError, TrainerBase
from horizon_plugins_dqn.config import QLearningConfig

if TYPE_CHECKING:
    import torch

    from horizon_engine import ForeachOptimizer, TimelineTensors

EVAL_CHUNK_ROWS = 65_536
"""Rows scored at once during evaluation, bounding its memory on a large eval split."""


@dataclass
class Bootstrap:
    """The parts of a TD target that do not depend on the network: the (discounted) rewards up
    to the state the target bootstraps from, that state's discount, and the batch's names of
    that state's tensors (``next_state`` one step ahead, ``next_n_state`` n steps ahead)."""

    returns: torch.Tensor
    discount: torch.Tensor
    prefix: str
    """``""`` for one step, ``"next_n_"`` for n steps: the possible next actions are
    ``{prefix}possible_next_actions``."""
    state: str
    """``next_state`` or ``next_n_state``; its presence is ``{state}_presence``."""


class QLearningTrainer(TrainerBase, Discounts):
    """The shared half of a Q-learning trainer. A subclass builds ``q_network`` and
    ``preprocessor`` in ``setup``, then calls ``finish_setup`` for the target network and the
    optimizer."""

    Config: ClassVar[type[QLearningConfig]] = QLearningConfig
    config: QLearningConfig

    def finish_setup(self) -> None:
        """The target network (a frozen copy of ``q_network``), the optimizer, and the
        parameter lists the soft target update reads every step."""
        import copy

        self.target_network = copy.deepcopy(self.q_network).requires_grad_(False)
        self.optimizer = self.make_optimizer(self.q_network)
        self._target_parameters = list(self.target_network.parameters())
        self._online_parameters = list(self.q_network.parameters())
        self.steps = 0

    def make_optimizer(self, module: torch.nn.Module) -> ForeachOptimizer:
        """Adam (or SGD) over ``module``'s parameters, computed as ``torch.optim``'s foreach
        implementation computes it (``horizon_engine.ForeachAdam``): one call per step for
        all parameters, on the CPU too (torch's default there is a loop over them), and no
        ``torch._dynamo`` import before the first update."""
        from horizon_engine import ForeachAdam, ForeachSgd

        kind = ForeachSgd if self.config.optimizer == "sgd" else ForeachAdam
        return kind(module.parameters(), lr=self.config.learning_rate, weight_decay=self.config.l2)

    def optimizers(self) -> list[ForeachOptimizer]:
        """Every optimizer whose learning rate decays (a subclass adds its extra models')."""
        return [self.optimizer]

    def state_input(self, batch: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """The network's input for the batch's state ``name`` (``state``, ``next_state`` or
        ``next_n_state``): the driver's ``<name>_preprocessed`` when the batch has it (computed
        once for the split), else the preprocessor run on ``<name>`` and its presence."""
        preprocessed = f"{name}_preprocessed"
        if preprocessed in batch:
            return batch[preprocessed]
        return self.preprocessor(batch[name], batch[f"{name}_presence"])

    @classmethod
    def data_problems(cls, config: ComponentConfig, n_step: int, origin: str) -> dict[str, str]:
        """``n_step > 1`` must be the data's own window, found before the run starts."""
        wanted = config.n_step
        if wanted > 1 and wanted != n_step:
            return {
                "n_step": f"[trainer] n_step = {wanted}, but {origin} builds n_step = {n_step}; "
                "set both to the same value (or leave the trainer's out: it follows the timeline)"
            }
        return {}

    def check_n_step(self, data_n_step: int | None) -> None:
        """``n_step > 1`` needs data with the same n-step window (``TrainingProblem.n_step``;
        None when the problem does not say, and the batches tell)."""
        n_step = self.config.n_step
        if n_step > 1 and data_n_step is not None and data_n_step != n_step:
            raise HorizonError(n_step_mismatch(n_step, f"n_step = {data_n_step}"))
        self.data_n_step = data_n_step

    def applied_options(self) -> dict[str, Any]:
        """The n-step return that applies: ``n_step``, or with 0 the data's window (one step
        for SARSA or data without windows)."""
        config = self.config
        window = self.data_n_step or 1
        return {"n_step": config.n_step or (window if config.maxq_learning else 1)}

    def td_loss(self, logged: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        if self.config.loss == "mse":
            return F.mse_loss(logged, target)
        return F.smooth_l1_loss(logged, target)

    def conservatism(
        self,
        scores: torch.Tensor,
        logged: torch.Tensor,
        batch: Mapping[str, torch.Tensor],
        metrics: dict[str, float],
        keep_unweighted: bool = True,
    ) -> torch.Tensor | None:
        """CQL's penalty of ``scores`` (Q of every possible action) against the ``logged``
        action's Q, weighted by ``cql_alpha``, less as the batch's logs cover the actions more
        (``targets.logged_coverage``, ``cql_covered``) unless ``cql_weighting = "constant"``;
        records ``cql_loss`` (the penalty before its weight), ``logged_coverage`` and
        ``cql_weight`` in ``metrics``.

        Without ``keep_unweighted``, a weight of 0 (logs that cover the actions evenly, as
        random play's) returns None and computes the penalty for its metric alone, without a
        gradient: adding ``0 * penalty`` to the loss changes no gradient by a bit, and its
        backward pass was about a tenth of the example's update. Keep it where the scores
        come from a forward of their own that must reach the backward (a data-parallel
        module's)."""
        import torch

        from horizon_plugins_dqn.targets import cql_gaps, logged_coverage

        config = self.config
        possible = batch["possible_actions"]
        # A batch built without propensities (by hand, by a host of its own) has a logger
        # believed deterministic: plain CQL's assumption.
        if "action_probability" in batch:
            propensity = batch["action_probability"]
        else:
            propensity = torch.ones(len(logged), dtype=logged.dtype, device=logged.device)
        coverage = float(logged_coverage(propensity, possible))
        weight = config.cql_alpha
        if config.cql_weighting == "coverage":
            weight *= max(0.0, 1.0 - coverage / config.cql_covered)
        weighted = keep_unweighted or weight > 0
        with torch.set_grad_enabled(weighted and torch.is_grad_enabled()):
            penalty = cql_gaps(scores, logged, possible).mean()
        metrics["cql_loss"] = float(penalty.detach())
        metrics["logged_coverage"] = coverage
        metrics["cql_weight"] = weight
        return weight * penalty if weighted else None

    def update(self, loss: torch.Tensor) -> None:
        """One optimizer step on ``loss``, the soft target update, and the learning-rate decay."""
        import torch

        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(
                self._target_parameters, self._online_parameters, self.config.target_update_rate
            )
        self.steps += 1
        if self.config.lr_decay < 1 and self.steps % self.config.lr_decay_steps == 0:
            self.set_learning_rate()

    def set_learning_rate(self) -> None:
        """``learning_rate * lr_decay ** (steps // lr_decay_steps)``, for every optimizer."""
        decays = self.steps // self.config.lr_decay_steps
        rate = self.config.learning_rate * self.config.lr_decay**decays
        for optimizer in self.optimizers():
            for group in optimizer.param_groups:
                group["lr"] = rate

    def bootstrap(
        self, batch: Mapping[str, torch.Tensor], boost: torch.Tensor | float
    ) -> Bootstrap:
        """The reward part of the target (plus ``boost``) and where it bootstraps from.

        With ``n_step = 0`` the data decides: the timeline's n-step windows where it has them
        (Q-learning only: SARSA needs the action logged where a window ends, which the
        timeline does not keep), one step otherwise.
        """
        from horizon_plugins_dqn.targets import n_step_return, one_step_discount

        config = self.config
        windows = "next_n_rewards" in batch
        follows = config.n_step == 0 and windows and config.maxq_learning
        if config.n_step == 1 or (config.n_step == 0 and not follows):
            time_diff = batch["time_diff"] if config.use_time_diff else None
            discount = one_step_discount(
                batch["not_terminal"], time_diff, config.gamma, config.use_time_diff
            )
            return Bootstrap(with_boost(batch["reward"], boost), discount, "", "next_state")
        if not windows:
            raise HorizonError(n_step_mismatch(config.n_step, "no n-step arrays (n_step = 1)"))
        rewards = batch["next_n_rewards"]
        if not follows and rewards.shape[1] > config.n_step:
            raise HorizonError(
                n_step_mismatch(config.n_step, f"windows of up to {rewards.shape[1]} steps")
            )
        returns, discount = n_step_return(
            rewards,
            batch["next_n_time_diffs"] if config.use_time_diff else None,
            batch["next_n_not_terminal"],
            batch["next_n_length"],
            config.gamma,
            config.use_time_diff,
        )
        return Bootstrap(with_boost(returns, boost), discount, "next_n_", "next_n_state")

    def logged_returns(self, data: TimelineTensors, reward: torch.Tensor) -> torch.Tensor:
        """Each eval row's discounted return to the end of its episode (float64), discounted
        as training discounts, for ``mc_loss``."""
        import torch

        from horizon_plugins_dqn.targets import discounted_returns, episode_ends

        config = self.config
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
        return discounted_returns(reward.double(), discount.double(), ends.double())

    def discount(self) -> float:
        """``gamma``: the sequential estimators discount with it unless told otherwise, and
        take the policy's scores (this Q-network's values under it) as their Q."""
        return self.config.gamma

    def state_dict(self) -> dict[str, Any]:
        """Networks, target network, optimizer and the update counter (which sets the decayed
        learning rate); the preprocessors are rebuilt from normalization.json."""
        return {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output; a checkpoint of another architecture is an error
        naming the mismatch, not a shape traceback."""
        try:
            self.q_network.load_state_dict(state["q_network"])
            self.target_network.load_state_dict(state["target_network"])
        except (KeyError, RuntimeError) as exc:
            raise checkpoint_mismatch(exc) from None
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.set_learning_rate()


def checkpoint_mismatch(exc: Exception) -> HorizonError:
    return HorizonError(
        "the checkpoint does not fit this [trainer] (layers, dueling, actions and "
        f"features must be the same as when it was written): {exc}"
    )


def with_boost(returns: torch.Tensor, boost: torch.Tensor | float) -> torch.Tensor:
    """``returns + boost``; ``returns`` itself when ``boost`` is the float 0.0 (no
    ``reward_boost``): the addition would only copy the batch's returns every update."""
    if isinstance(boost, float) and boost == 0.0:
        return returns
    return returns + boost


def n_step_mismatch(n_step: int, found: str) -> str:
    return (
        f"[trainer] n_step = {n_step} needs a timeline built with [timeline] n_step = {n_step} "
        f"(online: a replay buffer with [gym] n_step = {n_step}), which holds each row's next "
        f"{n_step} steps and the state where they end; this "
        f"timeline has {found}. Rebuild the timeline (--stages timeline,normalization,train)"
    )
