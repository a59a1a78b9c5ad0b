"""The verdict: is the trained policy better than the one that logged the data, and by how much?

Every estimate of the reward (``cpe.json``'s ``final``, made by the ``[[evaluation]]``
entries) is a candidate. Candidates are compared in one unit, the first of ``UNIT_ORDER``
that any of them is in: the return per episode as the environment counts it (over at most the
longest logged episode's steps, ``horizon``: what happens past what was logged is unknown),
else the reward per decision, else a discounted return. A candidate with any failed check
(``Estimate.warnings``: too few episodes, too few effective ones, a poor model fit, an interval
that leaves out the model's error, a one-step estimator on episodes) is shown but excluded.
Of those left, the one whose estimator's ``verdict_preference`` is highest (the narrowest
interval among equals) is recommended: its figure is the estimate. The interval, and the
decision, span every estimate left: the smallest interval holding each one's interval of the
difference from the logged policy's value (paired resamples, so whatever the sign of the
values). Estimators of different families fail in different directions (on the truth
suite's CartPole logs the Q model overestimated policies the logger covered poorly where
marginalized importance sampling underestimated policies that left the logger's states),
so where they disagree the truth may lie anywhere between; a span that holds 0 is
``unclear``:

- ``better``: the whole interval is above 0; ``worse``: below;
- ``unclear``: it straddles 0, or no estimate passed its checks. Each says what data would
  settle it (``settle``). With no estimate passing, the closest one is shown, but the verdict's
  interval is every value the logged rewards allow in the unit (its ``feasible_low`` and
  ``feasible_high`` diagnostics): an interval that looks precise on five episodes would stop a
  user from shipping a good policy (or let a bad one through).

One owner: the evaluation stage (``evaluation_stage.verdict_of``) decides the verdict here
and writes it into ``cpe.json`` and the manifest; ``horizon run`` and ``horizon evaluate``
print it last (``verdict_lines``); the report page opens with it
(``report_sections.verdict_section``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from horizon_engine.errors import HorizonError
from horizon_engine.estimation import MIN_VERDICT_EPISODES, few_episodes_warning

METRIC = "reward"
"""The verdict judges the reward the trainer maximizes (other metrics stay in the table)."""

UNIT_ORDER = ("return per episode", "reward per decision")
"""The units the verdict prefers, in order; any other (a discounted return) comes after."""

NO_INTERVAL = "no interval to judge it by"
"""The failed check of an estimate without an interval (an estimator that made none)."""


@dataclass(frozen=True)
class Candidate:
    """One estimate of the reward, as the verdict weighs it."""

    label: str
    kind: str
    unit: str
    estimate: float
    low: float | None
    high: float | None
    logged: float | None
    relative: float | None
    relative_low: float | None
    relative_high: float | None
    difference_low: float | None
    difference_high: float | None
    preference: int
    failed: tuple[str, ...]
    diagnostics: Mapping[str, Any] = field(default_factory=dict)

    @property
    def trusted(self) -> bool:
        return not self.failed

    @property
    def width(self) -> float:
        if self.low is None or self.high is None:
            return math.inf
        return self.high - self.low

    def to_json(self) -> dict[str, Any]:
        return {
            "estimator": self.label,
            "kind": self.kind,
            "unit": self.unit,
            "estimate": self.estimate,
            "interval": _interval(self.low, self.high),
            "logged": self.logged,
            "relative": self.relative,
            "relative_interval": _interval(self.relative_low, self.relative_high),
            "difference_interval": _interval(self.difference_low, self.difference_high),
            "trusted": self.trusted,
            "failed": list(self.failed),
            "diagnostics": dict(self.diagnostics),
        }


def _interval(low: float | None, high: float | None) -> list[float] | None:
    return None if low is None or high is None else [low, high]


def _number(value: Any) -> float | None:
    """A finite float, else None (a record read back from disk may hold anything)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def candidates_of(
    final: Mapping[str, Any],
    kinds: Mapping[str, str],
    preferences: Mapping[str, int],
    episodes: int,
) -> list[Candidate]:
    """The reward estimates of ``final`` (``cpe.json``'s, by label) as candidates; ``kinds``
    and ``preferences`` by label. An estimate without a unit (an estimator that does not say)
    is taken as the return per episode, and one made on fewer than ``MIN_VERDICT_EPISODES``
    episodes fails that check (``few_episodes_warning``) whatever its estimator checked."""
    found = []
    for label, estimates in final.items():
        estimate = estimates.get(METRIC) if isinstance(estimates, Mapping) else None
        if not isinstance(estimate, Mapping) or _number(estimate.get("value")) is None:
            continue
        warnings = estimate.get("warnings")
        if not isinstance(warnings, list):
            warnings = []
        failed = [str(reason) for reason in warnings if reason]
        few = few_episodes_warning(episodes)
        if few and few not in failed:
            failed.append(few)
        low, high = _number(estimate.get("low")), _number(estimate.get("high"))
        if (low is None or high is None) and not any("interval" in f for f in failed):
            failed.append(NO_INTERVAL)
        unit = estimate.get("unit")
        diagnostics = estimate.get("diagnostics")
        found.append(
            Candidate(
                label=str(label),
                kind=kinds.get(label, str(label)),
                unit=unit if isinstance(unit, str) else "return per episode",
                estimate=_number(estimate.get("value")) or 0.0,
                low=low,
                high=high,
                logged=_number(estimate.get("logged_value")),
                relative=_number(estimate.get("relative")),
                relative_low=_number(estimate.get("relative_low")),
                relative_high=_number(estimate.get("relative_high")),
                difference_low=_number(estimate.get("difference_low")),
                difference_high=_number(estimate.get("difference_high")),
                preference=int(preferences.get(label, 0)),
                failed=tuple(failed),
                diagnostics=diagnostics if isinstance(diagnostics, Mapping) else {},
            )
        )
    return found


def _unit_rank(unit: str) -> int:
    return UNIT_ORDER.index(unit) if unit in UNIT_ORDER else len(UNIT_ORDER)


def _ranked(candidates: list[Candidate]) -> list[Candidate]:
    """Trusted first, then by unit, preference (highest first) and interval width."""
    return sorted(
        candidates,
        key=lambda c: (not c.trusted, _unit_rank(c.unit), -c.preference, c.width, c.label),
    )


def _figure(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


def _said(candidate: Candidate) -> str:
    """``weighted_dr: 98.1 [80.2, 110.3] return per episode``."""
    interval = ""
    if candidate.low is not None and candidate.high is not None:
        interval = f" [{_figure(candidate.low)}, {_figure(candidate.high)}]"
    return f"{candidate.label}: {_figure(candidate.estimate)}{interval} {candidate.unit}"


def _difference(candidate: Candidate) -> tuple[float | None, float | None]:
    """The interval of estimate minus logged value: the paired one, else the estimate's
    interval less the logged value."""
    if candidate.difference_low is not None and candidate.difference_high is not None:
        return candidate.difference_low, candidate.difference_high
    if candidate.low is None or candidate.high is None or candidate.logged is None:
        return None, None
    return candidate.low - candidate.logged, candidate.high - candidate.logged


def _hull(
    intervals: list[tuple[float | None, float | None]],
) -> tuple[float | None, float | None]:
    """The smallest interval holding every one of ``intervals``; (None, None) when any has
    no bound (an estimate without an interval cannot be spanned)."""
    if not intervals or any(low is None or high is None for low, high in intervals):
        return None, None
    return min(low for low, _ in intervals), max(high for _, high in intervals)


def _episodes_to_settle(candidate: Candidate, episodes: int) -> int | None:
    """About how many eval episodes would make the difference's interval exclude 0, its width
    shrinking as one over the square root of the episodes; None when it cannot tell."""
    low, high = _difference(candidate)
    if low is None or high is None or candidate.logged is None:
        return None
    gap = abs(candidate.estimate - candidate.logged)
    half = (high - low) / 2
    if gap <= 0 or half <= 0:
        return None
    return math.ceil(episodes * (half / gap) ** 2)


def _side(candidate: Candidate) -> str:
    """Where the candidate's own interval of the difference lies: above 0, below, or holding
    it."""
    low, high = _difference(candidate)
    if low is not None and low > 0:
        return "lies above 0"
    if high is not None and high < 0:
        return "lies below 0"
    return "holds 0"


def _settle_failures(failed: list[str], episodes: int) -> str:
    """What data would let the failed checks pass."""
    asks = []
    text = " ".join(failed)
    if episodes < MIN_VERDICT_EPISODES:
        asks.append(
            f"hold out more episodes (now {episodes}; at least {MIN_VERDICT_EPISODES}): raise "
            "[timeline] eval_fraction or log more episodes"
        )
    if "importance weights" in text or "no eval row logged" in text or "rarely went" in text:
        asks.append(
            "log with more exploration (a logger that takes the policy's actions more often, "
            "such as a larger epsilon), so that importance weights have support"
        )
    if "fits held-out rows" in text or "fixed point" in text or "holds the model fixed" in text:
        asks.append("more logged episodes for the models to fit")
    if "one-step estimator" in text:
        asks.append('a sequential estimator ([[evaluation]] kind = "weighted_dr" or "fqe")')
    return "; ".join(asks) or "more logged episodes"


def decide(candidates: list[Candidate], episodes: int) -> dict[str, Any]:
    """The verdict on ``candidates`` made on ``episodes`` eval episodes (see the module)."""
    ranked = _ranked(candidates)
    verdict: dict[str, Any] = {
        "estimator": None,
        "metric": METRIC,
        "unit": None,
        "estimate": None,
        "interval": None,
        "logged": None,
        "relative": None,
        "relative_interval": None,
        "difference_interval": None,
        "trusted": False,
        "horizon": None,
        "decision": "unclear",
        "reasons": [],
        "settle": None,
        "eval_episodes": episodes,
        "candidates": [candidate.to_json() for candidate in ranked],
    }
    if not ranked:
        verdict["reasons"] = ["no estimator estimated the reward on the eval split"]
        verdict["settle"] = (
            'run an estimator of the reward ([[evaluation]] kind = "weighted_dr" or '
            '"fqe") on an eval split ([timeline] eval_fraction > 0)'
        )
        return verdict
    chosen = ranked[0]
    low, high = _difference(chosen)
    verdict.update(
        estimator=chosen.label,
        unit=chosen.unit,
        estimate=chosen.estimate,
        interval=_interval(chosen.low, chosen.high),
        logged=chosen.logged,
        relative=chosen.relative,
        relative_interval=_interval(chosen.relative_low, chosen.relative_high),
        difference_interval=_interval(low, high),
        trusted=chosen.trusted,
        horizon=_number(chosen.diagnostics.get("horizon")),
    )
    reasons: list[str] = verdict["reasons"]
    if not chosen.trusted:
        reasons.append("no estimator passed its checks; the closest, " + _said(chosen) + ":")
        reasons.extend(chosen.failed)
        feasible = _interval(
            _number(chosen.diagnostics.get("feasible_low")),
            _number(chosen.diagnostics.get("feasible_high")),
        )
        verdict.update(interval=feasible, relative_interval=None, difference_interval=None)
        if feasible is not None:
            reasons.append(
                f"so the interval is every value the logged rewards allow, [{_figure(feasible[0])}"
                f", {_figure(feasible[1])}]: an estimate that failed its checks narrows nothing"
            )
        verdict["settle"] = _settle_failures(list(chosen.failed), episodes)
        return verdict
    agreeing = [c for c in ranked if c.trusted and c.unit == chosen.unit and c is not chosen]
    low, high = _hull([_difference(c) for c in [chosen, *agreeing]])
    if agreeing and low is not None and high is not None:
        hull = _hull([(c.low, c.high) for c in [chosen, *agreeing]])
        relative = _hull([(c.relative_low, c.relative_high) for c in [chosen, *agreeing]])
        verdict.update(
            interval=_interval(*hull),
            relative_interval=_interval(*relative),
            difference_interval=_interval(low, high),
        )
        reasons.append(
            "every estimate that passed its checks counts: "
            + "; ".join(_said(c) for c in [chosen, *agreeing])
            + f"; the verdict's interval is their span, [{_figure(hull[0])}, "
            f"{_figure(hull[1])}] (estimators of different families err in different "
            "directions: where they disagree, the truth may lie anywhere between)"
        )
    against = f"the logged policy's {_figure(chosen.logged)}"
    if low is None or high is None:
        reasons.append(f"{_said(chosen)} has no interval to decide by")
        verdict["settle"] = "an interval ([[evaluation]] num_bootstrap > 0)"
        return verdict
    estimate_said = f"{_said(chosen)}, against {against}"
    difference = (
        "the span of their differences from it" if agreeing else "the interval of the difference"
    )
    if low > 0:
        verdict["decision"] = "better"
        reasons.append(
            f"{estimate_said}: {difference}, [{_figure(low)}, {_figure(high)}], lies above 0"
        )
    elif high < 0:
        verdict["decision"] = "worse"
        reasons.append(
            f"{estimate_said}: {difference}, [{_figure(low)}, {_figure(high)}], lies below 0"
        )
    else:
        reasons.append(
            f"{estimate_said}: {difference}, [{_figure(low)}, {_figure(high)}], holds 0 (parity)"
        )
        needed = _episodes_to_settle(chosen, episodes)
        if _side(chosen) != "holds 0":  # the span holds 0, the recommended estimate does not
            sides = ", ".join(f"{c.label}'s {_side(c)}" for c in [chosen, *agreeing])
            verdict["settle"] = (
                f"the estimates disagree (their intervals of the difference: {sides}); more "
                "eval episodes narrow each interval, and logs that explore more (a larger "
                "epsilon) bring the estimators' families together"
            )
        else:
            verdict["settle"] = (
                f"about {needed:,} eval episodes (now {episodes}) would settle a difference "
                "this size, if it is real"
                if needed is not None
                else "more eval episodes"
            )
    untrusted = [candidate.label for candidate in ranked if not candidate.trusted]
    if untrusted:
        reasons.append(
            "left out for failing their checks: " + ", ".join(untrusted) + " (see each one's)"
        )
    return verdict


MAX_SHIP_CANDIDATES = 10
"""The most epochs' checkpoints ``[export] checkpoint = "best"`` evaluates: each costs a whole
evaluation stage (the default estimators' refit intervals)."""


def ship_candidates(epochs: Sequence[int]) -> list[int]:
    """The epochs (of ``epochs``, ascending) whose checkpoints are evaluated to choose the one
    to ship: every one, or ``MAX_SHIP_CANDIDATES`` spread evenly from the first to the last."""
    if len(epochs) <= MAX_SHIP_CANDIDATES:
        return list(epochs)
    step = (len(epochs) - 1) / (MAX_SHIP_CANDIDATES - 1)
    return [epochs[round(index * step)] for index in range(MAX_SHIP_CANDIDATES)]


def _lower_bound(verdict: Mapping[str, Any]) -> float | None:
    """The verdict's lower bound of the difference from the logged policy, None where it
    rests on no trusted estimate or has no interval."""
    interval = verdict.get("difference_interval")
    if verdict.get("trusted") is not True or not isinstance(interval, list) or not interval:
        return None
    return _number(interval[0])


def ship_choice(verdicts: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """The epoch to ship of the epochs' ``verdicts`` (``(epoch, verdict)``, ascending): of
    those whose verdict rests on a trusted estimate, in the unit that comes first
    (``UNIT_ORDER``), the one with the highest lower bound of its difference from the logged
    policy: the epoch most surely better (or least surely worse), not the one whose estimate
    is highest on an interval that says little; the later epoch among equals. With no
    trusted verdict, the last epoch (nothing to choose by). Returns the choice as the verdict
    records it (``"checkpoint"``): the epoch, the candidates' verdicts in short, the reason."""
    last = verdicts[-1][0]
    bounded = [
        (epoch, verdict, bound)
        for epoch, verdict in verdicts
        if (bound := _lower_bound(verdict)) is not None
    ]
    unit = min((str(v.get("unit")) for _, v, _ in bounded), key=_unit_rank, default=None)
    comparable = [(epoch, v, bound) for epoch, v, bound in bounded if v.get("unit") == unit]
    candidates = [
        {
            "epoch": epoch,
            "decision": verdict.get("decision"),
            "estimator": verdict.get("estimator"),
            "estimate": verdict.get("estimate"),
            "interval": verdict.get("interval"),
            "difference_interval": verdict.get("difference_interval"),
            "unit": verdict.get("unit"),
            "trusted": verdict.get("trusted") is True,
        }
        for epoch, verdict in verdicts
    ]
    choice: dict[str, Any] = {
        "rule": "best",
        "epoch": last,
        "last_epoch": last,
        "evaluated": [epoch for epoch, _ in verdicts],
        "candidates": candidates,
    }
    if not comparable:
        choice["reason"] = (
            f"no evaluated epoch's verdict rests on an estimate that passed its checks, so "
            f"nothing can choose between them: the last epoch, {last}, is shipped"
        )
        return choice
    epoch, _, bound = max(comparable, key=lambda found: (found[2], found[0]))
    last_bound = next((b for e, _, b in comparable if e == last), None)
    against = (
        f"the last epoch's is {_figure(last_bound)}"
        if last_bound is not None
        else f"the last epoch's verdict, {last}'s, passed no check in that unit"
    )
    choice["epoch"] = epoch
    choice["reason"] = (
        f"of the {len(verdicts)} epochs evaluated ({', '.join(map(str, choice['evaluated']))}), "
        f"epoch {epoch}'s verdict has the highest lower bound of the difference from the "
        f"logged policy, {_figure(bound)} {unit}; {against}"
    )
    return choice


def shipped_epoch(verdict: Any, epochs: Sequence[int], where: str) -> int:
    """The epoch a verdict read back from ``cpe.json`` (``where``) chose to ship, checked:
    one of ``epochs``, those whose checkpoints the run folder holds. A record copied from
    elsewhere may name anything."""
    choice = verdict.get("checkpoint") if isinstance(verdict, Mapping) else None
    epoch = choice.get("epoch") if isinstance(choice, Mapping) else None
    if choice is None:
        raise HorizonError(
            f"{where}: its verdict chose no checkpoint to ship; run the evaluation stage "
            'with [export] checkpoint = "best" (--stages evaluation,export)'
        )
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch not in epochs:
        raise HorizonError(
            f"{where}: field 'verdict.checkpoint.epoch' is {epoch!r:.40}, not an epoch whose "
            "checkpoint the run folder holds"
        )
    return epoch


def verdict_lines(verdict: Mapping[str, Any]) -> list[str]:
    """The verdict for people, a few lines: the decision and the recommended estimate, the
    reasons, what would settle it. Reads a record from disk, so any field may be missing."""
    decision = verdict.get("decision")
    headlines = {
        "better": "BETTER than the logged policy",
        "worse": "WORSE than the logged policy",
    }
    headline = headlines.get(
        decision if isinstance(decision, str) else "", "UNCLEAR whether it beats the logged policy"
    )
    lines = [f"verdict: {headline}"]
    estimate = _number(verdict.get("estimate"))
    if estimate is not None:
        interval = verdict.get("interval")
        shown = ""
        if isinstance(interval, list) and len(interval) == 2:
            shown = f" [{_figure(_number(interval[0]))}, {_figure(_number(interval[1]))}]"
        relative = _number(verdict.get("relative"))
        horizon = _number(verdict.get("horizon"))
        over = f" (over at most {horizon:.0f} steps)" if horizon is not None else ""
        lines.append(
            f"  {verdict.get('estimator')}: {_figure(estimate)}{shown} {verdict.get('unit')}"
            f"{over}, "
            f"logged policy {_figure(_number(verdict.get('logged')))}"
            + (f" ({relative:.3g}x)" if relative is not None else "")
        )
    for reason in verdict.get("reasons") or ():
        lines.append(f"  - {reason}")
    if verdict.get("settle"):
        lines.append(f"  to settle it: {verdict['settle']}")
    choice = verdict.get("checkpoint")
    if isinstance(choice, Mapping) and _number(choice.get("epoch")) is not None:
        lines.append(f"  shipped: epoch {choice['epoch']:.0f}: {choice.get('reason')}")
    return lines
