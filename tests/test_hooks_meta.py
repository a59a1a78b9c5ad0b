"""Every hook is documented, tested and has a docstring (datasette's meta-tests).

A hook added to hookspecs.py without a ``### <hook>`` section in docs/plugins.md, or without a
test that names it, fails here, so plugin authors never meet an undocumented or untested hook.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from horizon_engine import hookspecs
from horizon_engine.plugins import HOOK_NAMES

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


def _test_sources() -> str:
    """The text of every test module and conftest.py, but not this file."""
    here = Path(__file__).resolve()
    files = [*sorted(ROOT.joinpath("tests").rglob("test_*.py")), ROOT / "tests" / "conftest.py"]
    return "\n".join(path.read_text(encoding="utf-8") for path in files if path.resolve() != here)


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


@pytest.mark.parametrize("hook", _hooks())
def test_hook_is_exercised_by_a_test(hook):
    assert re.search(rf"\b{hook}\b", _test_sources()), f"no test mentions {hook}"


@pytest.mark.parametrize("hook", _hooks())
def test_hook_has_a_docstring(hook):
    docstring = inspect.getdoc(getattr(hookspecs, hook))
    assert docstring, f"{hook} in hookspecs.py has no docstring"
    assert "Returns" in docstring, f"{hook}'s docstring does not say what it returns"
