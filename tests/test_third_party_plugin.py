"""The third-party plugin (tests/third_party_plugin), installed as pip would install it, runs one
component of every family written against the public API only: a data source, a timeline
engine and a feature type, a trainer (offline in ``horizon run``, online in ``horizon gym
train``), an estimator, an exporter and a command. docs/plugins.md shows each of them as
excerpts of these files, and the last test holds the excerpts to the files.

The data: ``reminder_rows`` logs a fair coin deciding each day whether to send a user a
reminder. A reminder earns 1 when the user has been away more than 24 hours and -1 otherwise;
no reminder earns 0. So the best policy sends exactly when ``hours_away > 24`` and earns 0.607
per decision in expectation (P(hours_away > 24) = exp(-24 / 48)); the logging policy earns
(0.607 - 0.393) / 2 = 0.107.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import horizon_engine
from horizon_engine import Engine, HorizonError, NormalizationConfig
from horizon_engine.errors import ConfigError
from horizon_engine.normalization import read_normalization
from horizon_engine.plugins import PluginHost

ROOT = Path(__file__).parents[1]
PROJECT = ROOT / "tests" / "third_party_plugin"
PACKAGE = PROJECT / "horizon_plugin_constant"
ACTIONS = ["send", "skip"]
RETURN_AFTER_HOURS = 24.0


@pytest.fixture
def host(plugin_site: Any) -> PluginHost:
    """A plugin host with the third-party plugin installed as a distribution (and the
    built-ins, but no other entry-point plugin)."""
    plugin_site.install_project(PROJECT)
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": "constant"})


@pytest.fixture
def one_thread() -> Any:
    """torch on one thread while a test learns, as the figures in its docstring were measured:
    a sum split over threads adds in another order, and a learning run can drift from it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def horizon(host: PluginHost, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real ``horizon`` command group, run in-process by click's CliRunner, with ``host``
    as the process's plugin host: its commands are loaded afresh (as the first command a fresh
    process meets would load them) and forgotten afterwards."""
    from horizon_engine import plugins
    from horizon_engine.cli import main

    loaded = plugins._default_host
    earlier = {
        name for info in (loaded.plugins.values() if loaded else ()) for name in info.commands
    }
    core = {name: command for name, command in main.commands.items() if name not in earlier}
    monkeypatch.setattr(main, "commands", core)
    monkeypatch.setattr(main, "plugin_commands_loaded", False)
    monkeypatch.setattr(plugins, "_default_host", host)

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    return invoke


def reminder_pipeline(output_dir: Path) -> dict[str, Any]:
    """Every family of the plugin in one pipeline: 300 users of 5 decisions each, 30% of the
    users held out for the estimators and the export's checks."""
    return {
        "pipeline": {"output_dir": str(output_dir), "seed": 0},
        "source": {"kind": "reminder_rows", "users": 300, "days": 5},
        "timeline": {"engine": "one_step", "actions": ACTIONS, "eval_fraction": 0.3},
        "normalization": {"overrides": {"hours_away": "log1p"}},
        "trainer": {
            "kind": "small_q",
            "epochs": 20,
            "minibatch_size": 64,
            "learning_rate": 0.01,
        },
        "evaluation": [
            {"kind": "one_step_ips"},
            {"kind": "one_step_ips", "policy": "epsilon_greedy", "epsilon": 1.0},
            {"kind": "logged_value"},
        ],
        "export": {"kind": "torch_program"},
    }


def true_value(send: np.ndarray, hours_away: np.ndarray) -> float:
    """What a policy sending where ``send`` earns per decision, by the source's reward rule."""
    reward = np.where(hours_away > RETURN_AFTER_HOURS, 1.0, -1.0)
    return float(np.where(send, reward, 0.0).mean())


# --- The public API only ------------------------------------------------------------------------


def test_every_module_of_the_plugin_imports_only_horizon_engines_public_names():
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 8
    for module in modules:
        named = []
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("horizon_eng"):
                assert node.module == "horizon_engine", (module.name, node.module)
                named += [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                assert not [a for a in node.names if a.name.startswith("horizon_engine")], module
        assert set(named) <= set(horizon_engine.__all__), (module.name, named)


# --- Every family in one horizon run ------------------------------------------------------------


def test_one_pipeline_runs_every_family_of_the_plugin_and_the_trainer_learns(
    host, tmp_path, one_thread
):
    """Measured (seed 0): the policy sends to the right users on 98.5% of fresh states and
    earns 0.587 per decision (the best policy 0.603 on them, the logger 0.107; seeds 1 and 2:
    96.2% and 0.565, 97.6% and 0.578); one_step_ips estimates 0.514 on the 350 eval decisions
    (its standard error there is about 0.05), the logger's value 0.054. The bars: 95%, 0.55,
    and an estimate above the logger's by 0.3 and within 0.2 of the policy's true value."""
    run = tmp_path / "run"

    manifest = Engine(plugins=host, show_progress=False).run(reminder_pipeline(run))

    assert manifest["status"] == "succeeded"
    assert manifest["stages"]["source"]["rows_out"] == 1500
    timeline = manifest["stages"]["timeline"]
    assert timeline["details"]["engine"] == "one_step"
    assert json.loads((run / "timeline" / "timeline.json").read_text())["n_step"] == 1
    assert timeline["rows_out"] == 1500  # every decision, each user's last one terminal
    eval_rows = timeline["details"]["eval_rows"]

    # The feature type: log1p, fitted by its own fit with the train split's largest
    # hours_away, stored under its own parameter name (none of Horizon's), and read back
    # through its own model, as training and export read it.
    normalization = json.loads((run / "normalization.json").read_text())["state_features"]
    rows = pq.read_table(run / "timeline" / "train")["state_features"].to_pylist()
    train_hours = np.array([dict(row)["hours_away"] for row in rows])
    log1p = host.component("feature_types", "log1p")
    assert log1p.plugin == "constant"
    fitted = log1p.cls(log1p.cls.Config()).fit(train_hours, NormalizationConfig())
    assert normalization["hours_away"] == {"feature_type": "log1p", "largest": train_hours.max()}
    assert normalization["hours_away"] == fitted.as_dict()
    read_back = read_normalization(run / "normalization.json", host)["state_features"]
    assert read_back["hours_away"] == fitted
    assert type(read_back["hours_away"]) is log1p.cls.Parameters

    # The exporter: a torch.export program that runs without Horizon Engine, verified on the
    # eval rows, its inputs and actions described inside the file.
    export = manifest["stages"]["export"]
    assert export["outputs"] == ["policy.pt2"]
    assert export["details"]["verified_rows"] == eval_rows
    assert export["details"]["max_abs_difference"] <= 1e-5
    extra = {"horizon.json": ""}
    program = torch.export.load(run / "policy.pt2", extra_files=extra).module()
    described = json.loads(extra["horizon.json"])
    assert described["feature_ids"] == ["hours_away"]
    assert described["actions"] == ACTIONS
    assert described["run_id"] == manifest["run_id"]
    # The program normalizes with the log1p scale of the parameter read back: 1 / log1p(largest).
    scales = {name: buffer for name, buffer in program.named_buffers() if name.endswith("scale")}
    assert len(scales) == 1
    expected_scale = torch.tensor([1.0 / math.log1p(train_hours.max())])
    torch.testing.assert_close(next(iter(scales.values())), expected_scale)

    # The trainer learned the rule: send exactly to users away more than a day.
    hours = np.random.default_rng(5).exponential(48.0, 20_000).astype(np.float32)
    values = torch.from_numpy(hours)[:, None]
    _, probabilities, action = program(values, torch.ones_like(values))
    send = (action == ACTIONS.index("send")).numpy()
    assert (send == (hours > RETURN_AFTER_HOURS)).mean() >= 0.95
    policy_value = true_value(send, hours)
    assert policy_value >= 0.55
    assert torch.equal(probabilities.max(dim=1).values, torch.ones(len(hours)))  # greedy

    # The estimator, once in the evaluation stage and after every epoch.
    estimates = json.loads((run / "cpe.json").read_text())["final"]
    trained, uniform, logged = (
        estimates["one_step_ips[0]"],
        estimates["one_step_ips[1]"],
        estimates["logged_value"],
    )
    assert trained["reward_per_step"] >= logged["reward_per_step"] + 0.3
    assert trained["reward_per_step"] == pytest.approx(policy_value, abs=0.2)
    assert trained["reward_per_episode"] == pytest.approx(5 * trained["reward_per_step"])
    # epsilon = 1 is the logging policy itself: every weight is 0.5 / 0.5.
    assert uniform["mean_weight"] == 1.0
    assert uniform["reward_per_episode"] == pytest.approx(logged["reward_per_episode"], abs=1e-12)
    assert uniform["reminders_per_episode"] == pytest.approx(logged["reminders_per_episode"])
    last_epoch = manifest["stages"]["train"]["details"]["last_epoch"]
    for label, figures in estimates.items():
        for name, value in figures.items():
            assert last_epoch[f"CPE/{label}/{name}"] == pytest.approx(value, abs=1e-12)
    assert "Evaluation/td_loss" in last_epoch  # the trainer's own evaluate, on the eval split


# --- The timeline engine ------------------------------------------------------------------------


def awkward_rows(path: Path) -> None:
    """Reminder rows as JSONL, with what a timeline engine must handle: rows that did not
    record their possible actions, rows where one action was possible, two rows without a
    reward (metrics only: the timeline rejects them), and an episode a time limit cut short."""
    from horizon_plugin_constant.reminders import reminder_rows

    rows = list(reminder_rows(40, 4, 3))
    for number, row in enumerate(rows):
        if number % 7 == 0:
            row["possible_actions"] = []
        if number % 11 == 0:
            row["possible_actions"] = ["send"] if row["action"] == "send" else ["skip"]
        if number in (20, 21):
            del row["reward"]
    rows[-1]["truncated"] = True
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


@pytest.mark.parametrize("add_terminal_state_row", [True, False])
def test_the_one_step_engine_builds_the_local_engines_one_step_table(
    host, tmp_path, add_terminal_state_row
):
    rows = tmp_path / "rows.jsonl"
    awkward_rows(rows)
    built = {}
    for engine, n_step in (("local", {"n_step": 1}), ("one_step", {})):
        run = tmp_path / engine
        config = {
            "pipeline": {"output_dir": str(run), "seed": 3, "on_bad_rows": "quarantine"},
            "source": {"kind": "jsonl", "path": str(rows)},
            "timeline": {
                "engine": engine,
                "actions": ACTIONS,
                "eval_fraction": 0.25,
                "add_terminal_state_row": add_terminal_state_row,
                **n_step,
            },
        }
        manifest = Engine(plugins=host, show_progress=False).run(config)
        quarantine = (run / "timeline" / "quarantine" / "part-00000.jsonl").read_text()
        built[engine] = {
            "report": manifest["stages"]["timeline"],
            "splits": {
                split: pq.read_table(run / "timeline" / split) for split in ("train", "eval")
            },
            "quarantined": [
                (record["location"].replace(str(run), ""), record["kind"])
                for record in map(json.loads, quarantine.splitlines())
            ],
        }

    local, one_step = built["local"], built["one_step"]
    assert one_step["report"]["details"]["engine"] == "one_step"
    for key in ("rows_in", "rows_out", "dropped"):
        assert one_step["report"][key] == local["report"][key]
    for key in ("train_rows", "eval_rows", "train_episodes", "eval_episodes"):
        assert one_step["report"]["details"][key] == local["report"]["details"][key]
    dropped = one_step["report"]["dropped"]
    assert dropped["missing_reward"] == 2 and dropped["truncated"] == 1
    assert ("terminal_row" in dropped) is not add_terminal_state_row
    for split in ("train", "eval"):
        mine, theirs = one_step["splits"][split], local["splits"][split]
        assert mine.schema.equals(theirs.schema, check_metadata=True)
        assert mine.num_rows > 0
        assert mine.to_pylist() == theirs.to_pylist()
    assert one_step["quarantined"] == local["quarantined"]
    assert [kind for _, kind in one_step["quarantined"]] == ["missing_reward"] * 2


@pytest.mark.parametrize(
    ("option", "value"),
    [("n_step", 3), ("reward", {"reminders": -0.1}), ("time_window_limit", 2)],
)
def test_the_one_step_engine_refuses_options_it_does_not_build_when_the_config_loads(
    host, tmp_path, option, value
):
    config = reminder_pipeline(tmp_path / "run")
    config["timeline"][option] = value

    with pytest.raises(ConfigError) as error:
        Engine(plugins=host, show_progress=False).validate(config)

    assert f"engine 'one_step' does not support {option}; use engine = 'local'" in str(error.value)
    assert not (tmp_path / "run").exists()


# --- The feature type ---------------------------------------------------------------------------


def test_log1p_maps_the_samples_range_onto_0_to_1_and_needs_its_largest_value(host):
    from horizon_engine.preprocessor import build_preprocessor

    stored = host.component("feature_types", "log1p").cls.Parameters
    parameters = {
        "hours": stored(feature_type="log1p", largest=99.0),
        "visits": stored(feature_type="log1p", largest=0.5),
    }
    preprocessor = build_preprocessor(list(parameters), parameters, plugins=host)
    values = torch.tensor([[99.0, 1.0], [math.e - 1.0, -3.0], [7.0, 1e9]])
    presence = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])

    out = preprocessor(values, presence)

    # A largest value below 1 counts as 1, so the scale stays finite; a missing value is 0.
    expected = [
        [1.0, 1.0],
        [1.0 / math.log(100.0), 0.0],
        [0.0, math.log1p(1e9) / math.log(2.0)],
    ]
    torch.testing.assert_close(out, torch.tensor(expected))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({}, "largest: Field required"),
        ({"largest": "many"}, "largest: Input should be a valid number"),
        ({"largest": 9.0, "max_value": 9.0}, "max_value: Extra inputs are not permitted"),
    ],
)
def test_a_plugin_types_parameters_are_validated_by_its_own_model_when_read(
    host, tmp_path, fields, problem
):
    """Before a type owned its parameters, a file could hold only Horizon's field names, and
    one the type needed but that was missing surfaced only when the model was built."""
    path = tmp_path / "normalization.json"
    features = {
        "visits": {"feature_type": "continuous", "mean": 1.0, "stddev": 2.0},
        "hours": {"feature_type": "log1p", **fields},
    }
    path.write_text(json.dumps({"state_features": features}))

    with pytest.raises(HorizonError) as error:
        read_normalization(path, host)

    assert str(error.value).startswith(
        f"{path}: state_features: feature 'hours': parameters of normalization type 'log1p' "
        f"(Log1pParameters): {problem}"
    )


def test_an_unknown_type_in_a_normalization_file_names_the_plugins_that_provide_types(
    host, tmp_path
):
    path = tmp_path / "normalization.json"
    hours = {"feature_type": "log1p", "largest": 9.0}
    path.write_text(json.dumps({"state_features": {"hours": hours}}))
    without_the_plugin = PluginHost(env={"HORIZON_DISABLE_PLUGINS": "constant"})

    with pytest.raises(HorizonError) as error:
        read_normalization(path, without_the_plugin)

    message = str(error.value)
    assert message.startswith(
        f"{path}: state_features: feature 'hours': unknown normalization type 'log1p'; the "
        "plugins that provide types: feature_types: binary, probability, continuous, boxcox, "
        "quantile, enum, continuous_action, do_not_preprocess"
    )
    assert "plugins not loaded: constant" in message
    assert read_normalization(path, host)["state_features"]["hours"].largest == 9.0


# --- The command --------------------------------------------------------------------------------


def test_the_plugins_command_writes_the_rows_its_source_yields(horizon, host, tmp_path):
    rows = tmp_path / "rows.jsonl"

    result = horizon(
        "reminder-rows", "-o", str(rows), "--users", "30", "--days", "4", "--seed", "7"
    )

    assert result.exit_code == 0, result.output
    assert result.output == f"wrote 120 rows of 30 users to {rows}\n"
    assert "reminder-rows" in horizon("--help").output
    # The built-in jsonl source reads the file into the rows the plugin's source yields.
    read = {}
    for kind, options in (
        ("jsonl", {"path": str(rows)}),
        ("reminder_rows", {"users": 30, "days": 4}),
    ):
        run = tmp_path / kind
        config = {
            "pipeline": {"output_dir": str(run), "seed": 7},
            "source": {"kind": kind, **options},
        }
        Engine(plugins=host, show_progress=False).run(config)
        read[kind] = pq.read_table(run / "source" / "rows.parquet")
    assert read["jsonl"].num_rows == 120
    assert read["jsonl"].equals(read["reminder_rows"])


def test_the_plugins_command_built_with_the_public_helper_reports_a_mistake_in_one_line(
    horizon, monkeypatch, tmp_path
):
    """``horizon_engine.command`` runs the plugin's command under the error-to-exit wrapper:
    a ``HorizonError`` from its work is one ``error:`` line and exit status 1."""
    from horizon_plugin_constant import commands

    def refused(users: int, days: int, seed: int):
        raise HorizonError(f"--users {users}: too many reminders")

    monkeypatch.setattr(commands, "reminder_rows", refused)

    result = horizon("reminder-rows", "-o", str(tmp_path / "rows.jsonl"), "--users", "3")

    assert result.exit_code == 1
    assert result.output == "error: --users 3: too many reminders\n"
    assert not (tmp_path / "rows.jsonl").exists()


# --- The trainer online -------------------------------------------------------------------------

GYM_TOML = """\
[gym]
env = "CartPole-v1"
seed = 0
episodes = 200
train_after_ts = 500
test_every_ts = 500
avg_over_num_episodes = 10
epsilon_decay_steps = 2000
epsilon_end = 0.05
score_bar = 100.0

[trainer]
kind = "small_q"
hidden = 64
learning_rate = 0.001
discount = 0.99
target_update_rate = 0.01
minibatch_size = 64

[export]
kind = "torch_program"
"""


def greedy_returns(program: torch.nn.Module, episodes: int) -> list[float]:
    """What the exported program earns playing CartPole greedily, on episodes no training or
    evaluation played (seeds from 10,000)."""
    import gymnasium

    env = gymnasium.make("CartPole-v1")
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            state = torch.tensor(observation, dtype=torch.float32)[None]
            _, _, action = program(state, torch.ones_like(state))
            observation, reward, terminated, truncated, _ = env.step(int(action))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


# --- A stage of its own -------------------------------------------------------------------------


def summary_pipeline(output_dir: Path) -> dict[str, Any]:
    """The plugin's source, the core's data stages and the plugin's ``row_summary`` stage."""
    return {
        "pipeline": {"output_dir": str(output_dir)},
        "source": {"kind": "constant_rows", "episodes": 4, "steps": 3},
        "timeline": {"eval_fraction": 0.5},
        "row_summary": {"label": "constant"},
    }


def test_the_plugins_stage_runs_after_the_timeline_it_reads_and_is_recorded_like_a_core_one(
    host, tmp_path
):
    run = tmp_path / "run"
    engine = Engine(plugins=host, show_progress=False)

    manifest = engine.run(summary_pipeline(run))

    assert manifest["executed"] == [
        "source",
        "timeline",
        "normalization",
        "row_summary",
        "report",
    ]
    record = manifest["stages"]["row_summary"]
    assert record["outputs"] == ["row_summary/rows.json"]
    assert record["run_id"] == manifest["run_id"]
    assert manifest["config"]["row_summary"] == {"label": "constant"}
    summary = json.loads((run / "row_summary" / "rows.json").read_text())
    timeline = manifest["stages"]["timeline"]["details"]
    assert summary == {
        "label": "constant",
        "train_rows": timeline["train_rows"],
        "eval_rows": timeline["eval_rows"],
    }

    # --stages: the timeline again makes the summary, which reads it, stale; the summary alone
    # then runs on the new timeline and is current again.
    again = engine.run(summary_pipeline(run), stages=["timeline"])
    assert "run" in again["stages"]["row_summary"]["stale"]
    alone = engine.run(summary_pipeline(run), stages=["row_summary"])
    assert alone["executed"] == ["row_summary"]
    assert "stale" not in alone["stages"]["row_summary"]
    unconfigured = summary_pipeline(run)
    del unconfigured["row_summary"]
    with pytest.raises(ConfigError, match=r"stage 'row_summary' has no \[row_summary\] section"):
        engine.run(unconfigured, stages=["row_summary"])


def test_the_stages_section_is_validated_and_listed_by_validate_and_plugins(horizon, tmp_path):
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n[source]\nkind = "constant_rows"\n'
        '\n[row_summary]\nlabl = "x"\n'
    )
    refused = horizon("validate", str(pipeline))
    assert refused.exit_code == 1
    assert f"{pipeline}:8: [row_summary] unknown key 'labl'; did you mean 'label'?" in (
        refused.stderr
    )
    pipeline.write_text(pipeline.read_text().replace("labl", "label"))
    listed = horizon("validate", str(pipeline))
    assert listed.exit_code == 0, listed.output
    *_, summary, report = listed.stdout.splitlines()
    assert summary.split() == ["row_summary", "-", *f"[row_summary] in {pipeline} line 7".split()]
    assert report.split() == ["report", "-", "defaults", "(no", "[report]", "section)"]
    plugins = horizon("plugins")
    assert (
        "  stage: row_summary [row_summary]  reads timeline/timeline.json; writes "
        "row_summary/rows.json"
    ) in plugins.stdout.splitlines()


def test_the_plugins_trainer_learns_cartpole_online_through_horizon_gym_train(
    horizon, tmp_path, one_thread
):
    """The same trainer, fed replay-buffer batches by ``horizon gym train``. A random policy
    lasts 22 steps of CartPole on average. Seeds 0-9 reached the score bar of 100 (a mean over
    10 greedy episodes) after 71 to 102 training episodes (1,500 to 3,000 steps); the exported
    program then averaged 87 to 214 over 20 episodes of its own (seed 0: 95 episodes, 214).
    The bar for the program is 60: learned, and well clear of chance."""
    gym_toml = tmp_path / "gym.toml"
    gym_toml.write_text(GYM_TOML, encoding="utf-8")
    run, history = tmp_path / "run", tmp_path / "history.csv"

    result = horizon("gym", "train", str(gym_toml), "-o", str(run), "-r", str(history))

    assert result.exit_code == 0, result.output
    assert re.match(r"CartPole-v1: \d+ episodes, ", result.output)
    assert "score bar 100: reached" in result.output
    assert f"wrote {run / 'policy.pt2'}" in result.output
    with history.open(encoding="utf-8") as handle:
        evaluations = list(csv.DictReader(handle))
    assert float(evaluations[-1]["mean_return"]) >= 100
    assert int(evaluations[-1]["episode"]) <= 200
    program = torch.export.load(run / "policy.pt2").module()
    assert np.mean(greedy_returns(program, 20)) >= 60


# --- docs/plugins.md shows this plugin ----------------------------------------------------------


def documented_blocks(language: str) -> list[tuple[str, str]]:
    """The ```<language> blocks of docs/plugins.md whose first line names a file
    (``# <path>``), as (path, the rest of the block)."""
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n# (\S+)[^\n]*\n(.*?)```", text, flags=re.S)


def test_the_worked_examples_in_the_docs_are_this_plugins_code_and_configs():
    excerpts = [
        (path, code)
        for path, code in documented_blocks("python")
        if path.startswith("horizon_plugin_constant/")
    ]
    shown = {path.removeprefix("horizon_plugin_constant/") for path, _ in excerpts}
    assert shown == {module.name for module in PACKAGE.glob("*.py")}
    for path, code in excerpts:
        source = (PROJECT / path).read_text(encoding="utf-8")
        assert f"\n{code.strip()}\n" in source, f"docs/plugins.md: {path} is not as documented"
    configs = dict(documented_blocks("toml"))
    assert tomllib.loads(configs["reminders.toml"]) == reminder_pipeline(Path("runs/reminders"))
    assert configs["gym.toml"] == GYM_TOML


def test_the_docs_name_every_public_name():
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = text.split("## The public API", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in horizon_engine.__all__ if f"`{name}`" not in section]
    assert missing == ["__version__"], f"docs/plugins.md, 'The public API', lacks {missing}"
