"""The house's walls (docs/architecture.md, "The layers"), as import-linter contracts in
pyproject.toml: the core never imports a plugin, plugins never import each other, plugins
import only the public API (the names ``horizon_engine`` exports, never one of its modules),
the core reaches its built-in plugins (``horizon_engine.builtin``) only through the plugin
manager, the built-in plugins import only the public API too (and each other), trainers never
import Spark, serving imports neither torch nor Spark.

The contracts are checked on the repository as it is, and on a copy with one deliberately
broken import, which must fail: a check that cannot fail would prove nothing.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = [
    "horizon_engine",
    "horizon_plugins_spark",
    "horizon_plugins_dqn",
    "horizon_plugins_ac",
    "horizon_plugins_cpe",
    "horizon_plugins_serving",
    "horizon_plugins_worldmodel",
]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the packages under ``root``, with its pyproject.toml's contracts."""
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    environment = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        command, cwd=root, env=environment, capture_output=True, text=True, check=False
    )


def test_the_repository_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 7 kept, 0 broken." in result.stdout


def copy_with_import(root: Path, module: str, line: str) -> Path:
    """The packages copied under ``root``, with ``line`` appended to ``module`` (a path)."""
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", root)
    path = root / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately\n")
    return root


def test_a_core_module_importing_a_plugin_breaks_the_contract(tmp_path):
    copy_with_import(tmp_path, "horizon_engine/errors.py", "import horizon_plugins_dqn")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "The core never imports a plugin package BROKEN" in result.stdout
    assert "horizon_engine.errors -> horizon_plugins_dqn" in result.stdout
    # Every plugin imports the core's errors module, so through it the Spark plugin would now
    # reach the DQN plugin too: import-linter follows indirect imports.
    assert "Plugin packages never import each other BROKEN" in result.stdout
    assert "Contracts: 5 kept, 2 broken." in result.stdout


def test_a_plugin_importing_a_core_module_breaks_the_public_api_contract(tmp_path):
    line = "from horizon_engine.schema import ActionType"
    copy_with_import(tmp_path, "horizon_plugins_dqn/config.py", line)

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "Plugin packages import only the public API: horizon_engine's own names BROKEN" in (
        result.stdout
    )
    assert "horizon_plugins_dqn.config -> horizon_engine.schema" in result.stdout
    assert "Contracts: 6 kept, 1 broken." in result.stdout


def test_a_core_module_importing_a_builtin_plugin_breaks_the_plugin_manager_contract(tmp_path):
    line = "from horizon_engine.builtin.gym.runner import train_gym"
    copy_with_import(tmp_path, "horizon_engine/cli.py", line)

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    name = "The core reaches its built-in plugins only through the plugin manager BROKEN"
    assert name in result.stdout
    assert "horizon_engine.cli -> horizon_engine.builtin.gym.runner" in result.stdout
    assert "Contracts: 6 kept, 1 broken." in result.stdout


def test_a_builtin_plugin_importing_a_core_module_breaks_the_builtin_public_api_contract(
    tmp_path,
):
    """The built-in plugins are held to the public API as a third party's would be."""
    line = "from horizon_engine.schema import ActionType"
    copy_with_import(tmp_path, "horizon_engine/builtin/estimators.py", line)

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "Built-in plugins import only the public API and each other BROKEN" in result.stdout
    assert "horizon_engine.builtin.estimators -> horizon_engine.schema" in result.stdout
    assert "Contracts: 6 kept, 1 broken." in result.stdout


def test_the_builtin_plugins_contract_excuses_no_import_of_the_core():
    """Of the core, the built-in plugins import only the public API: the contract's one
    exception is their imports of each other."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "importlinter"
    ]["contracts"]
    [builtin] = [contract for contract in contracts if contract["id"] == "builtin-public-api"]
    assert builtin["ignore_imports"] == ["horizon_engine.builtin.** -> horizon_engine.builtin.**"]


def test_serving_importing_torch_breaks_the_serving_contract(tmp_path):
    copy_with_import(tmp_path, "horizon_plugins_serving/__init__.py", "import torch")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "Serving imports neither torch nor Spark BROKEN" in result.stdout
    assert "horizon_plugins_serving -> torch" in result.stdout
    assert "Contracts: 6 kept, 1 broken." in result.stdout


OUTSIDE_DOCUMENTS = ("DESIGN.md", "HORIZON-FACTS.md", "shared/seeds")
"""Documents that live beside the repository, not in it: a module citing them points a reader
at a file a clone does not have (docs/architecture.md is the repository's own)."""


def test_no_module_cites_a_document_outside_the_repository():
    cited = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in OUTSIDE_DOCUMENTS
        if name in path.read_text(encoding="utf-8")
    ]
    assert cited == []


ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\d+|#\d+\b", re.IGNORECASE)
"""An issue cited by number ("issue 22", "issue #12", "#12")."""


def issue_citations(source: str) -> list[str]:
    """The issue numbers the docstrings of ``source`` cite (every string statement: a module's,
    class's or function's docstring, or an attribute's below it)."""
    return [
        found.group(0)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for found in ISSUE_NUMBER.finditer(node.value.value)
    ]


def test_no_docstring_cites_an_issue_number():
    """A docstring says what and why; the history of how a figure was reached belongs in the
    docs (docs/measurements.md), where it can name the issues."""
    cited = [
        f"{path.relative_to(ROOT)}: {citation}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for citation in issue_citations(path.read_text(encoding="utf-8"))
    ]
    assert cited == []
    assert issue_citations('"""Before issue 22."""\nX = 1\n"""Since issue #12."""') == [
        "issue 22",
        "issue #12",
    ]


def test_every_measurement_a_module_points_to_is_on_the_page():
    page = (ROOT / "docs" / "measurements.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^### (\S+)$", page, re.MULTILINE))
    missing = [
        f"{path.relative_to(ROOT)}: #{anchor}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for anchor in re.findall(r"docs/measurements\.md#(\w+)", path.read_text(encoding="utf-8"))
        if anchor not in sections
    ]
    assert sections and missing == []
