"""The replay buffer of online training: transitions in, the trainers' batches out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


class ReplayBuffer:
    """Preallocated ring arrays of transitions, sampled uniformly into the trainer's batch.

    A batch holds the tensors the batch schema (``horizon_engine.batch_schema``) declares, as
    the timeline's minibatches do, so a trainer cannot tell online from offline training; it is
    the ``SampledData`` the training driver samples from. ``episode_id`` numbers the episodes
    in the order they were played and ``step`` is a transition's place in its episode. With
    ``one_hot`` every action is offered as one-hot action features (``one_hot_actions``): a
    parametric batch. Transitions are
    written in the order they happen, one environment at a time, so the ring's next slot holds
    the next step of the same episode unless the transition ended its episode or is the
    newest: that is how ``n_step > 1`` windows are gathered. A window is cut short at its
    episode's end and at the newest transition, and then bootstraps from where it stops
    (a shorter, still correct, multi-step target), as the timeline cuts windows at the end of
    an episode.

    Every action of a Discrete space is always possible, so ``possible_actions`` is all ones and
    ``possible_next_actions`` all ones but after a termination (all zeros, as the timeline
    writes terminal rows). Observations are dense: presence is all ones. ``time_diff`` is 1.

    With ``action_width`` > 0 the actions are continuous (a Box space): each is a vector of
    ``action_width`` values in the user's units, stored raw as the timeline stores a continuous
    row's action features (the trainer's action preprocessor normalizes them), and the batch is
    a continuous one: ``action`` and ``next_action`` ``[B, G]`` float32 with their presence
    (all ones, but ``next_action_presence`` all zeros where there is no next action: after a
    termination, as the timeline's terminal rows have none), no possible-action masks.
    """

    ARRAYS: tuple[str, ...] = (
        "state",
        "next_state",
        "action",
        "next_action",
        "next_action_presence",
        "reward",
        "not_terminal",
        "action_probability",
        "episode_end",
        "episode_id",
        "step",
    )
    """The ring arrays: what a batch gathers from, and what ``state_dict`` holds."""

    def __init__(
        self,
        capacity: int,
        state_width: int,
        action_count: int,
        n_step: int = 1,
        seed: int = 0,
        one_hot: bool = False,
        action_width: int = 0,
    ) -> None:
        import torch

        self.capacity, self.action_count, self.n_step = capacity, action_count, n_step
        self.one_hot = one_hot
        self.action_width = action_width
        self.state = np.zeros((capacity, state_width), dtype=np.float32)
        self.next_state = np.zeros_like(self.state)
        if action_width:
            self.action = np.zeros((capacity, action_width), dtype=np.float32)
            self.next_action = np.zeros_like(self.action)
        else:
            self.action = np.zeros(capacity, dtype=np.int64)
            self.next_action = np.full(capacity, -1, dtype=np.int64)
        self.next_action_presence = np.zeros(capacity, dtype=np.float32)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.not_terminal = np.zeros(capacity, dtype=np.float32)
        self.action_probability = np.zeros(capacity, dtype=np.float32)
        self.episode_end = np.zeros(capacity, dtype=bool)
        self.episode_id = np.zeros(capacity, dtype=np.int64)
        self.step = np.zeros(capacity, dtype=np.int64)
        self.position = 0
        self.size = 0
        self.episode = 0
        self.episode_step = 0
        self.generator = torch.Generator().manual_seed(seed)
        # Tensors sharing the arrays' memory: sampling gathers from them without copying all.
        self._tensors = {name: torch.from_numpy(getattr(self, name)) for name in self.ARRAYS}

    def __len__(self) -> int:
        return self.size

    def state_dict(self) -> dict[str, Any]:
        """Everything later samples depend on, for a checkpoint: the filled slots of each ring
        array (the others still hold their initial values), the write position, the episode
        counters and the sampling generator's state."""
        import torch

        filled = {
            name: torch.from_numpy(getattr(self, name)[: self.size].copy()) for name in self.ARRAYS
        }
        return {
            "arrays": filled,
            "counters": [self.position, self.size, self.episode, self.episode_step],
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned, into the arrays the batches share."""
        self.position, self.size, self.episode, self.episode_step = state["counters"]
        for name in self.ARRAYS:
            getattr(self, name)[: self.size] = state["arrays"][name].numpy()
        self.generator.set_state(state["generator"])

    @property
    def newest(self) -> int:
        """The slot of the transition written last."""
        return (self.position - 1) % self.capacity

    def add(
        self,
        state: np.ndarray,
        action: int | np.ndarray,
        action_probability: float,
        reward: float,
        next_state: np.ndarray,
        terminated: bool,
        episode_end: bool,
        next_action: int | np.ndarray | None = None,
    ) -> None:
        """Write one transition over the oldest when full. ``episode_end`` is true for the last
        transition of an episode, terminated or truncated. ``next_action`` may come later,
        through ``set_next_action``: the runner chooses it after writing the transition, so
        that the step which ends the warm-up is already chosen by the policy it set up. A
        continuous action is a vector of ``action_width`` values."""
        slot = self.position
        self.state[slot] = state
        self.next_state[slot] = next_state
        self.action[slot] = action
        self.next_action[slot] = 0 if self.action_width else -1
        self.next_action_presence[slot] = 0.0
        if next_action is not None and not terminated:
            self._set_next(slot, next_action)
        self.reward[slot] = reward
        self.not_terminal[slot] = 0.0 if terminated else 1.0
        self.action_probability[slot] = action_probability
        self.episode_end[slot] = episode_end
        self.episode_id[slot] = self.episode
        self.step[slot] = self.episode_step
        self.episode_step += 1
        if episode_end:
            self.episode, self.episode_step = self.episode + 1, 0
        self.position = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def set_next_action(self, action: int | np.ndarray) -> None:
        """The newest transition's next action; ignored after a termination (stays -1, or
        absent for continuous actions)."""
        if self.not_terminal[self.newest]:
            self._set_next(self.newest, action)

    def _set_next(self, slot: int, action: int | np.ndarray) -> None:
        self.next_action[slot] = action
        self.next_action_presence[slot] = 1.0

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly with replacement (seeded generator), as
        a parametric batch with ``one_hot``."""
        import torch

        index = torch.randint(self.size, (batch_size,), generator=self.generator)
        batch = self.batch(index)
        return one_hot_actions(batch, self.action_count) if self.one_hot else batch

    def batch(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """The transitions in slots ``index`` as the trainer's batch dict."""
        import torch

        tensors = self._tensors
        state = tensors["state"][index]
        not_terminal = tensors["not_terminal"][index]
        ones = torch.ones_like(state)
        batch = {
            "state": state,
            "state_presence": ones,
            "next_state": tensors["next_state"][index],
            "next_state_presence": ones,
            "reward": tensors["reward"][index],
            "not_terminal": not_terminal,
            "time_diff": torch.ones_like(not_terminal),
            "action_probability": tensors["action_probability"][index],
            "episode_id": tensors["episode_id"][index],
            "step": tensors["step"][index],
            "action": tensors["action"][index],
            "next_action": tensors["next_action"][index],
        }
        if self.action_width:
            following = tensors["next_action_presence"][index].unsqueeze(1)
            batch["action_presence"] = torch.ones_like(batch["action"])
            batch["next_action_presence"] = following.expand(-1, self.action_width).clone()
        else:
            everything = torch.ones(len(index), self.action_count)
            batch["possible_actions"] = everything
            batch["possible_next_actions"] = everything * not_terminal.unsqueeze(1)
        if self.n_step > 1:
            batch |= self._n_step_windows(index)
        return batch

    def _n_step_windows(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each transition's next ``n_step`` rewards, padded past the window's length with
        reward 0 and not_terminal 0 (as the timeline's tensors are), and the state, presence and
        possible actions where the window ends."""
        import torch

        tensors = self._tensors
        steps = torch.arange(self.n_step)
        slots = (index.unsqueeze(1) + steps) % self.capacity
        # A window stops after a slot that ended its episode or is the newest transition.
        stops = tensors["episode_end"][slots] | (slots == self.newest)
        inside = torch.ones_like(stops)
        inside[:, 1:] = torch.cumprod(~stops[:, :-1], dim=1).bool()
        lengths = inside.sum(dim=1)
        weights = inside.to(torch.float32)
        last = slots.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1)
        end_state = tensors["next_state"][last]
        end_not_terminal = tensors["not_terminal"][last]
        windows = {
            "next_n_rewards": tensors["reward"][slots] * weights,
            "next_n_time_diffs": weights,
            "next_n_not_terminal": tensors["not_terminal"][slots] * weights,
            "next_n_length": lengths,
            "next_n_state": end_state,
            "next_n_state_presence": torch.ones_like(end_state),
        }
        if not self.action_width:
            windows["next_n_possible_next_actions"] = torch.ones(
                len(index), self.action_count
            ) * end_not_terminal.unsqueeze(1)
        return windows


def one_hot_actions(batch: dict[str, torch.Tensor], action_count: int) -> dict[str, torch.Tensor]:
    """A discrete batch as a parametric one: every action index becomes its one-hot action
    features (present only where hot, as the gym source's ``parametric_actions`` logs them),
    and every mask over actions a mask over candidates that are all the actions, in order.

    The names are those the timeline's parametric tensors have (``possible_action_features``,
    ...), so a parametric trainer trains online as it does offline.
    """
    import torch

    eye = torch.eye(action_count)
    rows = len(batch["action"])
    every = eye.expand(rows, -1, -1)
    logged = eye[batch["action"]]
    following = batch["next_action"]
    next_logged = eye[following.clamp(min=0)] * (following >= 0).unsqueeze(1)
    converted = dict(batch)
    converted |= {
        "action": logged,
        "action_presence": logged,
        "next_action": next_logged,
        "next_action_presence": next_logged,
    }
    for prefix in ("possible_action", "possible_next_action", "next_n_possible_next_action"):
        if f"{prefix}s" in batch:
            converted[f"{prefix}_features"] = every
            converted[f"{prefix}_presence"] = every
    return converted
