"""The closed loop of issue 14, end to end: ``examples/closed_loop/run_loop.py``'s four rounds
(round 0 uniformly random, then three trained, warm-started rounds) for both simulated
products, through ``horizon run``, the HTTP server and ``horizon join``.

The example's folder is a script's, not a package: the test puts it on ``sys.path`` and
imports ``run_loop`` from it (which imports ``products`` and ``traffic`` beside it), as
running the script does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "closed_loop"
sys.path.insert(0, str(EXAMPLE))

import run_loop  # noqa: E402

from horizon_plugins_serving.decision_log import read_decisions  # noqa: E402
from horizon_plugins_serving.predictor import Predictor  # noqa: E402

DOUBLY_ROBUST = {"bandit": "dr", "mdp": "weighted_dr"}
"""Each product's doubly robust estimator: one decision at a time, and weighted over
episodes."""
DIRECT = {"bandit": "dm", "mdp": "fqe"}
"""Each product's model-based estimator: a reward model, and fitted-Q evaluation."""


@pytest.fixture(autouse=True)
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("product", ["bandit", "mdp"])
def test_the_served_policy_improves_every_round_and_cpe_sees_it(product, tmp_path, capsys):
    """Seed 0, four rounds. The true values are exact (the bandit's expectation over its
    whole population, the MDP's linear solve), so no evaluation noise can make or break a
    rise: the claim is that training on more joined data, warm-started, serves a better
    policy every round, and any rise is a real one. Over seeds 0-9 every rise was positive;
    the smallest were 0.029 (bandit, out of the 0.28 between random play and the best
    epsilon-greedy policy) and 0.003 (MDP, round 1 of seed 8; 0.017 on this seed, out of
    0.29).

    Every round's decisions are in its log, each rewarded or defaulted by the join, some
    clicks came too late for the 48-hour window, the trained rounds' decisions were logged by
    the server under that round's model, and rounds 2 and 3 were warm-started from the round
    before.

    CPE's estimates of each trained policy (on the eval split of the data it was trained on)
    are held to two claims, each of which held on all ten seeds. The doubly robust
    estimate's 95% interval covers the true value in at least 2 of the 3 rounds (with
    independent 95% intervals, 2 misses of 3 has a chance under 1%; 27 of the bandit's 30
    intervals covered, 28 of the MDP's). The model-based estimate, less noisy, moves with the
    truth: it rises from the first trained round to the last (the truth rises by 0.07 to
    0.23 there). The truth's rises from one round to the next (0.003 to 0.18) are within
    its noise: every round's estimate rose on all ten seeds for the bandit's dm, on six for
    the MDP's fqe, so that is not asserted; nor is fqe's interval, which holds its Q model
    fixed in the resamples and covered 11 of 30.
    """
    results = run_loop.run_loop(product, 4, tmp_path, seed=0)
    table = capsys.readouterr().out
    lines = table.strip().splitlines()
    assert len(lines) == 6  # the header, one line per round and where the page is
    out = tmp_path / product
    assert lines[-1] == f"every trained round side by side: {out / 'report.html'}"
    page = (out / "report.html").read_text()
    same_data = page[page.index('id="same_data"') :]
    for round_number in (1, 2, 3):  # each trained round's policy on round 3's eval data
        assert f"<h3>round-{round_number}/run</h3>" in page
        assert f"<td>round-{round_number}/run</td>" in same_data

    values = [result.true_value for result in results]
    rises = np.diff(values)
    assert np.all(rises > 0), f"true values {values}"

    out = tmp_path / product
    actions = run_loop.PRODUCTS[product].make(0).ACTIONS
    for result in results:
        folder = out / f"round-{result.round}"
        logged = read_decisions(folder / "decisions.jsonl")
        assert logged.torn_lines == []
        assert len(logged.rows) == result.decisions == result.rewarded + result.defaulted
        assert result.late_rewards > 0  # the 48h window left some clicks out
        if result.round == 0:
            propensities = {row["action_probability"] for row in logged.rows}
            assert propensities == {1.0 / len(actions)}
            continue
        model = Predictor(folder / "run" / "model.onnx")
        assert {row["model_id"] for row in logged.rows} == {model.model_id}  # served over HTTP
        manifest = json.loads((folder / "run" / "manifest.json").read_text())
        warm_start = manifest["config"]["trainer"]["warm_start_from"]
        previous = out / f"round-{result.round - 1}" / "run"
        assert warm_start == (str(previous) if result.round >= 2 else None)

    doubly_robust = [result.estimates[DOUBLY_ROBUST[product]] for result in results[1:]]
    covered = [e["low"] <= v <= e["high"] for e, v in zip(doubly_robust, values[1:], strict=True)]
    assert sum(covered) >= 2, f"{doubly_robust} against {values[1:]}"
    direct = [result.estimates[DIRECT[product]]["value"] for result in results[1:]]
    assert direct[-1] > direct[0], f"{direct} against {values[1:]}"
