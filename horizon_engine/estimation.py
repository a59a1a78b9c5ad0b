"""The estimator contract: what a counterfactual estimator receives and returns.

An estimator answers "what would the trained policy have earned on the eval split's states,
had it made the decisions?" from logged data alone. It receives the eval split as episodes
(``EvaluationEpisodes``: the rows in episode and step order, with the logged propensities,
rewards and metrics, the evaluated policy's ``PolicyOutput`` on every row, the models the
trainer trained beside the policy, its discount and the run's seed) and returns named
estimates: an ``Estimate`` (the value with its interval, relative to the logged policy's value,
and its effective sample size) or a plain float. An estimator that cannot apply to the data at
all (importance weights of a continuous policy, which gives no probability of the logged
action) raises ``NotApplicable`` with the reason, which the core records instead of a number.
The training driver runs the ``[[evaluation]]`` estimators after every epoch (``every_epoch``)
and the evaluation stage runs them once after training (``horizon_engine.evaluation``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from horizon_engine.capabilities import NO_EVALUATION_MODELS, EvaluationModels
from horizon_engine.components import ComponentConfig, Estimator
from horizon_engine.errors import HorizonError
from horizon_engine.policies import ExplorationConfig

if TYPE_CHECKING:
    import torch

    from horizon_engine.dataset import TimelineTensors
    from horizon_engine.policies import PolicyOutput
    from horizon_engine.schema import ActionType


LABEL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
"""What an ``[[evaluation]] label`` may be: a TensorBoard tag's part and a plain word."""


MIN_VERDICT_EPISODES = 20
"""The fewest eval episodes an estimate may rest on to count in the verdict: a percentile
bootstrap over fewer understates the spread (it cannot show what the few episodes did not
happen to hold), and the issue that asked for the verdict set its bar for a decision here."""


def few_episodes_warning(episodes: int) -> str | None:
    """The warning an estimate on ``episodes`` eval episodes carries, None when they are
    enough (``MIN_VERDICT_EPISODES``): one sentence, which every estimator and the verdict
    share."""
    if episodes >= MIN_VERDICT_EPISODES:
        return None
    return (
        f"only {episodes} eval episodes: an interval resampled from so few understates the "
        f"uncertainty (at least {MIN_VERDICT_EPISODES} are needed)"
    )


class NotApplicable(HorizonError):
    """Raised by ``EstimatorBase.estimate`` when the estimator cannot apply to these episodes at
    all (say, importance weights for continuous actions); the message is the reason, which the
    core records for the entry (``cpe.json``'s ``entries``) instead of an estimate."""


@dataclass(frozen=True)
class Estimate:
    """One estimate of the evaluated policy's value with what is needed to judge it.

    ``value`` is the raw estimate (the metric's mean per episode under the evaluated policy, or
    per decision for one-step estimators), ``low`` and ``high`` its confidence interval (None
    when none was computed), ``logged_value`` the logging policy's value of the same quantity
    on the same rows, ``relative`` = ``value / logged_value`` (1.0 = parity, the Horizon paper's
    Figure 2) with its interval, None when the logged value is too near zero to divide by (the
    ``note`` says so), ``difference_low`` and ``difference_high`` the interval of ``value -
    logged_value`` from the same resamples (what decides better or worse whatever the sign of
    the values), and ``effective_sample_size`` of the importance weights where there are any.

    ``unit`` says what ``value`` measures ("return per episode", "return per episode,
    discounted at 0.99", "reward per decision"); ``diagnostics`` the figures the estimator
    checked its assumptions with (effective sample size, the share of episodes with a weight,
    the model's fit on held-out rows, ...); ``warnings`` each check it failed, as a reason not
    to trust it: an estimate with any is shown but left out of the verdict
    (``horizon_engine.verdict``).
    """

    value: float
    low: float | None = None
    high: float | None = None
    logged_value: float | None = None
    relative: float | None = None
    relative_low: float | None = None
    relative_high: float | None = None
    effective_sample_size: float | None = None
    note: str | None = None
    difference_low: float | None = None
    difference_high: float | None = None
    unit: str | None = None
    diagnostics: Mapping[str, float | None] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object; a value that is not finite becomes null."""
        import math

        def plain(value: Any) -> Any:
            if value is None or isinstance(value, str):
                return value
            if isinstance(value, Mapping):
                return {str(key): plain(item) for key, item in value.items()}
            if isinstance(value, tuple | list):
                return [plain(item) for item in value]
            number = float(value)
            return number if math.isfinite(number) else None

        return {name: plain(getattr(self, name)) for name in self.__dataclass_fields__}


class EstimatorConfig(ExplorationConfig):
    """Options every ``[[evaluation]]`` entry accepts: the exploration under which the trained
    policy's action probabilities are computed, and when the estimator runs."""

    every_epoch: bool = True
    """Also run after every training epoch, on the eval split (TensorBoard ``CPE/...``)."""
    label: str | None = Field(default=None, pattern=LABEL_PATTERN)
    """The entry's name in ``cpe.json``, on TensorBoard (``CPE/<metric>/<label>``) and in the
    verdict; by default its kind (with ``[i]``, its position, when two entries share a
    name). Letters, digits, ``_``, ``.`` and ``-``, at most 64."""


@dataclass
class EvaluationEpisodes:
    """The eval split as episodes: rows sorted by episode, then by step.

    ``data`` holds the rows as the batch schema names them (``reward``, ``action``,
    ``action_probability`` the logged propensity, ``episode_id``, ``step``, ...);
    ``episode_starts`` ``[E + 1]`` are the offsets of each episode's first row (and the row
    count), so episode ``e`` is rows ``episode_starts[e]:episode_starts[e + 1]``.
    """

    action_type: ActionType
    data: TimelineTensors
    episode_starts: torch.Tensor
    policy: PolicyOutput
    """The evaluated policy on every row's state, under the entry's exploration."""
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    """Each logged metric's value per row (``[N]``, 0 where a row lacks it), when rows carry a
    ``metrics`` map; the reward is ``data.reward``."""
    models: EvaluationModels = NO_EVALUATION_MODELS
    """What the trainer offers besides its policy (``OffersEvaluationModels``): the
    Q-network's features, ...; none of them when it offers none."""
    discount: float | None = None
    """The trainer's discount per step (``Discounts``), None when it has none."""
    seed: int | None = None
    """The run's seed, for estimators that draw random numbers (bootstrap intervals)."""
    horizon: int | None = None
    """The most rows any logged episode has (train and eval splits): the horizon a return
    per episode is counted over, which the eval split's own episodes may fall short of;
    None when unknown (the estimators then take the eval split's longest)."""

    @property
    def episode_count(self) -> int:
        return len(self.episode_starts) - 1

    def episode_totals(self, values: torch.Tensor) -> torch.Tensor:
        """``[E]``: the sum of a per-row ``values`` ``[N]`` over each episode's rows."""
        import torch

        lengths = self.episode_starts.diff()
        episodes = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        totals = torch.zeros(len(lengths), dtype=torch.float64)
        return totals.index_add_(0, episodes, values.detach().cpu().double())


class EstimatorBase(Estimator):
    """An estimator the driver and the evaluation stage can run. Subclass it and register it
    as an estimator; ``[[evaluation]] kind`` selects it by ``name``."""

    Config: ClassVar[type[ComponentConfig]] = EstimatorConfig
    default_entries: ClassVar[tuple[Mapping[str, Any], ...]] = ()
    """The ``[[evaluation]]`` entries of this kind (options, without ``kind``) that a pipeline
    training a policy runs when it writes no ``[[evaluation]]`` (``config.implied_sections``):
    each estimator says where it belongs in the default set, so an installed plugin's joins."""
    verdict_preference: ClassVar[int] = 0
    """Among the estimates that pass their checks in the verdict's unit, the verdict recommends
    the one of the highest preference (the narrowest interval among equals): how much the
    estimator's figures have earned trust on the truth suite (``benchmarks/cpe_truth.py``)."""
    details: dict[str, Any]
    """What the last ``estimate`` wants recorded beside its figures (the options in force, such
    as the discount it resolved); the core writes it into ``cpe.json``'s ``entries``."""

    def __init__(self, config: ComponentConfig) -> None:
        super().__init__(config)
        self.details = {}

    @abstractmethod
    def estimate(self, episodes: EvaluationEpisodes) -> dict[str, Estimate | float]:
        """Named estimates for the evaluated policy (or the logged one) on ``episodes``: an
        ``Estimate`` per metric for a counterfactual estimator (``"reward"``, then each logged
        metric), or plain floats. An estimate it cannot make is left out, not reported as a
        number it does not mean; when it can make none on such data, raise
        ``NotApplicable`` with the reason."""
