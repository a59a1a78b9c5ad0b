"""An exported model's card has one reader and one writer: ``horizon_engine/model_card.py``.

Every other module that loads a model asks it for the checked ``ModelCard``
(``read_model_card``, ``model_card_of_session``, ``card_if_exported``) and the exporter hands
it the card to write (``write_model_card``). A module reading ``custom_metadata_map`` or
``metadata_props`` itself, or looking a card key up by its string in something it got from a
model's metadata, gets fields nobody checked (the defaults sweep parsed ``action_feature_ids``
with ``json.loads`` of its own) and spells the format twice.

The model's input and output names are the card's too (``ModelInputs``, ``ModelOutputs``): the
exporter names the graph with them and every module that feeds a model or fetches from it
spells them through those names, so a renamed input cannot leave a caller feeding the old one.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from test_architecture import PACKAGES, ROOT

from horizon_engine import ActionBounds, ModelCard, ModelInputs, ModelOutputs

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
MODEL_NAMES = set(ModelInputs.of("parametric") + ModelOutputs.of("discrete"))
MODEL_NAMES |= set(ModelOutputs.of("continuous", stochastic=True))
"""Every input and output name of an exported model, taken from the exporter's namespace."""
SESSION_CALLS = {"run", "bind_ortvalue_input", "bind_ortvalue_output", "bind_input", "bind_output"}
"""The onnxruntime calls that take input or output names: feeds, fetches and io bindings."""


def lookup(node: ast.AST, methods: set[str]) -> tuple[ast.AST | None, ast.AST | None]:
    """What ``node`` looks a key up in, and the key: ``x[key]`` or ``x.get(key)`` (one of
    ``methods``); (None, None) for any other node."""
    if isinstance(node, ast.Subscript):
        return node.value, node.slice
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in methods
        and node.args
    ):
        return node.func.value, node.args[0]
    return None, None


def card_reads(source: str) -> list[str]:
    """Where ``source`` reads a model's metadata itself: each use of ``METADATA_ATTRIBUTES``,
    and each card key subscripted (or ``.get``) on an expression that names metadata."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in METADATA_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        looked_up, key = lookup(node, {"get", "pop"})
        if (
            looked_up is not None
            and isinstance(key, ast.Constant)
            and key.value in CARD_KEYS
            and "meta" in ast.unparse(looked_up).lower()
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def findings_outside_the_owner(check: Callable[[str], list[str]]) -> list[str]:
    """``check``'s findings in every module of the packages and benchmarks but model_card.py."""
    modules = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    modules += sorted((ROOT / "benchmarks").rglob("*.py"))
    assert OWNER in modules
    return [
        f"{path.relative_to(ROOT)}, {found}"
        for path in modules
        if path != OWNER
        for found in check(path.read_text(encoding="utf-8"))
    ]


def test_only_the_model_card_module_reads_or_writes_a_models_metadata():
    assert findings_outside_the_owner(card_reads) == []


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


def _model_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in MODEL_NAMES


def spelled_model_names(source: str) -> list[str]:
    """Where ``source`` spells a model's input or output name itself, in the forms that name
    one and no row field does: a name in the arguments of a session call (``SESSION_CALLS``:
    a fetch list, a feed dict's key, a bound input), a name asked for with ``in`` or ``not
    in`` (among a model's inputs or outputs), a dict or set literal of two or more constant
    keys all of which are model names (a feed dict, an output table, an input set), and a
    name looked up (subscript or ``.get``) in something whose name says feeds, inputs or
    outputs. Rows, batches and ``PolicyOutput`` fields share some of the names
    (``"action"``), so a bare string is not enough to flag."""
    found: dict[tuple[int, int], str] = {}
    for node in ast.walk(ast.parse(source)):
        spelled: list[ast.AST] = []
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in SESSION_CALLS
        ):
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            spelled = [leaf for argument in arguments for leaf in ast.walk(argument)]
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            spelled = [node.left]
        elif isinstance(node, ast.Dict | ast.Set):
            keys = [key for key in (node.keys if isinstance(node, ast.Dict) else node.elts) if key]
            if len(keys) >= 2 and all(_model_name(key) for key in keys):
                spelled = keys
        else:
            looked_up, key = lookup(node, {"get"})
            text = ast.unparse(looked_up).lower() if looked_up is not None else ""
            if any(word in text for word in ("feed", "input", "output")):
                spelled = [key]
        for leaf in spelled:
            if _model_name(leaf):
                found[leaf.lineno, leaf.col_offset] = f"line {leaf.lineno}: {leaf.value!r}"
    return [found[place] for place in sorted(found)]


def test_only_the_model_card_module_spells_a_models_input_and_output_names():
    assert findings_outside_the_owner(spelled_model_names) == []


def test_the_check_finds_the_names_it_forbids_and_passes_row_fields():
    """The forms the predictor, the gym source, the exporter and the benchmarks used before,
    then row and batch fields of the same names, which are not the model's."""
    assert spelled_model_names(
        'session.run(["action"], {"features": features, "presence": ones})\n'
        'binding.bind_ortvalue_output("scores", value)\n'
        'stochastic = "log_density" in outputs\n'
        'feeds |= {"candidates": offered, "candidate_presence": offered}\n'
        'fits = set(inputs) != {"features", "presence"}\n'
        'shape = outputs.get("scores")\n'
        'one = feeds["features"]\n'
    ) == [
        "line 1: 'action'",
        "line 1: 'features'",
        "line 1: 'presence'",
        "line 2: 'scores'",
        "line 3: 'log_density'",
        "line 4: 'candidates'",
        "line 4: 'candidate_presence'",
        "line 5: 'features'",
        "line 5: 'presence'",
        "line 6: 'scores'",
        "line 7: 'features'",
    ]
    assert (
        spelled_model_names(
            'row = {"action": action, "reward": reward}\n'
            'loss = F.cross_entropy(logits, batch["action"])\n'
            'fields = ("action", "scores", "probabilities", "log_density")\n'
            'numbers = {"features": useless}\n'
            'axes = {0: "batch", 1: "candidates"}\n'
        )
        == []
    )
