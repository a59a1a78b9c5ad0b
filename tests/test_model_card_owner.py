"""An exported model's card has one reader and one writer: ``horizon_engine/model_card.py``.

Every other module that loads a model asks it for the checked ``ModelCard``
(``read_model_card``, ``model_card_of_session``, ``card_if_exported``) and the exporter hands
it the card to write (``write_model_card``). A module reading ``custom_metadata_map`` or
``metadata_props`` itself, or looking a card key up by its string in something it got from a
model's metadata, gets fields nobody checked (the defaults sweep parsed ``action_feature_ids``
with ``json.loads`` of its own) and spells the format twice.
"""

from __future__ import annotations

import ast

from test_architecture import PACKAGES, ROOT

from horizon_engine import ActionBounds, ModelCard

OWNER = ROOT / "horizon_engine" / "model_card.py"
METADATA_ATTRIBUTES = {"custom_metadata_map", "metadata_props"}
CARD_KEYS = set(
    ModelCard(
        feature_ids=("f",),
        action_feature_ids=("a",),
        action_type="continuous",
        action_bounds=ActionBounds((0.0,), (1.0,)),
    ).metadata()
)
"""Every key a card writes, taken from the writer rather than spelled here."""


def card_reads(source: str) -> list[str]:
    """Where ``source`` reads a model's metadata itself: each use of ``METADATA_ATTRIBUTES``,
    and each card key subscripted (or ``.get``) on an expression that names metadata."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in METADATA_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        looked_up = None
        if isinstance(node, ast.Subscript):
            looked_up, key = node.value, node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "pop"}
            and node.args
        ):
            looked_up, key = node.func.value, node.args[0]
        if (
            looked_up is not None
            and isinstance(key, ast.Constant)
            and key.value in CARD_KEYS
            and "meta" in ast.unparse(looked_up).lower()
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_model_card_module_reads_or_writes_a_models_metadata():
    modules = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    modules += sorted((ROOT / "benchmarks").rglob("*.py"))
    assert OWNER in modules
    readers = [
        f"{path.relative_to(ROOT)}, {read}"
        for path in modules
        if path != OWNER
        for read in card_reads(path.read_text(encoding="utf-8"))
    ]
    assert readers == []


def test_the_check_finds_the_reads_it_forbids():
    """The forms the serving predictor, the gym source and the defaults sweep used before."""
    assert sorted(
        card_reads(
            'ids = json.loads(session.get_modelmeta().custom_metadata_map["action_feature_ids"])\n'
            'feature_ids = metadata.get("feature_ids")\n'
            "entry = model.metadata_props.add()\n"
            'actions = config["actions"]\n'
        )
    ) == [
        "line 1: .custom_metadata_map",
        "line 1: session.get_modelmeta().custom_metadata_map['action_feature_ids']",
        "line 2: metadata.get('feature_ids')",
        "line 3: .metadata_props",
    ]
