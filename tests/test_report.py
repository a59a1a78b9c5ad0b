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
    # Every section (the core's and the world model's) shows both runs.
    assert page.count('<div class="run">') == 2 * (len(CORE_HEADINGS) + 1)
    same = page[page.index('id="same_data"') :]
    assert same.count("<td>yesterday</td><td>weighted_dr</td>") == 1
    assert same.count("<td>today</td><td>weighted_dr</td>") == 1
    found = rendered(out, tmp_path, "two_runs")
    assert "On the same eval data" in found.headings
    assert found.headings.count("yesterday") == len(CORE_HEADINGS) + 1


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
