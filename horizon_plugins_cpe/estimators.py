"""The CPE estimators as ``[[evaluation]]`` components: one per kind, all on one config.

One-step (contextual bandit): ``dm``, ``ips``, ``snips``, ``dr``. Sequential, over whole
episodes: ``sequential_dr``, ``weighted_dr``, ``magic``, and the direct method ``fqe`` (the Q
model's value of each episode's first state, no importance weight), and ``mis``
(marginalized importance sampling: each step weighted by the ratio of the policies' state
distributions there, ``horizon_plugins_cpe.marginalized``). Each turns the core's
``EvaluationEpisodes`` into the formulas' ``CpeInputs`` (numpy, in episode and step order):
the reward and every logged metric, the logged action and its propensity, the evaluated
policy's probabilities under the entry's exploration, the possible actions and the state
features. The models the formulas need are cross-fitted here on the eval split
(``horizon_plugins_cpe.models``): a reward model for ``dm`` and ``dr``; ``ips`` and ``snips``
need none. The sequential kinds need the evaluated policy's ``Q``: with ``q_model = "auto"``
(the default) it is fitted for every metric by bounded FQE on the trained network's hidden
layer where the trainer offers it (``EvaluationModels.q_features``, from a trainer with
``OffersEvaluationModels``, as dqn: ``"network_fqe"``); else the policy's own scores when the
trainer declares them Q-values of the reward under its discount (it ``Discounts``), as
Horizon used its DQN's Q, with FQE on the state features for the other metrics; else FQE on
the state features for every metric (``"fqe"``). The hidden layer is the default because on
the CartPole example its estimates were of the truth's size where the DQN's scores
(conservative Q-learning's values) and linear FQE on the state features, which cannot
represent Q there, were far too small; it ranks a run's epochs less well than the scores,
and once the policy plays well its value is near the ceiling ``1 / (1 - gamma)`` and the
bounded estimates sit at it, so they tell a good policy from a bad one, not good ones apart
(measured: docs/measurements.md#network_fqe; ``tests/test_cpe_cartpole.py``). Inputs and
models are kept for the episodes last seen, so the entries of one epoch (one policy output,
one split) build the inputs once and fit each model once.

Every estimate comes back per metric (``"reward"``, then each logged metric by name) as an
``Estimate``: raw, relative to the logged policy's value, with a bootstrap interval over
episodes and the effective sample size. Continuous actions have no probability of the logged
action under the evaluated policy, so only the direct methods apply to them, ``dm`` and
``fqe``, with models of (state, action) evaluated at the policy's own action
(``horizon_plugins_cpe.continuous``); the other kinds raise ``NotApplicable`` with that
reason, which the core records in ``cpe.json``.

numpy, scipy and torch are imported where they are used, so listing plugins stays fast.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from horizon_engine import (
    ActionType,
    Estimate,
    EstimatorBase,
    EstimatorConfig,
    EvaluationEpisodes,
    HorizonError,
    NotApplicable,
)

if TYPE_CHECKING:
    import numpy as np
    import torch

    from horizon_plugins_cpe.diagnostics import Checked
    from horizon_plugins_cpe.formulas import CpeInputs, CpeOptions, MetricEstimate, ModelValues

CONTINUOUS_REASON = (
    "continuous actions: an importance weight needs both policies' densities at the logged "
    "action, and the rows' action_probability is a probability (1.0 for continuous logs, as "
    "Horizon's), while a deterministic policy has no density at all; on continuous actions "
    "only the direct methods apply, dm (a reward model at the policy's action) and fqe "
    "(fitted-Q evaluation)"
)
"""What ``cpe.json`` records for an importance-weighted entry on continuous actions."""

CONTINUOUS_KINDS = ("dm", "fqe")
"""The kinds that evaluate a continuous policy: models of (state, action) at its own action
(``horizon_plugins_cpe.continuous``)."""

REWARD_METRIC = "reward"
"""The name of the reward's estimates; a logged metric of that name is ``metrics.reward``
(or left out when it equals the reward on every row)."""


class CpeConfig(EstimatorConfig):
    """Options of every CPE estimator (``[[evaluation]] kind = "dm"``, ``"magic"``, ...)."""

    gamma: float | None = Field(default=None, ge=0.0, le=1.0)
    """Discount per step of the sequential estimators; by default the trainer's own (dqn's
    gamma), or 1.0 for a trainer without one."""
    num_bootstrap: int = Field(default=200, ge=0, le=100_000)
    """Bootstrap resamples of the episodes for each interval; 0 computes no interval. At most
    100,000: a percentile interval has settled long before (1,000 to 2,000 resamples is
    the usual advice), and drawing 100,000 resamples of 10,000 episodes already takes about
    15 s per estimator, the time (and the resamples' memory) growing in proportion beyond."""
    confidence: float = Field(default=0.95, gt=0.0, lt=1.0)
    """Coverage of the intervals."""
    weight_clip: float | None = Field(default=None, gt=0.0)
    """Clip each importance weight (per step ratio) at this value; off by default."""
    propensity_floor: float | None = Field(default=None, gt=0.0, le=1.0)
    """Raise logged propensities below this to it before dividing; off by default."""
    seed: int | None = None
    """Seed of the bootstrap and the models' cross-fitting folds; by default the run's."""
    q_model: Literal["auto", "network_fqe", "scores", "fqe"] = "auto"
    """The sequential kinds' Q of the evaluated policy: "network_fqe" fits Q for every metric
    on the eval split linearly in the trained network's last hidden layer (the trainer's
    ``q_features``, as dqn offers), its bootstrapped values bounded to the feasible returns;
    "scores" takes the policy's scores as Q-values of the reward (a Q-learning trainer's;
    other metrics get fitted-Q evaluation); "fqe" fits Q for every metric on the eval split
    linearly in the state features. "auto" takes "network_fqe" where the trainer offers
    ``q_features``, else the scores when the trainer has a discount (it declares its scores
    Q-values under it) and the entry does not set another gamma, else "fqe"."""


def _numpy(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().double().numpy()


NO_CANDIDATES_NOTE = (
    "{count} of {rows} eval rows offered no candidates (nothing was chosen there, as on "
    "Horizon's last rows of an episode): each is taken as its logged action, weight 1"
)
"""The note every estimate of parametric episodes with such rows carries."""


def _logged_slots(data: Any, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each parametric row's logged action as the index of the candidate it is (the first real
    candidate whose features and presence equal the logged action's), and which rows offered
    no candidates at all (their slot is 0). A row with candidates none of which is its logged
    action is bad input: its probability under the evaluated policy is unknown."""
    import numpy as np

    same = (data.possible_action_features == data.action.unsqueeze(1)) & (
        data.possible_action_presence == data.action_presence.unsqueeze(1)
    )
    match = same.all(dim=2) & (data.possible_actions > 0)
    found = match.any(dim=1).cpu().numpy()
    offered = (data.possible_actions > 0).any(dim=1).cpu().numpy()
    unknown = np.flatnonzero(offered & ~found)
    if len(unknown):
        shown = ", ".join(f"sequence_number {int(steps[row])}" for row in unknown[:5])
        raise HorizonError(
            f"[[evaluation]] {len(unknown)} of {len(found)} eval rows log an action that is none "
            f"of the candidates they offered (first: {shown}): its probability under the "
            "evaluated policy is unknown"
        )
    return match.double().argmax(dim=1).cpu().numpy().astype(np.int64), ~offered


def metric_columns(episodes: EvaluationEpisodes) -> tuple[tuple[str, ...], list[Any]]:
    """The names and per-row tensors of what is estimated: the reward, then each logged
    metric by name (a metric named ``reward`` that is not the reward itself as
    ``metrics.reward``)."""
    import torch

    names, columns = [REWARD_METRIC], [episodes.data.reward]
    for name, values in sorted(episodes.metrics.items()):
        if name == REWARD_METRIC:
            if torch.equal(values.to(episodes.data.reward), episodes.data.reward):
                continue
            name = f"metrics.{name}"
        names.append(name)
        columns.append(values)
    return tuple(names), columns


def cpe_inputs(episodes: EvaluationEpisodes) -> tuple[CpeInputs, str | None]:
    """The formulas' inputs from the core's episodes (discrete or parametric actions), and a
    note every estimate on them carries (parametric rows that offered no candidates)."""
    return split_inputs(episodes).with_policy(episodes.policy.probabilities)


@dataclass(eq=False)
class _SplitInputs:
    """The formulas' inputs that depend on the eval split alone: all but the evaluated
    policy's probabilities, which ``with_policy`` adds. Held by weak reference to the
    split's data, as ``_Prepared``: built once for a training's epochs, whose split does not
    change (rebuilding them was about 1 ms of every epoch's end on the example)."""

    data: weakref.ref
    metrics: int
    """``id()`` of the episodes' metrics dict (alive as long as the data it comes with)."""
    inputs: CpeInputs
    """The inputs, ``target_probabilities`` empty."""
    no_choice: np.ndarray | None
    """Parametric rows that offered no candidates (their logged action is the only one)."""
    note: str | None

    def matches(self, episodes: EvaluationEpisodes) -> bool:
        return self.data() is episodes.data and self.metrics == id(episodes.metrics)

    def with_policy(self, probabilities: torch.Tensor) -> tuple[CpeInputs, str | None]:
        """The inputs with the evaluated policy's ``probabilities`` ``[N, A]``, and the note."""
        target = _numpy(probabilities)
        if self.no_choice is not None:
            target = target.copy()
            target[self.no_choice] = 0.0
            target[self.no_choice, 0] = 1.0
        return replace(self.inputs, target_probabilities=target), self.note


_SPLITS: list[_SplitInputs] = []
"""The last eval splits' inputs (the newest last), found by the identity of their data and
metrics; at most ``PREPARED_KEPT``."""


def split_inputs(episodes: EvaluationEpisodes) -> _SplitInputs:
    """What the formulas' inputs take from the episodes' split, built on first use; on
    continuous actions (or a policy without probabilities) ``NotApplicable``."""
    import numpy as np

    from horizon_plugins_cpe.formulas import CpeInputs

    if episodes.action_type is ActionType.CONTINUOUS or episodes.policy.probabilities is None:
        raise NotApplicable(CONTINUOUS_REASON)
    for entry in _SPLITS:
        if entry.matches(episodes):
            return entry
    data = episodes.data
    names, columns = metric_columns(episodes)
    rewards = np.stack([_numpy(column) for column in columns], axis=1)
    possible = data.possible_actions.detach().cpu().numpy() > 0
    steps = data.step.detach().cpu().numpy()
    logged_propensity = _numpy(data.action_probability)
    no_choice, note = None, None
    if episodes.action_type is ActionType.DISCRETE:
        action = data.action.detach().cpu().numpy().astype(np.int64)
        # A row that recorded no possible actions has all of them possible (as the policy's).
        possible = np.where(possible.any(axis=1, keepdims=True), possible, True)
    else:
        action, offered_none = _logged_slots(data, steps)
        if offered_none.any():
            # No choice was made: the logged action is the only one, under either policy.
            no_choice = offered_none
            possible[no_choice, 0] = True
            logged_propensity = logged_propensity.copy()
            logged_propensity[no_choice] = 1.0
            note = NO_CANDIDATES_NOTE.format(count=int(no_choice.sum()), rows=len(no_choice))
    features = np.concatenate([_numpy(data.state), _numpy(data.state_presence)], axis=1)
    inputs = CpeInputs(
        episode_starts=episodes.episode_starts.detach().cpu().numpy().astype(np.int64),
        rewards=rewards,
        metric_names=names,
        action=action,
        logged_propensity=logged_propensity,
        target_probabilities=np.empty((len(action), 0)),
        possible=possible,
        features=features,
        row_label=lambda row: f"sequence_number {int(steps[row])}",
        horizon=episodes.horizon,
    )
    entry = _SplitInputs(weakref.ref(data), id(episodes.metrics), inputs, no_choice, note)
    _SPLITS.append(entry)
    del _SPLITS[:-PREPARED_KEPT]
    return entry


@dataclass(eq=False)
class _Prepared:
    """The inputs made from one ``EvaluationEpisodes``'s data, policy output and metrics, and
    the models fitted on them, by model kind and options. The data and the policy output are
    held by weak reference: the cache never keeps an eval split or an epoch's output alive."""

    data: weakref.ref
    output: weakref.ref
    metrics: int
    """``id()`` of the episodes' metrics dict (alive as long as the data it comes with)."""
    inputs: CpeInputs
    note: str | None
    """What every estimate on these inputs says of them (``cpe_inputs``)."""
    models: dict[tuple[str, CpeOptions], ModelValues] = field(default_factory=dict)
    coverage: dict[tuple[Any, ...], float] = field(default_factory=dict)
    """The policy's state coverage (``marginalized.state_coverage``) by the options it
    depends on (the ratios' features, propensity floor and clip): the Q kinds of one epoch
    share it, as they share their Q model."""
    hidden: np.ndarray | None = None
    """The trainer's hidden layer on every row (``q_features``), once computed
    (``hidden_layer``): the Q model, the state coverage and ``mis`` all read it."""
    ratio_inputs: CpeInputs | None = None
    """The inputs with the hidden layer's principal components as features (``mis``'s and
    the state coverage's), once built."""

    def hidden_layer(self, episodes: EvaluationEpisodes) -> np.ndarray:
        """The trainer's hidden layer on every row, computed on first use."""
        import torch

        if self.hidden is None:
            q_features = episodes.models.q_features
            assert q_features is not None  # asked for only where the trainer offers it
            with torch.no_grad():
                hidden = q_features(episodes.data.state, episodes.data.state_presence)
            self.hidden = _numpy(hidden)
        return self.hidden

    def matches(self, episodes: EvaluationEpisodes) -> bool:
        return (
            self.data() is episodes.data
            and self.output() is episodes.policy
            and self.metrics == id(episodes.metrics)
        )

    @property
    def policy(self) -> Any:
        """The policy output the inputs were made of (alive while an estimate uses it)."""
        return self.output()


_PREPARED: list[_Prepared] = []
"""The last few episodes' inputs and models (the newest last), found by the identity of the
episodes' data, policy output and metrics, which the core shares between the entries of one
epoch. An entry goes when its policy output is collected (the next epoch makes another)."""

PREPARED_KEPT = 2
"""How many episodes' inputs and models are kept at most: an epoch's two explorations, say."""


def _forget(entry: _Prepared) -> None:
    if entry in _PREPARED:
        _PREPARED.remove(entry)


def prepared(episodes: EvaluationEpisodes) -> _Prepared:
    """The inputs (and models fitted so far) of these episodes, built on first use."""
    for entry in _PREPARED:
        if entry.matches(episodes):
            return entry
    entry = _Prepared(
        weakref.ref(episodes.data),
        weakref.ref(episodes.policy),
        id(episodes.metrics),
        *cpe_inputs(episodes),
    )
    _PREPARED.append(entry)
    weakref.finalize(episodes.policy, _forget, entry)
    del _PREPARED[:-PREPARED_KEPT]
    return entry


def _estimate(result: MetricEstimate, note: str | None, checked: Checked) -> Estimate:
    """The formulas' estimate of one metric as the core's ``Estimate``, with the inputs'
    ``note`` after its own and what its checks found (``diagnostics.diagnose``)."""
    return Estimate(
        value=result.value,
        low=result.low,
        high=result.high,
        logged_value=result.logged_value,
        relative=result.relative,
        relative_low=result.relative_low,
        relative_high=result.relative_high,
        effective_sample_size=result.effective_sample_size,
        note="; ".join(part for part in (result.note, note) if part) or None,
        difference_low=result.difference_low,
        difference_high=result.difference_high,
        unit=checked.unit,
        diagnostics=checked.diagnostics,
        warnings=tuple(checked.warnings),
    )


def _checked_estimates(
    kind: str,
    inputs: Any,
    models: ModelValues | None,
    options: CpeOptions,
    found: dict[str, MetricEstimate],
    note: str | None,
    coverage: float | None = None,
) -> dict[str, Estimate]:
    """Every metric's estimate with its checks (``diagnostics.diagnose``; ``coverage`` the
    policy's state coverage for the kinds that lean on a Q model, None where unmeasured)."""
    from horizon_plugins_cpe.diagnostics import diagnose

    return {
        name: _estimate(
            result, note, diagnose(kind, inputs, models, options, result, metric, coverage)
        )
        for metric, (name, result) in enumerate(found.items())
    }


class CpeEstimator(EstimatorBase):
    """The shared half of the CPE estimators: a subclass names its kind and the model it
    needs (``"reward"``, ``"q"`` or None)."""

    Config: ClassVar[type[CpeConfig]] = CpeConfig
    config: CpeConfig
    model: ClassVar[str | None] = None

    def options(self, episodes: EvaluationEpisodes) -> CpeOptions:
        """The formulas' options: the config's, the discount and seed resolved."""
        from horizon_plugins_cpe.formulas import CpeOptions

        config = self.config
        gamma = config.gamma
        if gamma is None:
            gamma = episodes.discount if episodes.discount is not None else 1.0
        seed = config.seed
        if seed is None:
            seed = episodes.seed if episodes.seed is not None else 0
        return CpeOptions(
            gamma=float(gamma),
            num_bootstrap=config.num_bootstrap,
            confidence=config.confidence,
            weight_clip=config.weight_clip,
            propensity_floor=config.propensity_floor,
            seed=int(seed),
        )

    def estimate(self, episodes: EvaluationEpisodes) -> dict[str, Estimate | float]:
        """An ``Estimate`` per metric (``reward`` first); ``NotApplicable`` on continuous
        actions. ``details`` records the options in force (the discount resolved and where it
        came from, clipping, floor, seed) and the metrics estimated."""
        from horizon_plugins_cpe.formulas import estimate

        options = self.options(episodes)
        if episodes.action_type is ActionType.CONTINUOUS:
            return self._continuous(episodes, options)
        entry = prepared(episodes)
        model = self.model
        if model == "q":
            model = self._q_model(episodes)
        models = None
        if model is not None:
            key = (model, options)
            if key not in entry.models:
                entry.models[key] = self._fit(model, entry, options, episodes)
            models = entry.models[key]
        found = estimate(self.name, self._inputs(entry, episodes), models, options)
        gamma_from = "config" if self.config.gamma is not None else "trainer"
        if self.config.gamma is None and episodes.discount is None:
            gamma_from = "default"
        self.details = {
            **asdict(options),
            "gamma_from": gamma_from,
            "metrics": list(entry.inputs.metric_names),
        }
        if self.model == "q":
            self.details["q_model"] = "fqe" if model == "q" else model
        if models is not None and models.note:
            self.details["model_note"] = models.note
        blends = {
            name: {"j_steps": list(result.j_steps), "weights": list(result.magic_weights)}
            for name, result in found.items()
            if result.j_steps is not None and result.magic_weights is not None
        }
        if blends:
            self.details["magic_blend"] = blends
        from horizon_plugins_cpe.diagnostics import Q_KINDS
        from horizon_plugins_cpe.marginalized import state_coverage

        coverage = None
        if self.name in Q_KINDS:
            key = (self.config.q_model, options.propensity_floor, options.weight_clip)
            if key not in entry.coverage:
                ratio_inputs = self._ratio_inputs(entry, episodes)
                entry.coverage[key] = state_coverage(ratio_inputs, options)
            coverage = entry.coverage[key]
        return _checked_estimates(
            self.name, entry.inputs, models, options, found, entry.note, coverage
        )

    def _continuous(
        self, episodes: EvaluationEpisodes, options: CpeOptions
    ) -> dict[str, Estimate | float]:
        """``dm`` and ``fqe`` on continuous actions, by models of (state, action) evaluated at
        the policy's own action; ``NotApplicable`` for the importance-weighted kinds."""
        import numpy as np

        from horizon_plugins_cpe.continuous import ContinuousInputs, continuous_model_values
        from horizon_plugins_cpe.formulas import direct_per_decision, direct_per_episode

        if self.name not in CONTINUOUS_KINDS:
            raise NotApplicable(CONTINUOUS_REASON)
        data = episodes.data
        names, columns = metric_columns(episodes)
        inputs = ContinuousInputs(
            episode_starts=episodes.episode_starts.detach().cpu().numpy().astype(np.int64),
            rewards=np.stack([_numpy(column) for column in columns], axis=1),
            metric_names=names,
            features=np.concatenate([_numpy(data.state), _numpy(data.state_presence)], axis=1),
            action=_numpy(data.action * data.action_presence),
            policy_action=_numpy(episodes.policy.action),
        )
        sequential = self.name == "fqe"
        models = continuous_model_values(inputs, options, sequential)
        direct = direct_per_episode if sequential else direct_per_decision
        found = direct(inputs, models.expected, options)
        self.details = {
            **asdict(options),
            "metrics": list(names),
            "model": "fitted-Q evaluation of (state, action)"
            if sequential
            else "reward model of (state, action)",
        }
        if models.note:
            self.details["model_note"] = models.note
        return _checked_estimates(self.name, inputs, models, options, found, models.note)

    def _inputs(self, entry: _Prepared, episodes: EvaluationEpisodes) -> CpeInputs:
        """The formulas' inputs of this entry: the prepared ones (``mis`` swaps in its
        features)."""
        return entry.inputs

    def _ratio_inputs(self, entry: _Prepared, episodes: EvaluationEpisodes) -> CpeInputs:
        """The inputs with the features the state-distribution ratios are fitted on: the
        Q model's (``q_model``), the trainer's hidden layer where it offers ``q_features``
        and ``q_model`` is "auto" or "network_fqe", else the state features."""
        from horizon_plugins_cpe.marginalized import network_features

        offered = episodes.models.q_features is not None
        if self.config.q_model not in ("auto", "network_fqe") or not offered:
            return entry.inputs
        if entry.ratio_inputs is None:
            features = network_features(entry.hidden_layer(episodes))
            entry.ratio_inputs = replace(entry.inputs, features=features)
        return entry.ratio_inputs

    def _q_model(self, episodes: EvaluationEpisodes) -> str:
        """This entry's Q (``q_model`` resolved): ``network_fqe``, ``scores`` or ``q`` (FQE on
        the state features). ``network_fqe`` without ``q_features`` falls back as "auto"."""
        wanted = self.config.q_model
        if wanted == "fqe":
            return "q"
        if wanted in ("auto", "network_fqe") and episodes.models.q_features is not None:
            return "network_fqe"
        if episodes.policy.scores is None:
            return "q"
        if wanted == "scores":
            return "scores"
        gamma = self.config.gamma
        if episodes.discount is not None and (gamma is None or gamma == episodes.discount):
            return "scores"
        return "q"

    def _fit(
        self, model: str, entry: _Prepared, options: CpeOptions, episodes: EvaluationEpisodes
    ) -> ModelValues:
        """The ``model``'s values on the prepared inputs: ``reward`` (ridge), ``q`` (FQE),
        ``network_fqe`` (bounded FQE on the trainer's ``q_features``) or ``scores`` (the
        policy's scores for the reward, FQE for the other metrics)."""
        import numpy as np

        from horizon_plugins_cpe.formulas import ModelValues
        from horizon_plugins_cpe.models import q_model_values, reward_model_values

        inputs = entry.inputs
        if model == "reward":
            return reward_model_values(inputs, options)
        if model == "q":
            return q_model_values(inputs, options)
        if model == "network_fqe":  # _q_model chose it because the trainer offers q_features
            return q_model_values(inputs, options, entry.hidden_layer(episodes))
        scores = entry.policy.scores.detach().cpu().double().numpy()
        scores = np.where(inputs.possible, scores, 0.0)
        logged = scores[np.arange(len(scores)), inputs.action]
        expected = (scores * inputs.target_probabilities).sum(axis=1)
        if inputs.rewards.shape[1] == 1:
            return ModelValues(logged[:, None], expected[:, None])
        fitted = q_model_values(inputs, options)
        logged_all, expected_all = fitted.logged.copy(), fitted.expected.copy()
        logged_all[:, 0], expected_all[:, 0] = logged, expected
        return ModelValues(logged_all, expected_all, fitted.note)


class DirectMethod(CpeEstimator):
    """Direct method: the reward model's expected reward under the policy, per decision."""

    name = "dm"
    model = "reward"


class InversePropensity(CpeEstimator):
    """Inverse propensity scoring: logged rewards times pi(a|x) / mu(a|x), per decision."""

    name = "ips"


class SelfNormalizedIps(CpeEstimator):
    """Self-normalized IPS: IPS divided by the mean importance weight, per decision."""

    name = "snips"


class DoublyRobust(CpeEstimator):
    """Doubly robust: the direct method plus the weighted reward-model error, per decision."""

    name = "dr"
    model = "reward"


class SequentialDoublyRobust(CpeEstimator):
    """Sequential doubly robust (Jiang & Li 2016): discounted return per episode.

    Its model is the evaluated policy's Q (``q_model``)."""

    name = "sequential_dr"
    model = "q"


class WeightedDoublyRobust(CpeEstimator):
    """Weighted doubly robust (Thomas & Brunskill 2016): discounted return per episode.

    Sequential DR with the cumulative importance weights self-normalized per time step."""

    name = "weighted_dr"
    model = "q"
    default_entries = ({"gamma": 1.0, "every_epoch": False},)
    verdict_preference = 2


class FittedQEvaluation(CpeEstimator):
    """Fitted-Q evaluation: the model's discounted return per episode from its first state.

    The direct method over whole episodes: no importance weight, so it evaluates any policy,
    continuous or deterministic, and is only as good as its Q model."""

    name = "fqe"
    model = "q"
    default_entries = (
        {"gamma": 1.0, "every_epoch": False},
        {"label": "fqe_discounted", "every_epoch": False},
    )
    verdict_preference = 1


class Magic(CpeEstimator):
    """MAGIC (Thomas & Brunskill 2016): blended j-step weighted DR, return per episode.

    The weights minimize x^T (Cov + b b^T) x over the simplex: variance plus squared bias."""

    name = "magic"
    model = "q"
    verdict_preference = 3


class MarginalizedImportanceSampling(CpeEstimator):
    """Marginalized importance sampling (Xie, Ma & Wang 2019): return per episode, each step
    weighted by the ratio of the policies' state distributions there (fitted step by step by
    ridge regression), so no weight is a product along the episode.

    Its features are the Q model's (``q_model``): the trainer's hidden layer where it offers
    ``q_features`` and ``q_model`` is "auto" or "network_fqe", else the state features."""

    name = "mis"
    default_entries = ({"gamma": 1.0, "every_epoch": False},)

    def _inputs(self, entry: _Prepared, episodes: EvaluationEpisodes) -> CpeInputs:
        inputs = self._ratio_inputs(entry, episodes)
        self._features = (
            "state features"
            if inputs is entry.inputs
            else "the trained network's hidden layer (principal components)"
        )
        return inputs

    def estimate(self, episodes: EvaluationEpisodes) -> dict[str, Estimate | float]:
        found = super().estimate(episodes)
        self.details["features"] = self._features
        return found


ESTIMATORS: tuple[type[CpeEstimator], ...] = (
    DirectMethod,
    InversePropensity,
    SelfNormalizedIps,
    DoublyRobust,
    SequentialDoublyRobust,
    WeightedDoublyRobust,
    Magic,
    FittedQEvaluation,
    MarginalizedImportanceSampling,
)
"""Every CPE estimator, in the order ``horizon plugins`` lists them."""

KINDS: tuple[str, ...] = tuple(estimator.name for estimator in ESTIMATORS)
"""Their ``[[evaluation]] kind`` names: what ``horizon evaluate`` runs when a run has no
``[[evaluation]]`` entries."""
