"""pipeline.toml validation: every mistake names the file, the line, the section and the key,
what was expected and what was found.

The checks run against the built-in plugins only, so that the components other packages
register do not change the messages asserted here.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.config import build_spec, parse_override
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
        "[pipeline], [source], [timeline], [normalization], [trainer], [[evaluation]], [export]."
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
    assert result.stdout == f"{path}: valid ([source] gym)\n"


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
