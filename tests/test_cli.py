"""The `horizon` command line: run, gym collect, --help, and user errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pyarrow.parquet as pq
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.schema import ActionType, RowChecker, RowFormat, RowLayout, RowShaper


def test_gym_collect_writes_rows_that_validate_with_exact_propensities(tmp_path):
    output = tmp_path / "rows.jsonl"
    result = CliRunner().invoke(
        main,
        [
            "gym",
            "collect",
            "--env",
            "CartPole-v1",
            "--episodes",
            "4",
            "--epsilon",
            "1.0",
            "--seed",
            "0",
            "--ds",
            "2019-01-01",
            "-o",
            str(output),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert f"wrote {len(rows)} rows from 4 episodes" in result.output
    layout = RowLayout(RowFormat.PRE_TIMELINE, ActionType.DISCRETE)
    # Every column of the pre-timeline schema, and nothing else; ``truncated`` is written only
    # on the last row of an episode a time limit cut, which random CartPole episodes never reach.
    assert set(rows[0]) == {column.name for column in layout.columns} - {"truncated"}
    shaped = RowShaper(layout).shape((f"{output}:{i + 1}", row) for i, row in enumerate(rows))
    good, bad = RowChecker(layout).check(shaped.table, shaped.locations)
    assert shaped.bad_rows == [] and bad == []
    assert good.num_rows == len(rows)
    # A uniform policy over CartPole's two actions: every propensity is exactly 1/2.
    assert Counter(row["action_probability"] for row in rows) == {0.5: len(rows)}
    assert Counter(row["mdp_id"] for row in rows).keys() == {"0", "1", "2", "3"}


def test_gym_collect_epsilon_below_one_without_model_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(
        main, ["gym", "collect", "--epsilon", "0.1", "-o", str(tmp_path / "rows.jsonl")]
    )
    assert result.exit_code == 2
    assert "Error: --epsilon 0.1 is epsilon-greedy, which needs --model PATH.onnx" in result.output
    assert "[source]" not in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_gym_collect_unknown_env_blames_the_env_option(tmp_path):
    result = CliRunner().invoke(
        main, ["gym", "collect", "--env", "NoSuchEnv-v0", "-o", str(tmp_path / "rows.jsonl")]
    )
    assert result.exit_code == 2
    assert "Error: Invalid value for '--env': Environment `NoSuchEnv` doesn't exist." in (
        result.output
    )
    assert "[source]" not in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_gym_collect_model_that_does_not_exist_blames_the_model_option(tmp_path):
    missing = tmp_path / "model.onnx"
    result = CliRunner().invoke(
        main,
        ["gym", "collect", "--epsilon", "0.1", "--model", str(missing), "-o", str(tmp_path / "r")],
    )
    assert result.exit_code == 2
    assert f"Invalid value for '--model': File '{missing}' does not exist." in result.output
    assert "[source]" not in result.output


def test_run_prints_stage_summary_and_writes_manifest(tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n'
        '[source]\nkind = "gym"\nepisodes = 2\nds = "2019-01-01"\n'
    )
    result = CliRunner().invoke(main, ["run", str(pipeline), "--set", "pipeline.seed=4"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    rows = manifest["stages"]["source"]["rows_out"]
    assert f"source: {rows} rows in, {rows} out, 0 dropped" in result.output
    assert manifest["seed"] == 4
    assert pq.read_table(tmp_path / "run" / "source" / "rows.parquet").num_rows == rows


def test_run_reports_a_config_mistake_without_traceback(tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text('[source]\nkind = "gym"\nepisodse = 2\n')
    result = CliRunner().invoke(main, ["run", str(pipeline)])
    assert result.exit_code == 1
    assert f"{pipeline}:3: [source] unknown key 'episodse'" in result.output
    assert "did you mean 'episodes'?" in result.output
    assert "Traceback" not in result.output


def test_help_and_plugins_do_not_import_heavy_libraries():
    """`horizon --help` and `horizon plugins` must start fast: no torch, Spark, ONNX or gym."""
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from horizon_engine.cli import main\n"
        "for args in (['--help'], ['plugins'], ['plugins', '--json']):\n"
        "    assert CliRunner().invoke(main, args).exit_code == 0, args\n"
        "heavy = {'torch', 'pyspark', 'onnxruntime', 'onnx', 'gymnasium', 'tensorboardX'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_horizon_plugins_lists_every_section_beside_the_components():
    """Every section a user can write is listed: the core's [pipeline], and [gym], which the
    gym plugin's ``horizon gym train`` declares as a section it reads (``config_sections``)."""
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)["sections"]
    sections = {
        section["section"]: {option["name"]: option for option in section["options"]}
        for section in listed
    }
    assert list(sections) == ["pipeline", "gym"]
    assert listed[1]["command"] == "horizon gym train"
    assert sections["pipeline"]["on_bad_rows"]["default"] == "fail"
    assert sections["gym"]["score_bar"]["help"].startswith("Stop once an evaluation's mean")
    text = CliRunner().invoke(main, ["plugins"]).output
    assert text.startswith("[pipeline]  options of the run as a whole (pipeline.toml)\n")
    assert "\n  torch_threads: int | None (default None)  CPU threads for torch" in text
