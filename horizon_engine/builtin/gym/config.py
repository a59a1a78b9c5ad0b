"""gym.toml: the ``[gym]`` section, and the pipeline sections it shares, validated together.

``[normalization]``, ``[trainer]`` and ``[export]`` are pipeline.toml's sections, checked by the
same rules (``load_config_sections``), so a gym file's mistakes read like a pipeline file's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from horizon_engine import (
    Choice,
    ComponentConfig,
    ConfigError,
    ConfigSections,
    NormalizationConfig,
    PluginHost,
    load_config_sections,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

GYM_SECTIONS: tuple[str, ...] = ("gym", "normalization", "trainer", "export")
"""The sections of gym.toml; the last three are pipeline.toml's, validated the same way."""


class GymSection(ComponentConfig):
    """Online training in a Gymnasium environment: the environment, the schedule, the outputs.

    The ``[gym]`` section of gym.toml.
    """

    env: str = "CartPole-v1"
    """The Gymnasium environment id; its action space must be Discrete, or a Box with finite
    bounds for a continuous-action trainer (one with an exploration_policy: sac, td3, ddpg)."""
    seed: int = Field(default=0, ge=0)
    """Seeds the environments, the exploration, the replay sampling and the network weights."""
    episodes: int = Field(default=300, ge=1)
    """Most training episodes to play (evaluation episodes do not count)."""
    max_steps: int | None = Field(default=None, ge=1)
    """Most steps per episode (a truncation); None keeps the environment's own time limit."""
    replay_buffer_size: int = Field(default=100_000, ge=1)
    """Transitions the replay buffer holds; the oldest are overwritten first."""
    n_step: int = Field(default=1, ge=1)
    """Steps of the multi-step windows the replay buffer gives each transition (1: none), as
    [timeline] n_step does offline; a trainer with n_step > 1 needs the same value, and the
    dqn trainers' default (n_step = 0) follows it."""
    train_after_ts: int = Field(default=1000, ge=1)
    """Steps of uniform random play before training: they fit the normalization."""
    train_every_ts: int = Field(default=1, ge=1)
    """Steps between two rounds of training."""
    num_train_batches: int = Field(default=1, ge=1)
    """Minibatches ([trainer] minibatch_size transitions each) per round of training."""
    test_every_ts: int = Field(default=2000, ge=1)
    """Steps between two evaluations of the greedy policy (and checkpoints)."""
    avg_over_num_episodes: int = Field(default=20, ge=1)
    """Greedy episodes per evaluation; their mean return is compared with the score bar."""
    epsilon_start: float = Field(default=1.0, ge=0.0, le=1.0)
    """Exploration rate when training starts (Discrete spaces; a Box space explores with the
    trainer's own noise)."""
    epsilon_end: float = Field(default=0.02, ge=0.0, le=1.0)
    """Exploration rate after the decay."""
    epsilon_decay_steps: int = Field(default=10_000, ge=0)
    """Steps after train_after_ts over which epsilon falls linearly from start to end."""
    score_bar: float | None = None
    """Stop once an evaluation's mean return reaches it (--score-bar overrides)."""
    policy_refresh_ts: int = Field(default=10, ge=1)
    """Steps between two copies of the trainer's policy for acting."""
    parametric_actions: bool = False
    """Give the trainer each action as one-hot action features whose ids follow the state's
    (CartPole: "4" and "5"), as the gym source's parametric_actions logs them: for parametric
    trainers such as parametric_dqn."""
    torch_threads: int | None = Field(default=None, ge=1)
    """CPU threads for torch during the run; deprecated: [trainer] threads says it for every
    way of training, and this is used only while that is not set."""
    output_dir: str = "runs/gym"
    """Folder for normalization.json, problem.json, checkpoints/, check_rows.pt, tensorboard/,
    manifest.json and model.onnx."""
    ds: str | None = None
    """The ``ds`` date written into every -f row; None writes today's date (ISO)."""

    @model_validator(mode="after")
    def _consistent(self) -> GymSection:
        if self.epsilon_end > self.epsilon_start:
            raise ValueError(
                f"epsilon_end = {self.epsilon_end} is above epsilon_start = "
                f"{self.epsilon_start}; epsilon decays from start to end"
            )
        return self


@dataclass(frozen=True)
class GymSpec:
    """A validated gym.toml: the ``[gym]`` options and the chosen components."""

    origin: str
    gym: GymSection
    trainer: Choice
    normalization: Choice | None = None
    export: Choice | None = None

    @property
    def choices(self) -> dict[str, Choice]:
        """The configured component sections, by section name."""
        sections = [
            ("normalization", self.normalization),
            ("trainer", self.trainer),
            ("export", self.export),
        ]
        return {name: choice for name, choice in sections if choice is not None}

    @property
    def normalization_config(self) -> NormalizationConfig:
        """The ``[normalization]`` options, defaults without the section. Its ``engine`` has no
        use online: the warm-up's states are in memory, not in a timeline to sample."""
        if self.normalization is None:
            return NormalizationConfig()
        return self.normalization.config  # type: ignore[return-value]

    def resolved(self) -> dict[str, Any]:
        """The config as resolved, defaults filled in, as manifest.json records it."""
        resolved: dict[str, Any] = {"gym": self.gym.model_dump(mode="json")}
        for name, choice in self.choices.items():
            resolved[name] = choice.resolved()
        return resolved


def load_gym_spec(
    source: str | Path | Mapping[str, Any],
    plugins: PluginHost | None,
    overrides: Iterable[str] = (),
) -> GymSpec:
    """Load gym.toml (a path or a dict), apply ``--set`` overrides, and validate it against
    ``plugins``' components (the process's plugins when None).

    ``[normalization]``, ``[trainer]`` and ``[export]`` are validated exactly as in
    pipeline.toml, and every mistake is reported at once with the file, line, section and key.
    """
    sections = load_config_sections(
        source,
        {"gym": GymSection},
        GYM_SECTIONS[1:],
        overrides,
        plugins,
        what="gym file",
        required={
            "trainer": "a gym file needs a [trainer] section choosing the trainer, e.g. "
            '[trainer] kind = "dqn"'
        },
    )
    gym: GymSection = sections.options["gym"]  # type: ignore[assignment]
    chosen = sections.choices
    trainer = chosen["trainer"]
    threads = trainer.config.threads if "threads" in trainer.config.model_fields_set else None
    if gym.torch_threads is not None and threads is None:
        config = trainer.config.model_copy(update={"threads": gym.torch_threads})
        trainer = Choice(trainer.section, trainer.component, config, trainer.rule)
    spec = GymSpec(sections.origin, gym, trainer, chosen.get("normalization"), chosen.get("export"))
    _check_spec(spec, sections)
    return spec


def _check_spec(spec: GymSpec, sections: ConfigSections) -> None:
    """What no one section can check alone: the sections' options against each other."""
    problems = []
    batch = spec.trainer.config.minibatch_size
    if batch > spec.gym.replay_buffer_size:
        problems.append(
            f"{sections.where('trainer', 'minibatch_size')}: [trainer] minibatch_size = "
            f"{batch} is larger than [gym] replay_buffer_size = {spec.gym.replay_buffer_size}; "
            "training samples minibatches from the buffer"
        )
    if problems:
        raise ConfigError(problems)


def epsilon_at(step: int, config: GymSection) -> float:
    """The exploration rate of the action chosen at ``step`` (0-based, over all episodes).

    1 during the warm-up (``step < train_after_ts``), then linear from ``epsilon_start`` to
    ``epsilon_end`` over ``epsilon_decay_steps`` steps, then ``epsilon_end``.
    """
    if step < config.train_after_ts:
        return 1.0
    if config.epsilon_decay_steps == 0:
        return config.epsilon_end
    done = min(1.0, (step - config.train_after_ts) / config.epsilon_decay_steps)
    return config.epsilon_start + (config.epsilon_end - config.epsilon_start) * done
