"""The run report: ``horizon report`` and the report stage, on every kind of run the engine
makes, opened in a real headless Chromium.

Each run is small (a few episodes, two or three epochs): the page's content is checked, not
the policy. Every page is rendered by ``browser.render_page``, its screenshot kept beside the
run in the test's tmp folder (the artifact to look at when a test fails), and checked for the
sections' headings, no console errors and a drawn page. Without Chromium the rendering is
skipped with the reason; the page's own checks still run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from browser import find_chromium, render_page
from click.testing import CliRunner
from test_parametric_dqn import gym_parametric_config

from horizon_engine import Engine, RunFolder
from horizon_engine.cli import main
from horizon_engine.plugins import get_plugin_host
from horizon_engine.report import build_report, run_sections
from horizon_engine.report_page import MAX_PAGE_BYTES

CORE_HEADINGS = [
    "The run",
    "Rows",
    "Normalization",
    "Training",
    "Counterfactual evaluation",
    "Actions",
    "Export",
]
WORLD_MODEL_HEADING = "Is the problem an MDP? (world model)"
VERDICT_HEADINGS = ["Verdict", "Estimators behind the verdict"]
"""The sections a run with a verdict (one that evaluated a trained policy) opens with."""


def run(config: dict) -> Path:
    manifest = Engine(show_progress=False).run(config)
    assert manifest["status"] == "succeeded"
    return Path(manifest["config"]["pipeline"]["output_dir"])


def discrete_config(output: Path, seed: int = 0, **trainer: object) -> dict:
    return {
        "pipeline": {"output_dir": str(output), "seed": seed},
        "source": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 30},
        "timeline": {"reward": {"reward": 1.0}, "eval_fraction": 0.2},
        "trainer": {"kind": "dqn", "epochs": 3, "layers": [32], **trainer},
        "evaluation": [{"kind": "logged_value"}, {"kind": "weighted_dr", "num_bootstrap": 20}],
    }


def shown(sections, key: str):
    section = next(section for section in sections if section.key == key)
    assert section.absent is None, f"{key}: {section.absent}"
    return section.body


def rendered(page: Path, tmp_path: Path, name: str):
    """The page in Chromium; its screenshot kept as ``tmp_path/name.png``."""
    if find_chromium() is None:
        pytest.skip(
            "no Chromium to open the page in: install the 'chromium' package (make test does, "
            "as root with apt-get) or point $HORIZON_CHROMIUM at one"
        )
    found = render_page(page, tmp_path / f"{name}.png")
    assert found.console_errors == []
    assert found.non_blank
    return found


def test_a_discrete_run_writes_its_page_with_every_section(tmp_path):
    output = run(discrete_config(tmp_path / "run"))
    page = output / RunFolder.REPORT
    manifest = json.loads((output / RunFolder.MANIFEST).read_text())
    assert manifest["executed"][-1] == "report"
    assert manifest["stages"]["report"]["outputs"] == [RunFolder.REPORT]
    text = page.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text

    sections = run_sections(RunFolder(output), get_plugin_host())
    assert shown(sections, "training").count("<img") == 1
    cpe = shown(sections, "cpe")
    assert "weighted_dr" in cpe and "relative [interval]" in cpe
    actions = shown(sections, "actions")
    assert re.search(r"<td>0</td><td class=\"number\">0\.\d+</td>", actions)
    export = shown(sections, "export")
    assert "model.onnx" in export and "features" in export and "rtol" in export
    assert "continuous" in shown(sections, "normalization")
    funnel = shown(sections, "rows")
    assert funnel.count("<img") == 1 and "<td>eval</td>" in funnel

    found = rendered(page, tmp_path, "discrete")
    assert found.headings[:1] == ["Run report: run"]
    assert [name for name in found.headings if name in CORE_HEADINGS] == CORE_HEADINGS
    assert WORLD_MODEL_HEADING in found.headings


def test_a_parametric_run_compares_its_candidates(tmp_path):
    config = gym_parametric_config(tmp_path / "run", 20, 0, epochs=2, layers=[32])
    config["timeline"]["eval_fraction"] = 0.2
    output = run(config)
    sections = run_sections(RunFolder(output), get_plugin_host())
    assert "candidate 0" in shown(sections, "actions")
    assert "parametric" in shown(sections, "export")
    rendered(output / RunFolder.REPORT, tmp_path, "parametric")


def test_a_continuous_run_draws_each_action_dimension(tmp_path):
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "source": {"kind": "gym", "env": "Pendulum-v1", "policy": "random", "episodes": 4},
        "timeline": {"reward": {"reward": 1.0}, "eval_fraction": 0.25},
        "trainer": {"kind": "sac", "epochs": 2, "layers": [32, 32], "minibatch_size": 64},
    }
    output = run(config)
    sections = run_sections(RunFolder(output), get_plugin_host())
    actions = shown(sections, "actions")
    assert actions.count("<img") == 1 and 'alt="action ' in actions
    assert "continuous_action" in shown(sections, "normalization")
    assert "continuous" in shown(sections, "export")
    rendered(output / RunFolder.REPORT, tmp_path, "continuous")


def test_a_run_without_eval_split_estimators_or_export_says_why_each_is_absent(tmp_path):
    config = {
        "pipeline": {
            "output_dir": str(tmp_path / "run"),
            "seed": 0,
            "stages": ["source", "timeline", "normalization", "train", "report"],
        },
        "source": {"kind": "gym", "env": "CartPole-v1", "policy": "random", "episodes": 10},
        "timeline": {"reward": {"reward": 1.0}, "eval_fraction": 0.0},
        "trainer": {"kind": "dqn", "epochs": 2, "layers": [16]},
    }
    output = run(config)
    sections = {
        section.key: section for section in run_sections(RunFolder(output), get_plugin_host())
    }
    assert "no [[evaluation]] estimators" in sections["cpe"].absent
    assert "no eval rows" in sections["actions"].absent
    assert "exported no model" in sections["export"].absent
    assert sections["training"].absent is None
    found = rendered(output / RunFolder.REPORT, tmp_path, "minimal")
    assert [name for name in found.headings if name in CORE_HEADINGS] == CORE_HEADINGS


def test_a_section_whose_file_is_corrupt_says_so_and_the_others_are_shown(tmp_path):
    output = run(discrete_config(tmp_path / "run"))
    (output / RunFolder.CPE).write_text('{"final": ')
    (output / RunFolder.TRAINING_EPOCHS).write_text('{"epochs": [{"epoch": "one"}]}')
    sections = {
        section.key: section for section in run_sections(RunFolder(output), get_plugin_host())
    }
    assert "cpe.json: cannot be read" in sections["cpe"].absent
    assert "training_epochs.json: expected" in sections["training"].absent
    assert sections["export"].absent is None and sections["actions"].absent is None


def test_a_page_of_a_thousand_features_stays_small(tmp_path):
    """Only the worst-behaved features are drawn; the rest are a table. Binary features but
    the first ten (identifying a continuous feature's type tries Box-Cox: 13 ms each here)."""
    rows = tmp_path / "rows.jsonl"
    with rows.open("w") as file:
        for episode in range(20):
            for step in range(10):
                features = {str(i): float((episode + step + i) % 2) for i in range(1000)}
                features |= {str(i): (episode * 7 + step * 3 + i) % 13 * 0.5 for i in range(10)}
                row = {
                    "mdp_id": f"e{episode}",
                    "sequence_number": step,
                    "state_features": features,
                    "action": "a" if step % 2 else "b",
                    "action_probability": 0.5,
                    "metrics": {"reward": 1.0},
                }
                file.write(json.dumps(row) + "\n")
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "seed": 0},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"reward": {"reward": 1.0}, "actions": ["a", "b"]},
        "normalization": {},
    }
    output = run(config)
    page = (output / RunFolder.REPORT).read_text()
    size = len(page.encode())
    assert size < 1_000_000 < MAX_PAGE_BYTES, size
    assert page.count("data:image/png") == 2  # the funnel and the drawn features
    assert "The other 988 features" in page


def test_two_runs_side_by_side_evaluate_both_policies_on_the_newer_eval_data(tmp_path):
    first = run(discrete_config(tmp_path / "yesterday", seed=0))
    second = run(discrete_config(tmp_path / "today", seed=1, warm_start_from=str(first)))
    out = tmp_path / "both.html"
    result = CliRunner().invoke(main, ["report", str(first), str(second), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    page = out.read_text()
    # Every section (the verdict's, the core's and the world model's) shows both runs.
    assert page.index("<section") == page.index('<section id="verdict">')
    assert page.count('<div class="run">') == 2 * (len(VERDICT_HEADINGS + CORE_HEADINGS) + 1)
    same = page[page.index('id="same_data"') :]
    assert same.count("<td>yesterday</td><td>weighted_dr</td>") == 1
    assert same.count("<td>today</td><td>weighted_dr</td>") == 1
    found = rendered(out, tmp_path, "two_runs")
    assert "On the same eval data" in found.headings
    assert found.headings.count("yesterday") == len(VERDICT_HEADINGS + CORE_HEADINGS) + 1


def test_horizon_report_refuses_a_folder_that_is_not_there(tmp_path):
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert "no such run folder" in result.output
    assert "Traceback" not in result.output


def test_horizon_report_replaces_only_a_page_it_wrote(tmp_path):
    """``horizon report RUN -o RUN/manifest.json`` replaced the run's manifest with the page
    (issue 33): ``-o`` names an HTML page, and a file there that is not one of the command's
    pages is kept; a page it wrote, the run stage's ``report.html`` included, is replaced."""
    config = discrete_config(tmp_path / "run")
    output = run({**config, "trainer": {"kind": "dqn", "epochs": 1, "layers": [16]}})
    manifest = (output / RunFolder.MANIFEST).read_bytes()
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my own page</html>")
    for target, why in (
        (output / RunFolder.MANIFEST, "a report is an HTML page; name it with .html"),
        (mine, "there is a file there that horizon report did not write"),
    ):
        result = CliRunner().invoke(main, ["report", str(output), "-o", str(target)])
        assert result.exit_code == 1 and f"error: -o {target}: {why}" in result.output
    assert (output / RunFolder.MANIFEST).read_bytes() == manifest
    assert mine.read_text() == "<html>my own page</html>"
    for target in (output / RunFolder.REPORT, tmp_path / "page.html", tmp_path / "page.html"):
        result = CliRunner().invoke(main, ["report", str(output), "-o", str(target)])
        assert result.exit_code == 0, result.output


def test_report_enabled_false_leaves_the_stage_out(tmp_path):
    config = discrete_config(tmp_path / "run")
    config["report"] = {"enabled": False}
    output = run({**config, "trainer": {"kind": "dqn", "epochs": 1, "layers": [16]}})
    assert not (output / RunFolder.REPORT).exists()
    manifest = json.loads((output / RunFolder.MANIFEST).read_text())
    assert "report" not in manifest["executed"]


def test_a_plugin_whose_sections_raise_is_named_and_the_page_still_written(tmp_path, monkeypatch):
    output = run(discrete_config(tmp_path / "run"))
    host = get_plugin_host()

    class Broken:
        @staticmethod
        def horizon_report_sections(folder):
            raise RuntimeError("no idea")

    from horizon_engine.hookspecs import hookimpl

    Broken.horizon_report_sections = hookimpl(Broken.horizon_report_sections)
    host.pm.register(Broken, name="broken_report")
    try:
        page = build_report([output], host)
    finally:
        host.pm.unregister(name="broken_report")
    assert (
        "plugin &#x27;broken_report&#x27; failed to build its sections: RuntimeError: no idea"
        in page
    )
    assert 'id="training"' in page


def test_an_online_run_shows_its_evaluations_and_its_export(tmp_path):
    example = Path(__file__).resolve().parents[1] / "examples" / "cartpole_online.toml"
    text = example.read_text()
    for key, value in {
        "episodes": "15",
        "train_after_ts": "200",
        "test_every_ts": "200",
        "avg_over_num_episodes": "2",
        "output_dir": json.dumps(str(tmp_path / "online")),
    }.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    pipeline = tmp_path / "online.toml"
    pipeline.write_text(text)
    trained = CliRunner().invoke(main, ["gym", "train", str(pipeline)])
    assert trained.exit_code == 0, trained.output

    sections = {
        section.key: section
        for section in run_sections(RunFolder(tmp_path / "online"), get_plugin_host())
    }
    assert "evaluations while training online" in sections["training"].body
    assert "Evaluation/mean_return" in sections["training"].body  # each evaluation's metrics
    assert "<td>episodes</td>" in sections["rows"].body
    assert "model.onnx" in sections["export"].body
    assert "online run logs no eval split" in sections["actions"].absent
    out = tmp_path / "online.html"
    assert (
        CliRunner().invoke(main, ["report", str(tmp_path / "online"), "-o", str(out)]).exit_code
        == 0
    )
    rendered(out, tmp_path, "online")


def test_the_funnel_names_quarantined_rows_and_where_they_are(tmp_path):
    rows = tmp_path / "rows.jsonl"
    lines = [
        {
            "mdp_id": f"e{episode}",
            "sequence_number": step,
            "state_features": {"0": float(step)},
            "action": "a",
            "action_probability": 0.5,
            "metrics": {"reward": 1.0},
        }
        for episode in range(5)
        for step in range(4)
    ]
    lines[3]["action_probability"] = 2.0  # not a probability: quarantined
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines) + "{torn\n")
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run"), "on_bad_rows": "quarantine"},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"reward": {"reward": 1.0}, "actions": ["a"]},
    }
    manifest = Engine(show_progress=False).run(config)
    dropped = manifest["stages"]["source"]["dropped"]
    assert sum(dropped.values()) == 2
    sections = run_sections(RunFolder(tmp_path / "run"), get_plugin_host())
    funnel = shown(sections, "rows")
    for reason, count in dropped.items():
        assert f"<td>source</td><td>quarantined</td><td>{reason}</td>" in funnel
        assert f'<td class="number">{count}</td><td>source/quarantine.jsonl</td>' in funnel


def test_horizon_run_prints_where_the_page_is_and_plugins_lists_the_stage(tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n'
        '[source]\nkind = "gym"\nenv = "CartPole-v1"\npolicy = "random"\nepisodes = 5\n\n'
        "[timeline]\nreward = { reward = 1.0 }\n"
    )
    result = CliRunner().invoke(main, ["run", str(pipeline)])
    assert result.exit_code == 0, result.output
    page = tmp_path / "run" / RunFolder.REPORT
    assert re.search(rf"^report: {re.escape(str(page))}, \d+\.\d\d s$", result.output, re.M)
    listed = CliRunner().invoke(main, ["plugins"]).output
    assert (
        "  stage: report [report]  reads every other stage's outputs (it runs last); "
        "writes report.html"
    ) in listed


GOOD_VERDICT = {
    "estimator": "weighted_dr",
    "metric": "reward",
    "unit": "return per episode",
    "estimate": 98.1,
    "interval": [80.2, 110.3],
    "logged": 22.7,
    "relative": 4.32,
    "relative_interval": [3.5, 4.9],
    "difference_interval": [57.5, 87.6],
    "trusted": True,
    "horizon": 500,
    "decision": "better",
    "reasons": [
        "The interval lies above the logged policy's value.",
        "weighted_dr passed its checks.",
    ],
    "settle": None,
    "eval_episodes": 280,
    "candidates": [
        {
            "estimator": "weighted_dr",
            "kind": "weighted_dr",
            "unit": "return per episode",
            "estimate": 98.1,
            "interval": [80.2, 110.3],
            "logged": 22.7,
            "relative": 4.3,
            "trusted": True,
            "failed": [],
            "diagnostics": {"effective_sample_size": 51.2, "nonzero_weight_share": 0.4},
        },
        {
            "estimator": "dr",
            "kind": "dr",
            "unit": "reward per decision",
            "estimate": 1.0,
            "interval": [1.0, 1.0],
            "logged": 1.0,
            "relative": 1.0,
            "trusted": False,
            "failed": ["a one-step estimator on episodes of 22 steps on average"],
            "diagnostics": {"effective_sample_size": 280},
        },
    ],
    "checkpoint": {
        "rule": "best",
        "epoch": 7,
        "last_epoch": 8,
        "evaluated": [7, 8],
        "reason": "epoch 7's verdict has the highest lower bound",
        "candidates": [
            {
                "epoch": 7,
                "decision": "better",
                "estimator": "weighted_dr",
                "estimate": 98.1,
                "interval": [80.2, 110.3],
                "difference_interval": [57.5, 87.6],
            },
            {
                "epoch": 8,
                "decision": "unclear",
                "estimator": "fqe",
                "estimate": 30.0,
                "interval": [20.0, 40.0],
                "difference_interval": [-2.7, 17.3],
            },
        ],
    },
}
"""A verdict as issue 34 specifies it: better, by weighted_dr, one rejected candidate."""


def verdict_run(folder: Path, verdict: object = GOOD_VERDICT, **manifest: object) -> Path:
    """A run folder holding only a manifest with ``verdict`` (a folder copied from elsewhere
    may hold anything there): every other section is absent, the verdict's are what is
    checked."""
    folder.mkdir(parents=True)
    record = {"config": {"pipeline": {}}, "name": folder.name, "verdict": verdict, **manifest}
    (folder / RunFolder.MANIFEST).write_text(json.dumps(record))
    return folder


def section_html(page: str, key: str) -> str:
    """The HTML of the section ``key`` of a one-run page."""
    start = page.index(f'<section id="{key}">')
    return page[start : page.index("</section>", start)]


def test_the_verdict_opens_the_page_with_its_estimates_below(tmp_path):
    """Issue 34: the page opened with the run's metadata, the answer 2,300 pixels down."""
    page = build_report([verdict_run(tmp_path / "run")], get_plugin_host())
    order = [page.index(f'<section id="{key}">') for key in ("verdict", "estimators", "run")]
    assert order == sorted(order) and page.index("<section") == order[0]
    verdict = section_html(page, "verdict")
    assert '<div class="verdict verdict-better"><p class="headline">Better than the logged' in (
        verdict
    )
    assert (
        "Estimated 98.1 [80.2, 110.3] return per episode (over at most 500 steps), against 22.7 "
        "for the logged policy; 4.32 [3.5, 4.9] times the logged policy&#x27;s value; the "
        "interval of the difference [57.5, 87.6]."
    ) in verdict
    assert "By weighted_dr, the estimator recommended, on the metric reward, over 280 eval" in (
        verdict
    )
    assert "<li>weighted_dr passed its checks.</li>" in verdict
    assert (
        "Checkpoint shipped: epoch 7: epoch 7&#x27;s verdict has the highest lower bound."
        in verdict
    )
    assert (
        '<tr class="recommended"><td class="number">7</td><td>better</td><td>weighted_dr</td>'
        "<td>98.1 [80.2, 110.3]</td><td>[57.5, 87.6]</td></tr>"
    ) in verdict
    assert "What would settle it" not in verdict  # settle is null for a clear decision
    estimates = section_html(page, "estimators")
    assert (
        '<tr class="recommended"><td>weighted_dr (recommended)</td><td>return per episode</td>'
        '<td class="number">98.1</td><td>[80.2, 110.3]</td><td class="number">22.7</td>'
        "<td>4.3</td><td>✓ yes</td><td></td>"
    ) in estimates
    assert (
        '<tr class="untrusted"><td>dr</td><td>reward per decision</td><td class="number">1</td>'
        '<td>[1, 1]</td><td class="number">1</td><td>1</td><td>✗ no</td>'
        "<td>a one-step estimator on episodes of 22 steps on average</td></tr>"
    ) in estimates
    diagnostics = estimates[estimates.index("<details>") :]
    assert "<th>effective_sample_size</th><th>nonzero_weight_share</th>" in diagnostics
    assert '<td>dr</td><td class="number">280</td><td>-</td>' in diagnostics


@pytest.mark.parametrize(
    ("decision", "css_class", "headline"),
    [
        ("better", "verdict-better", "Better than the logged policy"),
        ("worse", "verdict-worse", "Worse than the logged policy"),
        ("unclear", "verdict-unclear", "Unclear whether it is better than the logged policy"),
        ("<b>ship</b>", "verdict-unknown", "An unknown decision: &lt;b&gt;ship&lt;/b&gt;"),
        (None, "verdict-unknown", "No decision recorded"),
        (["better"], "verdict-unknown", "An unknown decision: better"),
    ],
)
def test_each_decision_has_its_box_and_headline(tmp_path, decision, css_class, headline):
    verdict = {**GOOD_VERDICT, "decision": decision}
    page = build_report([verdict_run(tmp_path / "run", verdict)], get_plugin_host())
    assert f'<div class="verdict {css_class}"><p class="headline">{headline}</p>' in page


@pytest.mark.parametrize(
    ("estimator", "source"),
    [
        (None, "No estimator passed its checks, on the metric reward"),
        ("dr", "No estimator passed its checks; the closest is dr, on the metric reward"),
    ],
)
def test_an_unclear_verdict_says_what_would_settle_it(tmp_path, estimator, source):
    """With no estimate passing its checks the verdict names none, or the closest one
    (``trusted`` false), which the table does not mark recommended."""
    candidates = [{**entry, "trusted": False} for entry in GOOD_VERDICT["candidates"][::-1]]
    verdict = {
        **GOOD_VERDICT,
        "estimator": estimator,
        "trusted": False,
        "decision": "unclear",
        "settle": "About 200 more eval episodes, or logging with more exploration.",
        "checkpoint": None,
        "candidates": candidates,
    }
    page = build_report([verdict_run(tmp_path / "run", verdict)], get_plugin_host())
    shown = section_html(page, "verdict")
    assert f"<p>{source}, over 280 eval episodes.</p>" in shown
    assert "What would settle it: About 200 more eval episodes, or logging with more" in shown
    assert "Checkpoint" not in shown
    estimates = section_html(page, "estimators")
    assert "recommended" not in estimates
    assert estimates.count('<tr class="untrusted">') == 2


@pytest.mark.parametrize("manifest", [{}, {"verdict": None}])
def test_a_run_without_a_verdict_has_the_page_it_had(tmp_path, manifest):
    folder = tmp_path / "run"
    folder.mkdir()
    record = {"config": {"pipeline": {}}, "name": "run", **manifest}
    (folder / RunFolder.MANIFEST).write_text(json.dumps(record))
    page = build_report([folder], get_plugin_host())
    assert 'class="verdict' not in page and 'id="estimators"' not in page
    assert page.index("<section") == page.index('<section id="run">')


@pytest.mark.parametrize(
    ("verdict", "key", "why"),
    [
        ("yes", "verdict", "the manifest&#x27;s verdict is a string (&#x27;yes&#x27;), not an"),
        ([1, 2], "verdict", "the manifest&#x27;s verdict is a list of 2 values, not an object"),
        (7, "verdict", "the manifest&#x27;s verdict is a number (7), not an object"),
        ({**GOOD_VERDICT, "candidates": {"dr": 1}}, "estimators", "the verdict&#x27;s candidates"),
        ({**GOOD_VERDICT, "candidates": None}, "estimators", "the verdict lists no candidates"),
        ({**GOOD_VERDICT, "candidates": []}, "estimators", "the verdict considered no estimate"),
    ],
)
def test_a_verdict_of_the_wrong_shape_says_so(tmp_path, verdict, key, why):
    page = build_report([verdict_run(tmp_path / "run", verdict)], get_plugin_host())
    assert f'<p class="absent">Not shown: {why}' in section_html(page, key)
    assert 'id="run"' in page and 'id="training"' in page


def test_a_hostile_verdict_is_shown_escaped_and_bounded(tmp_path):
    """A copied folder's verdict with HTML in its strings, NaN and infinities, values of the
    wrong types, and lists far longer than a page shows: every value is escaped, each list cut
    with a count of what was left out, and a reason of 10 MB does not push the page over its
    bound (it would have failed the whole page)."""
    verdict = {
        "estimator": "<script>alert(1)</script>",
        "metric": ["<b>reward</b>"],
        "unit": '<img src="x">',
        "estimate": float("nan"),
        "interval": "wide",
        "logged": {"mean": [1, 2, 3]},
        "relative": float("inf"),
        "relative_interval": [float("-inf"), None],
        "decision": "unclear",
        "reasons": ["r" * 10_000_000, *(f"reason {index}" for index in range(30))],
        "eval_episodes": 10**400,
        "checkpoint": "latest",
        "candidates": [
            "junk",
            *(
                {
                    "estimator": f"e{index}",
                    "trusted": index % 2 == 0,
                    "failed": ["<i>x</i>"] * 15,
                    "estimate": True,
                    "interval": [index, {"a": 1}],
                    "diagnostics": {f"d{name}": name for name in range(30)},
                }
                for index in range(1, 50)
            ),
        ],
    }
    page = build_report([verdict_run(tmp_path / "run", verdict)], get_plugin_host())
    assert len(page.encode()) < 100_000
    assert "<script>" not in page and "<img" not in page and "<i>x" not in page
    shown = section_html(page, "verdict")
    assert (
        "Estimated nan [wide] &lt;img src=&quot;x&quot;&gt;, against {mean: (3 values)} for the "
        "logged policy; inf [-inf, -] times the logged policy&#x27;s value."
    ) in shown
    assert (
        "By &lt;script&gt;alert(1)&lt;/script&gt;, the estimator recommended, on the metric "
        "&lt;b&gt;reward&lt;/b&gt;, over 10,000,000,"
    ) in shown
    assert f"<li>{'r' * 400}… (9,999,600 more characters)</li>" in shown
    assert shown.count("<li>") == 11 and "<li>and 21 more reasons, not shown</li>" in shown
    # 10**400 with its separators is 401 digits and 133 commas: cut at 400 characters.
    assert "… (134 more characters) eval episodes." in shown
    assert "Checkpoint: latest." in shown
    estimates = section_html(page, "estimators")
    rows = estimates[: estimates.index("<details>")].count("<tr")
    assert rows == 1 + 20  # the header and the first 20 entries
    assert "<td>(entry 1 is a string (&#x27;junk&#x27;), not an object)</td>" in estimates
    assert "30 more estimates were considered; the first 20 are shown." in estimates
    assert "<td>e1</td><td>-</td><td>true</td><td>[1, (1 fields)]</td><td>-</td>" in estimates
    assert "; ".join(["&lt;i&gt;x&lt;/i&gt;"] * 10) + "; and 5 more</td>" in estimates
    assert '<tr class="untrusted"><td>e3</td>' in estimates
    assert "18 more diagnostics are not shown." in estimates  # 30 met, 12 drawn


def test_runs_side_by_side_open_with_their_verdicts_where_one_has_none(tmp_path):
    """The older run, made before verdicts, comes first: its sections would have set the
    page's order, and the newer run's verdict would have come last."""
    older = tmp_path / "older"
    older.mkdir()
    (older / RunFolder.MANIFEST).write_text(json.dumps({"config": {"pipeline": {}}}))
    newer = verdict_run(tmp_path / "newer")
    page = build_report([older, newer], get_plugin_host())
    assert page.index("<section") == page.index('<section id="verdict">')
    verdict = page[page.index('<section id="verdict">') : page.index('<section id="estimators"')]
    assert "Not shown: the run recorded no verdict" in verdict
    assert "verdict-better" in verdict


def test_a_run_opens_its_page_with_the_verdict_its_evaluation_made(tmp_path):
    """The evaluation stage's verdict (in the manifest) opens the run's own page and
    ``horizon report``'s, in its decision's box, with each of its candidates in the table;
    every other section is shown as before."""
    output = run({**discrete_config(tmp_path / "run"), "trainer": {"kind": "dqn", "epochs": 1}})
    verdict = json.loads((output / RunFolder.MANIFEST).read_text())["verdict"]
    sections = run_sections(RunFolder(output), get_plugin_host())
    assert [section.key for section in sections][:3] == ["verdict", "estimators", "run"]
    assert f'<div class="verdict verdict-{verdict["decision"]}">' in shown(sections, "verdict")
    for candidate in verdict["candidates"]:
        assert f"<td>{candidate['estimator']}" in shown(sections, "estimators")
    for key in ("training", "cpe", "actions", "export"):
        shown(sections, key)
    out = tmp_path / "page.html"
    result = CliRunner().invoke(main, ["report", str(output), "-o", str(out)])
    assert result.exit_code == 0, result.output
    for page in (out, output / RunFolder.REPORT):
        found = rendered(page, tmp_path, page.stem)
        assert found.headings[1:3] == VERDICT_HEADINGS
        assert [name for name in found.headings if name in CORE_HEADINGS] == CORE_HEADINGS
