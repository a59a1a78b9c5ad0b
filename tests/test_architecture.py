"""The house's walls (DESIGN.md), as import-linter contracts in pyproject.toml: the core never
imports a plugin, plugins never import each other, trainers never import Spark.

The contracts are checked on the repository as it is, and on a copy with one deliberately
broken import, which must fail: a check that cannot fail would prove nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = [
    "horizon_engine",
    "horizon_plugins_spark",
    "horizon_plugins_dqn",
    "horizon_plugins_ac",
    "horizon_plugins_cpe",
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
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_a_core_module_importing_a_plugin_breaks_the_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    errors = tmp_path / "horizon_engine" / "errors.py"
    errors.write_text(errors.read_text() + "\nimport horizon_plugins_dqn  # deliberately\n")

    result = lint_imports(tmp_path)

    assert result.returncode != 0
    assert "The core never imports a plugin package BROKEN" in result.stdout
    assert "horizon_engine.errors -> horizon_plugins_dqn" in result.stdout
    # Every plugin imports the core's errors module, so through it the Spark plugin would now
    # reach the DQN plugin too: import-linter follows indirect imports.
    assert "Plugin packages never import each other BROKEN" in result.stdout
    assert "Contracts: 1 kept, 2 broken." in result.stdout
