"""The CPE truth suite's smallest case (``benchmarks/cpe_truth.py``, short profile,
``cartpole_random`` alone): logged uniformly random CartPole, five policies trained and played
in the real environment, every estimator run as ``horizon evaluate --data`` runs it.

It holds what the suite measures today and understands: the played truths spread (the
deliberately bad policy last, the long-trained one first), every figure is computed and finite,
the one-step estimators say parity on CartPole (every reward is 1, so any policy earns 1 per
step), and the sequential estimators, which estimate the discounted return, put the bad policy
last and come near the discounted truth of the policies that end early. Nothing here says the
estimators are good enough to ship on: the suite's job is to record how far they are.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import cpe_truth

SEQUENTIAL = ("sequential_dr", "weighted_dr", "magic", "fqe")


@pytest.mark.slow
def test_the_truth_suite_on_random_cartpole(tmp_path):
    """One test, so that the suite runs once whatever worker pytest-xdist gives it (about 20 s
    of CPU here)."""
    torch.set_num_threads(1)
    profile = cpe_truth.PROFILES["short"]
    (result,) = cpe_truth.run_suite(profile, 7, tmp_path, ["cartpole_random"])
    check_played_truth_spreads_the_policies(result, profile.played)
    check_every_figure_is_computed_and_finite(result)
    check_one_step_estimators_say_parity_whatever_the_policy(result)
    check_sequential_estimators_put_the_bad_policy_last_near_its_truth(result)
    check_the_default_verdict_ships_no_policy_worse_than_the_logger(result)


def check_played_truth_spreads_the_policies(result: cpe_truth.DatasetResult, played: int):
    """Measured (seed 7, 50 played episodes): bad 8.7, random 23.8, few 19.5, mid 208.5,
    many 490.8 per episode; the logger 22.6 over its 1,000 episodes."""
    truth = {policy.name: policy.truth for policy in result.policies}
    others = [value.undiscounted for name, value in truth.items() if name != "bad"]
    assert truth["bad"].undiscounted < 0.7 * min(others), truth
    assert truth["many"].undiscounted > 5 * result.logger.undiscounted, truth
    for value in truth.values():
        assert value.per_step == 1.0 and value.episodes == played
        assert value.discounted < value.undiscounted


def check_every_figure_is_computed_and_finite(result: cpe_truth.DatasetResult):
    for kind in cpe_truth.estimator_kinds():
        figure = cpe_truth.figures(result, kind)
        assert math.isfinite(figure.relative_error), figure
        assert 0.0 <= figure.regret <= 1.0, figure
        assert figure.coverage is None or 0.0 <= figure.coverage <= 1.0, figure
        assert figure.near_coverage is None or figure.coverage <= figure.near_coverage <= 1.0
        assert figure.spearman is None or -1.0 <= figure.spearman <= 1.0, figure
    report = cpe_truth.report(result)
    assert "return per episode, discounted at 0.99" in report
    assert "reward per step" in report and "return per episode, undiscounted" in report


def check_one_step_estimators_say_parity_whatever_the_policy(result: cpe_truth.DatasetResult):
    """The issue's "one-step estimator on a sequential problem": per decision, every CartPole
    policy earns 1, so ``dm``, ``snips`` and ``dr`` say 1.0 relative for the policy that drops
    the pole and for the one that holds it 500 steps alike (measured: within 1e-5)."""
    for policy in result.policies:
        for kind in ("dm", "snips", "dr"):
            assert abs(policy.estimates[kind].relative - 1.0) < 0.01, (policy.name, kind)


def check_sequential_estimators_put_the_bad_policy_last_near_its_truth(
    result: cpe_truth.DatasetResult,
):
    """Measured: every sequential kind's lowest estimate is the bad policy's (8.7 against 15.6
    and more for the others), and for the policies that end early (bad, random, few) the raw
    estimate lies within 12% of the discounted truth; the median relative error over the five
    policies is 4% to 7%. Above that, the discounted value saturates (the truth's 87.5 and
    99.2 for 208 and 491 steps), the estimates of mid and many both reach about 100 and
    rank mid first: Spearman 0.9 and a regret of 59% of the gap, not asserted here."""
    by_name = {policy.name: policy for policy in result.policies}
    for kind in SEQUENTIAL:
        values = {name: policy.estimates[kind].value for name, policy in by_name.items()}
        assert min(values, key=values.get) == "bad", (kind, values)
        for name in ("bad", "random", "few"):
            truth = by_name[name].truth.discounted
            assert abs(values[name] - truth) < 0.25 * truth, (kind, name, values[name], truth)
        assert cpe_truth.figures(result, kind).relative_error < 0.25, kind


def check_the_default_verdict_ships_no_policy_worse_than_the_logger(
    result: cpe_truth.DatasetResult,
):
    """The verdict a pipeline at its defaults reaches, per policy. Measured (seed 7, truth
    over the first 94 steps, the longest logged episode's, the logger's 22.6): bad worse (9.1
    [8.8, 15.1] against 8.7), random and few unclear (their truths 23.8 and 19.5 beside the
    logger's), mid unclear (fqe 94.0, but mis's lower bound 21.2 keeps the span across
    parity), many better (93.1 [25.6, 93.4] against 94.0); Spearman 0.97. That mid is not
    shipped and that the intervals cover 3 of 5 truths are the issue's open bars, not
    asserted."""
    figure = cpe_truth.verdict_figures(result)
    assert figure.false_ships == [], figure
    assert figure.decisions["bad"] == "worse (fqe)", figure
    assert figure.decisions["many"].startswith("better"), figure
    assert figure.spearman is not None and figure.spearman >= 0.9, figure


def test_figures_of_a_made_up_data_set():
    """The figures by hand: three policies of true returns 10, 50 and 100 per episode
    (discounted 9, 40 +- a standard error of 0.6, and 60), every reward 1."""

    def truth(undiscounted: float, discounted: float, error: float = 0.0) -> cpe_truth.Truth:
        return cpe_truth.Truth(undiscounted, discounted, 1.0, 100, 0.0, error)

    def estimate(value: float, low: float | None = None, high: float | None = None):
        return cpe_truth.Estimate(value, low, high, value / 18.0, 18.0)

    estimates = {
        "weighted_dr": [estimate(9, 8, 10), estimate(44, 41, 47), estimate(54, 50, 70)],
        "fqe": [estimate(30), estimate(20), estimate(10)],
        "dm": [estimate(1.0, 1.0, 1.0)] * 3,
    }
    policies = [
        cpe_truth.PolicyResult(name, truth(*truths), {k: v[i] for k, v in estimates.items()})
        for i, (name, truths) in enumerate(
            [("bad", (10, 9)), ("mid", (50, 40, 0.6)), ("good", (100, 60))]
        )
    ]
    result = cpe_truth.DatasetResult("made_up", truth(20, 18), 0.99, 10, policies, 0.0)

    weighted = cpe_truth.figures(result, "weighted_dr")
    assert weighted.unit == "return per episode, discounted at 0.99"
    assert weighted.relative_error == pytest.approx(0.1)  # errors 0, 4/40, 6/60
    assert weighted.ratio_error == pytest.approx(0.1)  # the same, both sides over 18
    assert weighted.coverage == pytest.approx(2 / 3)  # 40 lies outside [41, 47]
    assert weighted.near_coverage == 1.0  # but 40 + 2 * 0.6 reaches it
    assert (weighted.spearman, weighted.regret) == (pytest.approx(1.0), 0.0)

    reversed_ranking = cpe_truth.figures(result, "fqe")
    assert reversed_ranking.coverage is None
    assert reversed_ranking.spearman == pytest.approx(-1.0)
    assert reversed_ranking.regret == pytest.approx(1.0)  # ships the worst: (100 - 10) / 90

    tied = cpe_truth.figures(result, "dm")
    assert tied.unit == "reward per step"
    assert (tied.relative_error, tied.coverage, tied.near_coverage) == (0.0, 1.0, 1.0)
    assert tied.spearman is None
    assert tied.regret == pytest.approx((100 - 160 / 3) / 90)  # a choice among all three


def test_figures_at_gamma_one_judge_the_return_cut_at_the_horizon():
    """The kinds at gamma 1 (``<kind>.g1``) are judged against the return of the first 94
    steps (the longest logged episode) and, as ``<kind>.g1@eval``, of the first 70 (the
    longest eval episode, the estimator's own horizon): a policy that holds the pole 300
    steps earns 94 and 70 there, one that drops it after 9 earns 9 in both."""

    def truth(full: float, cut: float, eval_cut: float) -> cpe_truth.Truth:
        return cpe_truth.Truth(full, 0.9 * full, 1.0, 100, 0.0, 0.0, cut, 0.0, eval_cut, 0.0)

    estimates = [cpe_truth.Estimate(9.0, 8.0, 10.0, 0.5, 18.0)]
    estimates.append(cpe_truth.Estimate(70.0, 69.0, 70.0, 3.9, 18.0))
    policies = [
        cpe_truth.PolicyResult(name, truth(*truths), {"fqe.g1": estimate})
        for name, truths, estimate in zip(
            ("bad", "good"), ((9, 9, 9), (300, 94, 70)), estimates, strict=True
        )
    ]
    result = cpe_truth.DatasetResult("made_up", truth(20, 20, 20), 0.99, 10, policies, 0.0, 94, 70)
    logged = cpe_truth.figures(result, "fqe.g1")
    assert logged.unit == "return per episode, first 94 steps"
    assert logged.relative_error == pytest.approx((0 + 24 / 94) / 2)
    assert logged.coverage == 0.5  # 70 misses 94
    own = cpe_truth.figures(result, "fqe.g1@eval")
    assert own.unit == "return per episode, first 70 steps"
    assert (own.relative_error, own.coverage, own.regret) == (0.0, 1.0, 0.0)
    assert "fqe.g1@eval" in cpe_truth.judged_kinds()
    assert "fqe.g1@eval" not in cpe_truth.estimator_kinds()
