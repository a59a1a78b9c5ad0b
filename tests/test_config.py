"""pipeline.toml validation: every mistake names the file, the line, the section and the key,
what was expected and what was found.

The checks run against the built-in plugins only, so that the components other packages
register do not change the messages asserted here.
"""

from __future__ import annotations

from typing import Self

import pytest
from click.testing import CliRunner
from pydantic import field_validator, model_validator

from horizon_engine.cli import main
from horizon_engine.components import ComponentConfig
from horizon_engine.config import ConfigBuilder, build_spec, parse_override
from horizon_engine.errors import ConfigError
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import PluginHost

GOOD = """\
[pipeline]
output_dir = "runs/test"
seed = 0

[source]
kind = "gym"
episodes = 10
"""


@pytest.fixture(scope="module")
def builtin_plugins() -> PluginHost:
    """The built-in plugins and no entry-point plugin."""
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": ""})


@pytest.fixture
def problems(tmp_path, builtin_plugins):
    """Write ``text`` as pipeline.toml, validate it, and return (its path, the problems)."""

    def validate(text: str, overrides: tuple[str, ...] = ()) -> tuple[str, list[str]]:
        path = tmp_path / "pipeline.toml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            build_spec(path, builtin_plugins, overrides)
        assert str(caught.value) == "\n".join(caught.value.problems)
        return str(path), caught.value.problems

    return validate


def test_a_good_file_resolves_with_defaults(tmp_path, builtin_plugins):
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    spec = build_spec(path, builtin_plugins)
    assert spec.origin == str(path)
    resolved = spec.resolved()
    assert resolved["pipeline"]["on_bad_rows"] == "fail"
    assert resolved["source"]["kind"] == "gym"
    assert resolved["source"]["episodes"] == 10
    assert resolved["source"]["env"] == "CartPole-v1"  # the gym source's default


def test_misspelt_key_suggests_the_right_one(problems):
    path, found = problems(GOOD.replace("episodes = 10", "episodse = 10"))
    assert len(found) == 1
    assert found[0].startswith(
        f"{path}:7: [source] unknown key 'episodse' of data_sources component 'gym'; "
        "did you mean 'episodes'? Valid keys: "
    )
    assert "episodes" in found[0].split("Valid keys: ")[1]


def test_unknown_section_suggests_the_right_one(problems):
    path, found = problems(GOOD + '\n[trainr]\nkind = "dqn"\n')
    assert found == [
        f"{path}:9: unknown section [trainr]; did you mean [trainer]? Valid sections: "
        "[pipeline], [source], [timeline], [normalization], [trainer], [[evaluation]], [export], "
        "[report]."
    ]


def test_key_outside_any_section(problems):
    path, found = problems("seed = 3\n" + GOOD.replace("seed = 0\n", ""))
    assert found[0].startswith(
        f"{path}:1: key 'seed' is outside any section; move it under [pipeline]. Sections: "
    )


def test_missing_kind(problems):
    path, found = problems('[source]\nenv = "CartPole-v1"\n')
    assert found == [
        f"{path}:1: [source] needs 'kind = ...' to choose a component; "
        "available: jsonl, parquet, gym"
    ]


def test_unknown_kind_suggests_the_right_one(problems):
    path, found = problems('[source]\nkind = "jsnl"\npath = "rows.jsonl"\n')
    assert len(found) == 1
    assert found[0].startswith(
        f"{path}:2: [source] kind = 'jsnl': no data_sources component 'jsnl' is registered; "
        "did you mean 'jsonl'?"
    )


def test_wrong_type(problems):
    path, found = problems(GOOD.replace("episodes = 10", 'episodes = "ten"'))
    assert found == [
        f"{path}:7: [source] key 'episodes' of data_sources component 'gym': expected a valid "
        "integer, unable to parse string as an integer; found 'ten' (str)"
    ]


def test_value_out_of_range(problems):
    path, found = problems(GOOD + "epsilon = 1.5\n")
    assert found == [
        f"{path}:8: [source] key 'epsilon' of data_sources component 'gym': expected less than "
        "or equal to 1; found 1.5 (float)"
    ]


def test_missing_required_key(problems):
    path, found = problems('[source]\nkind = "jsonl"\n')
    assert found == [
        f"{path}:1: [source] missing required key 'path' of data_sources component 'jsonl' "
        "(expected str | list[str])"
    ]


def test_key_of_a_union_type_gets_one_message(problems):
    path, found = problems('[source]\nkind = "jsonl"\npath = ["a.jsonl", 3]\n')
    assert found == [
        f"{path}:3: [source] key 'path' of data_sources component 'jsonl': expected "
        "str | list[str]; found ['a.jsonl', 3] (list)"
    ]


def test_bad_on_bad_rows_literal(problems):
    path, found = problems(GOOD.replace("seed = 0", 'seed = 0\non_bad_rows = "skip"'))
    assert found == [
        f"{path}:4: [pipeline] key 'on_bad_rows': expected 'fail' or 'quarantine'; "
        "found 'skip' (str)"
    ]


def test_evaluation_given_as_a_table(problems):
    path, found = problems(GOOD + '\n[evaluation]\nkind = "ips"\n')
    assert found == [
        f"{path}:9: [evaluation] must be an array of tables, one [[evaluation]] header per "
        "item; found a single table [evaluation]"
    ]


def test_every_problem_is_reported_at_once(problems):
    text = GOOD.replace("episodes = 10", 'episodes = "ten"\nepisodse = 1') + "[trainr]\n"
    path, found = problems(text)
    assert [problem.split(": ")[0] for problem in found] == [
        f"{path}:9",
        f"{path}:7",
        f"{path}:8",
    ]


def test_invalid_toml_names_file_and_line(problems):
    path, found = problems(GOOD + "epsilon = \n")
    assert found == [f"{path}:8: not valid TOML: Invalid value (at line 8, column 11)"]


def test_nonexistent_file(tmp_path, builtin_plugins):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        build_spec(missing, builtin_plugins)
    assert (
        str(caught.value) == f"{missing}: cannot read the pipeline file (No such file or directory)"
    )


def test_overrides_change_the_resolved_config(tmp_path, builtin_plugins):
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    spec = build_spec(
        path, builtin_plugins, ["source.episodes=3", "pipeline.seed=7", "source.env=Acrobot-v1"]
    )
    assert spec.pipeline.seed == 7
    assert spec.resolved()["source"]["episodes"] == 3
    assert spec.resolved()["source"]["env"] == "Acrobot-v1"  # a bare word is a string
    path.write_text(GOOD)  # the file itself is unchanged
    assert build_spec(path, builtin_plugins).resolved()["source"]["episodes"] == 10


def test_a_bad_value_from_an_override_names_the_override(problems):
    path, found = problems(GOOD, ("source.episodes=ten",))
    assert found == [
        f"{path} (--set source.episodes): [source] key 'episodes' of data_sources component "
        "'gym': expected a valid integer, unable to parse string as an integer; found 'ten' (str)"
    ]


@pytest.mark.parametrize("text", ["source.episodes", "episodes=3", ".episodes=3"])
def test_bad_override_syntax(text):
    with pytest.raises(ConfigError) as caught:
        parse_override(text)
    assert str(caught.value) == f"--set {text!r}: expected SECTION.KEY=VALUE"


def test_override_into_a_value(tmp_path, builtin_plugins):
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    with pytest.raises(ConfigError) as caught:
        build_spec(path, builtin_plugins, ["pipeline.seed.x=1"])
    assert str(caught.value) == "--set 'pipeline.seed.x=1': 'seed' is a value, not a section"


def test_section_whose_component_is_not_installed(problems):
    # No trainer is registered by the built-in plugins (the dqn plugin is a separate package).
    path, found = problems(GOOD + '\n[trainer]\nkind = "dqn"\n')
    assert len(found) == 1
    assert found[0].startswith(
        f"{path}:10: [trainer] kind = 'dqn': no trainers component 'dqn' is registered"
    )
    assert "Available: none." in found[0]


def test_dict_config_is_named_config(builtin_plugins):
    with pytest.raises(ConfigError) as caught:
        build_spec({"source": {"kind": "gym", "episodes": 0}}, builtin_plugins)
    assert str(caught.value) == (
        "<config>: [source] key 'episodes' of data_sources component 'gym': "
        "expected greater than or equal to 1; found 0 (int)"
    )
    spec = Engine(builtin_plugins).validate({"source": {"kind": "gym"}}, ["source.episodes=2"])
    assert spec.origin == "<config>"
    assert spec.resolved()["source"]["episodes"] == 2


# horizon validate --------------------------------------------------------------------------


def test_cli_validate_good_file(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"{path}: valid; a run executes 2 stages:\n  source  gym  [source] in {path} line 5\n"
        "  report  -    defaults (no [report] section)\n"
    )


def test_cli_validate_bad_file(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD.replace("episodes = 10", "episodse = 10"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {path}:7: [source] unknown key 'episodse'")
    assert "Traceback" not in result.output


def test_cli_validate_with_override(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["validate", str(path), "--set", "source.epsilon=2"])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {path} (--set source.epsilon): [source] key")


# Errors of a model validator, which pydantic gives no field location ---------------------


class RangeConfig(ComponentConfig):
    """A component config whose model validator checks two keys together."""

    low: int = 0
    high: int = 10
    step: int = 1

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low >= self.high:
            raise ValueError(f"low must be below high, found {self.low} >= {self.high}")
        if self.step >= self.high - self.low:
            # As an ``assert`` would, but pytest rewrites the message of a test module's assert.
            raise AssertionError("the range holds less than one step")
        return self


class SilentConfig(ComponentConfig):
    """A component config whose model validator fails without a message."""

    level: int = 0

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.level <= 0:
            raise AssertionError
        return self


RANGE_TOML = "[pipeline]\nseed = 1\n\n[trainer]\nstep = 1\nhigh = 2\nlow = 5\n"


def model_problems(model: type[ComponentConfig], plugins: PluginHost, **options) -> list[str]:
    builder = ConfigBuilder(plugins, "pipeline.toml", RANGE_TOML)
    assert builder.validate("trainer", model, options) is None
    return builder.problems


def test_model_validator_error_names_the_keys_it_is_about_and_their_line(builtin_plugins):
    assert model_problems(RangeConfig, builtin_plugins, step=1, high=2, low=5) == [
        "pipeline.toml:6: [trainer] keys 'high', 'low': low must be below high, found 5 >= 2; "
        "found high = 2, low = 5"
    ]


def test_model_validator_assertion_without_pydantic_prefix(builtin_plugins):
    assert model_problems(RangeConfig, builtin_plugins, step=3, high=2, low=0) == [
        "pipeline.toml:5: [trainer] key 'step': the range holds less than one step; found step = 3"
    ]


def test_model_validator_error_naming_no_key_points_at_the_section(builtin_plugins):
    assert model_problems(SilentConfig, builtin_plugins, level=0) == [
        "pipeline.toml:4: [trainer] options: "
        "the component's check of its options failed without saying why"
    ]


def test_field_validator_error_has_no_pydantic_prefix(builtin_plugins):
    class EvenConfig(ComponentConfig):
        step: int = 2

        @field_validator("step")
        @classmethod
        def _even(cls, step: int) -> int:
            if step % 2:
                raise ValueError("must be even")
            return step

    assert model_problems(EvenConfig, builtin_plugins, step=1) == [
        "pipeline.toml:5: [trainer] key 'step': must be even; found 1 (int)"
    ]


def test_a_trainer_option_mismatch_shows_no_question_mark_nor_pydantic_prefix(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(
        GOOD + '\n[trainer]\nkind = "dqn"\nlayers = [16]\nactivations = ["relu", "relu"]\n'
    )
    with pytest.raises(ConfigError) as caught:
        build_spec(path, PluginHost(env={"HORIZON_LOAD_PLUGINS": "dqn"}))
    [problem] = caught.value.problems
    assert problem.startswith(f"{path}:11: [trainer] keys 'layers', 'activations' of trainers")
    assert "'?'" not in problem
    assert "Value error" not in problem


# [pipeline] stages ---------------------------------------------------------------------------


def test_unknown_stage_names_file_line_and_the_nearest_stage(problems):
    path, found = problems(GOOD.replace("seed = 0", 'seed = 0\nstages = ["source", "trian"]'))
    assert found == [
        f"{path}:4: [pipeline] key 'stages': unknown stage 'trian'; did you mean 'train'? "
        "Stages: source, timeline, normalization, train, evaluation, export, report."
    ]


def test_stage_without_its_section_names_file_and_line(problems):
    path, found = problems(GOOD.replace("seed = 0", 'seed = 0\nstages = ["train"]'))
    assert found == [
        f"{path}:4: [pipeline] key 'stages': stage 'train' has no [trainer] section; "
        "add the section or leave the stage out"
    ]


# A kind that is not registered ----------------------------------------------------------------

SAC = GOOD + '\n[trainer]\nkind = "sac"\n'


def test_a_kind_not_registered_names_the_installed_plugins_not_loaded_here(problems):
    # The core names no plugin package: what could provide the kind is any plugin left out.
    path, found = problems(SAC)
    [problem] = found
    assert problem.startswith(
        f"{path}:10: [trainer] kind = 'sac': no trainers component 'sac' is registered. "
        "Available: none. Installed plugins not loaded here: "
    )
    assert "ac" in problem.split("not loaded here: ")[1].split(" (")[0].split(", ")
    assert problem.endswith("(left out by HORIZON_DISABLE_PLUGINS or HORIZON_LOAD_PLUGINS).")


def test_a_kind_a_loaded_plugin_registers_is_found(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(SAC.replace('"sac"', '"td3"'))
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "ac"})
    assert build_spec(path, host).sections["trainer"].component.name == "td3"
