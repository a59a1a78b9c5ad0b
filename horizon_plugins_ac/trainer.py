"""The actor-critic trainers: ``sac``, ``td3`` and ``ddpg`` for continuous actions.

One base (``ActorCriticTrainer``) holds what they share: the critics and their targets, the
one-step or n-step TD target, the conservative critic penalty, the behaviour-cloning term of the
actor's loss, soft target updates, evaluation, checkpoints and the policy modules. Each trainer
says how its actor acts (deterministic with target smoothing, or a squashed Gaussian) and how
its next-state value is computed.

torch is imported inside the methods (and by the modules they import), so that listing the
plugin's options does not load it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine import (
    ActionType,
    ComponentConfig,
    Discounts,
    ExploresOnline,
    HorizonError,
    InvertiblePreprocessing,
    TrainerBase,
    TrainingProblem,
)
from horizon_plugins_ac.config import (
    ActorCriticConfig,
    DdpgConfig,
    DeterministicActorConfig,
    SacConfig,
    Td3Config,
)

if TYPE_CHECKING:
    import torch

    from horizon_engine import ForeachAdam, TimelineTensors
    from horizon_plugins_ac.networks import NoiseState

EVAL_CHUNK_ROWS = 65_536
"""Rows evaluated at once on the eval split, bounding its memory."""


@contextmanager
def parameters_frozen(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s parameters without gradients for the duration: the actor's loss passes
    through the critics, and their weights' gradients there would be computed only to be
    zeroed before the critics' next step. Without them ddpg's train stage on Horizon's
    Pendulum rows (3,000 updates, one thread) took 32.4-33.8 s rather than 35.3-35.5 s. The
    actor's gradients, which flow through the critics' inputs, are the same to the bit: so are
    the checkpoints of td3, sac and ddpg after 4 epochs."""
    frozen = [parameter for parameter in module.parameters() if parameter.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)


class ActorCriticTrainer(TrainerBase, Discounts, ExploresOnline):
    """What ``sac``, ``td3`` and ``ddpg`` share. A subclass builds ``actor`` (``build_actor``),
    says how many critics it has, and implements ``next_value``, ``actor_loss`` and
    ``policy``."""

    Config: ClassVar[type[ActorCriticConfig]] = ActorCriticConfig
    config: ActorCriticConfig
    critic_count: ClassVar[int] = 2
    target_actor: ClassVar[bool] = True
    """Whether the trainer keeps a target copy of the actor (TD3, DDPG; SAC does not)."""

    def setup(self, problem: TrainingProblem) -> None:
        """Build the actor, the critics, their target copies and the optimizers. The weights
        depend on ``problem.seed`` alone (a forked RNG)."""
        import torch

        from horizon_engine import ForeachAdam
        from horizon_plugins_ac.networks import Critic

        config = self.config
        if problem.action_type is not ActionType.CONTINUOUS:
            raise HorizonError(
                f"[trainer] kind = {self.name!r} learns continuous actions; the timeline's "
                f"actions are {problem.action_type.value}"
            )
        action_preprocessor = problem.action_preprocessor
        if not isinstance(action_preprocessor, InvertiblePreprocessing):
            raise HorizonError(
                f"[trainer] kind = {self.name!r} needs the action features normalized as "
                "continuous_action (the default for continuous actions), which maps them to "
                "(-1, 1) and back; check normalization.json's action_features"
            )
        self.check_n_step(problem.n_step)
        unset = 0.0 if problem.online else config.LOGGED_BC_WEIGHT
        self.bc_weight = unset if config.bc_weight == "auto" else config.bc_weight
        self.preprocessor = problem.state_preprocessor
        self.action_preprocessor = action_preprocessor
        self.action_width = problem.action_width
        width, actions = problem.state_width, problem.action_width
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(problem.seed)
            self.actor = self.build_actor(width, actions).to(problem.device)
            self.critics = torch.nn.ModuleList(
                Critic(width, actions, config.layers) for _ in range(self.critic_count)
            ).to(problem.device)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_target = (
            copy.deepcopy(self.actor).requires_grad_(False) if self.target_actor else None
        )
        self.actor_optimizer = ForeachAdam(self.actor.parameters(), lr=config.actor_learning_rate)
        self.critic_optimizer = ForeachAdam(
            self.critics.parameters(), lr=config.critic_learning_rate
        )
        self._critic_pairs = (
            list(self.target_critics.parameters()),
            list(self.critics.parameters()),
        )
        self._actor_pairs = (
            (list(self.actor_target.parameters()), list(self.actor.parameters()))
            if self.actor_target is not None
            else None
        )
        self.steps = 0
        self.synced_critics = [problem.data_parallel(critic) for critic in self.critics]
        """The critics as their loss forwards them (``TrainingProblem.data_parallel``)."""
        self.finish_setup(problem)

    def build_actor(self, state_width: int, action_width: int) -> torch.nn.Module:
        raise NotImplementedError

    def finish_setup(self, problem: TrainingProblem) -> None:
        """What a trainer builds beside the networks (SAC: the temperature)."""

    # --- the data ------------------------------------------------------------------------

    @classmethod
    def data_problems(cls, config: ComponentConfig, n_step: int, origin: str) -> dict[str, str]:
        """``n_step > 1`` must be the data's own window, found before the run starts."""
        wanted = getattr(config, "n_step", 1)
        if wanted > 1 and wanted != n_step:
            return {
                "n_step": f"[trainer] n_step = {wanted}, but {origin} builds n_step = {n_step}; "
                "set both to the same value (or set the trainer's to 0: it follows the data)"
            }
        return {}

    def check_n_step(self, data_n_step: int | None) -> None:
        n_step = self.config.n_step
        if n_step > 1 and data_n_step is not None and data_n_step != n_step:
            raise HorizonError(
                f"[trainer] n_step = {n_step} needs data with n-step windows of {n_step} "
                f"([timeline] n_step, or [gym] n_step online); this data has n_step = "
                f"{data_n_step}"
            )

    def state_input(self, batch: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """The networks' input for the batch's state ``name``: the driver's
        ``<name>_preprocessed`` when the batch has it, else the preprocessor's output."""
        preprocessed = f"{name}_preprocessed"
        if preprocessed in batch:
            return batch[preprocessed]
        return self.preprocessor(batch[name], batch[f"{name}_presence"])

    def logged_action(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The logged action normalized to (-1, 1) ``[B, D]``."""
        return self.action_preprocessor(batch["action"], batch["action_presence"])

    def bootstrap(
        self, batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, str]:
        """``(returns, discount, state)``: the rewards up to the state the target bootstraps
        from, that state's discount (0 past a terminal row), and its name in the batch."""
        import torch

        config = self.config
        windows = "next_n_rewards" in batch
        if config.n_step == 1 or (config.n_step == 0 and not windows):
            return batch["reward"], config.gamma * batch["not_terminal"], "next_state"
        if not windows:
            raise HorizonError(
                f"[trainer] n_step = {config.n_step} needs n-step windows in the data; these "
                "batches have none (n_step = 1)"
            )
        rewards, lengths = batch["next_n_rewards"], batch["next_n_length"]
        steps = torch.arange(rewards.shape[1], device=rewards.device)
        inside = (steps.unsqueeze(0) < lengths.unsqueeze(1)).to(rewards.dtype)
        returns = (inside * torch.pow(config.gamma, steps.to(rewards.dtype)) * rewards).sum(1)
        last = batch["next_n_not_terminal"].gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
        discount = torch.pow(config.gamma, lengths.to(rewards.dtype)) * last
        return returns, discount, "next_n_state"

    # --- the update ----------------------------------------------------------------------

    def next_value(self, next_state: torch.Tensor) -> torch.Tensor:
        """The target networks' value ``[B]`` of the next state (no gradient)."""
        raise NotImplementedError

    def actor_loss(
        self, state: torch.Tensor, logged: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def sampled_actions(self, state: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` of the actor's own actions per state ``[count, B, D]`` and their
        log-densities ``[count, B]``, for the conservative penalty."""
        raise NotImplementedError

    def actor_updates_now(self) -> bool:
        """Whether this step updates the actor (TD3 delays it)."""
        return True

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One critic update, then (when due) one actor update and the soft target update.

        Returns ``critic_loss`` (the TD loss, summed over the critics), ``mean_q`` (the first
        critic on the logged actions), ``cql_loss`` with ``cql_alpha > 0`` and, on steps that
        update the actor, ``actor_loss`` (plus ``bc_loss`` and, for SAC, ``alpha`` and
        ``entropy``)."""
        import torch

        config = self.config
        state = self.state_input(batch, "state")
        logged = self.logged_action(batch)
        returns, discount, ahead = self.bootstrap(batch)
        with torch.no_grad():
            target = returns + discount * self.next_value(self.state_input(batch, ahead))
        values = [critic(state, logged) for critic in self.synced_critics]
        td_loss = sum(torch.nn.functional.mse_loss(q, target) for q in values)
        loss = td_loss
        metrics = {
            "critic_loss": float(td_loss.detach()),
            "mean_q": float(values[0].detach().mean()),
        }
        if config.cql_alpha > 0:
            cql_loss = self.cql_penalty(state, values)
            loss = loss + config.cql_alpha * cql_loss
            metrics["cql_loss"] = float(cql_loss.detach())
        self.critic_optimizer.zero_grad()
        loss.backward()
        self.critic_optimizer.step()
        if self.actor_updates_now():
            with parameters_frozen(self.critics):
                actor_loss, actor_metrics = self.actor_loss(state, logged)
                self.actor_optimizer.zero_grad()
                actor_loss.backward()
            self.actor_optimizer.step()
            metrics.update(actor_metrics)
            metrics["actor_loss"] = float(actor_loss.detach())
            self.update_targets(actor=True)
        else:
            self.update_targets(actor=False)
        self.steps += 1
        return metrics

    def applied_options(self) -> dict[str, Any]:
        """``bc_weight`` as it applies (an unset one resolved for logs or online play)."""
        return {"bc_weight": self.bc_weight}

    def update_targets(self, actor: bool) -> None:
        """Soft update of the critics' targets (and of the actor's, when ``actor``)."""
        import torch

        rate = self.config.target_update_rate
        with torch.no_grad():
            torch._foreach_lerp_(*self._critic_pairs, rate)
            if actor and self._actor_pairs is not None:
                torch._foreach_lerp_(*self._actor_pairs, rate)

    def policy_objective(
        self, q: torch.Tensor, action: torch.Tensor, logged: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The actor's loss from ``q`` (the critic's value of the actor's ``action``, minus
        SAC's entropy cost): ``-mean(q)``, or with ``bc_weight`` TD3+BC's
        ``-mean(q) / mean|q| + bc_weight * mean((action - logged)^2)``."""
        bc_weight = self.bc_weight
        if bc_weight == 0:
            return -q.mean(), {}
        bc_loss = ((action - logged) ** 2).mean()
        scale = q.abs().mean().detach().clamp(min=1e-6)
        return -q.mean() / scale + bc_weight * bc_loss, {"bc_loss": float(bc_loss.detach())}

    def cql_penalty(self, state: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
        """CQL(H): for each critic, ``logsumexp`` over sampled actions of ``Q(s, a) - log
        density(a)`` (uniform actions on (-1, 1)^D and the actor's own) minus Q of the logged
        action, averaged over the batch and summed over the critics."""
        import math

        import torch

        count, (rows, width) = self.config.cql_samples, state.shape
        d = self.action_width
        with torch.no_grad():
            uniform = torch.rand(count, rows, d, device=state.device) * 2.0 - 1.0
            uniform_log_density = torch.full((count, rows), -d * math.log(2.0), device=state.device)
            own, own_log_density = self.sampled_actions(state, count)
        actions = torch.cat([uniform, own]).reshape(-1, d)
        log_density = torch.cat([uniform_log_density, own_log_density])
        states = state.unsqueeze(0).expand(2 * count, rows, width).reshape(-1, width)
        penalty = state.new_zeros(())
        for critic, logged_q in zip(self.synced_critics, values, strict=True):
            sampled = critic(states, actions).reshape(2 * count, rows)
            penalty = penalty + (torch.logsumexp(sampled - log_density, dim=0) - logged_q).mean()
        return penalty

    # --- evaluation, checkpoints, policies -----------------------------------------------

    def evaluate(self, data: TimelineTensors) -> dict[str, float]:
        """On the eval split, the model unchanged: ``critic_loss`` (the TD loss of the first
        critic against the same target as training), ``logged_q`` (its mean on the logged
        actions), ``policy_q`` (on the policy's own action) and ``action_distance`` (the root
        mean squared distance between the policy's and the logged actions, normalized units:
        how far the policy strays from the logs)."""
        import torch

        if len(data) == 0:
            return {}
        tensors = data.tensors()
        sums = dict.fromkeys(("critic_loss", "logged_q", "policy_q", "action_distance"), 0.0)
        with torch.no_grad():
            for start in range(0, len(data), EVAL_CHUNK_ROWS):
                batch = {
                    name: value[start : start + EVAL_CHUNK_ROWS] for name, value in tensors.items()
                }
                state = self.state_input(batch, "state")
                logged = self.logged_action(batch)
                returns, discount, ahead = self.bootstrap(batch)
                target = returns + discount * self.next_value(self.state_input(batch, ahead))
                q = self.critics[0](state, logged)
                own = self.greedy_action(state)
                sums["critic_loss"] += float(((q - target) ** 2).sum())
                sums["logged_q"] += float(q.sum())
                sums["policy_q"] += float(self.critics[0](state, own).sum())
                sums["action_distance"] += float(((own - logged) ** 2).mean(dim=1).sum())
        metrics = {name: total / len(data) for name, total in sums.items()}
        metrics["action_distance"] **= 0.5
        return metrics

    def greedy_action(self, state: torch.Tensor) -> torch.Tensor:
        """The policy's deterministic action, normalized ``[B, D]``."""
        return self.actor(state)

    def discount(self) -> float:
        """``gamma``, which the sequential estimators discount with unless told otherwise."""
        return self.config.gamma

    def state_dict(self) -> dict[str, Any]:
        """Actor, critics, their targets, both optimizers and the update count; the
        preprocessors are rebuilt from normalization.json."""
        state = {
            "actor": self.actor.state_dict(),
            "critics": self.critics.state_dict(),
            "target_critics": self.target_critics.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "steps": self.steps,
        }
        if self.actor_target is not None:
            state["actor_target"] = self.actor_target.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output; a checkpoint of another architecture is an error
        naming the mismatch, not a shape traceback."""
        try:
            self.actor.load_state_dict(state["actor"])
            self.critics.load_state_dict(state["critics"])
            self.target_critics.load_state_dict(state["target_critics"])
            if self.actor_target is not None:
                self.actor_target.load_state_dict(state["actor_target"])
            self.actor_optimizer.load_state_dict(state["actor_optimizer"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise HorizonError(
                f"the checkpoint does not fit this [trainer] kind = {self.name!r} (layers, "
                f"state and action features must be the same as when it was written): {exc}"
            ) from None
        self.steps = int(state["steps"])

    def frozen(self, module: torch.nn.Module) -> torch.nn.Module:
        """A copy of ``module`` in eval mode without gradients: training on never changes a
        policy already handed out."""
        return copy.deepcopy(module).eval().requires_grad_(False)


class DeterministicActorCritic(ActorCriticTrainer):
    """``td3`` and ``ddpg``: a deterministic actor, explored online with added noise."""

    config: DeterministicActorConfig
    smoothing_noise: ClassVar[float] = 0.0

    def finish_setup(self, problem: TrainingProblem) -> None:
        """The actor as its loss forwards it (``data_parallel``); no Ornstein-Uhlenbeck process
        yet: the first exploration module starts it."""
        self.synced_actor = problem.data_parallel(self.actor)
        self.noise_state: NoiseState | None = None

    def state_dict(self) -> dict[str, Any]:
        """The shared state plus the Ornstein-Uhlenbeck process's current value while one runs:
        ``horizon gym train --resume`` continues mid-episode with the same noise."""
        state = super().state_dict()
        if self.noise_state is not None and self.noise_state.value is not None:
            state["exploration_noise"] = self.noise_state.value.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The shared state, and the process's value when the checkpoint holds one."""
        from horizon_plugins_ac.networks import NoiseState

        super().load_state_dict(state)
        noise = state.get("exploration_noise")
        if noise is not None:
            self.noise_state = self.noise_state or NoiseState()
            self.noise_state.value = noise.to(next(self.actor.parameters()).device)

    def build_actor(self, state_width: int, action_width: int) -> torch.nn.Module:
        from horizon_plugins_ac.networks import DeterministicActor

        return DeterministicActor(state_width, action_width, self.config.layers)

    def next_action(self, next_state: torch.Tensor) -> torch.Tensor:
        """The target actor's next action (TD3 smooths it with clipped noise)."""
        return self.actor_target(next_state)

    def next_value(self, next_state: torch.Tensor) -> torch.Tensor:
        import torch

        action = self.next_action(next_state)
        values = [critic(next_state, action) for critic in self.target_critics]
        return values[0] if len(values) == 1 else torch.minimum(*values)

    def actor_loss(
        self, state: torch.Tensor, logged: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        action = self.synced_actor(state)
        return self.policy_objective(self.critics[0](state, action), action, logged)

    def sampled_actions(self, state: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's action plus Gaussian noise of standard deviation 0.2 (TD3's smoothing
        noise), clipped to (-1, 1), with the Gaussian's log-density."""
        import math

        import torch

        sigma = 0.2
        action = self.actor(state).unsqueeze(0)
        noise = sigma * torch.randn(count, *action.shape[1:], device=state.device)
        log_density = -0.5 * (noise / sigma) ** 2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)
        return (action + noise).clamp(-1.0, 1.0), log_density.sum(dim=-1)

    def policy(self) -> torch.nn.Module:
        """Raw ``(values, presence)`` -> the actor's action ``[B, D]`` in the user's units."""
        from horizon_plugins_ac.networks import DeterministicPolicy

        live = DeterministicPolicy(self.preprocessor, self.actor, self.action_preprocessor)
        return self.frozen(live)

    def exploration_policy(self) -> torch.nn.Module:
        """For acting online: the actor's action plus ``exploration_noise`` (Gaussian, or
        Ornstein-Uhlenbeck with ``noise = "ou"``, whose ``reset()`` starts an episode; the
        process runs on across the modules handed out, held by the trainer), clipped to the
        action bounds, in the user's units ``[B, D]``."""
        from horizon_plugins_ac.networks import NoiseState, NoisyPolicy

        process = None
        if self.config.noise == "ou":
            if self.noise_state is None:
                self.noise_state = NoiseState()
            process = self.noise_state
        live = NoisyPolicy(
            self.preprocessor,
            self.actor,
            self.action_preprocessor,
            self.config.exploration_noise,
            process,
        )
        # The networks are copied; the process is shared with every module handed out.
        shared = {id(process): process} if process is not None else {}
        return copy.deepcopy(live, shared).eval().requires_grad_(False)


class Td3Trainer(DeterministicActorCritic):
    """TD3: twin critics, target policy smoothing and delayed actor updates."""

    name = "td3"
    Config: ClassVar[type[Td3Config]] = Td3Config
    config: Td3Config

    def next_action(self, next_state: torch.Tensor) -> torch.Tensor:
        import torch

        config = self.config
        action = self.actor_target(next_state)
        noise = (torch.randn_like(action) * config.target_noise).clamp(
            -config.target_noise_clip, config.target_noise_clip
        )
        return (action + noise).clamp(-1.0, 1.0)

    def actor_updates_now(self) -> bool:
        return (self.steps + 1) % self.config.policy_delay == 0


class DdpgTrainer(DeterministicActorCritic):
    """DDPG: a deterministic actor and one critic, with soft target updates."""

    name = "ddpg"
    Config: ClassVar[type[DdpgConfig]] = DdpgConfig
    config: DdpgConfig
    critic_count = 1


class SacTrainer(ActorCriticTrainer):
    """SAC: twin critics, a tanh-squashed Gaussian actor and automatic entropy tuning."""

    name = "sac"
    Config: ClassVar[type[SacConfig]] = SacConfig
    config: SacConfig
    target_actor = False

    def build_actor(self, state_width: int, action_width: int) -> torch.nn.Module:
        from horizon_plugins_ac.networks import GaussianActor

        return GaussianActor(state_width, action_width, self.config.layers)

    def finish_setup(self, problem: TrainingProblem) -> None:
        """The temperature, learned as ``log_alpha`` with its own Adam."""
        from horizon_engine import ForeachAdam
        from horizon_plugins_ac.networks import ActionSampler, Temperature, action_log_scale

        config = self.config
        self.synced_sampler = problem.data_parallel(ActionSampler(self.actor))
        """The actor's ``sample`` as the actor's loss draws it (``data_parallel``)."""
        temperature = Temperature(config.alpha, config.learn_alpha).to(problem.device)
        self.log_alpha = temperature.log_alpha
        self.synced_temperature = (
            problem.data_parallel(temperature) if config.learn_alpha else temperature
        )
        self.alpha_optimizer: ForeachAdam | None = (
            ForeachAdam([self.log_alpha], lr=config.alpha_learning_rate)
            if config.learn_alpha
            else None
        )
        self.target_entropy = (
            config.target_entropy
            if config.target_entropy != "auto"
            else -float(problem.action_width)
        )
        self.log_scale = action_log_scale(self.action_preprocessor, problem.action_width)

    def applied_options(self) -> dict[str, Any]:
        """The shared ones and ``target_entropy`` as it applies."""
        return {**super().applied_options(), "target_entropy": self.target_entropy}

    def next_value(self, next_state: torch.Tensor) -> torch.Tensor:
        """``min_i Q'_i(s', a') - alpha log pi(a'|s')`` with ``a'`` drawn from the actor."""
        import torch

        action, log_density = self.actor.sample(next_state)
        values = [critic(next_state, action) for critic in self.target_critics]
        return torch.minimum(*values) - self.log_alpha.exp().detach() * log_density

    def actor_loss(
        self, state: torch.Tensor, logged: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The reparameterized loss ``alpha log pi(a|s) - min_i Q_i(s, a)`` (with
        ``bc_weight``, scaled and joined by the cloning term as TD3+BC's), then one step of the
        temperature towards ``target_entropy``."""
        import torch

        action, log_density = self.synced_sampler(state)
        q = torch.minimum(*(critic(state, action) for critic in self.critics))
        alpha = self.log_alpha.exp().detach()
        loss, metrics = self.policy_objective(q - alpha * log_density, action, logged)
        metrics["entropy"] = float(-log_density.mean().detach())
        if self.alpha_optimizer is not None:
            gap = (log_density.detach() + self.target_entropy).mean()
            alpha_loss = self.synced_temperature(gap)
            self.alpha_optimizer.zero_grad()
            alpha_loss.backward()
            self.alpha_optimizer.step()
        metrics["alpha"] = float(self.log_alpha.detach().exp())
        return loss, metrics

    def sampled_actions(self, state: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` draws from the actor at each state, with their log-densities."""
        rows = state.shape[0]
        repeated = state.unsqueeze(0).expand(count, *state.shape).reshape(count * rows, -1)
        action, log_density = self.actor.sample(repeated)
        return action.reshape(count, rows, -1), log_density.reshape(count, rows)

    def greedy_action(self, state: torch.Tensor) -> torch.Tensor:
        return self.actor.mean_action(state)[0]

    def state_dict(self) -> dict[str, Any]:
        """The shared state plus the temperature and its optimizer."""
        state = super().state_dict()
        state["log_alpha"] = self.log_alpha.detach().clone()
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import torch

        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        if self.alpha_optimizer is not None and "alpha_optimizer" in state:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])

    def policy(self) -> torch.nn.Module:
        """Raw ``(values, presence)`` -> ``(action, log_density)``: the deterministic mean
        action ``tanh(mean)`` in the user's units and its log-density under the trained
        stochastic policy, over the user's units (what evaluation and export serve)."""
        from horizon_plugins_ac.networks import SacPolicy

        live = SacPolicy(self.preprocessor, self.actor, self.action_preprocessor, self.log_scale)
        return self.frozen(live)

    def exploration_policy(self) -> torch.nn.Module:
        """For acting online: a draw from the trained policy, in the user's units ``[B, D]``."""
        from horizon_plugins_ac.networks import SacExploration

        live = SacExploration(
            self.preprocessor, self.actor, self.action_preprocessor, self.log_scale
        )
        return self.frozen(live)
