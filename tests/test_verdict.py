"""The verdict (horizon_engine.verdict): which estimate it recommends, what it decides and why,
on crafted estimates; and at the end of a pipeline that names only its trainer."""

import json
import math

from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.estimation import MIN_VERDICT_EPISODES, few_episodes_warning
from horizon_engine.verdict import candidates_of, decide, verdict_lines

EPISODES = 100


def estimate(value, low, high, logged=20.0, unit="return per episode", warnings=(), **extra):
    """An estimate of the reward as cpe.json's ``final`` holds it; the difference interval is
    the estimate's less the logged value unless given."""
    return {
        "reward": {
            "value": value,
            "low": low,
            "high": high,
            "logged_value": logged,
            "relative": value / logged,
            "difference_low": extra.get("difference_low", low - logged),
            "difference_high": extra.get("difference_high", high - logged),
            "unit": unit,
            "warnings": list(warnings),
            "diagnostics": extra.get("diagnostics", {}),
        }
    }


def verdict(final, preferences=None, episodes=EPISODES):
    kinds = {label: label.split("[")[0] for label in final}
    found = candidates_of(final, kinds, preferences or {}, episodes)
    return decide(found, episodes)


def test_an_interval_of_the_difference_above_zero_is_better_below_is_worse():
    better = verdict({"fqe": estimate(60.0, 50.0, 70.0)})
    assert better["decision"] == "better"
    assert better["estimator"] == "fqe" and better["interval"] == [50.0, 70.0]
    assert better["logged"] == 20.0 and better["relative"] == 3.0
    assert "lies above 0" in better["reasons"][0]
    worse = verdict({"fqe": estimate(10.0, 5.0, 15.0)})
    assert worse["decision"] == "worse" and "lies below 0" in worse["reasons"][0]


def test_the_paired_difference_decides_not_the_estimates_interval_against_the_logged_value():
    """Resampled together, estimate and logged value can differ surely though the estimate's
    interval holds the logged value (both move with the same episodes)."""
    found = verdict({"fqe": estimate(25.0, 15.0, 35.0, difference_low=2.0, difference_high=8.0)})
    assert found["decision"] == "better"


def test_negative_returns_are_judged_by_the_difference_not_the_ratio():
    """Acrobot's returns are negative: -150 against a logged -500 is better though the ratio
    is 0.3."""
    found = verdict({"fqe": estimate(-150.0, -180.0, -120.0, logged=-500.0)})
    assert found["decision"] == "better"
    assert math.isclose(found["relative"], 0.3)


def test_an_interval_that_holds_parity_is_unclear_and_says_how_many_episodes_would_settle_it():
    found = verdict({"fqe": estimate(24.0, 14.0, 34.0)})
    assert found["decision"] == "unclear"
    assert "holds 0 (parity)" in found["reasons"][0]
    # half-width 10 against a gap of 4: (10 / 4)^2 = 6.25 times the episodes
    assert found["settle"].startswith("about 625 eval episodes (now 100)")


def test_an_estimate_that_failed_a_check_is_shown_but_left_out():
    final = {
        "weighted_dr": estimate(90.0, 85.0, 95.0, warnings=["its importance weights have..."]),
        "fqe": estimate(24.0, 14.0, 34.0),
    }
    found = verdict(final, {"weighted_dr": 5, "fqe": 1})
    assert found["estimator"] == "fqe" and found["decision"] == "unclear"
    assert [c["estimator"] for c in found["candidates"]] == ["fqe", "weighted_dr"]
    assert found["candidates"][1]["trusted"] is False
    assert "left out for failing their checks: weighted_dr" in found["reasons"][-1]


def test_with_no_estimate_passing_its_checks_the_verdict_is_unclear_and_names_the_failures():
    final = {
        "weighted_dr": estimate(
            90.0,
            85.0,
            95.0,
            warnings=["its importance weights have no effective sample size"],
            diagnostics={"feasible_low": 1.0, "feasible_high": 200.0},
        ),
        "fqe": estimate(80.0, 70.0, 90.0, warnings=["its model did not reach a fixed point"]),
    }
    found = verdict(final, {"weighted_dr": 2, "fqe": 1})
    assert found["decision"] == "unclear" and found["trusted"] is False
    assert found["estimator"] == "weighted_dr"  # the closest, shown with its figures
    assert found["reasons"][0].startswith("no estimator passed its checks")
    assert "its importance weights have no effective sample size" in found["reasons"]
    assert "more exploration" in found["settle"]
    # its figures are shown, but the interval is all the logged rewards allow, not its own
    assert found["estimate"] == 90.0 and found["interval"] == [1.0, 200.0]
    assert found["difference_interval"] is None
    assert "every value the logged rewards allow, [1, 200]" in found["reasons"][-1]


def test_too_few_eval_episodes_fail_every_estimate_whatever_its_estimator_checked():
    few = MIN_VERDICT_EPISODES - 1
    found = verdict({"fqe": estimate(60.0, 50.0, 70.0)}, episodes=few)
    assert found["decision"] == "unclear"
    assert few_episodes_warning(few) in found["candidates"][0]["failed"]
    assert "eval_fraction" in found["settle"]
    # an estimator that said it already is not told twice
    said = verdict(
        {"fqe": estimate(60.0, 50.0, 70.0, warnings=[few_episodes_warning(few)])}, episodes=few
    )
    assert said["candidates"][0]["failed"] == [few_episodes_warning(few)]
    assert few_episodes_warning(MIN_VERDICT_EPISODES) is None


def test_the_interval_spans_every_trusted_estimate_and_decides_by_the_span():
    """Families err in different directions: where they disagree the truth may lie anywhere
    between, so the verdict's interval (and its decision) spans them."""
    final = {"magic": estimate(60.0, 55.0, 65.0), "fqe": estimate(30.0, 25.0, 35.0)}
    found = verdict(final, {"magic": 3, "fqe": 1})
    assert found["estimator"] == "magic" and found["estimate"] == 60.0
    assert found["interval"] == [25.0, 65.0] and found["difference_interval"] == [5.0, 45.0]
    assert found["decision"] == "better"
    assert found["reasons"][0].startswith("every estimate that passed its checks counts")
    # one of them below parity: the span holds 0
    final["fqe"] = estimate(15.0, 10.0, 19.0)
    disagreeing = verdict(final, {"magic": 3, "fqe": 1})
    assert disagreeing["decision"] == "unclear"
    # not "N episodes would settle it": magic's own interval already excludes parity
    assert disagreeing["settle"].startswith(
        "the estimates disagree (their intervals of the difference: magic's lies above 0, "
        "fqe's lies below 0)"
    )
    # an estimate in another unit or one that failed its checks is not spanned
    final["fqe"] = estimate(15.0, 10.0, 19.0, warnings=["its model did not reach a fixed point"])
    final["fqe_discounted"] = estimate(5.0, 4.0, 6.0, unit="return per episode, discounted at 0.99")
    assert verdict(final, {"magic": 3, "fqe": 1})["interval"] == [55.0, 65.0]


def test_the_preferred_unit_comes_before_the_preferred_estimator():
    final = {
        "fqe_discounted": estimate(
            99.0, 98.0, 100.0, unit="return per episode, discounted at 0.99"
        ),
        "fqe": estimate(60.0, 50.0, 70.0),
    }
    found = verdict(final, {"fqe_discounted": 9, "fqe": 0})
    assert found["estimator"] == "fqe" and found["unit"] == "return per episode"
    # among equals in unit and preference, the narrower interval
    final = {"a": estimate(60.0, 40.0, 80.0), "b": estimate(61.0, 55.0, 67.0)}
    assert verdict(final)["estimator"] == "b"


def test_hostile_records_give_a_verdict_not_a_traceback():
    """A run folder copied from elsewhere: estimates of any shape and type."""
    final = {
        "text": "not a mapping",
        "nan": {"reward": {"value": float("nan")}},
        "strings": {"reward": {"value": 5.0, "low": "1", "high": [2], "warnings": "oops"}},
        "bool": {"reward": {"value": True}},
        "fine": estimate(60.0, 50.0, 70.0, diagnostics=["not", "a", "mapping"]),
    }
    found = verdict(final)
    assert found["estimator"] == "fine" and found["decision"] == "better"
    assert [c["estimator"] for c in found["candidates"]] == ["fine", "strings"]
    json.dumps(found, allow_nan=False)
    for hostile in ({}, {"decision": ["x"], "reasons": ["<b>"], "estimate": "x"}, found):
        lines = verdict_lines(hostile)
        assert lines[0].startswith("verdict: ")
    assert verdict_lines({})[0] == "verdict: UNCLEAR whether it beats the logged policy"


def test_no_estimate_of_the_reward_is_unclear_and_says_what_to_run():
    found = verdict({"logged_value": {"reward_per_episode": 20.0}})
    assert found["decision"] == "unclear" and found["estimator"] is None
    assert "[[evaluation]]" in found["settle"]


def test_a_pipeline_naming_only_its_trainer_ends_with_the_verdict(tmp_path):
    """No [[evaluation]]: the default estimators run (sections_at_defaults says so), cpe.json
    and the manifest hold the verdict, and it is what `horizon run` prints last."""
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\nseed = 0\n\n'
        '[source]\nkind = "gym"\nepisodes = 120\nds = "2019-01-01"\n\n'
        "[timeline]\neval_fraction = 0.25\n\n"
        '[trainer]\nkind = "dqn"\nepochs = 2\n'
    )
    result = CliRunner().invoke(main, ["run", str(pipeline)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert "evaluation" in manifest["sections_at_defaults"]
    cpe = json.loads((tmp_path / "run" / "cpe.json").read_text())
    assert cpe["verdict"] == manifest["verdict"]
    verdict_found = manifest["verdict"]
    assert verdict_found["decision"] in ("better", "worse", "unclear")
    assert verdict_found["eval_episodes"] == cpe["episodes"] >= MIN_VERDICT_EPISODES
    labels = {candidate["estimator"] for candidate in verdict_found["candidates"]}
    assert {"weighted_dr", "fqe", "fqe_discounted", "mis"} <= labels
    units = {c["estimator"]: c["unit"] for c in verdict_found["candidates"]}
    assert units["fqe"] == "return per episode"
    assert units["fqe_discounted"].startswith("return per episode, discounted at ")
    tail = result.output.rstrip("\n").split("\n")
    first = next(i for i, line in enumerate(tail) if line.startswith("verdict: "))
    assert tail[first - 1].startswith("run ") and "succeeded" in tail[first - 1]
    assert tail[first:] == verdict_lines(verdict_found)


def test_a_damaged_eval_split_at_defaults_is_named_not_a_traceback(tmp_path):
    """A run folder copied from elsewhere whose eval split file is not Parquet: the
    evaluation stage at its defaults names the file."""
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\nseed = 0\n\n'
        '[source]\nkind = "gym"\nepisodes = 30\nds = "2019-01-01"\n\n'
        "[timeline]\neval_fraction = 0.25\n\n"
        '[trainer]\nkind = "dqn"\nepochs = 1\n'
    )
    assert CliRunner().invoke(main, ["run", str(pipeline)]).exit_code == 0
    split = tmp_path / "run" / "timeline" / "eval"
    damaged = sorted(split.glob("*.parquet"))[0]
    damaged.write_bytes(b"not parquet")
    result = CliRunner().invoke(main, ["run", str(pipeline), "--stages", "evaluation"])
    assert result.exit_code == 1
    assert f"{damaged}: not a readable timeline split file" in result.output
    assert "Traceback" not in result.output
