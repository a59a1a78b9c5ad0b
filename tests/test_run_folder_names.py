"""``RunFolder`` owns the run folder: its names, and the files the engine reads back.

No other module spells a run-folder file name (an AST scan of every string constant that is
a path, docstrings and prose messages aside), so that a stage, a command and the gym runner
cannot disagree on where a file lives; and the typed reads refuse a file that is not what
its name says with an error naming it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from horizon_engine.driver import ProblemDescription
from horizon_engine.errors import HorizonError
from horizon_engine.run_folder import RunFolder, inside_path
from horizon_engine.schema import ActionType

ROOT = Path(__file__).resolve().parents[1]

RUN_FOLDER_FILE = re.compile(
    r"(^|/)(manifest\.json|problem\.json|cpe\.json|cpe_\w+\.json|normalization\.json"
    r"|check_rows\.pt|latest\.pt|epoch-\S*\.pt|model\.onnx|timeline/timeline\.json"
    r"|rows\.parquet|quarantine\.jsonl)$"
)
"""A string that is a path to one of the run's files (not a message that mentions one)."""


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of every docstring's constant: a module's, a class's, a function's, and the
    attribute docstrings that follow an assignment."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            found |= {
                id(statement.value)
                for statement in body
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            }
    return found


def spelled_run_folder_paths(module: Path, shown: str) -> list[str]:
    """Each string constant of ``module`` that is a run-folder path, as ``shown:line: value``."""
    tree = ast.parse(module.read_text(encoding="utf-8"))
    docstrings = _docstrings(tree)
    return [
        f"{shown}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and RUN_FOLDER_FILE.search(node.value.strip())
    ]


def test_no_module_but_run_folder_spells_a_run_folder_file():
    packages = [ROOT / "horizon_engine", *sorted(ROOT.glob("horizon_plugins_*"))]
    modules = [
        path
        for package in packages
        for path in sorted(package.rglob("*.py"))
        if path != ROOT / "horizon_engine" / "run_folder.py"
    ]
    assert len(modules) > 50
    spelled = [
        found
        for module in modules
        for found in spelled_run_folder_paths(module, str(module.relative_to(ROOT)))
    ]
    assert spelled == []


def test_the_scan_finds_a_spelled_name(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        '"""Reads manifest.json."""\n'
        'MANIFEST = "manifest.json"\n'
        'LATEST = f"{FOLDER}/latest.pt"\n'
        'MESSAGE = "normalization.json has no such feature"\n'
    )
    assert spelled_run_folder_paths(module, "module.py") == [
        "module.py:2: 'manifest.json'",
        "module.py:3: '/latest.pt'",
    ]


def test_every_name_is_a_path_inside_the_folder(tmp_path):
    names = [
        value
        for name, value in vars(RunFolder).items()
        if name.isupper() and isinstance(value, str)
    ]
    assert RunFolder.MANIFEST in names and RunFolder.MODEL in names
    for name in [*names, *RunFolder.TIMELINE_SPLITS, RunFolder.checkpoint_name(7)]:
        assert inside_path(tmp_path, name, "RunFolder") == tmp_path / name
    assert RunFolder.checkpoint_name(7) == "checkpoints/epoch-0007.pt"
    assert RunFolder(tmp_path).checkpoint_path(7).parent == RunFolder(tmp_path).checkpoints


def test_a_manifest_is_written_and_read_back(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_manifest({"config": {"pipeline": {}}, "status": "succeeded"})
    assert folder.manifest() == {"config": {"pipeline": {}}, "status": "succeeded"}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "not a run's manifest"),
        ("{not json", "not a run's manifest"),
        ("[1, 2]", r"not a run's manifest \(no config in it\)"),
        ('{"config": {"pipeline": 3}}', "config.pipeline is 3, not a table of options"),
    ],
)
def test_a_file_that_is_no_manifest_is_refused_with_its_path(tmp_path, text, why):
    if text is not None:
        (tmp_path / RunFolder.MANIFEST).write_text(text)
    with pytest.raises(HorizonError, match=why) as refused:
        RunFolder(tmp_path).manifest()
    assert str(tmp_path / RunFolder.MANIFEST) in str(refused.value)


def test_cpe_epochs_are_none_until_the_train_stage_records_them(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.cpe_epochs() == []
    folder.write_json(RunFolder.CPE_EPOCHS, {"epochs": [{"epoch": 1}]})
    assert folder.cpe_epochs() == [{"epoch": 1}]
    (tmp_path / RunFolder.CPE).write_text("[]")
    with pytest.raises(HorizonError, match=r"cpe\.json: holds no JSON object"):
        folder.cpe()


def test_the_problem_is_built_in_the_normalizations_feature_order(tmp_path):
    """The pipeline and the gym runner both build their problem with ``for_data``: the
    network's inputs are the normalization's features, in its order; it reads back as
    written."""
    normalization = {"state_features": {"b": None, "a": None}, "action_features": {"x": None}}
    description = ProblemDescription.for_data(
        ActionType.CONTINUOUS, [], normalization, n_step=1, seed=3, max_feature_value=6.0
    )
    assert description.feature_ids == ["b", "a"]
    assert description.action_feature_ids == ["x"]
    assert description.write(tmp_path) == RunFolder.PROBLEM
    assert RunFolder(tmp_path).problem() == description
    with pytest.raises(HorizonError, match="field 'n_step' is below 1"):
        ProblemDescription.for_data(ActionType.DISCRETE, ["0"], normalization, 0, 3, 6.0)
    assert json.loads((tmp_path / RunFolder.PROBLEM).read_text())["action_type"] == "continuous"
