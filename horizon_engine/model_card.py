"""An exported model's card: what ``model.onnx``'s metadata says about its inputs and outputs.

The ONNX exporter writes the card (``ModelCard.metadata``) and everything that loads an exported
model reads it back (``read_model_card``, ``model_card_from_metadata``): ``horizon serve`` and
``horizon score``, and the gym source playing a model's policy. A model file is input like any
other, so the card is checked as it is read: each field must be valid JSON of its type
(``feature_ids`` a list of distinct strings, ``action_bounds`` a low and a high per action
feature with low <= high, ...), or reading stops with a ``ModelCardError`` naming the file and
the field. The keys are named once, here, for the writer and the readers alike, and so are the
model's input and output names (``ModelInputs``, ``ModelOutputs``): the exporter names the
graph's inputs and outputs with them and everything that feeds a model or fetches from it looks
them up here. This module does not import torch: the serving side uses it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NoReturn

from horizon_engine.errors import HorizonError
from horizon_engine.exploration import Exploration

FEATURE_IDS = "feature_ids"
ACTIONS = "actions"
ACTION_FEATURE_IDS = "action_feature_ids"
ACTION_TYPE = "action_type"
ACTION_BOUNDS = "action_bounds"
NORMALIZATION = "normalization"
POLICY = "policy"
RUN_ID = "run_id"
HORIZON_VERSION = "horizon_version"

ACTION_TYPES = ("discrete", "parametric", "continuous")
"""What a model's outputs are: a score per named action, per candidate action (scored from
its features), or the action's features themselves."""


class ModelInputs:
    """An exported model's input names. Every model takes ``features`` and ``presence``
    ``[batch, features]`` (in ``feature_ids`` order; presence 1.0 or 0.0); a parametric model
    also takes its candidate actions, ``candidates`` and ``candidate_presence`` ``[batch,
    candidates, action features]`` and ``candidate_mask`` ``[batch, candidates]``."""

    FEATURES: Final = "features"
    PRESENCE: Final = "presence"
    CANDIDATES: Final = "candidates"
    CANDIDATE_PRESENCE: Final = "candidate_presence"
    CANDIDATE_MASK: Final = "candidate_mask"
    STATE: Final = (FEATURES, PRESENCE)
    PER_CANDIDATE: Final = (CANDIDATES, CANDIDATE_PRESENCE, CANDIDATE_MASK)

    @classmethod
    def of(cls, action_type: str) -> tuple[str, ...]:
        """The inputs of a model of ``action_type``, in the exporter's order."""
        return cls.STATE + (cls.PER_CANDIDATE if action_type == "parametric" else ())


class ModelOutputs:
    """An exported model's output names. A discrete or parametric model outputs ``scores``
    and ``probabilities`` (per action or candidate) and ``action`` (the chosen index); a
    continuous actor outputs ``action`` (its features) and, for a stochastic policy,
    ``log_density``."""

    SCORES: Final = "scores"
    PROBABILITIES: Final = "probabilities"
    ACTION: Final = "action"
    LOG_DENSITY: Final = "log_density"
    SCORED: Final = (SCORES, PROBABILITIES, ACTION)
    ACTOR: Final = (ACTION, LOG_DENSITY)

    @classmethod
    def of(cls, action_type: str, stochastic: bool = False) -> tuple[str, ...]:
        """The outputs of a model of ``action_type``, in the exporter's order; ``stochastic``
        counts for a continuous actor only."""
        if action_type == "continuous":
            return cls.ACTOR[: 1 + stochastic]
        return cls.SCORED


class ModelCardError(HorizonError):
    """A model file's metadata is missing a field Horizon needs or holds a malformed one."""


@dataclass(frozen=True)
class ActionBounds:
    """Each action feature's range (``continuous_action`` normalization), in the order of
    ``action_feature_ids``: None where a feature has no range."""

    low: tuple[float | None, ...]
    high: tuple[float | None, ...]

    def as_dict(self) -> dict[str, list[float | None]]:
        return {"low": list(self.low), "high": list(self.high)}


@dataclass(frozen=True)
class ModelCard:
    """An exported model's metadata, checked."""

    feature_ids: tuple[str, ...]
    """The state features, in the order of the ``features`` and ``presence`` inputs."""
    actions: tuple[str, ...] = ()
    """The discrete actions' names, in the order of the scores."""
    action_feature_ids: tuple[str, ...] = ()
    """The action features (parametric candidates, continuous actions), in input order."""
    action_type: str = "discrete"
    action_bounds: ActionBounds | None = None
    normalization: dict[str, Any] | None = field(default=None, compare=False)
    policy: dict[str, Any] | None = field(default=None, compare=False)
    run_id: str | None = None
    horizon_version: str | None = None

    @property
    def continuous(self) -> bool:
        return self.action_type == "continuous"

    @property
    def parametric(self) -> bool:
        return self.action_type == "parametric"

    @property
    def exploration(self) -> Exploration | None:
        """The policy the user's ``[export]`` section named (its epsilon and temperature),
        which ``horizon serve`` and ``horizon score`` apply unless told otherwise; None for a
        model whose card records none and for a continuous actor, whose action is its own."""
        if self.continuous or not self.policy:
            return None
        return _exploration(self.policy)

    def metadata(self) -> dict[str, str]:
        """The card as ONNX metadata properties: JSON text per field, plain text for the run
        id and version; ``action_type`` and ``action_bounds`` only for a continuous model."""
        written = {
            FEATURE_IDS: json.dumps(list(self.feature_ids)),
            ACTIONS: json.dumps(list(self.actions)),
            ACTION_FEATURE_IDS: json.dumps(list(self.action_feature_ids)),
            NORMALIZATION: json.dumps(self.normalization or {}),
            POLICY: json.dumps(self.policy or {}),
            RUN_ID: self.run_id or "",
            HORIZON_VERSION: self.horizon_version or "",
        }
        if self.continuous:
            written[ACTION_TYPE] = self.action_type
            if self.action_bounds is not None:
                written[ACTION_BOUNDS] = json.dumps(self.action_bounds.as_dict())
        return written


def read_model_card(path: str | Path) -> ModelCard:
    """The card of the ONNX model at ``path`` (its weights are not loaded), or a
    ``ModelCardError`` naming the file and what is wrong."""
    import onnx

    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise ModelCardError(f"{path}: no such model file") from None
    except Exception as exc:  # protobuf raises its own untyped decode errors
        raise ModelCardError(f"{path}: not an ONNX model ({exc})") from None
    return model_card_from_metadata(
        {entry.key: entry.value for entry in model.metadata_props}, str(path)
    )


def model_card_of_session(session: Any, origin: str) -> ModelCard:
    """The card of the model an onnxruntime ``InferenceSession`` has loaded, checked as
    ``model_card_from_metadata`` checks it."""
    return model_card_from_metadata(session.get_modelmeta().custom_metadata_map, origin)


def model_card_from_metadata(metadata: Mapping[str, str], origin: str) -> ModelCard:
    """The card in a model's metadata properties (onnxruntime's ``custom_metadata_map``);
    ``origin`` names the model file in messages."""
    fields = _Fields(metadata, origin)
    if FEATURE_IDS not in metadata:
        raise ModelCardError(
            f"{origin}: no {FEATURE_IDS} in the model's metadata; expected a model written by "
            "`horizon export`"
        )
    feature_ids = fields.names(FEATURE_IDS)
    actions = fields.names(ACTIONS)
    action_feature_ids = fields.names(ACTION_FEATURE_IDS)
    default_type = "parametric" if action_feature_ids else "discrete"
    action_type = metadata.get(ACTION_TYPE, default_type)
    if action_type not in ACTION_TYPES:
        fields.refuse(ACTION_TYPE, f"is not one of {', '.join(ACTION_TYPES)}")
    if action_type == "discrete" and not actions:
        fields.refuse(ACTIONS, "names no action; a discrete model scores named actions")
    if action_type != "discrete" and not action_feature_ids:
        fields.refuse(
            ACTION_FEATURE_IDS, f"names no action feature; a {action_type} model needs them"
        )
    return ModelCard(
        feature_ids=feature_ids,
        actions=actions,
        action_feature_ids=action_feature_ids,
        action_type=action_type,
        action_bounds=fields.bounds(len(action_feature_ids)),
        normalization=fields.table(NORMALIZATION),
        policy=fields.policy(),
        run_id=metadata.get(RUN_ID) or None,
        horizon_version=metadata.get(HORIZON_VERSION) or None,
    )


def card_if_exported(session: Any, origin: str) -> ModelCard | None:
    """The card of the model an onnxruntime session has loaded when ``horizon export`` wrote
    it (it has ``feature_ids``), checked as ``model_card_from_metadata`` checks it; None for
    any other ONNX model, which carries no card (the gym source plays any model's argmax)."""
    metadata = session.get_modelmeta().custom_metadata_map
    return model_card_from_metadata(metadata, origin) if FEATURE_IDS in metadata else None


def write_model_card(card: ModelCard, model: Any) -> None:
    """Add ``card``'s fields to an ``onnx.ModelProto``'s metadata properties."""
    for key, value in card.metadata().items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value


def _exploration(policy: Mapping[str, Any]) -> Exploration:
    """The ``Exploration`` of a card's policy table: its epsilon counts for epsilon_greedy
    only, as ``horizon score --epsilon`` does."""
    kind = policy.get("policy", "greedy")
    epsilon = policy.get("epsilon", 0.0) if kind == "epsilon_greedy" else 0.0
    return Exploration(kind, epsilon, policy.get("temperature", 1.0))


class _Fields:
    """Reads one model's metadata fields, each refused with the file and field named."""

    def __init__(self, metadata: Mapping[str, str], origin: str) -> None:
        self.metadata = metadata
        self.origin = origin

    def refuse(self, key: str, why: str) -> NoReturn:
        shown = str(self.metadata.get(key))
        shown = shown if len(shown) <= 80 else f"{shown[:80]}..."
        raise ModelCardError(f"{self.origin}: model metadata '{key}' {why}; found {shown!r}")

    def json(self, key: str) -> Any:
        """The field's JSON value; None when the model has no such field."""
        if key not in self.metadata:
            return None
        try:
            return json.loads(self.metadata[key])
        except (ValueError, RecursionError) as exc:
            self.refuse(key, f"is not valid JSON ({exc})")

    def names(self, key: str) -> tuple[str, ...]:
        value = self.json(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            self.refuse(key, "is not a JSON list of strings")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            self.refuse(key, f"lists {repeated[0]!r} more than once")
        return tuple(value)

    def table(self, key: str) -> dict[str, Any] | None:
        value = self.json(key)
        if value is not None and not isinstance(value, dict):
            self.refuse(key, "is not a JSON object")
        return value

    def policy(self) -> dict[str, Any] | None:
        """``policy``: the ``[export]`` section's ``policy``, ``epsilon`` and ``temperature``,
        each of its type and range (an empty table records none)."""
        value = self.table(POLICY)
        if not value:
            return value
        numbers = [value.get(name, 0.0) for name in ("epsilon", "temperature")]
        if not isinstance(value.get("policy", "greedy"), str) or not all(
            _finite_number(number) for number in numbers
        ):
            self.refuse(POLICY, "holds a policy that is not a name or a setting not a number")
        try:
            _exploration(value)
        except HorizonError as exc:
            self.refuse(POLICY, str(exc))
        return value

    def bounds(self, width: int) -> ActionBounds | None:
        """``action_bounds``: ``{"low": [...], "high": [...]}``, one finite number (or null)
        per action feature in each, low <= high."""
        value = self.json(ACTION_BOUNDS)
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) != {"low", "high"}:
            self.refuse(ACTION_BOUNDS, 'is not a JSON object {"low": [...], "high": [...]}')
        for side in ("low", "high"):
            values = value[side]
            if not isinstance(values, list) or len(values) != width:
                self.refuse(
                    ACTION_BOUNDS, f"{side!r} is not a list of {width} (one per action feature)"
                )
            if not all(bound is None or _finite_number(bound) for bound in values):
                self.refuse(ACTION_BOUNDS, f"{side!r} holds a value that is not a finite number")
        for index, (low, high) in enumerate(zip(value["low"], value["high"], strict=True)):
            if low is not None and high is not None and low > high:
                self.refuse(
                    ACTION_BOUNDS,
                    f"gives action feature {index} a low bound {low} above its high bound {high}",
                )
        return ActionBounds(tuple(value["low"]), tuple(value["high"]))


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
