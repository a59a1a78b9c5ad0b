"""One bad plugin never takes the command line down.

A plugin whose component Horizon cannot use (short of its family's contract, a register hook
that raises; a name another plugin has is tests/test_plugins.py's) is a load failure like a
misspelt hook: left out whole, reported by every command with how to disable it, while the
other plugins load and `horizon plugins` lists them. A plugin's component that raises during
a run is named, by plugin and component, in the error `horizon run` prints and in the
manifest.

Plugins are installed in-process into a temporary site folder (``plugin_site`` in conftest.py)
and loaded by a fresh ``PluginHost``.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from horizon_engine import Engine, HorizonError
from horizon_engine.errors import PluginError
from horizon_engine.plugins import DEFAULT_PLUGINS, PluginHost

BUILTINS = [module.rsplit(".", 1)[-1] for module in DEFAULT_PLUGINS]

SHORT_OF_CONTRACT = """
from horizon_engine import DataSource, hookimpl

CALLS = []

class Silent(DataSource):
    '''Never says how it reads.'''
    name = "silent"

@hookimpl
def horizon_register_data_sources(register):
    register(Silent)

@hookimpl
def horizon_on_stage_start(run, stage):
    CALLS.append(stage)
"""
"""A plugin whose source lacks the abstract ``read``, and which would observe every stage."""

GREETER = """
import click
from horizon_engine import DataSource, hookimpl

class Greetings(DataSource):
    '''Rows of greetings.'''
    name = "greetings"

    def read(self, run):
        return iter(())

@hookimpl
def horizon_register_data_sources(register):
    register(Greetings)

@hookimpl
def horizon_register_commands(cli):
    @cli.command()
    def greet():
        '''Say hello.'''
        click.echo("hello")
"""
"""A sound plugin with a component and a command, loaded beside the bad one."""

FAILING = """
import json
from horizon_engine import DataSource, HorizonError, hookimpl

class Failing(DataSource):
    '''Raises what its config names, from its own code or from a library it calls.'''
    name = "failing"

    def read(self, run):
        self.decode()
        yield from ()

    def decode(self):
        return json.loads("{")

class Refusing(DataSource):
    '''Refuses, as a component should, with a message for the user.'''
    name = "refusing"

    def read(self, run):
        raise HorizonError("refusing: the rows are not ready")

class Crashing(DataSource):
    '''Fails with a KeyError of its own.'''
    name = "crashing"

    def read(self, run):
        raise KeyError("user_id")

@hookimpl
def horizon_register_data_sources(register):
    register(Failing)
    register(Refusing)
    register(Crashing)
"""
"""A plugin whose sources raise during a run."""


def install(site: Any, plugin: str, source: str) -> None:
    module = f"horizon_plugin_{plugin}"
    site.install(f"horizon-plugin-{plugin}", "1.0", {plugin: module}, {f"{module}.py": source})


def only(*plugins: str) -> PluginHost:
    return PluginHost(env={"HORIZON_LOAD_PLUGINS": ",".join(plugins)})


@pytest.fixture
def horizon(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``horizon`` in-process with a given host as the process's plugin host, its plugin
    commands loaded afresh and forgotten afterwards."""
    from horizon_engine import plugins
    from horizon_engine.cli import main

    loaded = plugins._default_host
    earlier = {
        name for info in (loaded.plugins.values() if loaded else ()) for name in info.commands
    }
    monkeypatch.setattr(
        main, "commands", {k: v for k, v in main.commands.items() if k not in earlier}
    )
    monkeypatch.setattr(main, "plugin_commands_loaded", False)

    def invoke(host: PluginHost, *args: str) -> Any:
        monkeypatch.setattr(plugins, "_default_host", host)
        return CliRunner().invoke(main, list(args))

    return invoke


def source_pipeline(folder: Path, kind: str) -> Path:
    pipeline = folder / "pipeline.toml"
    pipeline.write_text(
        f'[pipeline]\noutput_dir = "{folder / "run"}"\n\n[source]\nkind = "{kind}"\n',
        encoding="utf-8",
    )
    return pipeline


# --- A plugin that cannot be loaded -------------------------------------------------------------


def test_a_component_short_of_its_contract_leaves_its_plugin_out_and_the_others_load(
    plugin_site,
):
    install(plugin_site, "silent", SHORT_OF_CONTRACT)
    install(plugin_site, "greeter", GREETER)

    host = only("silent", "greeter")

    assert list(host.plugins) == [*BUILTINS, "greeter"]
    assert host.component("data_sources", "greetings").plugin == "greeter"
    [failure] = host.failures
    assert (failure.name, failure.entry_point) == ("silent", "horizon_plugin_silent")
    assert failure.error == (
        "registered horizon_plugin_silent.Silent in horizon_register_data_sources: it does not "
        "implement read, which horizon_engine.DataSource requires"
    )
    # Left out whole: none of its hooks is called, so it cannot half-take part in a run.
    assert host.pm.get_plugin("silent") is None


def test_a_register_hook_that_raises_leaves_out_its_plugin_and_its_earlier_components(
    plugin_site,
):
    install(
        plugin_site,
        "halfway",
        """
        from horizon_engine import DataSource, hookimpl

        class Fine(DataSource):
            '''Would load on its own.'''
            name = "fine"

            def read(self, run):
                return iter(())

        @hookimpl
        def horizon_register_data_sources(register):
            register(Fine)

        @hookimpl
        def horizon_register_trainers(register):
            raise ImportError("no module named 'cuda_kernels'")
        """,
    )

    host = only("halfway")

    assert "halfway" not in host.plugins
    assert [entry.name for entry in host.components("data_sources")].count("fine") == 0
    [failure] = host.failures
    assert failure.error == (
        "horizon_register_trainers raised ImportError: no module named 'cuda_kernels'"
    )


def test_every_command_reports_the_bad_plugin_and_horizon_plugins_lists_the_others(
    plugin_site, tmp_path, horizon
):
    install(plugin_site, "silent", SHORT_OF_CONTRACT)
    install(plugin_site, "greeter", GREETER)
    warning = (
        "warning: plugin 'silent' (horizon_plugin_silent) failed to load: registered "
        "horizon_plugin_silent.Silent in horizon_register_data_sources: it does not implement "
        "read, which horizon_engine.DataSource requires; disable it with "
        "HORIZON_DISABLE_PLUGINS=silent (see `horizon plugins`)"
    )
    host = only("silent", "greeter")
    pipeline = source_pipeline(tmp_path, "greetings")

    for args in (["greet"], ["validate", str(pipeline)]):
        result = horizon(host, *args)
        assert result.stderr.splitlines() == [warning], args

    listing = horizon(host, "plugins")
    assert listing.exit_code == 0, listing.stderr
    assert "greeter 1.0  [horizon-plugin-greeter (horizon_plugin_greeter)]" in listing.stdout
    assert "  commands: horizon greet" in listing.stdout
    assert listing.stderr.splitlines() == [
        "FAILED silent [horizon_plugin_silent]: registered horizon_plugin_silent.Silent in "
        "horizon_register_data_sources: it does not implement read, which "
        "horizon_engine.DataSource requires"
    ]


# --- A plugin's component that fails during a run -----------------------------------------------


def test_a_components_exception_names_the_plugin_and_component_in_the_error_and_manifest(
    plugin_site, tmp_path
):
    install(plugin_site, "failing", FAILING)
    config = {"pipeline": {"output_dir": str(tmp_path)}, "source": {"kind": "crashing"}}

    with pytest.raises(PluginError) as error:
        Engine(plugins=only("failing"), show_progress=False).run(config)

    message = str(error.value)
    assert message.startswith(
        "plugin 'failing' (horizon-plugin-failing 1.0): its data_sources component 'crashing' "
        "raised KeyError: 'user_id' (in Crashing.read, horizon_plugin_failing line "
    )
    assert isinstance(error.value.__cause__, KeyError)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert (manifest["status"], manifest["failed_stage"]) == ("failed", "source")
    assert manifest["error"] == message


def test_horizon_run_prints_the_components_failure_in_one_line(plugin_site, tmp_path, horizon):
    install(plugin_site, "failing", FAILING)

    result = horizon(only("failing"), "run", str(source_pipeline(tmp_path, "failing")))

    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    [line] = result.stderr.splitlines()
    # The failure is in the json module the component called; the component is still named.
    assert line.startswith(
        "error: plugin 'failing' (horizon-plugin-failing 1.0): its data_sources component "
        "'failing' raised JSONDecodeError: Expecting property name enclosed in double quotes"
    )
    assert "(in Failing.decode, horizon_plugin_failing line " in line


def test_blame_leaves_errors_that_are_not_a_components_own_as_they_are(plugin_site):
    """A HorizonError keeps its message, a refused write its disk-full advice, and an error
    raised outside every component is not pinned on one."""
    install(plugin_site, "failing", FAILING)
    host = only("failing")
    source = host.component("data_sources", "refusing").cls
    refusing = source(source.Config())

    with pytest.raises(HorizonError) as refused:
        refusing.read(None)
    assert host.blame(refused.value) is None

    full = OSError(errno.ENOSPC, "No space left on device")
    assert host.blame(full) is None
    try:
        raise RuntimeError("core bug")
    except RuntimeError as core_bug:
        assert host.blame(core_bug) is None
