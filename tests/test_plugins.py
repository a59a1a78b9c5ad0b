"""Plugins: a third party's plugin is discovered, listed and used by name; a broken plugin is
reported by its name; allow and block lists; the register hooks of every family; lifecycle hooks.

Plugins are installed as pip would install them (see ``plugin_site`` in conftest.py) and loaded
by a fresh ``PluginHost``, never by registering modules on the manager behind Horizon's back.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest

import horizon_engine
from horizon_engine import Engine, HorizonError
from horizon_engine.errors import ConfigError, PluginError
from horizon_engine.plugins import DEFAULT_PLUGINS, PluginFailure, PluginHost

BUILTINS = [module.rsplit(".", 1)[-1] for module in DEFAULT_PLUGINS]
"""The core's own plugins, which load before any entry point."""

THIRD_PARTY = Path(__file__).parent / "third_party_plugin"
"""A plugin project as its author publishes it: pyproject.toml and the package."""

HORIZON = Path(sys.executable).with_name("horizon")
"""The console script of the environment running the tests."""

CONSTANT_HOOKS = [
    "horizon_on_epoch_end",
    "horizon_on_run_end",
    "horizon_on_stage_end",
    "horizon_on_stage_start",
    "horizon_register_commands",
    "horizon_register_data_sources",
    "horizon_register_estimators",
    "horizon_register_exporters",
    "horizon_register_feature_types",
    "horizon_register_stages",
    "horizon_register_timeline_engines",
    "horizon_register_trainers",
]

CONSTANT_COMPONENTS = [
    ("data_sources", "constant_rows"),
    ("data_sources", "reminder_rows"),
    ("timeline_engines", "one_step"),
    ("feature_types", "log1p"),
    ("trainers", "small_q"),
    ("estimators", "one_step_ips"),
    ("exporters", "torch_program"),
]
"""The third-party plugin's components: one of every family (tests/test_third_party_plugin.py
runs each), by family and name."""


@pytest.fixture
def site(plugin_site: Any) -> Any:
    """A site folder with the third-party ``constant`` plugin installed."""
    plugin_site.install_project(THIRD_PARTY)
    return plugin_site


def install_module(site: Any, plugin: str, source: str, version: str = "1.0") -> str:
    """Install a one-module plugin ``plugin`` whose module is ``horizon_plugin_<plugin>``."""
    module = f"horizon_plugin_{plugin}"
    site.install(f"horizon-plugin-{plugin}", version, {plugin: module}, {f"{module}.py": source})
    return module


def only(*plugins: str, **env: str) -> PluginHost:
    """A host loading only the named entry-point plugins (and the built-ins)."""
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": ",".join(plugins), **env})


def failure_of(host: PluginHost, name: str) -> PluginFailure:
    [failure] = [failure for failure in host.failures if failure.name == name]
    return failure


def recorded_calls() -> list[tuple[str, dict[str, Any]]]:
    """The lifecycle hook calls the ``constant`` plugin saw (it is imported by then)."""
    return sys.modules["horizon_plugin_constant"].CALLS


def run_constant(host: PluginHost, output_dir: Path, **options: Any) -> dict[str, Any]:
    config = {
        "pipeline": {"output_dir": str(output_dir)},
        "source": {"kind": "constant_rows", **options},
    }
    return Engine(plugins=host, show_progress=False).run(config)


def horizon(site: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the ``horizon`` command with ``site`` on PYTHONPATH and only the given HORIZON_* vars."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HORIZON_")}
    environment.update(PYTHONPATH=str(site.path), **env)
    return subprocess.run(
        [str(HORIZON), *args], capture_output=True, text=True, env=environment, timeout=120
    )


# A third party's plugin, installed as pip would install it.


def test_third_party_plugin_is_discovered_through_its_entry_point(site):
    host = PluginHost(env={})

    info = host.plugins["constant"]
    assert info.version == "0.3.1"
    assert info.source == "horizon-plugin-constant (horizon_plugin_constant)"
    assert info.hooks == CONSTANT_HOOKS
    assert [(entry.family, entry.name) for entry in info.components] == CONSTANT_COMPONENTS
    assert host.component("data_sources", "constant_rows").plugin == "constant"
    assert "sources" in host.plugins
    assert host.versions()["constant"] == "0.3.1"
    assert "constant" not in [failure.name for failure in host.failures]


def test_third_party_plugin_imports_only_the_public_api():
    tree = ast.parse((THIRD_PARTY / "horizon_plugin_constant" / "__init__.py").read_text())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("horizon_engine"):
            imported += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            assert not [alias for alias in node.names if alias.name.startswith("horizon_engine")]
    assert imported
    for module, name in imported:
        assert module in ("horizon_engine", "horizon_engine.schema"), (module, name)
        if module == "horizon_engine":
            assert name in horizon_engine.__all__, name


def test_horizon_plugins_lists_the_third_party_plugin(site):
    result = horizon(site, "plugins")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("constant 0.3.1  [horizon-plugin-constant (horizon_plugin_constant)]")
    assert lines[start + 1 : start + 8] == [
        f"  hooks: {', '.join(CONSTANT_HOOKS)}",
        "  commands: horizon reminder-rows",
        "  stage: row_summary [row_summary]  reads timeline/timeline.json; writes "
        "row_summary/rows.json",
        "  data_sources: constant_rows  Writes one discrete pre-timeline row, the same each step, "
        "for every step of every episode.",
        "      episodes: int (default 2)  How many episodes to write; with 0 the source yields "
        "nothing.",
        "      steps: int (default 3)  How many rows (decisions) each episode has.",
        "      reward: float (default 1.0)  The reward of every row.",
    ]
    assert "constant" not in result.stderr


def test_horizon_plugins_json_lists_the_third_party_plugin(site):
    result = horizon(site, "plugins", "--json")

    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    [plugin] = [plugin for plugin in listing["plugins"] if plugin["name"] == "constant"]
    assert plugin["version"] == "0.3.1"
    assert plugin["source"] == "horizon-plugin-constant (horizon_plugin_constant)"
    assert plugin["hooks"] == CONSTANT_HOOKS
    components = plugin["components"]
    assert [(c["family"], c["name"]) for c in components] == CONSTANT_COMPONENTS
    component = components[0]
    assert component["summary"].startswith("Writes one discrete pre-timeline row")
    options = {
        option["name"]: (option["type"], option["required"], option["default"])
        for option in component["options"]
    }
    assert options == {
        "episodes": ("int", False, 2),
        "steps": ("int", False, 3),
        "reward": ("float", False, 1.0),
    }
    assert all(option["help"] for option in component["options"])
    assert "constant" not in [failure["name"] for failure in listing["failures"]]


def test_horizon_plugins_honours_the_allow_and_block_lists(site):
    allowed = horizon(site, "plugins", "--json", HORIZON_LOAD_PLUGINS="constant")
    blocked = horizon(site, "plugins", "--json", HORIZON_DISABLE_PLUGINS="constant,sources")

    assert [p["name"] for p in json.loads(allowed.stdout)["plugins"]] == [*BUILTINS, "constant"]
    names = [p["name"] for p in json.loads(blocked.stdout)["plugins"]]
    assert "constant" not in names
    assert "sources" not in names


def test_third_party_source_runs_by_name_in_a_pipeline(site, tmp_path):
    host = only("constant")

    manifest = run_constant(host, tmp_path / "run", episodes=4, steps=5)

    rows = pq.read_table(tmp_path / "run" / "source" / "rows.parquet")
    assert rows.num_rows == 20
    assert sorted(set(rows["mdp_id"].to_pylist())) == [f"episode-{i}" for i in range(4)]
    assert rows["action"].to_pylist() == ["stay"] * 20
    assert manifest["status"] == "succeeded"
    assert manifest["plugins"]["constant"] == "0.3.1"
    assert manifest["config"]["source"] == {
        "kind": "constant_rows",
        "episodes": 4,
        "steps": 5,
        "reward": 1.0,
    }
    assert manifest["stages"]["source"]["rows_out"] == 20
    ends = [args for hook, args in recorded_calls() if hook == "horizon_on_stage_end"]
    assert [(args["stage"], args["report"].rows_out) for args in ends] == [
        ("source", 20),
        ("report", 0),
    ]


def test_third_party_source_options_are_validated_by_its_config_model(site, tmp_path):
    with pytest.raises(ConfigError) as error:
        run_constant(only("constant"), tmp_path / "run", episode=4)

    assert (
        "[source] unknown key 'episode' of data_sources component 'constant_rows'; "
        "did you mean 'episodes'?"
    ) in str(error.value)


# A broken plugin is reported by its name.


def test_plugin_that_fails_to_import_is_reported_and_the_others_still_load(site):
    install_module(site, "broken", "raise RuntimeError('needs a GPU driver')")

    host = only("broken", "constant")

    failure = failure_of(host, "broken")
    assert failure.entry_point == "horizon_plugin_broken"
    assert failure.error == "import failed: RuntimeError: needs a GPU driver"
    assert "broken" not in host.plugins
    assert list(host.plugins) == [*BUILTINS, "constant"]
    with pytest.raises(PluginError, match=r"Plugins that failed to load: broken \(see"):
        host.component("data_sources", "gpu_rows")


def test_horizon_plugins_reports_a_plugin_that_fails_to_import(site):
    install_module(site, "broken", "raise RuntimeError('needs a GPU driver')")

    result = horizon(site, "plugins", HORIZON_LOAD_PLUGINS="broken,constant")

    assert result.returncode == 0
    assert (
        "FAILED broken [horizon_plugin_broken]: import failed: RuntimeError: needs a GPU driver"
    ) in result.stderr.splitlines()
    assert "constant 0.3.1  [horizon-plugin-constant (horizon_plugin_constant)]" in result.stdout


def test_load_failures_are_listed_for_the_manifest(site):
    install_module(site, "broken", "raise RuntimeError('needs a GPU driver')")

    host = only("broken", "constant")

    assert host.load_failures() == [
        {
            "name": "broken",
            "entry_point": "horizon_plugin_broken",
            "error": "import failed: RuntimeError: needs a GPU driver",
        }
    ]
    assert only("constant").load_failures() == []


def test_horizon_run_and_validate_warn_of_a_plugin_that_fails_to_load(site, tmp_path):
    install_module(site, "broken", "raise RuntimeError('needs a GPU driver')")
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{tmp_path / "run"}"\n\n[source]\nkind = "constant_rows"\n'
    )
    warning = (
        "warning: plugin 'broken' (horizon_plugin_broken) failed to load: import failed: "
        "RuntimeError: needs a GPU driver; disable it with HORIZON_DISABLE_PLUGINS=broken "
        "(see `horizon plugins`)"
    )

    for command in ("validate", "run"):
        result = horizon(site, command, str(pipeline), HORIZON_LOAD_PLUGINS="broken,constant")
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines() == [warning]

    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "succeeded"
    assert manifest["plugin_failures"] == [
        {
            "name": "broken",
            "entry_point": "horizon_plugin_broken",
            "error": "import failed: RuntimeError: needs a GPU driver",
        }
    ]


def test_registering_a_built_in_component_name_is_a_failure_naming_both_plugins(site):
    install_module(
        site,
        "impostor",
        """
        from horizon_engine import DataSource, hookimpl

        class Jsonl(DataSource):
            '''Another JSONL reader.'''
            name = "jsonl"

            def read(self, run):
                return iter(())

        @hookimpl
        def horizon_register_data_sources(register):
            register(Jsonl)
        """,
    )

    host = only("impostor")
    assert host.component("data_sources", "jsonl").plugin == "sources"
    assert failure_of(host, "impostor").error == (
        "two plugins register the data_sources component 'jsonl': 'sources' "
        "(horizon_engine.builtin.sources.JsonlSource) and 'impostor' "
        "(horizon_plugin_impostor.Jsonl); 'impostor' is left out "
        "(HORIZON_DISABLE_PLUGINS=sources leaves out the other instead)"
    )
    # Blocking the built-ins instead lets the plugin provide `jsonl`.
    host = only("impostor", HORIZON_DISABLE_PLUGINS="sources")
    assert host.component("data_sources", "jsonl").plugin == "impostor"


def test_two_third_party_plugins_registering_one_name_is_a_failure_naming_both(site):
    install_module(
        site,
        "copycat",
        """
        from horizon_engine import DataSource, hookimpl

        class Rows(DataSource):
            '''Constant rows, again.'''
            name = "constant_rows"

            def read(self, run):
                return iter(())

        @hookimpl
        def horizon_register_data_sources(register):
            register(Rows)
        """,
    )

    # Whichever the environment lists second is left out; the failure names both.
    [failure] = only("constant", "copycat").failures
    message = failure.error
    assert message.startswith("two plugins register the data_sources component 'constant_rows'")
    assert "'constant' (horizon_plugin_constant.ConstantRows)" in message
    assert "'copycat' (horizon_plugin_copycat.Rows)" in message


def test_an_entry_point_name_already_taken_is_reported(site):
    install_module(site, "sources", "")

    host = only("sources", "constant")

    failure = failure_of(host, "sources")
    assert failure.entry_point == "horizon_plugin_sources"
    assert failure.error == "another plugin is already called 'sources' (builtin)"
    assert host.plugins["sources"].source == "builtin"


def test_one_module_under_two_plugin_names_is_reported(plugin_site):
    module = "horizon_plugin_twice"
    entry_points = {"first": module, "second": module}
    plugin_site.install("horizon-plugin-twice", "1.0", entry_points, {f"{module}.py": ""})

    host = only("first", "second")

    assert list(host.plugins) == [*BUILTINS, "first"]
    assert host.failures == [
        PluginFailure("second", module, "its module is already loaded as plugin 'first'")
    ]


def test_disabled_plugin_is_not_loaded(site):
    host = PluginHost(env={"HORIZON_DISABLE_PLUGINS": "constant"})

    assert "constant" not in host.plugins
    assert "constant" not in [failure.name for failure in host.failures]
    with pytest.raises(PluginError, match="no data_sources component 'constant_rows'"):
        host.component("data_sources", "constant_rows")


def test_built_in_plugin_can_be_disabled(site, tmp_path):
    host = only("constant", HORIZON_DISABLE_PLUGINS="sources")

    assert list(host.plugins) == [*(name for name in BUILTINS if name != "sources"), "constant"]
    names = [entry.name for entry in host.components("data_sources")]
    assert names == ["constant_rows", "reminder_rows"]
    config = {"pipeline": {"output_dir": str(tmp_path)}, "source": {"kind": "jsonl", "path": "x"}}
    with pytest.raises(ConfigError, match="no data_sources component 'jsonl' is registered"):
        Engine(plugins=host, show_progress=False).run(config)


def test_load_plugins_allow_list_loads_only_the_named_entry_points(site):
    install_module(site, "other", "")

    assert list(only("constant").plugins) == [*BUILTINS, "constant"]
    assert list(only("other").plugins) == [*BUILTINS, "other"]
    assert list(only("other", HORIZON_DISABLE_PLUGINS="other").plugins) == BUILTINS
    assert {"constant", "other"} <= set(PluginHost(env={}).plugins)


def test_misspelt_hook_is_reported_with_the_nearest_hook_name(site):
    install_module(
        site,
        "typo",
        """
        from horizon_engine import hookimpl

        @hookimpl
        def horizon_register_data_source(register):
            raise AssertionError("a plugin with a misspelt hook must be left out")

        @hookimpl
        def horizon_on_run_end(run, manifest):
            raise AssertionError("a plugin with a misspelt hook must be left out")
        """,
    )

    host = only("typo", "constant")

    failure = failure_of(host, "typo")
    assert failure.entry_point == "horizon_plugin_typo"
    assert failure.error == (
        "implements unknown hook 'horizon_register_data_source'; "
        "did you mean 'horizon_register_data_sources'?"
    )
    assert "typo" not in host.plugins
    assert host.pm.get_plugin("typo") is None
    host.on_run_end(run=SimpleNamespace(run_id="r1"), manifest={"status": "succeeded"})


def test_hook_with_a_wrong_argument_name_is_reported(site):
    install_module(
        site,
        "wrongargs",
        """
        from horizon_engine import hookimpl

        @hookimpl
        def horizon_on_stage_end(run, stage, result):
            pass
        """,
    )

    host = only("wrongargs", "constant")

    assert failure_of(host, "wrongargs").error == (
        "hook 'horizon_on_stage_end' declares unknown argument(s) result; "
        "the hook passes run, stage, report"
    )
    assert "wrongargs" not in host.plugins
    assert "constant" in host.plugins


def test_hook_implementation_pluggy_rejects_is_reported(plugin_site):
    install_module(
        plugin_site,
        "wrapper",
        """
        from horizon_engine import hookimpl

        @hookimpl(wrapper=True)
        def horizon_on_stage_end(stage):
            return None
        """,
    )

    host = only("wrapper")

    error = failure_of(host, "wrapper").error
    assert error.startswith(
        "cannot be registered: Plugin 'wrapper' for hook 'horizon_on_stage_end'"
    )
    assert "not a generator function" in error
    assert "wrapper" not in host.plugins


BAD_REGISTRATIONS = {
    "not_a_class": (
        "register(lambda: None)",
        "<lambda> at 0x",
        "expected a subclass of horizon_engine.DataSource",
    ),
    "wrong_family": (
        """
        class Learner(Trainer):
            '''A trainer.'''
            name = "learner"

        register(Learner)
        """,
        "Learner in horizon_register_data_sources: ",
        "it is a trainers component; expected a subclass of horizon_engine.DataSource",
    ),
    "no_name": (
        """
        class Nameless(DataSource):
            '''No name.'''

        register(Nameless)
        """,
        "Nameless in horizon_register_data_sources: ",
        "it has no name; set the class attribute name = '...'",
    ),
    "no_read": (
        """
        class Silent(DataSource):
            '''Reads nothing: it never says how.'''
            name = "silent"

        register(Silent)
        """,
        "Silent in horizon_register_data_sources: ",
        "it does not implement read, which horizon_engine.DataSource requires",
    ),
    "plain_pydantic_config": (
        """
        from pydantic import BaseModel

        class Loose(DataSource):
            '''Its config would accept any key.'''
            name = "loose"
            class Config(BaseModel):
                path: str

        register(Loose)
        """,
        "Loose in horizon_register_data_sources: ",
        "expected a subclass of horizon_engine.ComponentConfig",
    ),
}


@pytest.mark.parametrize("case", BAD_REGISTRATIONS)
def test_registering_something_other_than_a_component_is_a_failure(plugin_site, case):
    body, what, problem = BAD_REGISTRATIONS[case]
    source = (
        "from horizon_engine import DataSource, Trainer, hookimpl\n\n"
        "@hookimpl\n"
        "def horizon_register_data_sources(register):\n"
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
    )
    install_module(plugin_site, "bad", source)

    message = str(failure_of(only("bad"), "bad"))
    assert message.startswith("plugin 'bad' (horizon_plugin_bad) failed to load: registered ")
    assert what in message
    assert problem in message


def test_unknown_component_kind_in_a_pipeline_suggests_the_nearest_name(site, tmp_path):
    with pytest.raises(ConfigError) as error:
        run_constant(only("constant"), tmp_path / "run", kind="constant_row")

    message = str(error.value)
    assert message.startswith(
        "<config>: [source] kind = 'constant_row': no data_sources component 'constant_row' is "
        "registered; did you mean 'constant_rows'? Available: jsonl, parquet, gym, constant_rows, "
        "reminder_rows."
    )
    assert not (tmp_path / "run").exists()


# The register hooks of every family.


def test_every_family_registers_through_its_own_hook(plugin_site):
    install_module(
        plugin_site,
        "families",
        """
        from horizon_engine import (
            EstimatorBase,
            ExporterBase,
            FeatureParameters,
            FeatureType,
            NormalizationEngine,
            TimelineEngine,
            TrainerBase,
            hookimpl,
        )

        class LocalTimeline(TimelineEngine):
            '''The timeline, on this machine.'''
            name = "toy"

            def build(self, run, rows, output, action_type, quarantine):
                raise NotImplementedError

        class SparkTimeline(LocalTimeline):
            '''The timeline, on a SparkSession.'''
            name = "toy_spark"

        class Sampler(NormalizationEngine):
            '''The feature sample, drawn elsewhere.'''
            name = "toy_sampler"

            def sample(self, run, train, column, num_samples):
                raise NotImplementedError

        class Halves(FeatureType):
            '''Half the value.'''
            name = "toy_halves"
            Parameters = FeatureParameters

            def fit(self, values, config): ...
            def module(self, parameters, max_feature_value): ...

        class Dqn(TrainerBase):
            '''Deep Q-learning.'''
            name = "toy_dqn"

            def setup(self, problem): ...
            def train_step(self, batch): ...
            def state_dict(self): ...
            def load_state_dict(self, state): ...
            def policy(self): ...

        class Ips(EstimatorBase):
            '''Inverse propensity scoring.'''
            name = "toy_ips"

            def estimate(self, episodes):
                return {}

        class Onnx(ExporterBase):
            '''ONNX.'''
            name = "toy_onnx"

            def export(self, run, bundle):
                return []

        @hookimpl
        def horizon_register_timeline_engines(register):
            register(LocalTimeline)
            register(SparkTimeline)

        @hookimpl
        def horizon_register_normalization_engines(register):
            register(Sampler)

        @hookimpl
        def horizon_register_feature_types(register):
            register(Halves)

        @hookimpl
        def horizon_register_trainers(register):
            register(Dqn)

        @hookimpl
        def horizon_register_estimators(register):
            register(Ips)

        @hookimpl
        def horizon_register_exporters(register):
            register(Onnx)
        """,
    )

    host = only("families")

    assert host.deprecations == []
    assert host.component("timeline_engines", "toy_spark").cls.__name__ == "SparkTimeline"
    [listing] = [plugin for plugin in host.describe() if plugin["name"] == "families"]
    assert [(c["family"], c["name"]) for c in listing["components"]] == [
        ("timeline_engines", "toy"),
        ("timeline_engines", "toy_spark"),
        ("normalization_engines", "toy_sampler"),
        ("feature_types", "toy_halves"),
        ("trainers", "toy_dqn"),
        ("estimators", "toy_ips"),
        ("exporters", "toy_onnx"),
    ]
    assert "toy_halves" in host.feature_types()


def test_one_engine_name_twice_in_a_family_is_a_failure(plugin_site):
    for plugin in ("spark_one", "spark_two"):
        install_module(
            plugin_site,
            plugin,
            """
            from horizon_engine import TimelineEngine, hookimpl

            class SparkTimeline(TimelineEngine):
                '''The timeline, on a SparkSession.'''
                name = "spark"

                def build(self, run, rows, output, action_type, quarantine):
                    raise NotImplementedError

            @hookimpl
            def horizon_register_timeline_engines(register):
                register(SparkTimeline)
            """,
        )

    [failure] = only("spark_one", "spark_two").failures
    message = failure.error
    assert "the timeline_engines component 'spark'" in message
    assert "'spark_one' (horizon_plugin_spark_one.SparkTimeline)" in message
    assert "'spark_two' (horizon_plugin_spark_two.SparkTimeline)" in message


# The deprecated transforms hook.

LEGACY_PLUGIN = """
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from horizon_engine import FeatureTransform, NormalizationTransform, TimelineTransform
import_warnings = [str(warning.message) for warning in caught]

from horizon_engine import feature_module, hookimpl


class OldTimeline(TimelineTransform):
    '''A timeline engine written for the transforms hook.'''
    engine = "old_local"

    def build(self, run, rows, output, action_type, quarantine):
        raise NotImplementedError


class OldSampler(NormalizationTransform):
    '''A normalization engine written for the transforms hook.'''
    engine = "old_local"

    def sample(self, run, train, column, num_samples):
        raise NotImplementedError


class Doubled(FeatureTransform):
    '''A feature type written before types fitted themselves.'''
    name = "doubled"

    def module(self, parameters, max_feature_value):
        return feature_module(_doubled)


def _doubled(x):
    return x * 2.0


@hookimpl
def horizon_register_transforms(register):
    register(OldTimeline)
    register(OldSampler)
    register(Doubled)
"""

LEGACY_WARNING = (
    "plugin 'legacy' (horizon_plugin_legacy) is deprecated: horizon_register_transforms is "
    "deprecated; register timeline engines with horizon_register_timeline_engines, "
    "normalization engines with horizon_register_normalization_engines and feature types "
    "with horizon_register_feature_types (docs/plugins.md)"
)


def test_the_deprecated_transforms_hook_routes_each_class_to_its_family(plugin_site):
    """A plugin written for the one transforms hook still loads, each class in the family of
    its base class (an engine named by its ``engine``), and is reported as deprecated, naming
    the three hooks that replace it."""
    import numpy as np

    from horizon_engine.normalization import NormalizationConfig, identify_all

    module = install_module(plugin_site, "legacy", LEGACY_PLUGIN)

    host = only("legacy")

    assert host.failures == []
    assert host.component("timeline_engines", "old_local").cls.__name__ == "OldTimeline"
    assert host.component("normalization_engines", "old_local").cls.__name__ == "OldSampler"
    assert host.component("feature_types", "doubled").plugin == "legacy"
    assert [str(deprecation) for deprecation in host.deprecations] == [LEGACY_WARNING]
    expected = [
        f"horizon_engine.{old} is deprecated: subclass horizon_engine.{new} and register it "
        "with its family's hook (docs/plugins.md)"
        for old, new in [
            ("FeatureTransform", "FeatureType"),
            ("NormalizationTransform", "NormalizationEngine"),
            ("TimelineTransform", "TimelineEngine"),
        ]
    ]
    assert sys.modules[module].import_warnings == expected
    # A type without a fit of its own is fitted as before: the sample's range.
    sample = {"3": np.arange(30.0)}
    fitted = identify_all(sample, NormalizationConfig(), {"3": "doubled"}, host.feature_types())
    assert fitted.parameters["3"].model_dump(exclude_none=True) == {
        "feature_type": "doubled",
        "min_value": 0.0,
        "max_value": 29.0,
    }


def test_a_class_of_no_family_in_the_deprecated_hook_names_the_three_bases(plugin_site):
    install_module(
        plugin_site,
        "stray",
        """
        from horizon_engine import DataSource, hookimpl

        class Rows(DataSource):
            '''Rows, in the wrong hook.'''
            name = "rows"

        @hookimpl
        def horizon_register_transforms(register):
            register(Rows)
        """,
    )

    assert failure_of(only("stray"), "stray").error == (
        "registered horizon_plugin_stray.Rows in horizon_register_transforms: expected a "
        "subclass of one of horizon_engine.TimelineEngine, horizon_engine.NormalizationEngine, "
        "horizon_engine.FeatureType"
    )


def test_horizon_plugins_and_every_command_report_a_deprecated_hook(plugin_site, tmp_path):
    install_module(plugin_site, "legacy", LEGACY_PLUGIN)
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text('[pipeline]\noutput_dir = "run"\n\n[source]\nkind = "gym"\n')

    listed = horizon(plugin_site, "plugins", HORIZON_LOAD_PLUGINS="legacy")
    validated = horizon(plugin_site, "validate", str(pipeline), HORIZON_LOAD_PLUGINS="legacy")

    assert listed.returncode == 0
    assert f"DEPRECATED {LEGACY_WARNING}" in listed.stderr.splitlines()
    listing = listed.stdout.splitlines()
    assert "  timeline_engines: old_local  A timeline engine written for the transforms hook." in (
        listing
    )
    assert validated.stderr.splitlines().count(f"warning: {LEGACY_WARNING}") == 1


# Lifecycle hooks.


def test_stage_and_run_hooks_observe_a_run_in_order(site, tmp_path):
    output_dir = tmp_path / "run"

    manifest = run_constant(only("constant"), output_dir, episodes=2, steps=3)

    calls = recorded_calls()
    assert [hook for hook, _ in calls] == [
        "horizon_on_stage_start",
        "horizon_on_stage_end",
        "horizon_on_stage_start",
        "horizon_on_stage_end",
        "horizon_on_run_end",
    ]
    assert [args["stage"] for hook, args in calls[2:4]] == ["report", "report"]
    started, ended, _, _, finished = (args for _, args in calls)
    assert started["stage"] == "source"
    assert started["run"].output_dir == output_dir
    assert started["run"] is ended["run"] is finished["run"]
    assert ended["stage"] == "source"
    assert (ended["report"].rows_in, ended["report"].rows_out) == (6, 6)
    assert ended["report"].outputs == ["source/rows.parquet"]
    assert finished["manifest"] is manifest
    assert finished["manifest"]["status"] == "succeeded"
    on_disk = json.loads((output_dir / "manifest.json").read_text())
    assert on_disk["status"] == "succeeded"
    assert on_disk["stages"]["source"]["rows_out"] == 6


def test_run_end_hook_is_called_when_a_stage_fails(site, tmp_path):
    with pytest.raises(HorizonError, match="the source yielded no rows"):
        run_constant(only("constant"), tmp_path / "run", episodes=0)

    calls = recorded_calls()
    assert [hook for hook, _ in calls] == ["horizon_on_stage_start", "horizon_on_run_end"]
    manifest = calls[-1][1]["manifest"]
    assert manifest["status"] == "failed"
    assert manifest["error"] == "[source] constant_rows: the source yielded no rows"
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["status"] == "failed"


def test_epoch_end_hook_receives_the_epochs_metrics(site, tmp_path):
    host = only("constant")
    run = SimpleNamespace(run_id="r1", output_dir=tmp_path)

    host.on_epoch_end(run, 1, {"Training/td_loss": 0.5})
    host.on_epoch_end(run, 2, {"Training/td_loss": 0.25, "CPE/DR": 1.5})

    assert recorded_calls() == [
        ("horizon_on_epoch_end", {"run": run, "epoch": 1, "metrics": {"Training/td_loss": 0.5}}),
        (
            "horizon_on_epoch_end",
            {"run": run, "epoch": 2, "metrics": {"Training/td_loss": 0.25, "CPE/DR": 1.5}},
        ),
    ]


# The plugins in docs/plugins.md work as printed.


def _documented_modules() -> dict[str, str]:
    """The ```python blocks of docs/plugins.md that start with a ``# <module>.py`` line."""
    text = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n# (\w+\.py)\n(.*?)```", text, flags=re.S)
    return dict(blocks)


def test_documented_example_plugins_work(plugin_site, tmp_path, capsys):
    """The one-file plugin docs/plugins.md starts with; its worked examples are the third-party
    plugin's code, held to it by tests/test_third_party_plugin.py."""
    modules = _documented_modules()
    assert sorted(modules) == ["horizon_stage_timer.py"]
    source = {"horizon_stage_timer.py": modules["horizon_stage_timer.py"]}
    plugin_site.install(
        "horizon-stage-timer", "0.1.0", {"stage_timer": "horizon_stage_timer"}, source
    )
    plugin_site.install_project(THIRD_PARTY)
    host = only("stage_timer", "constant")
    assert host.failures == []
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "constant_rows", "episodes": 10, "steps": 5},
    }

    manifest = Engine(plugins=host, show_progress=False).run(config)

    assert manifest["stages"]["source"]["rows_out"] == 50
    assert re.fullmatch(
        r"source: 50 rows out in \d+\.\d\d s\nreport: 0 rows out in \d+\.\d\d s\n",
        capsys.readouterr().out,
    )


def test_a_gym_runs_manifest_records_plugins_that_failed_to_load(site, tmp_path):
    from horizon_engine.builtin.gym.config import load_gym_spec
    from horizon_engine.builtin.gym.runner import train_gym

    install_module(site, "broken", "raise RuntimeError('needs a GPU driver')")
    host = only("broken", "dqn")
    config = {
        "gym": {
            "env": "CartPole-v1",
            "episodes": 2,
            "train_after_ts": 20,
            "avg_over_num_episodes": 1,
            "output_dir": str(tmp_path / "run"),
        },
        "trainer": {"kind": "dqn", "minibatch_size": 8},
    }
    train_gym(load_gym_spec(config, host), host)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["plugin_failures"] == host.load_failures() != []


CONTRACT_BREACHES = {
    "trainers": (
        "HalfDone",
        """
        class HalfDone(TrainerBase):
            '''Sets up, and nothing more.'''
            name = "half_done"

            def setup(self, problem): ...
            def state_dict(self): ...
            def load_state_dict(self, state): ...
        """,
        "it does not implement policy, train_step, which horizon_engine.TrainerBase requires",
    ),
    "exporters": (
        "Plain",
        """
        class Plain(Exporter):
            '''The empty family base, not the exporter contract.'''
            name = "plain"
        """,
        "expected a subclass of horizon_engine.ExporterBase",
    ),
    "feature_types": (
        "NoFit",
        """
        class NoFit(FeatureType):
            '''Builds a module, fits no parameters.'''
            name = "no_fit"

            def module(self, parameters, max_feature_value): ...
        """,
        "it does not implement fit, which horizon_engine.FeatureType requires",
    ),
    "timeline_engines": (
        "Nameless",
        """
        class Nameless(TimelineEngine):
            '''An engine [timeline] engine could not select.'''

            def build(self, run, rows, output, action_type, quarantine): ...
        """,
        "it has no name; set the class attribute name = '...' that pipeline.toml selects "
        "(every horizon_engine.TimelineEngine needs one)",
    ),
    "normalization_engines": (
        "Misfiled",
        """
        class Misfiled(TimelineEngine):
            '''A timeline engine, in the normalization engines' hook.'''
            name = "misfiled"

            def build(self, run, rows, output, action_type, quarantine): ...
        """,
        "it is a timeline_engines component; expected a subclass of "
        "horizon_engine.NormalizationEngine (register it in horizon_register_timeline_engines)",
    ),
}


@pytest.mark.parametrize("family", CONTRACT_BREACHES)
def test_a_component_short_of_its_familys_contract_is_refused_when_plugins_load(
    plugin_site, family
):
    """At load time, naming the plugin and the methods, not as an AttributeError mid-run; the
    plugin is left out (tests/test_bad_plugins.py: the others still load)."""
    cls, body, problem = CONTRACT_BREACHES[family]
    source = (
        "from horizon_engine import Exporter, FeatureType, TimelineEngine, TrainerBase\n"
        "from horizon_engine import hookimpl\n\n"
        + textwrap.dedent(body).strip()
        + f"\n\n@hookimpl\ndef horizon_register_{family}(register):\n    register({cls})\n"
    )
    install_module(plugin_site, "breach", source)

    message = str(failure_of(only("breach"), "breach"))
    assert message.startswith(
        f"plugin 'breach' (horizon_plugin_breach) failed to load: registered "
        f"horizon_plugin_breach.{cls} in "
    )
    assert message.endswith(problem)


def test_engines_are_not_normalization_types(tmp_path):
    """Engines and feature types are families of their own: an engine's name given to a
    feature as its type is a config error naming the types there are."""
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "source": {"kind": "gym", "episodes": 3, "ds": "2019-01-01"},
        "timeline": {"actions": ["0", "1"]},
        "normalization": {"overrides": {"0": "local"}},
    }
    with pytest.raises(HorizonError, match="'local'") as error:
        Engine(show_progress=False).run(config)
    types = str(error.value).split("types: ")[1]
    assert "continuous" in types
    assert "local" not in types


# --- Commands -----------------------------------------------------------------------------------


def test_a_plugin_adds_commands_and_one_taken_or_raising_is_a_failure(plugin_site):
    import click
    from click.testing import CliRunner

    install_module(
        plugin_site,
        "greeter",
        """
        import click
        from horizon_engine import hookimpl

        @hookimpl
        def horizon_register_commands(cli):
            @cli.command()
            @click.argument("name")
            def greet(name):
                '''Say hello.'''
                click.echo(f"hello {name}")

            @cli.command("run")
            def shadow():
                '''Would replace the core's horizon run.'''
        """,
    )
    install_module(
        plugin_site,
        "broken",
        """
        from horizon_engine import hookimpl

        @hookimpl
        def horizon_register_commands(cli):
            raise RuntimeError("no commands today")
        """,
    )
    host = only("greeter", "broken")

    @click.group()
    def cli() -> None:
        """A stand-in for the horizon group."""

    @cli.command("run")
    def core_run() -> None:
        click.echo("core run")

    host.register_commands(cli)
    assert sorted(cli.commands) == ["greet", "gym", "run"]
    assert CliRunner().invoke(cli, ["greet", "ada"]).output == "hello ada\n"
    assert CliRunner().invoke(cli, ["run"]).output == "core run\n"
    assert host.plugins["greeter"].commands == ["greet"]
    assert str(failure_of(host, "greeter")).endswith(
        "failed to load: its command 'horizon run' is refused: the name is taken"
    )
    assert failure_of(host, "broken").error == (
        "horizon_register_commands raised RuntimeError: no commands today"
    )
