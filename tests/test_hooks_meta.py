"""Every hook is documented, really called, and has a docstring (datasette's meta-tests).

A hook added to hookspecs.py without a ``### <hook>`` section in docs/plugins.md fails here. So
does one the core never calls: a recording plugin implementing every hook watches a real run
(all six stages, then the command line listing its commands), and each hook must reach it with
the arguments its spec names, so plugin authors never meet a hook that is declared and dead.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import pytest

from horizon_engine import hookspecs
from horizon_engine.plugins import HOOK_NAMES, PluginHost

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs" / "plugins.md"


def _hooks() -> list[str]:
    """Every function hookspecs.py declares as a hook (carrying pluggy's spec marker)."""
    marker = f"{hookspecs.hookspec.project_name}_spec"
    return sorted(name for name, value in vars(hookspecs).items() if hasattr(value, marker))


def _documented_sections() -> dict[str, str]:
    """docs/plugins.md's ``### name`` headings, each with the text up to the next heading."""
    text = DOCS.read_text(encoding="utf-8")
    parts = re.split(r"^(#{1,3}) (.+)$", text, flags=re.M)
    return {
        title.strip(): body
        for level, title, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
        if level == "###"
    }


def test_the_hooks_are_found():
    # The other meta-tests pass vacuously if no hook is found; the plugin host's list of hooks
    # (used to suggest the nearest one to a misspelt name) must hold exactly these.
    assert {"horizon_register_data_sources", "horizon_on_run_end"} <= set(_hooks())
    assert list(HOOK_NAMES) == _hooks()


def test_every_documented_hook_exists():
    assert sorted(_documented_sections()) == _hooks()


@pytest.mark.parametrize("hook", _hooks())
def test_hook_is_documented_with_its_arguments(hook):
    section = _documented_sections().get(hook)
    assert section is not None, f"docs/plugins.md has no '### {hook}' section"
    arguments = ", ".join(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert f"{hook}({arguments})" in section, f"the '{hook}' section does not show its call"
    assert "Returns" in section, f"the '{hook}' section does not say what it returns"


def _recording_plugin() -> str:
    """A plugin implementing every hook, each appending (hook, {argument: its type's name}) to
    ``CALLS``."""
    lines = ["from horizon_engine import hookimpl", "CALLS = []"]
    for hook in _hooks():
        arguments = list(inspect.signature(getattr(hookspecs, hook)).parameters)
        lines += [
            "",
            "@hookimpl",
            f"def {hook}({', '.join(arguments)}):",
            f"    CALLS.append(({hook!r}, {{name: type(value).__name__ for name, value in "
            f"locals().items()}}))",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def hook_calls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, str]]]:
    """Every hook call a recording plugin sees during a real run of every stage, and while the
    command line loads its plugins' commands: hook name -> each call's arguments' types."""
    import importlib
    import sys

    import click

    from horizon_engine.pipeline import Engine

    site = tmp_path_factory.mktemp("site")
    (site / "horizon_hook_recorder.py").write_text(_recording_plugin())
    dist = site / "horizon_hook_recorder-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: horizon-hook-recorder\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text("[horizon]\nrecorder = horizon_hook_recorder\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "recorder,dqn"})
        assert "recorder" in host.plugins, host.failures
        output = tmp_path_factory.mktemp("run")
        config = textwrap.dedent(
            f"""
            [pipeline]
            output_dir = "{output}"
            [source]
            kind = "gym"
            env = "CartPole-v1"
            episodes = 20
            ds = "2019-01-01"
            [timeline]
            actions = ["0", "1"]
            eval_fraction = 0.3
            [normalization]
            [trainer]
            kind = "dqn"
            epochs = 1
            [[evaluation]]
            kind = "logged_value"
            [export]
            kind = "onnx"
            """
        )
        (output / "pipeline.toml").write_text(config)
        Engine(host).run(output / "pipeline.toml")
        host.register_commands(click.Group("horizon"))
        recorder = sys.modules["horizon_hook_recorder"]
        calls: dict[str, list[dict[str, str]]] = {}
        for hook, arguments in recorder.CALLS:
            calls.setdefault(hook, []).append(arguments)
        return calls
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("horizon_hook_recorder", None)


@pytest.mark.parametrize("hook", _hooks())
def test_hook_is_called_by_the_core(hook, hook_calls):
    assert hook in hook_calls, f"no run called {hook}"
    spec_arguments = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    for arguments in hook_calls[hook]:
        assert list(arguments) == spec_arguments
        assert "NoneType" not in arguments.values(), arguments


def test_the_lifecycle_hooks_are_called_once_per_stage_epoch_and_run(hook_calls):
    stages = ["source", "timeline", "normalization", "train", "evaluation", "export", "report"]
    assert len(hook_calls["horizon_on_stage_start"]) == len(stages)
    assert len(hook_calls["horizon_on_stage_end"]) == len(stages)
    assert len(hook_calls["horizon_on_epoch_end"]) == 1
    assert len(hook_calls["horizon_on_run_end"]) == 1


@pytest.mark.parametrize("hook", _hooks())
def test_hook_has_a_docstring(hook):
    docstring = inspect.getdoc(getattr(hookspecs, hook))
    assert docstring, f"{hook} in hookspecs.py has no docstring"
    assert "Returns" in docstring, f"{hook}'s docstring does not say what it returns"
