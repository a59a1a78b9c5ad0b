"""The built-in ``gym`` data source: log a policy's decisions in a Gymnasium environment.

Horizon's gym tooling generated training data by running a (random or epsilon-greedy) policy in
an environment and writing the decisions as pre-timeline rows; this source does the same, so a
pipeline can be tried end to end without logged data. Every row carries the probability with
which the logging policy chose its action, because counterfactual evaluation and off-policy
training divide by it: it must be the true propensity, which for epsilon-greedy is
``1 - epsilon + epsilon / n`` for the greedy action (Horizon logged ``1 - epsilon``, which
undercounts the chance that the uniform draw also picks the greedy action).

gymnasium and onnxruntime are imported inside the functions that need them, so that importing
the plugin (``horizon plugins``, config validation) stays fast.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from pydantic import Field

from horizon_engine import (
    ActionType,
    DataSource,
    Exploration,
    HorizonError,
    ModelInputs,
    ModelOutputs,
    RowFormat,
    RowLayout,
    RowShaper,
    SourceBatch,
    SourceConfig,
    card_if_exported,
)

if TYPE_CHECKING:
    import gymnasium

BATCH_ROWS = 10_000
"""Rows shaped into one Arrow batch: large enough to amortize Arrow, small enough for memory."""


class GymSourceConfig(SourceConfig):
    """Options of the ``gym`` source (``[source]`` with ``kind = "gym"``)."""

    env: str = "CartPole-v1"
    """The Gymnasium environment id to run."""
    episodes: int = Field(200, ge=1)
    """How many episodes to run and log."""
    policy: Literal["random", "epsilon_greedy"] = "random"
    """The logging policy: uniform random, or epsilon-greedy around an ONNX model."""
    epsilon: float = Field(1.0, ge=0.0, le=1.0)
    """For epsilon_greedy: the chance of a uniform random action instead of the greedy one."""
    model: str | None = None
    """Path to an ONNX model: for discrete actions one scoring the actions of an observation
    (its argmax is greedy), for continuous ones an exported actor (its ``action`` output)."""
    action_noise: float = Field(0.0, ge=0.0)
    """For continuous actions under epsilon_greedy: Gaussian noise added to the model's
    action, its standard deviation this fraction of each action's half-range (the noisy action
    clipped to the bounds): a mediocre logging policy from a trained actor."""
    seed: int | None = None
    """Seed of the environment and the policy; None uses the run seed."""
    max_steps: int | None = Field(None, ge=1)
    """Most steps logged per episode; None keeps the environment's own time limit."""
    ds: str | None = None
    """The ``ds`` partition date written into every row; None writes today's date (ISO)."""
    parametric_actions: bool = False
    """Log a discrete action as a one-hot action-feature map whose ids follow the state's
    (CartPole: "4" and "5", as in Horizon's parametric CartPole data) and every action's map as
    possible_actions: the parametric-action form of a discrete environment."""


def collect_rows(
    config: GymSourceConfig,
    seed: int,
    greedy: Callable[[np.ndarray], int] | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Run the environment and yield ``(location, row)``, one pre-timeline row per step.

    ``location`` is ``"episode {i} step {t}"``. ``state_features`` is the flattened observation
    the action was chosen from (a Discrete observation becomes one-hot). The Timeline job knows
    an episode ends where its rows end, and makes its last row terminal; so the last row of an
    episode cut by a time limit (the environment's own ``truncated``, or ``max_steps``) carries
    ``truncated = true``, which tells the timeline that the episode did not end there: a random
    policy's state at step 500 of Acrobot is not an end state to learn a value of 0 for. A step
    both terminated and truncated is a real termination.

    ``greedy`` maps a flattened observation to the greedy action index; without it,
    ``config.model`` provides one. For discrete actions, ``action_probability`` is the exact
    chance the logging policy had of choosing the logged action. For continuous (Box) actions
    the action is drawn uniformly within the bounds (``random``), or under ``epsilon_greedy``
    is the ``config.model`` actor's action with ``action_noise`` added, or with chance
    ``epsilon`` a uniform one; it is logged as a feature map whose ids continue after the
    state's (Pendulum: state ``"0"`` to ``"2"``, action ``"3"``). Its ``action_probability``
    is 1.0, as Horizon logged it: a density is no probability (the uniform one,
    ``1 / prod(high - low)``, can exceed 1, which the row schema forbids).

    The same ``seed`` gives the same rows (and, with ``config.ds`` set, identical ones): it
    seeds the policy's generator and the environment's first reset, after which the
    environment continues its own generator.
    """
    import gymnasium

    ds = config.ds or datetime.date.today().isoformat()
    env = make_env(config.env)
    try:
        choose = _policy(config, env, greedy, np.random.default_rng(seed))
        for episode in range(config.episodes):
            observation, _ = env.reset(seed=seed if episode == 0 else None)
            step = 0
            while True:
                state = gymnasium.spaces.flatten(env.observation_space, observation)
                state = np.asarray(state, dtype=np.float64).ravel()
                action, logged, possible, probability = choose(state)
                observation, reward, terminated, truncated, _ = env.step(action)
                step += 1
                cut = not terminated and (truncated or step == config.max_steps)
                row = pre_timeline_row(
                    ds, episode, step - 1, state, logged, probability, reward, possible, cut
                )
                yield f"episode {episode} step {step - 1}", row
                if terminated or cut:
                    break
    finally:
        env.close()


_Choose = Callable[[np.ndarray], tuple[Any, Any, list[Any] | None, float]]
"""A policy: flattened state -> (action for env.step, logged action, possible actions or None for
continuous actions, propensity)."""


def _policy(
    config: GymSourceConfig,
    env: gymnasium.Env,
    greedy: Callable[[np.ndarray], int] | None,
    rng: np.random.Generator,
) -> _Choose:
    from gymnasium import spaces

    space = env.action_space
    if isinstance(space, spaces.Box):
        if config.parametric_actions:
            raise HorizonError(
                f"[source] parametric_actions = true needs a Discrete action space; "
                f"env = {config.env!r} has continuous actions"
            )
        return _uniform_box(config, env, space, rng)
    if not isinstance(space, spaces.Discrete):
        raise HorizonError(
            f"[source] env = {config.env!r} has a {type(space).__name__} action space; "
            "the gym source supports Discrete and Box action spaces"
        )
    n = int(space.n)
    names: list[Any] = [str(int(space.start) + i) for i in range(n)]
    if config.parametric_actions:
        first_id = int(spaces.flatdim(env.observation_space))
        names = [{str(first_id + i): 1.0} for i in range(n)]
    epsilon = config.epsilon if config.policy == "epsilon_greedy" else 1.0
    if epsilon < 1.0 and greedy is None:
        if config.model is None:
            raise HorizonError(
                f"[source] policy = 'epsilon_greedy' with epsilon < 1 (here {epsilon}) "
                "needs a model = 'path.onnx' to be greedy about"
            )
        greedy = _onnx_greedy(config.model, n)

    exploration = Exploration("epsilon_greedy", epsilon)

    def choose(state: np.ndarray) -> tuple[Any, Any, list[Any] | None, float]:
        best = int(greedy(state)) if epsilon < 1.0 else None
        index, probability = exploration.explore_or_exploit(best, n, rng)
        return int(space.start) + index, names[index], list(names), probability

    return choose


def _uniform_box(
    config: GymSourceConfig,
    env: gymnasium.Env,
    space: gymnasium.spaces.Box,
    rng: np.random.Generator,
) -> _Choose:
    """Actions in a bounded Box: uniform, or (epsilon_greedy) an ONNX actor's with Gaussian
    noise and a chance of a uniform one; the action ids follow the state feature ids."""
    from gymnasium import spaces

    low, high = space.low.ravel(), space.high.ravel()
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise HorizonError(
            f"[source] env = {config.env!r} has an unbounded action space; "
            "a uniform random policy needs finite bounds"
        )
    first_id = int(spaces.flatdim(env.observation_space))
    epsilon = config.epsilon if config.policy == "epsilon_greedy" else 1.0
    actor = None
    if epsilon < 1.0:
        if config.model is None:
            raise HorizonError(
                f"[source] policy = 'epsilon_greedy' with epsilon < 1 (here {epsilon}) "
                "needs a model = 'path.onnx': an exported actor of this environment's actions"
            )
        actor = _onnx_actor(config.model, len(low))
    spread = config.action_noise * (high - low) / 2

    def choose(state: np.ndarray) -> tuple[Any, Any, list[Any] | None, float]:
        if actor is None or rng.random() < epsilon:
            action = rng.uniform(low, high)
        else:
            action = np.clip(actor(state) + rng.normal(0.0, 1.0, len(low)) * spread, low, high)
        action = action.astype(space.dtype)
        logged = {str(first_id + j): float(v) for j, v in enumerate(action)}
        return action.reshape(space.shape), logged, None, 1.0

    return choose


def _onnx_actor(path: str, dimensions: int) -> Callable[[np.ndarray], np.ndarray]:
    """An exported continuous actor: one observation -> its ``action`` output ``[D]`` (the
    observation as float32 ``[1, obs_dim]``, with a presence mask of ones when the model takes
    one)."""
    session = _onnx_session(path)
    names = [model_input.name for model_input in session.get_inputs()]
    outputs = [output.name for output in session.get_outputs()]
    if ModelOutputs.ACTION not in outputs or ModelOutputs.SCORES in outputs:
        raise HorizonError(
            f"[source] model = {path!r} is no continuous actor (its outputs are {outputs}); "
            "a continuous action space needs a model exported from an actor-critic trainer"
        )

    def act(state: np.ndarray) -> np.ndarray:
        observation = state.astype(np.float32).reshape(1, -1)
        feeds = {names[0]: observation}
        if len(names) > 1:
            feeds[names[1]] = np.ones_like(observation)
        (action,) = session.run([ModelOutputs.ACTION], feeds)
        action = np.asarray(action, dtype=np.float64).ravel()
        if action.size != dimensions:
            raise HorizonError(
                f"[source] model = {path!r} gives {action.size} action values; the "
                f"environment takes {dimensions}"
            )
        return action

    return act


def _onnx_session(path: str) -> Any:
    """An onnxruntime session of the ``[source] model``, or an error naming it."""
    if not Path(path).is_file():
        raise HorizonError(f"[source] model = {path!r}: no such file")
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors for a bad model
        raise HorizonError(f"[source] model = {path!r}: cannot load the ONNX model: {exc}") from exc


def _onnx_greedy(path: str, n_actions: int) -> Callable[[np.ndarray], int]:
    """Greedy action of an ONNX model: the argmax of its first output for one observation.

    The observation goes to the first input as float32 ``[1, obs_dim]``. Models exported with a
    presence mask (a second input of the same shape) get a mask of ones: gym observations are
    dense, every feature is present. A parametric model (with ``candidates`` inputs) is offered
    every action as the one-hot features ``parametric_actions`` logs, in action order.
    """
    session = _onnx_session(path)
    names = [model_input.name for model_input in session.get_inputs()]
    card = card_if_exported(session, path)
    action_ids = list(card.action_feature_ids) if card else []

    def greedy(state: np.ndarray) -> int:
        observation = state.astype(np.float32).reshape(1, -1)
        feeds = {names[0]: observation}
        if len(names) > 1:
            feeds[names[1]] = np.ones_like(observation)
        if ModelInputs.CANDIDATES in names:
            feeds |= _one_hot_candidates(path, action_ids, observation.shape[1], n_actions)
        scores = np.asarray(session.run(None, feeds)[0])
        if scores.size != n_actions:
            raise HorizonError(
                f"[source] model = {path!r} scores {scores.size} actions; "
                f"the environment has {n_actions}"
            )
        return int(np.argmax(scores))

    return greedy


def _one_hot_candidates(
    path: str, action_ids: list[str], first_id: int, n_actions: int
) -> dict[str, np.ndarray]:
    """Every action as a candidate with the one-hot features ``parametric_actions`` logs
    (ids ``first_id`` + index), laid out in the model's ``action_feature_ids`` order."""
    wanted = [str(first_id + index) for index in range(n_actions)]
    unknown = sorted(set(wanted) - set(action_ids))
    if unknown:
        raise HorizonError(
            f"[source] model = {path!r} takes action features {action_ids}, not the one-hot "
            f"features {wanted} of this environment's actions"
        )
    candidates = np.zeros((1, n_actions, len(action_ids)), dtype=np.float32)
    for index, feature in enumerate(wanted):
        candidates[0, index, action_ids.index(feature)] = 1.0
    mask = np.ones((1, n_actions), dtype=np.float32)
    return dict(zip(ModelInputs.PER_CANDIDATE, (candidates, candidates.copy(), mask), strict=True))


def make_env(env_id: str, section: str = "source") -> gymnasium.Env:
    """The environment, or an error naming ``[section] env``."""
    import gymnasium

    try:
        return gymnasium.make(env_id)
    except gymnasium.error.Error as exc:
        raise HorizonError(f"[{section}] env = {env_id!r}: {exc}") from exc


def pre_timeline_row(
    ds: str,
    episode: int,
    step: int,
    state: np.ndarray,
    action: Any,
    action_probability: float,
    reward: float,
    possible_actions: list[Any] | None,
    truncated: bool = False,
) -> dict[str, Any]:
    """One logged decision as a pre-timeline row; ``horizon gym train -f`` writes the same.

    ``truncated`` marks the last row of an episode that a time limit cut short; the field is
    written only then, so rows of episodes that end by themselves look like Horizon's.
    """
    row = {
        "ds": ds,
        "mdp_id": str(episode),
        "sequence_number": step,
        "state_features": {str(i): float(v) for i, v in enumerate(state)},
        "action": action,
        "reward": float(reward),
        "action_probability": action_probability,
        "possible_actions": possible_actions,
        "metrics": {"reward": float(reward)},
    }
    if possible_actions is None:
        del row["possible_actions"]
    if truncated:
        row["truncated"] = True
    return row


def layout_for_env(env_id: str, parametric_actions: bool = False) -> RowLayout:
    """The layout of the rows the gym source writes for an environment.

    Rows are always pre-timeline; the actions are continuous for a Box action space, else
    parametric with ``parametric_actions`` and discrete without (``collect_rows`` rejects other
    action spaces).
    """
    from gymnasium import spaces

    env = make_env(env_id)
    try:
        continuous = isinstance(env.action_space, spaces.Box)
    finally:
        env.close()
    action_type = ActionType.CONTINUOUS if continuous else ActionType.DISCRETE
    if parametric_actions and not continuous:
        action_type = ActionType.PARAMETRIC
    return RowLayout(RowFormat.PRE_TIMELINE, action_type)


class SeededRun(Protocol):
    """All the gym source needs of the run context: its seed (a pipeline's RunContext has it)."""

    seed: int


class GymSource(DataSource):
    """Runs a Gymnasium environment and logs its decisions as pre-timeline rows.

    Useful to try a pipeline end to end, or to generate data for a learning test, without
    logged data: with the same seed it writes the same rows.
    """

    name = "gym"
    Config = GymSourceConfig

    def read(self, run: SeededRun) -> Iterator[SourceBatch]:
        """Run the episodes and yield their rows in batches of ``BATCH_ROWS``."""
        config: GymSourceConfig = self.config  # type: ignore[assignment]
        layout = layout_for_env(config.env, config.parametric_actions)
        _check_declared_layout(config, layout)
        seed = run.seed if config.seed is None else config.seed
        shaper = RowShaper(layout)
        pairs = collect_rows(config, seed)
        while batch := list(itertools.islice(pairs, BATCH_ROWS)):
            shaped = shaper.shape(batch)
            yield SourceBatch(
                table=shaped.table,
                layout=layout,
                locations=shaped.locations,
                bad_rows=shaped.bad_rows,
                ignored_fields=shaped.ignored_fields,
            )


def _check_declared_layout(config: GymSourceConfig, layout: RowLayout) -> None:
    """A ``row_format`` or ``action_type`` the rows cannot have is a config mistake: say so."""
    for key, declared, actual in (
        ("row_format", config.row_format, layout.row_format.value),
        ("action_type", config.action_type, layout.action_type.value),
    ):
        if declared not in ("auto", actual):
            raise HorizonError(
                f"[source] {key} = {declared!r}, but the gym source writes {actual!r} for "
                f"env = {config.env!r}; leave {key} = 'auto'"
            )
