"""Config values that crashed or misled: each is refused by ``validate`` (``horizon validate``
and ``Engine().validate``) with the file, the line where there is one, and the key."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from horizon_engine import preflight
from horizon_engine.cli import main
from horizon_engine.components import FAMILIES, MAX_LEARNING_RATE
from horizon_engine.errors import ConfigError, HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import PluginHost

SOURCE = '[source]\nkind = "gym"\nepisodes = 2\n'
TIMELINE = '[timeline]\nactions = ["0", "1"]\n\n[normalization]\n'


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The installed plugins (the DQN trainer among them), as `horizon validate` has them."""
    return Engine(plugins=PluginHost(env={}), show_progress=False)


@pytest.fixture
def refused(tmp_path, engine):
    """Write ``text`` as pipeline.toml, validate it, and return (its path, the message)."""

    def validate(text: str, **options: object) -> tuple[str, str]:
        path = tmp_path / "pipeline.toml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            engine.validate(path, **options)
        return str(path), str(caught.value)

    return validate


def pipeline_text(output_dir: str, *sections: str) -> str:
    return "\n".join([f"[pipeline]\noutput_dir = {output_dir}\n", SOURCE, *sections])


def test_layers_too_large_for_the_machine_are_refused_before_allocating(refused, monkeypatch):
    monkeypatch.setattr(preflight, "_machine_memory", lambda: 16 * 2**30)
    trainer = '[trainer]\nkind = "dqn"\nlayers = [100000, 100000]\n'
    path, message = refused(pipeline_text('"runs/x"', TIMELINE, trainer))
    assert message.startswith(
        f"{path}:15: [trainer] layers = [100000, 100000] makes networks of about 1e+10 "
        "weights, 149 GiB to train"
    )
    assert "more than this machine's 16 GiB of memory" in message


@pytest.mark.parametrize(
    ("output_dir", "why"),
    [
        ('""', "key 'output_dir': names no folder"),
        ('"   "', "key 'output_dir': names no folder"),
        ('"runs/a\\u0000b"', "key 'output_dir': holds a NUL byte"),
        ('"/"', "is the filesystem's root or a folder directly under it"),
        ('"/tmp"', "is the filesystem's root or a folder directly under it"),
        ('"/proc/self"', "is in /proc, a folder of the operating system"),
        ('"/etc/horizon"', "is in /etc, a folder of the operating system"),
    ],
)
def test_an_output_dir_that_is_no_folder_of_the_runs_own_is_refused(refused, output_dir, why):
    path, message = refused(pipeline_text(output_dir))
    assert message.startswith(f"{path}:2: [pipeline] ")
    assert why in message


def test_the_current_folder_its_parents_and_a_checkout_are_refused(tmp_path, refused, monkeypatch):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "runs").mkdir()
    monkeypatch.chdir(project / "runs")
    # ".." is the checkout's top too, which is said first: no manifest there makes it a run's.
    reasons = {".": "the current folder or one above it", "..": "the top of a git work tree"}
    for output_dir, reason in reasons.items():
        path, message = refused(pipeline_text(f'"{output_dir}"'))
        assert f"{path}:2: [pipeline] output_dir = {output_dir!r}" in message
        assert reason in message
    monkeypatch.chdir(tmp_path)
    path, message = refused(pipeline_text(f'"{project}"'))
    assert "is the top of a git work tree (a project's checkout)" in message


def test_a_run_folder_may_be_named_from_inside_it(tmp_path, engine, monkeypatch):
    """`horizon export .` in a run folder validates its config with output_dir '.'."""
    (tmp_path / "manifest.json").write_text('{"run_id": "r", "stages": {}}')
    (tmp_path / "pipeline.toml").write_text(pipeline_text('"."'))
    monkeypatch.chdir(tmp_path)
    assert engine.validate(tmp_path / "pipeline.toml").pipeline.output_dir == "."


def test_arrays_nested_5000_deep_are_a_config_error_naming_the_file(tmp_path, refused, engine):
    path, message = refused(pipeline_text('"runs/x"') + "layers = " + "[" * 5000 + "]" * 5000)
    assert message.startswith(f"{path}: arrays or tables nest too deeply to read")
    path, message = refused(pipeline_text('"runs/x"') + "deep = " + "[" * 40 + "]" * 40)
    assert message == f"{path}:7: [source] key 'deep' nests arrays or tables more than 32 deep"
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    config = {"pipeline": {"output_dir": str(tmp_path / "run")}, "source": {"deep": nested}}
    with pytest.raises(ConfigError, match="<config>: \\[source\\] key 'deep' nests"):
        engine.validate(config)
    with pytest.raises(ConfigError, match=r"--set source\.deep: the value nests too deeply"):
        engine.validate(config | {"source": {}}, ["source.deep=" + "[" * 5000])


def test_duplicate_actions_and_stages_are_refused(refused):
    timeline = TIMELINE.replace('["0", "1"]', '["0", "1", "0"]')
    path, message = refused(pipeline_text('"runs/x"', timeline))
    assert message.startswith(f"{path}:9: [timeline] key 'actions' of timeline_engines component ")
    assert "lists '0' more than once; found ['0', '1', '0'] (list)" in message
    text = pipeline_text('"runs/x"').replace(
        "[pipeline]\n", '[pipeline]\nstages = ["source", "source"]\n'
    )
    path, message = refused(text)
    assert f"{path}:2: [pipeline] key 'stages': lists 'source' more than once" in message


def test_lists_where_repeating_means_something_are_accepted(engine, tmp_path):
    """Only lists of names refuse a repeat (``DistinctNames``): one activation per layer may
    well be the same activation twice."""
    trainer = {"kind": "dqn", "layers": [8, 8], "activations": ["relu", "relu"]}
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "gym", "episodes": 2},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {},
        "trainer": trainer,
    }
    assert engine.validate(config).sections["trainer"].config.activations == ["relu", "relu"]


@pytest.mark.parametrize(
    ("epochs", "why"),
    [
        ("1e12", "key 'epochs' of trainers component 'dqn': 1000000000000 is beyond any count"),
        ("2.5", 'epochs = 2.5: give a number of passes (1 or more) or "auto"'),
        ("nan", "[trainer] key 'epochs' holds nan"),
    ],
)
def test_epochs_beyond_any_count_are_refused(refused, epochs, why):
    trainer = f'[trainer]\nkind = "dqn"\nepochs = {epochs}\n'
    path, message = refused(pipeline_text('"runs/x"', TIMELINE, trainer))
    assert message.startswith(f"{path}:15: ")
    assert why in message


def test_a_pipeline_without_a_source_is_refused_by_validate(tmp_path, refused, engine):
    run = tmp_path / "run"
    text = f'[pipeline]\noutput_dir = "{run}"\n\n{TIMELINE}'
    path, message = refused(text)
    assert message == (
        f"{path}: no [source] section, and {run}/source/rows.parquet does not exist: the stages "
        "to run read it; add a [source] section naming the logged rows (`horizon plugins` lists "
        "the kinds): the stages between it and [trainer] run at their defaults"
    )
    (run / "source").mkdir(parents=True)
    (run / "source" / "rows.parquet").write_bytes(b"recorded by an earlier run")
    assert engine.validate(tmp_path / "pipeline.toml", stages=["timeline"]).sections


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        ('[normalization.overrides]\n"3" = "sideways"\n', 13),
        ('[normalization]\noverrides = {"3" = {type = "sideways", mean = 0.0}}\n', 13),
    ],
)
def test_an_unknown_override_type_is_refused_by_validate(refused, overrides, line):
    text = pipeline_text('"runs/x"', TIMELINE.replace("[normalization]\n", ""), overrides)
    path, message = refused(text)
    assert message.startswith(
        f"{path}:{line}: [normalization] overrides: feature '3': unknown type 'sideways'; types: "
    )
    assert "continuous" in message


def test_horizon_validate_prints_the_problem_in_one_line(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(pipeline_text('"/proc/self"'))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert f"{path}:2: [pipeline] output_dir = '/proc/self' (that is /proc/" in result.output
    assert "is in /proc, a folder of the operating system" in result.output
    assert "Traceback" not in result.output


def test_networks_that_fail_to_allocate_are_a_clear_error(trainer_host, tmp_path, monkeypatch):
    """Layers the config check let through (memory taken by others since, a smaller GPU) fail
    where the trainer allocates them: one message naming the section, not torch's traceback."""
    from test_training import pipeline

    def allocate_too_much(self, problem):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
            "you tried to allocate 40000000000 bytes."
        )

    trainer = trainer_host.pm.get_plugin("mean_reward").MeanReward
    monkeypatch.setattr(trainer, "setup", allocate_too_much)
    with pytest.raises(HorizonError, match=r"\[trainer\] kind = 'mean_reward': its networks"):
        Engine(plugins=trainer_host, show_progress=False).run(pipeline(tmp_path / "run"))


def test_an_output_dir_is_checked_when_the_current_folder_was_removed(
    engine, tmp_path, monkeypatch
):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    config = {"pipeline": {"output_dir": str(tmp_path / "run")}, "source": {"kind": "gym"}}
    assert engine.validate(config).pipeline.output_dir == str(tmp_path / "run")


TRAINER = '[trainer]\nkind = "dqn"\n'


@pytest.mark.parametrize(
    ("sections", "line", "key"),
    [
        ((TIMELINE.replace("]\n", "]\nmax_memory_gb = 1e300\n", 1),), 9, "[timeline] key"),
        ((TIMELINE, TRAINER + "max_memory_gb = 1e300\n"), 15, "[trainer] key"),
    ],
)
def test_a_max_memory_gb_beyond_any_machine_is_refused(refused, sections, line, key):
    """1e300 GiB is no number of bytes: the run failed with an OverflowError converting it."""
    path, message = refused(pipeline_text('"runs/x"', *sections))
    assert message.startswith(f"{path}:{line}: {key} 'max_memory_gb' of ")
    assert "1e+300 is beyond any weight, scale or size an option takes (at most 1e+09" in message


@pytest.mark.parametrize(
    ("section", "line", "key"),
    [
        (
            TRAINER + '\n[[evaluation]]\nkind = "dm"\nnum_bootstrap = 2147483647\n',
            18,
            "[evaluation[0]] key 'num_bootstrap' of estimators component 'dm'",
        ),
        (
            '[trainer]\nkind = "world_model"\nnum_bootstrap = 2147483647\n',
            15,
            "[trainer] key 'num_bootstrap' of trainers component 'world_model'",
        ),
    ],
)
def test_num_bootstrap_is_bounded_to_what_a_run_can_draw(refused, section, line, key):
    """2**31 - 1 resamples ran out of memory after 80 s, blamed on the plugin."""
    path, message = refused(pipeline_text('"runs/x"', TIMELINE, section))
    assert message.startswith(f"{path}:{line}: {key}")
    assert message.endswith(": expected less than or equal to 100000; found 2147483647 (int)")


@pytest.mark.parametrize(
    ("kind", "option"),
    [
        ("dqn", "learning_rate"),
        ("parametric_dqn", "learning_rate"),
        ("sac", "actor_learning_rate"),
        ("td3", "critic_learning_rate"),
        ("sac", "alpha_learning_rate"),
        ("world_model", "learning_rate"),
    ],
)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("1e300", "expected less than or equal to 10; found 1e+300"),
        ("1e30", "expected less than or equal to 10; found 1e+30"),
        ("0.0", "expected greater than 0; found 0.0"),
        ("inf", "expected a finite number; found inf"),
    ],
)
def test_a_learning_rate_no_optimizer_trains_with_is_refused(refused, kind, option, value, why):
    trainer = f'[trainer]\nkind = "{kind}"\n{option} = {value}\n'
    path, message = refused(pipeline_text('"runs/x"', TIMELINE, trainer))
    assert message.startswith(f"{path}:15: [trainer] key '{option}' of trainers component ")
    assert why in message


def test_every_learning_rate_option_is_a_learning_rate(engine):
    """The bound is one type (``LearningRate``), which every trainer's learning rate options
    take: a new option declared as a plain float would accept 1e30 again."""
    options = [
        (entry.name, name, info)
        for entry in engine.plugins.components("trainers")
        for name, info in entry.cls.Config.model_fields.items()
        if name.endswith("learning_rate")
    ]
    assert len(options) >= 6  # dqn, parametric_dqn, world_model: 1; sac: 3; td3, ddpg: 2
    for kind, name, info in options:
        bounds = [getattr(rule, "le", None) for rule in info.metadata]
        assert MAX_LEARNING_RATE in bounds, f"{kind} {name}"


@pytest.mark.parametrize(
    ("section", "option", "why"),
    [
        (TIMELINE.replace("]\n", "]\nreward = { reward = inf }\n", 1), "reward.reward", "finite"),
        (TIMELINE.replace("]\n", "]\neval_fraction = inf\n", 1), "eval_fraction", "finite"),
        (TRAINER + "gamma = -inf\n", "gamma", "expected a finite number; found -inf"),
        (TRAINER + "cql_alpha = inf\n", "cql_alpha", "expected a finite number; found inf"),
        (TRAINER + "cql_alpha = 1e20\n", "cql_alpha", "1e+20 is beyond any weight, scale"),
        (TRAINER + 'reward_boost = {"0" = -1e20}\n', "reward_boost", "-1e+20 is beyond any"),
    ],
)
def test_infinite_and_huge_floats_are_refused(refused, section, option, why):
    """inf passed every float option that set no upper bound (a reward weight, gamma's
    bound is checked first, cql_alpha, ...), and 1e20 every one without a bound at all."""
    sections = (section,) if section.startswith("[timeline]") else (TIMELINE, section)
    path, message = refused(pipeline_text('"runs/x"', *sections))
    assert message.startswith(f"{path}:")
    assert f"key '{option}' of " in message
    assert why in message


def test_no_float_option_of_any_component_takes_infinity(engine):
    """The rule is the config models' base's (``ComponentConfig``), not each option's: every
    registered component's float options, a map's values included, refuse inf."""
    from pydantic import ValidationError

    checked = 0
    for family in FAMILIES:
        for entry in engine.plugins.components(family):
            model = entry.cls.Config
            for name, info in model.model_fields.items():
                text = str(info.annotation)
                if "float" not in text or "bool" in text:
                    continue
                value = {"x": float("inf")} if "dict[" in text else float("inf")
                with pytest.raises(ValidationError, match=r"finite number|= inf:"):
                    model.model_validate({name: value})
                checked += 1
    assert checked > 50  # every float option of the installed plugins' many components


@pytest.mark.parametrize(
    ("weights", "why"),
    [
        ('{ "" = 1.0 }', "a weight's key '' names no metric"),
        ('{ " clicks" = 1.0 }', "metric ' clicks' has spaces around its name"),
        ("{}", "weighs no metric, so every reward would be 0"),
    ],
)
def test_reward_weights_name_metrics(refused, weights, why):
    timeline = TIMELINE.replace("]\n", f"]\nreward = {weights}\n", 1)
    path, message = refused(pipeline_text('"runs/x"', timeline))
    assert message.startswith(f"{path}:9: [timeline] key 'reward' of timeline_engines ")
    assert why in message


def test_a_byte_order_mark_is_skipped(tmp_path, engine):
    """Some editors start a UTF-8 file with a BOM; tomllib called it an invalid statement."""
    path = tmp_path / "pipeline.toml"
    path.write_bytes(b"\xef\xbb\xbf" + pipeline_text(f'"{tmp_path / "run"}"').encode())
    assert engine.validate(path).sections["source"].config.episodes == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            SOURCE + 'kind = "gym"\n',
            ":7: [source] key 'kind' is given twice (first at line 5); keep one",
        ),
        (
            SOURCE + "[source]\nseed = 1\n",
            ":7: [source] is declared twice (first at line 4); give each of its keys once, "
            "under one header",
        ),
        (
            "[timeline]\nreward = { a = 1.0, a = 2.0 }\n",
            ":5: [timeline] key 'reward' gives 'a' twice in its inline table; keep one",
        ),
        ("seed = 1\nseed = 2\n", ":2: key 'seed' is given twice (first at line 1); keep one"),
    ],
)
def test_a_key_given_twice_is_named_with_its_section_and_first_line(refused, text, expected):
    """tomllib's own words were "Cannot overwrite a value (at line 7, column 13)"."""
    if text.startswith("seed"):
        text = text + '\n[pipeline]\noutput_dir = "runs/x"\n'
    else:
        text = '[pipeline]\noutput_dir = "runs/x"\n\n' + text
    path, message = refused(text)
    assert message == path + expected
