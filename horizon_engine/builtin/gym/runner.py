"""Playing, training and evaluating in a Gymnasium environment: ``train_gym``."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from horizon_engine import (
    ActionType,
    EarlierRun,
    Exploration,
    ExploresOnline,
    HorizonError,
    NormalizationConfig,
    PluginHost,
    ProblemDescription,
    RunContext,
    RunFolder,
    TrainingDriver,
    export_policy,
    get_plugin_host,
    record_failure,
)
from horizon_engine.builtin.gym.config import GymSpec, epsilon_at
from horizon_engine.builtin.gym.replay_buffer import ReplayBuffer
from horizon_engine.builtin.gym.results import (
    Evaluation,
    ExportAfterTrainingError,
    GymTrainingResult,
    write_reward_history,
)
from horizon_engine.builtin.gym.resume import (
    Position,
    RowsWriter,
    check_resumable,
    prune_online_states,
    read_online_state,
    rows_writer,
    save_online_state,
)
from horizon_engine.builtin.gym_source import pre_timeline_row

if TYPE_CHECKING:
    import gymnasium
    import torch

    from horizon_engine import Normalization, NormalizationParameters

GYM_COMMAND = "horizon gym train"
"""What a gym run's manifest.json records as its ``command``."""


def make_env(env_id: str) -> gymnasium.Env:
    """The environment, or an error naming ``[gym] env``; its action space must be Discrete or
    a Box with finite bounds (the warm-up draws uniformly inside them)."""
    import gymnasium

    from horizon_engine.builtin.gym_source import make_env as make_any_env

    env = make_any_env(env_id, "gym")
    space = env.action_space
    problem = None
    if isinstance(space, gymnasium.spaces.Box):
        if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
            problem = (
                f"[gym] env = {env_id!r} has an unbounded Box action space (low {space.low}, "
                f"high {space.high}); horizon gym train needs finite bounds to explore "
                "uniformly in the warm-up and to map the actor's actions into"
            )
    elif not isinstance(space, gymnasium.spaces.Discrete):
        problem = (
            f"[gym] env = {env_id!r} has a {type(space).__name__} action space; horizon gym "
            "train plays Discrete and (bounded) Box action spaces"
        )
    if problem is not None:
        env.close()
        raise HorizonError(problem)
    return env


def train_gym(
    spec: GymSpec,
    plugins: PluginHost | None = None,
    rows: Path | None = None,
    reward_history: Path | None = None,
    show_progress: bool = False,
    resume: bool = False,
) -> GymTrainingResult:
    """Play, train and evaluate as ``spec`` says; write the run's files.

    ``rows`` (``-f``): every training transition as a pre-timeline JSON row. ``reward_history``
    (``-r``): the evaluations as CSV. Both are written atomically, as is everything in the
    output folder: ``normalization.json``, what the training driver writes (``problem.json``,
    ``checkpoints/``: one per evaluation, ``latest.pt`` the last; ``check_rows.pt``: greedy-play
    states to check an export on), ``tensorboard/`` (through ``horizon_on_epoch_end``, one
    "epoch" per evaluation), ``manifest.json`` and, with ``[export]``, the exported model.
    ``resume`` continues the output folder's interrupted run (``OnlineRun``) to the result the
    uninterrupted run would have had.
    """
    host = plugins or get_plugin_host()
    return OnlineRun(spec, host, show_progress).run(rows, reward_history, resume)


class OnlineRun:
    """The state of one ``train_gym`` call: environments, replay buffer, training driver,
    counters. The driver trains the ``[trainer]`` as the pipeline's train stage does; this
    class plays, fills the buffer, and tells the driver when to train and when an "epoch"
    (an evaluation) ends.

    Resuming (``--resume``): each evaluation, once its step's row is written, is a point the
    run can continue from exactly. The driver's epoch checkpoint holds the trainer (networks,
    targets, optimizers, a td3/ddpg Ornstein-Uhlenbeck process's value) and torch's
    generators; beside it, written just before, the runner's own state
    (``RunFolder.online_state_path``): the replay buffer and its generator, the numpy generators
    of exploration and evaluation, the step count, the acting copy of the policy and when it
    was taken (epsilon is a function of the step count), the evaluations, warnings and
    outputs so far, the ``ds`` of the rows, the length of the ``-f`` rows written, and the
    ``Position`` in the episode. Evaluations fall mid-episode and a Gymnasium environment
    cannot be saved in general, so the training environment is restored by replay: the
    episode's reset is repeated (with the seed for episode 1, else from the environment's
    generator state recorded before the reset) and its actions so far are played again, which
    brings any environment whose episodes depend only on its generator and the actions
    (classic control, Box2D, MuJoCo) to the same state; the replayed observation must equal
    the recorded one, or the resume is refused. The evaluation environments are reset with a
    fresh seed each time and carry nothing over. A kill before the first evaluation leaves
    nothing to continue from: the resumed run starts over.
    """

    def __init__(self, spec: GymSpec, plugins: PluginHost, show_progress: bool) -> None:
        self.spec = spec
        self.config = spec.gym
        self.plugins = plugins
        self.output_dir = Path(self.config.output_dir)
        self.folder = RunFolder(self.output_dir)
        # A run the command drives itself: its epoch metrics reach the plugins' hooks.
        self.run_context = RunContext.for_command(
            self.output_dir, self.config.seed, uuid.uuid4().hex[:12], show_progress, plugins
        )
        self.driver: TrainingDriver | None = None
        self.acting: torch.nn.Module | None = None
        self.continuous = False
        """A Box action space: actions are vectors, ``_choose`` returns them."""
        self.refreshed_at = 0
        self.steps = 0
        self.ds = self.config.ds or dt.date.today().isoformat()
        """The ``ds`` of the ``-f`` rows: a resumed run keeps the interrupted run's."""
        self.episode_actions: list[Any] = []
        """The actions of the training episode under way (as plain data), for a replay."""
        self.episode_random: str | None = None
        """The training environment's generator state (JSON) before this episode's reset."""
        self.rows_path: Path | None = None
        self.evaluations: list[Evaluation] = []
        self.warnings: list[str] = []
        self.outputs: list[str] = []

    def run(
        self, rows: Path | None, reward_history: Path | None, resume: bool = False
    ) -> GymTrainingResult:
        """Play and train (with ``resume``, from the folder's interrupted run: ``_resume``),
        record the result, then export.

        Training's record does not depend on the export: the ``-r`` history, the manifest's
        ``result``, ``outputs`` and ``seconds`` are written once training ends. A failed export
        then leaves the manifest ``"status": "failed"`` with ``"failed_stage": "export"`` and
        its ``error`` beside that result, and raises ``ExportAfterTrainingError`` (the training
        report, then the export's error) for a ``HorizonError``, or the exception otherwise. A
        failure before that records ``"failed_stage": "training"``. As under ``horizon run``,
        an exception a plugin's component raised is blamed on it (``PluginHost.blame``): the
        ``PluginError`` naming plugin and component is the manifest's ``error`` and the one
        raised (its cause the original); any other exception keeps its traceback.
        The runner's resume state is removed once the manifest says the run succeeded.
        """
        started = time.perf_counter()
        earlier = check_resumable(self.spec) if resume else None
        with self.folder.held():
            return self._train_and_export(started, earlier, rows, reward_history, resume)

    def _train_and_export(
        self,
        started: float,
        earlier: EarlierRun | None,
        rows: Path | None,
        reward_history: Path | None,
        resume: bool,
    ) -> GymTrainingResult:
        """``run`` once the folder is held (``RunFolder.held``): nothing it writes or removes
        goes through a link swapped into the folder meanwhile."""
        import torch

        manifest = self._start_manifest()
        if earlier is not None:
            continued = earlier.manifest.get("continued_runs")
            earlier_runs = continued if isinstance(continued, list) else []
            manifest["continued_runs"] = [earlier.run_id, *map(str, earlier_runs)]
        self.rows_path = Path(rows).resolve() if rows is not None else None
        manifest["rows_file"] = str(rows) if rows is not None else None
        manifest["reward_history_file"] = str(reward_history) if reward_history else None
        threads = torch.get_num_threads()  # the driver sets [trainer] threads once set up
        if self.config.torch_threads is not None:
            self.warnings.append(
                "[gym] torch_threads is deprecated: [trainer] threads sets the CPU threads of "
                "every way of training (torch_threads is used while [trainer] threads is not set)"
            )
        stage = "training"
        try:
            with ExitStack() as envs:
                self._open_envs(envs)
                position, offset = self._resume() if resume else (None, None)
                if position is not None:
                    manifest["resumed_after_evaluation"] = self.driver.epoch
                with rows_writer(rows, offset) as writer:
                    episodes = self._play(writer, position)
                if reward_history is not None:
                    write_reward_history(reward_history, self.evaluations)
                result = self._result(episodes, started)
                self._record(manifest, result)
                stage = "export"
                exported = self._export()
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            blamed = self.plugins.blame(exc)  # a component's own exception, as `horizon run`
            failure = blamed or exc
            finish = self._interrupted if interrupted else self._finish
            record_failure(manifest, failure, stage, finish)
            if stage == "export" and isinstance(failure, HorizonError):
                report = result.report(self.config.avg_over_num_episodes, (rows, reward_history))
                raise ExportAfterTrainingError(result, report, str(failure)) from exc
            if blamed is not None:
                raise blamed from exc
            raise
        finally:
            torch.set_num_threads(threads)
        result.outputs = list(self.outputs)
        result.seconds = round(time.perf_counter() - started, 3)
        self._record(manifest, result)
        manifest["status"] = "succeeded"
        if exported is not None:
            manifest["export"] = exported
        self._finish(manifest)
        prune_online_states(self.output_dir, None)
        return result

    def _result(self, episodes: int, started: float) -> GymTrainingResult:
        """What training did, with the files written so far."""
        return GymTrainingResult(
            env=self.config.env,
            episodes=episodes,
            steps=self.steps,
            updates=self.driver.updates if self.driver is not None else 0,
            evaluations=self.evaluations,
            score_bar=self.config.score_bar,
            output_dir=self.output_dir,
            outputs=list(self.outputs),
            warnings=self.warnings,
            seconds=round(time.perf_counter() - started, 3),
        )

    def _record(self, manifest: dict[str, Any], result: GymTrainingResult) -> None:
        """The result in the manifest, and the manifest on disk: it survives what follows."""
        manifest["result"] = result.summary()
        manifest["outputs"] = result.outputs
        manifest["warnings"] = result.warnings
        manifest["seconds"] = result.seconds
        self.folder.write_manifest(manifest)

    def _open_envs(self, stack: ExitStack) -> None:
        """The training environment and one per evaluation episode, closed by ``stack``; the
        replay buffer and the generators, sized and seeded for them."""
        import gymnasium

        config = self.config
        self.env = make_env(config.env)
        stack.callback(self.env.close)
        self.eval_envs = []
        for _ in range(config.avg_over_num_episodes):
            self.eval_envs.append(make_env(config.env))
            stack.callback(self.eval_envs[-1].close)
        space = self.env.action_space
        self.observation_space = self.env.observation_space
        width = int(gymnasium.spaces.flatdim(self.observation_space))
        self.feature_ids = [str(i) for i in range(width)]
        self.continuous = isinstance(space, gymnasium.spaces.Box)
        if self.continuous:
            if config.parametric_actions:
                raise HorizonError(
                    f"[gym] parametric_actions = true needs a Discrete action space; "
                    f"env = {config.env!r} has a Box action space (continuous actions)"
                )
            # Action feature ids follow the state's, as the gym source logs Box actions.
            self.low = space.low.astype(np.float64).ravel()
            self.high = space.high.astype(np.float64).ravel()
            self.first_action = 0
            self.actions = []
            self.action_feature_ids = [str(width + j) for j in range(len(self.low))]
        else:
            self.first_action = int(space.start)
            self.actions = [str(self.first_action + i) for i in range(int(space.n))]
            self.action_feature_ids = (
                [str(width + i) for i in range(len(self.actions))]
                if config.parametric_actions
                else []
            )
        self.buffer = ReplayBuffer(
            config.replay_buffer_size,
            width,
            len(self.actions),
            config.n_step,
            config.seed,
            one_hot=config.parametric_actions,
            action_width=len(self.action_feature_ids) if self.continuous else 0,
        )
        self.rng = np.random.default_rng(config.seed)
        self.eval_rng = np.random.default_rng([config.seed, 1])

    def _play(self, rows: RowsWriter | None, position: Position | None) -> int:
        """The training episodes (from a resumed run's ``position`` on), then a last
        evaluation unless one was just made; returns how many episodes were played."""
        config = self.config
        episode, first = 0, 1
        if position is not None:
            episode = position.episode
            first = config.episodes + 1 if position.stopped else episode + int(position.ended)
        with self.run_context.progress(f"{config.env} episodes", config.episodes) as advance:
            advance(first - 1)
            for episode in range(first, config.episodes + 1):
                resumed = position if position is not None and episode == position.episode else None
                if self._episode(episode, rows, resumed):
                    break
                advance(1)
        if self.driver is None:
            self.warnings.append(
                f"no training: the {self.steps} steps played never reached "
                f"train_after_ts = {config.train_after_ts}"
            )
            return episode
        if not self.evaluations or self.evaluations[-1].timestep != self.steps:
            finished = Position(episode, 0, True, True, [], None, 0.0, [], None)
            self._end_epoch(self._evaluation(episode), finished, rows)
        self._save_check_rows()
        self.outputs += self.driver.outputs
        self.outputs.append(self.folder.write_training_epochs(self.driver.history))
        return episode

    def _episode(self, episode: int, rows: RowsWriter | None, resumed: Position | None) -> bool:
        """Play one training episode, or the rest of a resumed run's episode from its step;
        True when an evaluation reached the score bar. An evaluation's checkpoint comes once
        its step's row is written: the run can continue from there (``Position``)."""
        config, env = self.config, self.env
        if resumed is None:
            state, action, probability = self._start_episode(episode)
            step = 0
        else:
            state = np.asarray(resumed.state, dtype=np.float64)
            action, probability = self._action_from(resumed.action), resumed.probability
            step = resumed.step
        while True:
            observation, reward, terminated, truncated, _ = env.step(self._env_action(action))
            self.episode_actions.append(np.asarray(action).tolist())
            next_state = self._flatten(observation)
            step += 1
            self.steps += 1
            ended = terminated or truncated or step == config.max_steps
            self.buffer.add(state, action, probability, reward, next_state, terminated, ended)
            logged, possible = self._logged(action)
            row = pre_timeline_row(
                self.ds, episode - 1, step - 1, state, logged, probability, reward, possible
            )
            if self.driver is None and self.steps == config.train_after_ts:
                self._set_up()
            if not terminated:
                # The next action is chosen now, by the policy before this step's update (as
                # Horizon's runner did), and stored as the transition's next action; after a
                # truncation it is drawn for SARSA's sake but not played.
                action, probability = self._choose(next_state)
                self.buffer.set_next_action(action)
            evaluation = None
            if self.driver is not None:
                self._train()
                if self.steps % config.test_every_ts == 0:
                    evaluation = self._evaluation(episode)
            reached = evaluation is not None and self._reaches_bar(evaluation)
            if rows is not None:
                # An episode cut by a time limit, or stopped here by the score bar, did not
                # end: its last row says so, and the timeline makes no terminal row of it.
                if not terminated and (ended or reached):
                    row["truncated"] = True
                rows.write(json.dumps(row))
            if evaluation is not None:
                position = Position(
                    episode,
                    step,
                    ended,
                    reached,
                    next_state.tolist(),
                    np.asarray(action).tolist(),
                    probability,
                    list(self.episode_actions),
                    self.episode_random,
                )
                self._end_epoch(evaluation, position, rows)
            if reached:
                return True
            if ended:
                return False
            state = next_state

    def _start_episode(self, episode: int) -> tuple[np.ndarray, Any, float]:
        """Reset the training environment (with the seed for episode 1, recording its
        generator's state before a later reset), restart the exploration; the first state and
        the action chosen in it."""
        random = self.env.unwrapped.np_random.bit_generator.state if episode > 1 else None
        self.episode_random = json.dumps(random) if random is not None else None
        self.episode_actions = []
        observation, _ = self.env.reset(seed=self.config.seed if episode == 1 else None)
        state = self._flatten(observation)
        self._reset_exploration()
        action, probability = self._choose(state)
        return state, action, probability

    def _replay(self, position: Position) -> None:
        """Bring the fresh training environment to ``position``: reset it as its episode was
        reset, play the episode's actions again, and check that it arrives at the recorded
        observation (an environment that depends on more than its generator would not)."""
        env = self.env
        if position.env_random is None:
            observation, _ = env.reset(seed=self.config.seed)
        else:
            env.unwrapped.np_random.bit_generator.state = json.loads(position.env_random)
            observation, _ = env.reset()
        for action in position.actions:
            observation, *_ = env.step(self._env_action(self._action_from(action)))
        if not np.array_equal(self._flatten(observation), np.asarray(position.state)):
            raise HorizonError(
                f"--resume: [gym] env = {self.config.env!r} did not come back to the recorded "
                f"observation when its episode {position.episode} was replayed to step "
                f"{position.step}: its episodes depend on more than its seed and the actions "
                "played, so the run cannot continue as it would have; train again without "
                "--resume"
            )
        self.episode_random = position.env_random
        self.episode_actions = list(position.actions)

    def _action_from(self, saved: Any) -> Any:
        """An action as ``Position`` and ``episode_actions`` hold it (plain data), as played."""
        return np.asarray(saved, dtype=np.float64) if self.continuous else int(saved)

    def _resume(self) -> tuple[Position | None, int | None]:
        """Continue the folder's interrupted run from its last complete evaluation: the
        training driver as it was then (``TrainingDriver.resume``), the runner's state of the
        same evaluation, the training environment replayed to where it stood. Returns the
        ``Position`` to play on from and the byte length of the ``-f`` rows then, or
        ``(None, None)`` when no evaluation was complete: the run starts over."""
        if self.folder.last_epoch_checkpoint() is None:
            return None, None
        self._start_driver(self.folder.normalization(self.plugins))
        self.driver.resume()
        state = read_online_state(self.output_dir, self.driver.epoch)
        self._check_rows_file(state.get("rows_file"))
        try:
            position, offset = self._restore(state)
            if not position.stopped:
                self._replay(position)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            path = self.folder.online_state_path(self.driver.epoch)
            raise HorizonError(
                f"--resume: {path} does not hold the runner state of this run "
                f"({type(exc).__name__}: {exc}); train again without --resume"
            ) from None
        return position, offset

    def _restore(self, state: dict[str, Any]) -> tuple[Position, int | None]:
        """The runner as ``_online_state`` recorded it; the ``Position`` it stood at and the
        length of the ``-f`` rows then (None without -f)."""
        self.steps, self.refreshed_at = int(state["steps"]), int(state["refreshed_at"])
        self.ds = str(state["ds"])
        self.evaluations = [Evaluation(**evaluation) for evaluation in state["evaluations"]]
        self.warnings, self.outputs = list(state["warnings"]), list(state["outputs"])
        self.rng.bit_generator.state = json.loads(state["rng"])
        self.eval_rng.bit_generator.state = json.loads(state["eval_rng"])
        self.buffer.load_state_dict(state["buffer"])
        refreshed_at = self.refreshed_at
        self._refresh()
        self.acting.load_state_dict(state["acting"])
        self.refreshed_at = refreshed_at
        offset = None if self.rows_path is None else int(state["rows_offset"])
        return Position(**state["position"]), offset

    def _check_rows_file(self, recorded: str | None) -> None:
        """A resumed run appends to the interrupted run's ``-f`` rows: the same file."""
        if recorded == (str(self.rows_path) if self.rows_path is not None else None):
            return
        if recorded is None:
            raise HorizonError(
                f"--resume: the interrupted run wrote no -f rows, so it cannot give "
                f"{self.rows_path} all of them; resume without -f"
            )
        raise HorizonError(
            f"--resume: the interrupted run wrote its -f rows to {recorded}; resume with "
            f"-f {recorded}, where the rows so far wait to be continued"
        )

    def _online_state(self, position: Position, rows: RowsWriter | None) -> dict[str, Any]:
        """What the rest of the run depends on besides the driver's checkpoint (the class
        docstring lists it), as tensors and plain data."""
        return {
            "position": asdict(position),
            "steps": self.steps,
            "refreshed_at": self.refreshed_at,
            "ds": self.ds,
            "evaluations": [asdict(evaluation) for evaluation in self.evaluations],
            "warnings": list(self.warnings),
            "outputs": list(self.outputs),
            "rng": json.dumps(self.rng.bit_generator.state),
            "eval_rng": json.dumps(self.eval_rng.bit_generator.state),
            "buffer": self.buffer.state_dict(),
            "acting": self.acting.state_dict(),
            "rows_file": str(self.rows_path) if self.rows_path is not None else None,
            "rows_offset": rows.offset() if rows is not None else None,
        }

    def _flatten(self, observation: Any) -> np.ndarray:
        import gymnasium

        flat = gymnasium.spaces.flatten(self.observation_space, observation)
        return np.asarray(flat, dtype=np.float64).ravel()

    def _env_action(self, action: Any) -> Any:
        """What ``env.step`` takes for an action as the buffer holds it."""
        if self.continuous:
            space = self.env.action_space
            return np.asarray(action, dtype=space.dtype).reshape(space.shape)
        return self.first_action + int(action)

    def _reset_exploration(self) -> None:
        """A new episode: the continuous exploration module's ``reset()``, when it has one."""
        reset = getattr(self.acting, "reset", None) if self.continuous else None
        if callable(reset):
            reset()

    def _choose(self, state: np.ndarray) -> tuple[Any, float]:
        """Epsilon-greedy around the acting policy: (action index, its exact propensity). For
        a Box space: uniform inside the bounds in the warm-up, then the trainer's exploration
        module (its action clipped to the bounds, in case), with propensity 1.0 as the gym
        source logs continuous actions (a density is no probability, and the module's is not
        known)."""
        if self.continuous:
            if self.acting is None:
                return self.rng.uniform(self.low, self.high), 1.0
            action = self._actions(self.acting, state[None])[0]
            return np.clip(action, self.low, self.high), 1.0
        epsilon = epsilon_at(self.steps, self.config) if self.acting is not None else 1.0
        best = self._greedy(state) if epsilon < 1.0 else None
        exploration = Exploration("epsilon_greedy", epsilon)
        return exploration.explore_or_exploit(best, len(self.actions), self.rng)

    def _greedy(self, state: np.ndarray) -> int:
        return int(self._scores(self.acting, state[None]).argmax(dim=1))

    def _actions(self, policy: torch.nn.Module, states: np.ndarray) -> np.ndarray:
        """Continuous actions ``[rows, D]`` (float64) of a policy module on flattened states:
        its action, or the action of a stochastic policy's ``(action, log_density)``."""
        import torch

        device = self.driver.device
        values = torch.from_numpy(states.astype(np.float32)).to(device)
        with torch.no_grad():
            result = policy(values, torch.ones_like(values))
        if isinstance(result, tuple):
            result = result[0]
        return result.detach().to("cpu", torch.float64).numpy().reshape(len(states), -1)

    def _played(self, policy: torch.nn.Module, states: np.ndarray) -> list[Any]:
        """The evaluated policy's choices on flattened states, as ``_env_action`` takes them:
        the greedy action indices, or the deterministic continuous actions (within bounds)."""
        if self.continuous:
            return list(np.clip(self._actions(policy, states), self.low, self.high))
        return self._scores(policy, states).argmax(dim=1).tolist()

    def _scores(self, policy: torch.nn.Module, states: np.ndarray) -> torch.Tensor:
        """The policy's scores ``[rows, actions]`` of flattened states; a parametric policy is
        offered every action, in order, as its one-hot action features."""
        import torch

        device = self.driver.device
        values = torch.from_numpy(states.astype(np.float32)).to(device)
        presence = torch.ones_like(values)
        with torch.no_grad():
            if not self.action_feature_ids:
                return policy(values, presence)
            every = torch.eye(len(self.actions), device=device).expand(len(values), -1, -1)
            return policy(values, presence, every, every)

    def _logged(self, index: Any) -> tuple[Any, list[Any] | None]:
        """An action and the possible actions as the ``-f`` rows log them: the action names,
        with ``parametric_actions`` the one-hot feature maps, for a Box space the action's
        feature map (no possible actions), as the gym source logs them."""
        if self.continuous:
            values = np.asarray(index, dtype=np.float64).ravel()
            return dict(zip(self.action_feature_ids, map(float, values), strict=True)), None
        if not self.action_feature_ids:
            return self.actions[index], list(self.actions)
        maps: list[Any] = [{feature: 1.0} for feature in self.action_feature_ids]
        return maps[index], maps

    def _set_up(self) -> None:
        """At the end of the warm-up: fit (or, for a warm start, read) the normalization,
        write it, and start the training driver (which sets the trainer up, from the earlier
        run's checkpoint for a warm start), on ``[trainer] threads`` from here on."""
        trainer_config = self.spec.trainer.config
        warm_start = trainer_config.warm_start_from
        if warm_start:
            earlier = RunFolder(warm_start)
            normalization = earlier.normalization(self.plugins)
            path = earlier.file(RunFolder.NORMALIZATION)
            self._check_features(
                normalization, f"[trainer] warm_start_from = {warm_start!r}: {path}"
            )
        else:
            normalization = self._identify(self.spec.normalization_config)
        self.outputs.append(self.folder.write_normalization(normalization))
        self._start_driver(normalization)
        if "epochs" in trainer_config.model_fields_set:
            self.warnings.append(
                "[trainer] epochs is not used online: [gym] episodes and the score bar say "
                "how long to train"
            )
        self._refresh()

    def _start_driver(self, normalization: Normalization) -> None:
        """The training driver of this environment's problem, on ``[trainer] threads``."""
        import torch

        self.driver = TrainingDriver(
            self.run_context,
            self.spec.trainer,
            self._problem(normalization),
            normalization,
            plugins=self.plugins,
        )
        torch.set_num_threads(self.driver.threads)  # for training and acting; run() restores

    def _check_features(self, normalization: dict[str, dict[str, Any]], where: str) -> None:
        """Normalization read from a file must describe this environment's observations (and,
        with ``parametric_actions``, its one-hot actions)."""
        for name, expected in (
            ("state_features", self.feature_ids),
            ("action_features", self.action_feature_ids),
        ):
            found = list(normalization.get(name, {}))
            if found != expected:
                raise HorizonError(
                    f"{where} has {name} {found}; [gym] env = {self.config.env!r} "
                    f"(parametric_actions = {str(self.config.parametric_actions).lower()}) "
                    f"has {expected}"
                )

    def _problem(self, normalization: Normalization) -> ProblemDescription:
        """The problem the trainer is set up for: this environment's actions, discrete or
        (with ``parametric_actions``) one-hot action features, the features of
        ``normalization`` (this environment's, ``_check_features``) and the buffer's n-step
        window."""
        config = self.config
        action_type = ActionType.PARAMETRIC if self.action_feature_ids else ActionType.DISCRETE
        return ProblemDescription.for_data(
            ActionType.CONTINUOUS if self.continuous else action_type,
            self.actions,
            normalization,
            config.n_step,
            config.seed,
            self.spec.normalization_config.max_feature_value,
            online=True,
        )

    def _identify(self, config: NormalizationConfig) -> Normalization:
        """Identify each feature's normalization from (a sample of) the warm-up, as the
        normalization stage does from the timeline (same rules, overrides and notes): the
        states' features, with ``parametric_actions`` the one-hot action features (each
        present, as 1.0, wherever its action was taken), and for a Box space the action
        features as ``continuous_action`` over the Box's bounds (``_box_bounds``)."""
        from horizon_engine import identify_feature_sets

        transitions = len(self.buffer)
        rows = np.arange(transitions)
        if transitions > config.num_samples:
            chosen = np.random.default_rng(self.config.seed).choice(
                transitions, config.num_samples, replace=False
            )
            rows = np.sort(chosen)
        states = self.buffer.state[rows]
        samples = {feature: states[:, i] for i, feature in enumerate(self.feature_ids)}
        sets = {"state_features": (samples, config.overrides, False)}
        if self.continuous:
            actions = self.buffer.action[rows]
            samples = {feature: actions[:, j] for j, feature in enumerate(self.action_feature_ids)}
            sets["action_features"] = (samples, config.action_overrides, True)
        elif self.action_feature_ids:
            taken = np.bincount(self.buffer.action[rows], minlength=len(self.actions))
            samples = {
                feature: np.ones(int(count))
                for feature, count in zip(self.action_feature_ids, taken, strict=True)
            }
            sets["action_features"] = (samples, config.action_overrides, False)
        feature_types = self.plugins.feature_types()
        normalization, notes = identify_feature_sets(sets, config, feature_types)
        self.warnings += [f"normalization: {note}" for note in notes]
        if self.continuous:
            self._box_bounds(normalization["action_features"], config)
        return normalization

    def _box_bounds(
        self, parameters: dict[str, NormalizationParameters], config: NormalizationConfig
    ) -> None:
        """Each ``continuous_action`` feature (every action feature but those an override
        types otherwise) maps the Box's own [low, high], not the warm-up's observed range:
        uniform play never quite reaches the bounds, and an actor whose (-1, 1) mapped to the
        observed range could never play them; the bounds are also what the environment
        enforces, so every action the exported model emits lies inside them."""
        for j, feature in enumerate(self.action_feature_ids):
            found = parameters[feature]
            if found.feature_type != "continuous_action":
                continue
            bounds = {"min_value": float(self.low[j]), "max_value": float(self.high[j])}
            parameters[feature] = found.model_copy(update=bounds)

    def _refresh(self) -> None:
        """A fresh acting module: the trainer's policy, or for a Box space its exploration
        policy (an error naming the trainer when it has none)."""
        trainer = self.driver.trainer
        if self.continuous:
            if not isinstance(trainer, ExploresOnline):
                raise HorizonError(
                    f"[trainer] kind = {trainer.name!r} gives no exploration policy "
                    f"(it does not implement exploration_policy()), which [gym] env = "
                    f"{self.config.env!r}, a Box action space, needs to act with: train a "
                    "continuous-action trainer such as sac, td3 or ddpg"
                )
            self.acting = trainer.exploration_policy()
        else:
            self.acting = trainer.policy()
        self.refreshed_at = self.steps

    def _train(self) -> None:
        """A round of training when one is due, then a fresh acting policy when one is due."""
        config = self.config
        batch_size = self.spec.trainer.config.minibatch_size
        if self.steps % config.train_every_ts == 0 and len(self.buffer) >= batch_size:
            self.driver.train_sampled(self.buffer, config.num_train_batches)
        if self.steps - self.refreshed_at >= config.policy_refresh_ts:
            self._refresh()

    def _evaluation(self, episode: int) -> Evaluation:
        """Greedy episodes of the trained policy, added to the evaluations."""
        returns = self._greedy_returns(self.driver.trainer.policy())
        evaluation = Evaluation(self.steps, episode, returns)
        self.evaluations.append(evaluation)
        return evaluation

    def _reaches_bar(self, evaluation: Evaluation) -> bool:
        bar = self.config.score_bar
        return bar is not None and evaluation.mean_return >= bar

    def _end_epoch(
        self, evaluation: Evaluation, position: Position, rows: RowsWriter | None
    ) -> None:
        """The driver's end of an "epoch" with the evaluation's figures (the epoch hook, a
        checkpoint), the runner's state at ``position`` written just before it, and the
        previous evaluation's runner state removed once the checkpoint is in place."""
        returns = evaluation.returns
        metrics = {
            "Evaluation/mean_return": evaluation.mean_return,
            "Evaluation/min_return": float(min(returns)),
            "Evaluation/max_return": float(max(returns)),
            "Gym/timestep": float(self.steps),
            "Gym/episode": float(evaluation.episode),
        }
        if not self.continuous:
            metrics["Gym/epsilon"] = epsilon_at(self.steps, self.config)
        checkpoint = {
            "timestep": self.steps,
            "episode": evaluation.episode,
            "mean_return": evaluation.mean_return,
        }
        epoch = self.driver.epoch + 1
        save_online_state(self.output_dir, epoch, self._online_state(position, rows))
        self.driver.end_epoch(metrics, checkpoint=checkpoint)
        prune_online_states(self.output_dir, epoch)

    def _greedy_returns(self, policy: torch.nn.Module) -> list[float]:
        """One greedy episode in each evaluation environment (for a Box space: the actions of
        the deterministic ``policy()``, the action of a stochastic one's ``(action,
        log_density)``), played in lockstep (one forward pass per step for all of them), each
        reset with a fresh seed from the evaluation stream: deterministic for a run, never the
        training episodes' starts."""

        envs = self.eval_envs
        seeds = self.eval_rng.integers(2**31, size=len(envs))
        observations = [env.reset(seed=int(seed))[0] for env, seed in zip(envs, seeds, strict=True)]
        returns = np.zeros(len(envs))
        active = list(range(len(envs)))
        step = 0
        while active:
            states = np.stack([self._flatten(observations[i]) for i in active])
            chosen = self._played(policy, states)
            step += 1
            still = []
            for i, action in zip(active, chosen, strict=True):
                observation, reward, terminated, truncated, _ = envs[i].step(
                    self._env_action(action)
                )
                observations[i] = observation
                returns[i] += reward
                if not (terminated or truncated or step == self.config.max_steps):
                    still.append(i)
            active = still
        return returns.tolist()

    def _save_check_rows(self) -> None:
        """Keep ``TrainingDriver.CHECK_ROWS`` greedy-play states of the final policy (a
        parametric policy's with every action offered, in order): an export of this run is
        checked on them."""
        import torch

        states = self._greedy_states(self.driver.trainer.policy(), TrainingDriver.CHECK_ROWS)
        values = torch.from_numpy(states.astype(np.float32))
        rows = {"state": values, "state_presence": torch.ones_like(values)}
        if self.action_feature_ids and not self.continuous:
            every = torch.eye(len(self.actions)).expand(len(values), -1, -1)
            rows |= {
                "possible_action_features": every,
                "possible_action_presence": every,
                "possible_actions": torch.ones(every.shape[:2]),
            }
        self.driver.save_check_rows(rows)

    def _export(self) -> dict[str, Any] | None:
        """Export the final policy when ``[export]`` is configured and a policy was trained,
        checked on the saved greedy-play states (the exporter verifies its file against
        PyTorch on them); the exporter's outputs and details, or None."""
        if self.spec.export is None or self.driver is None:
            return None
        exported = export_policy(self.run_context, self.spec.export, self.driver.trainer.policy())
        self.outputs += exported["outputs"]
        return exported

    def _greedy_states(self, policy: torch.nn.Module, count: int) -> np.ndarray:
        """``count`` states the greedy policy visits (episodes from the evaluation stream)."""

        env = self.eval_envs[0]
        states: list[np.ndarray] = []
        while len(states) < count:
            observation, _ = env.reset(seed=int(self.eval_rng.integers(2**31)))
            for _ in range(count - len(states)):
                state = self._flatten(observation)
                states.append(state)
                action = self._played(policy, state[None])[0]
                observation, _, terminated, truncated, _ = env.step(self._env_action(action))
                if terminated or truncated:
                    break
        return np.stack(states)

    def _start_manifest(self) -> dict[str, Any]:
        """The run's manifest, as every command that runs in a folder starts it."""
        return self.folder.start_manifest(
            self.run_context.run_id,
            self.config.seed,
            self.spec.origin,
            self.spec.resolved(),
            self.plugins,
            command=GYM_COMMAND,
        )

    def _finish(self, manifest: dict[str, Any]) -> None:
        """The final manifest, then ``horizon_on_run_end``."""
        self.folder.finish_manifest(manifest, self._on_run_end)

    def _interrupted(self, manifest: dict[str, Any]) -> None:
        """``_finish`` for a run stopped by Ctrl-C (or SIGTERM), which ``--resume`` continues
        from its last complete evaluation."""
        self.folder.finish_interrupted(manifest, self._on_run_end)

    def _on_run_end(self, manifest: dict[str, Any]) -> None:
        self.plugins.on_run_end(self.run_context, manifest)
