"""Feature normalization: the parameters of each feature's transformation, and how to pick them.

Horizon analyses a sample of each feature, picks a transformation (binary, probability,
continuous, Box-Cox, quantile, enum, ...) and fits its parameters; the network applies them in
its forward pass, so data never has to be regenerated when normalization changes. This module
holds each feature's parameters (``FeatureParameters``: its type's name and the fields that type
stores, each type declaring its own model; the built-in types' is ``NormalizationParameters``,
in Horizon's own field names so its files read and write unchanged), ``normalization.json``
(read back through each type's model), the ``[normalization]`` config, and ``identify``: the
rules that pick a type from a sample. Applying the parameters is the preprocessor's job
(``horizon_engine.preprocessor``), one vectorized operation per type.

The built-in types (``horizon_engine.builtin.feature_types``, each a registered ``FeatureType``
that fits its own parameters): ``binary`` (x != 0), ``probability`` (logit of x clamped to
[1e-5, 1 - 1e-5]), ``continuous`` ((x - mean) / stddev), ``boxcox`` (Box-Cox, then continuous),
``quantile`` (piecewise-linear rank among the sample's quantiles, in [0, 1]), ``enum`` (one-hot
over the values seen; an unseen value is all zeros), ``continuous_action`` ([min, max] mapped
linearly to (-1, 1)) and ``do_not_preprocess`` (passed through). Continuous, Box-Cox outputs are
clamped to [-max_feature_value, max_feature_value].

Decisions where Horizon was unclear or wrong:
- a constant feature c is reported and becomes ``continuous`` with mean c - 1 and stddev 1: 1
  where present, 0 where missing (missing values become 0). Its presence is all a constant
  says; passing it through as 0 would erase that (a parametric action's one-hot features,
  logged as ``{"4": 1.0}`` with the other absent, are constants of exactly this kind), and
  Horizon's binary keeps it only for c != 0;
- a feature with fewer than ``min_samples`` non-missing values is ``do_not_preprocess`` and
  reported;
- the standard deviation floor is ``stddev_floor`` (default 1e-6, only against division by zero;
  Horizon used 1.0, which never scales a low-variance feature up, yet its own CartPole file holds a
  stddev of 0.064);
- NaN or infinity in a sample is an error naming the feature.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from horizon_engine.components import Component, ComponentConfig
from horizon_engine.errors import HorizonError
from horizon_engine.row_values import FLOAT32_MAX, FLOAT32_SMALLEST_NORMAL

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    import numpy as np
    import pyarrow as pa

    from horizon_engine.driver import Normalization
    from horizon_engine.plugins import PluginHost
    from horizon_engine.preprocessor import FeatureType
    from horizon_engine.run_context import RunContext

MISSING_VALUE = -1337.1337
"""Horizon's sentinel for a missing feature in dense arrays; our tensors carry a presence mask."""


class FeatureParameters(BaseModel):
    """One feature's normalization: the name of its type and the parameters that type stores.

    Each ``FeatureType`` declares the model of what it stores (its ``Parameters``, a subclass of
    this one with the type's own fields), fits one from a sample and builds its module from
    them. ``normalization.json`` holds each feature's as one flat object, ``feature_type``
    first, and reading it validates the fields with the type's own model
    (``read_normalization``), so a plugin type's parameters read back as they were written.
    """

    model_config = ConfigDict(extra="forbid")

    feature_type: str
    """The name of a registered ``FeatureType`` (built in or a plugin's)."""

    def as_dict(self) -> dict[str, Any]:
        """The parameters that are set, type first, as ``normalization.json`` holds them."""
        fields = self.model_dump(exclude={"feature_type"}, exclude_none=True)
        return {"feature_type": self.feature_type, **fields}


class NormalizationParameters(FeatureParameters):
    """The built-in types' parameters, in Horizon's field names, so its files read and write
    unchanged.

    Horizon's types share one set of fields (each uses some: ``mean`` and ``stddev`` for
    ``continuous``, ``possible_values`` for ``enum``, ...; ``min_value`` and ``max_value`` are
    recorded for every feature). Horizon wrote the type in upper case (``"CONTINUOUS"``), which
    ``from_horizon`` and ``to_horizon`` translate.
    """

    boxcox_lambda: float | None = None
    boxcox_shift: float | None = None
    mean: float | None = None
    stddev: float | None = None
    possible_values: list[float] | None = None
    quantiles: list[float] | None = None
    min_value: float | None = None
    max_value: float | None = None

    def to_horizon(self) -> str:
        """The JSON string Horizon stored per feature (type in upper case)."""
        fields = self.model_dump(exclude={"feature_type"})
        return json.dumps({"feature_type": self.feature_type.upper(), **fields})

    @classmethod
    def from_horizon(cls, text: str, where: str) -> NormalizationParameters:
        """Read one of Horizon's per-feature JSON strings (its type in upper case)."""
        try:
            fields = json.loads(text)
            fields["feature_type"] = str(fields["feature_type"]).lower()
            return cls.model_validate(fields)
        except (ValueError, KeyError, TypeError) as exc:
            raise HorizonError(f"{where}: not Horizon normalization parameters: {exc}") from None


class TypeOverride(BaseModel):
    """An override with parameters: ``{type = "continuous", mean = 0.0, stddev = 2.0}``.

    Besides ``type``, the fields are that type's own parameters; they are validated by its
    model when the override is applied (``apply_override``), a plugin type's as a built-in's.
    """

    model_config = ConfigDict(extra="allow")

    type: str

    def parameters(self) -> dict[str, Any]:
        """The parameters the override gives, by field name."""
        return dict(self.model_extra or {})


class NormalizationConfig(ComponentConfig):
    """The ``[normalization]`` section."""

    num_samples: int = Field(default=100_000, ge=1)
    """Rows sampled (uniformly, without replacement) to identify and fit each feature."""
    min_samples: int = Field(default=20, ge=1)
    """Fewer non-missing values than this and a feature is left unnormalized (and reported)."""
    max_enum_values: int = Field(default=10, ge=1)
    """Non-negative integer features with at most this many distinct values are enums."""
    quantiles: bool = False
    """Use the quantile type for features that stay far from normal (Horizon's K^2 > 1000).
    Off by default: a quantile maps every value past the sample's range to one value, and
    logged data rarely covers the states a better policy reaches (random CartPole stays near
    the middle of the track); with it, offline CartPole, Acrobot and LunarLander learned worse
    in benchmarks/defaults_sweep.py (README, "Defaults")."""
    quantile_buckets: int = Field(default=20, ge=2)
    """Quantile buckets (buckets + 1 boundaries), as Horizon's 20."""
    max_feature_value: float = Field(default=6.0, gt=0)
    """Continuous and Box-Cox outputs are clamped to [-max_feature_value, max_feature_value]."""
    stddev_floor: float = Field(default=1e-6, gt=0)
    """Smallest standard deviation divided by (Horizon used 1.0; see the module docstring); at
    least float32's smallest normal number, which the network can divide by."""
    overrides: dict[str, str | TypeOverride] = Field(default_factory=dict)
    """Feature id -> type name, or -> {type = ..., parameters...}, forcing what identify picks."""
    action_overrides: dict[str, str | TypeOverride] = Field(default_factory=dict)
    """The same for action features (parametric and continuous actions)."""

    @field_validator("stddev_floor")
    @classmethod
    def _divisible_in_float32(cls, floor: float) -> float:
        """A floor the network, computing in float32, can divide by."""
        if floor < FLOAT32_SMALLEST_NORMAL:
            raise ValueError(
                f"{floor:g} is below float32's smallest normal number "
                f"({FLOAT32_SMALLEST_NORMAL:.3g}), which the network cannot divide by"
            )
        return floor


BOXCOX_MAX_STDDEV = 1e8
K2_THRESHOLD = 1000.0
"""D'Agostino's K^2 above which a distribution counts as far from normal (Horizon's rule)."""
BOXCOX_FLOOR = 1e-6
"""The ``boxcox`` type floors ``x + shift`` here (Box-Cox needs positive values)."""


def identify(
    values: np.ndarray,
    config: NormalizationConfig,
    feature: str,
    action: bool = False,
    feature_types: Mapping[str, FeatureType] | None = None,
) -> tuple[FeatureParameters, str | None]:
    """Pick a feature's type from its sample (missing values removed) and let that type fit it.

    The rules choose among the built-in types by name (``binary``, ``probability``, ``enum``,
    ``continuous``, ``boxcox``, ``quantile``, ``continuous_action``); the chosen type's own
    ``fit`` computes its parameters, as it does for an override. Returns the parameters and,
    where the choice deserves the user's attention, a note (constant feature, too few
    samples). ``action`` features of continuous actions are ``continuous_action``.
    ``feature_types`` are the registered types by name, the process's plugins' by default.
    """
    import numpy as np

    from horizon_engine.plugins import get_plugin_host

    registered = get_plugin_host().feature_types() if feature_types is None else feature_types

    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][0]
        raise HorizonError(f"feature {feature!r}: the sample holds {bad}; features must be finite")
    if len(values) < config.min_samples:
        note = (
            f"feature {feature!r}: {len(values)} values, fewer than min_samples = "
            f"{config.min_samples}; left unnormalized"
        )
        return NormalizationParameters(feature_type="do_not_preprocess"), note

    def fitted(type_name: str) -> FeatureParameters:
        return fit(values, type_name, config, registered, feature)

    low, high = float(values.min()), float(values.max())
    if action:
        return fitted("continuous_action"), None
    if low == high:
        note = f"feature {feature!r}: constant {low}; 1 where present, 0 where missing"
        constant = NormalizationParameters(
            feature_type="continuous", mean=low - 1.0, stddev=1.0, min_value=low, max_value=high
        )
        return constant, note
    if np.isin(values, (0.0, 1.0)).all():
        return fitted("binary"), None
    if low >= 0.0 and high <= 1.0:
        return fitted("probability"), None
    integral = low >= 0 and (values == np.round(values)).all()
    if integral and len(np.unique(values)) <= config.max_enum_values:
        return fitted("enum"), None
    return _continuous_kind(values, fitted, config), None


def fit(
    values: np.ndarray,
    type_name: str,
    config: NormalizationConfig,
    feature_types: Mapping[str, FeatureType],
    feature: str,
) -> FeatureParameters:
    """The registered type ``type_name``'s parameters fitted to ``values`` (its ``fit``), built
    in or a plugin's alike; a type that is not registered is an error naming the feature."""
    found = feature_types.get(type_name)
    if found is None:
        raise HorizonError(
            f"feature {feature!r}: normalization type {type_name!r} is not registered; "
            f"types: {', '.join(sorted(feature_types)) or 'none'}"
        )
    fitted = found.fit(values, config)
    if not isinstance(fitted, found.Parameters) or fitted.feature_type != type_name:
        raise HorizonError(
            f"feature {feature!r}: normalization type {type_name!r} fitted "
            f"{type(fitted).__name__}(feature_type={getattr(fitted, 'feature_type', None)!r}); "
            f"its fit must return its own {found.Parameters.__name__} with its own name"
        )
    return fitted


def _boxcox_sample(values: np.ndarray, shift: float, lambda_: float) -> np.ndarray:
    """The sample as the fitted ``boxcox`` type transforms it before standardizing (the Box-Cox
    of ``values + shift``, floored at ``BOXCOX_FLOOR``): what ``identify`` tests for normality."""
    import numpy as np
    from scipy import special

    return special.boxcox(np.maximum(values + shift, BOXCOX_FLOOR), lambda_)


NORMALTEST_MIN_SAMPLES = 8
"""The fewest values scipy's normality test takes (its skew test's minimum); a smaller sample
(``min_samples`` below 8) says nothing about its shape and stays plain continuous."""


def _continuous_kind(
    values: np.ndarray,
    fitted: Callable[[str], FeatureParameters],
    config: NormalizationConfig,
) -> FeatureParameters:
    """Box-Cox where it makes the sample much more normal, else quantile or plain continuous."""
    import numpy as np
    from scipy import stats

    if len(values) < NORMALTEST_MIN_SAMPLES:
        return fitted("continuous")
    k2_before = float(stats.normaltest(values).statistic)
    boxcox = fitted("boxcox")
    transformed = _boxcox_sample(values, boxcox.boxcox_shift, boxcox.boxcox_lambda)
    spread = float(np.std(transformed))
    if (
        not 0.9 <= boxcox.boxcox_lambda <= 1.1
        and np.isfinite(spread)
        and 0 < spread < BOXCOX_MAX_STDDEV
    ):
        k2_after = float(stats.normaltest(transformed).statistic)
        if k2_after * 10 < k2_before and k2_after <= K2_THRESHOLD:
            return boxcox
    if config.quantiles and k2_before > K2_THRESHOLD:
        return fitted("quantile")
    return fitted("continuous")


def apply_override(
    identified: FeatureParameters,
    override: str | TypeOverride,
    values: np.ndarray,
    config: NormalizationConfig,
    feature_types: Mapping[str, FeatureType],
    feature: str,
) -> FeatureParameters:
    """The parameters the user's override asks for.

    A type other than the identified one is refitted to the sample (so ``"17" = "enum"`` gets
    the values seen); parameters the override gives replace the fitted ones, validated by the
    type's own model (an unknown or ill-typed field is an error naming the feature).
    """
    type_name = override if isinstance(override, str) else override.type
    if type_name != identified.feature_type:
        identified = fit(values, type_name, config, feature_types, feature)
    if isinstance(override, str):
        return identified
    model = feature_types[type_name].Parameters
    return _validated(
        model, {**identified.model_dump(), **override.parameters()}, f"feature {feature!r}"
    )


def override_problem(override: str | TypeOverride, feature_type: FeatureType) -> str | None:
    """What is wrong with an override's parameters that can be told before any data is seen:
    a field the type's model does not declare (a misspelt ``stddev``, or another type's), a
    value its model refuses (``mean = "high"``), or one the network cannot compute with
    (``parameter_problem``). The parameters as a whole (with the fitted ones the override
    leaves) are validated again when the override is applied (``apply_override``)."""
    from pydantic import ValidationError

    if isinstance(override, str):
        return None
    model = feature_type.Parameters
    given = override.parameters()
    unknown = sorted(set(given) - set(model.model_fields))
    if unknown:
        declared = sorted(set(model.model_fields) - {"feature_type"})
        return (
            f"type {override.type!r} has no parameter {', '.join(unknown)}; its parameters "
            f"({model.__name__}): {', '.join(declared) or 'none'}"
        )
    try:
        model.model_validate({"feature_type": override.type, **given})
    except ValidationError as exc:
        refused = [error for error in exc.errors() if error["loc"] and error["loc"][0] in given]
        if refused:
            loc = ".".join(str(part) for part in refused[0]["loc"])
            return f"{loc}: {refused[0]['msg']}; found {refused[0]['input']!r}"
    return next(
        (
            problem
            for name, value in given.items()
            if (problem := _value_problem(name, value)) is not None
        ),
        None,
    )


def parameter_problem(parameters: FeatureParameters) -> str | None:
    """Why the network cannot compute with a feature's ``parameters`` (any type's), naming the
    first field that it cannot hold: a number (a list's item too) that is not finite or is
    beyond float32 (``FLOAT32_MAX``), which the network computes in, or a ``stddev`` too small
    to divide by in float32; None when every field is usable. ``read_normalization`` and
    ``identify_all`` refuse such parameters with the feature's name."""
    for name in type(parameters).model_fields:
        problem = _value_problem(name, getattr(parameters, name))
        if problem is not None:
            return problem
    return None


def _value_problem(name: str, value: Any) -> str | None:
    """``parameter_problem`` for one field's value."""
    import math

    listed = isinstance(value, list | tuple)
    items = value if listed else [value]
    for item in items:
        if not isinstance(item, int | float) or isinstance(item, bool):
            continue
        holds = f"{name} holds" if listed else f"{name} ="
        if not math.isfinite(item):
            return f"{holds} {item}, which is not finite"
        if abs(item) > FLOAT32_MAX:
            return (
                f"{holds} {item:g}, beyond float32 (at most {FLOAT32_MAX:.3g} either way), "
                "which the network computes in"
            )
    if name == "stddev" and isinstance(value, int | float) and 0 < value < FLOAT32_SMALLEST_NORMAL:
        return (
            f"stddev = {value:g} is below float32's smallest normal number "
            f"({FLOAT32_SMALLEST_NORMAL:.3g}): the network would divide by 0"
        )
    return None


def _validated(model: type[FeatureParameters], fields: Any, where: str) -> FeatureParameters:
    """``fields`` validated by a type's parameters model; an error names each bad field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'parameters'}: {error['msg']}"
            for error in exc.errors()
        )
        type_name = fields.get("feature_type") if isinstance(fields, dict) else None
        raise HorizonError(
            f"{where}: parameters of normalization type {type_name!r} ({model.__name__}): "
            f"{problems}"
        ) from None


def read_horizon_file(path: Path | str) -> dict[str, NormalizationParameters]:
    """Horizon's ``{feature_id: "<JSON string of parameters>"}`` file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HorizonError(f"{path}: cannot read Horizon normalization parameters: {exc}") from None
    parameters = {
        str(feature): NormalizationParameters.from_horizon(text, f"{path}: feature {feature!r}")
        for feature, text in raw.items()
    }
    for feature, fields in parameters.items():
        problem = parameter_problem(fields)
        if problem is not None:
            raise HorizonError(f"{path}: feature {feature!r}: {problem}")
    return parameters


def write_horizon_file(path: Path | str, parameters: dict[str, NormalizationParameters]) -> None:
    """Write parameters in Horizon's format, so its tools can read ours."""
    from horizon_engine.files import atomic_output

    with atomic_output(Path(path)) as temporary:
        data = {feature: params.to_horizon() for feature, params in parameters.items()}
        temporary.write_text(json.dumps(data) + "\n", encoding="utf-8")


class NormalizationEngine(Component):
    """Samples feature values from the timeline; engines differ only in how they sample.

    Registered through ``horizon_register_normalization_engines``; its ``name`` is what
    ``[normalization] engine`` selects. Identification, overrides and the file are the core's
    (``run_normalization_stage``), so every engine picks the same types from the same sample.
    """

    family = "normalization_engines"
    Config: ClassVar[type[ComponentConfig]] = NormalizationConfig

    @abstractmethod
    def sample(
        self, run: RunContext, train: Path, column: str, num_samples: int
    ) -> dict[str, np.ndarray]:
        """Up to ``num_samples`` rows of the map column ``column`` of the timeline's ``train``
        split, chosen uniformly without replacement (seeded by the run), as feature id -> the
        values those rows hold (a row without the feature contributes nothing)."""


def group_map_values(entries: pa.MapArray) -> dict[str, np.ndarray]:
    """Feature id -> its values, from a map column (the rows of a sample)."""
    import numpy as np
    import pyarrow.compute as pc

    from horizon_engine.schema import map_entries

    _, keys, values = map_entries(entries)
    encoded = pc.dictionary_encode(keys)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    numbers = values.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(encoded.dictionary) + 1))
    return {
        str(feature): numbers[order[bounds[index] : bounds[index + 1]]]
        for index, feature in enumerate(encoded.dictionary.to_pylist())
    }


def sort_feature_ids(feature_ids: Iterable[str]) -> list[str]:
    """Feature ids in Horizon's order: numerically when every id is an integer, else as text."""
    ids = [str(feature) for feature in feature_ids]
    try:
        return sorted(ids, key=int)
    except ValueError:
        return sorted(ids)


class FeatureSetResult(BaseModel):
    """The identified (and overridden) parameters of one feature set, with notes."""

    parameters: dict[str, FeatureParameters]
    notes: list[str]


def identify_all(
    samples: dict[str, np.ndarray],
    config: NormalizationConfig,
    overrides: dict[str, str | TypeOverride],
    feature_types: Mapping[str, FeatureType],
    action: bool = False,
    where: str = "[normalization] overrides",
) -> FeatureSetResult:
    """Identify every sampled feature, then apply the overrides (an unknown id is an error).

    ``feature_types`` are the registered types by name (``PluginHost.feature_types``)."""
    parameters: dict[str, FeatureParameters] = {}
    notes: list[str] = []
    for feature in sort_feature_ids(samples):
        identified, note = identify(samples[feature], config, feature, action, feature_types)
        parameters[feature] = identified
        if note:
            notes.append(note)
    for feature, override in overrides.items():
        if feature not in parameters:
            raise HorizonError(
                f"{where}: feature {feature!r} is not in the data; features: "
                f"{', '.join(parameters) or 'none'}"
            )
        type_name = override if isinstance(override, str) else override.type
        if type_name not in feature_types:
            raise HorizonError(
                f"{where}: feature {feature!r}: unknown type {type_name!r}; "
                f"types: {', '.join(sorted(feature_types))}"
            )
        parameters[feature] = apply_override(
            parameters[feature], override, samples[feature], config, feature_types, feature
        )
        notes.append(f"feature {feature!r}: type {type_name!r} set by an override")
    for feature, fitted in parameters.items():
        # What the file's reader will refuse is refused here, where the stage that wrote it
        # (and the override that asked for it) can be named.
        kind = feature_types.get(fitted.feature_type)
        if kind is not None:
            try:
                kind.check(fitted, feature)
            except HorizonError as exc:
                raise HorizonError(f"{where}: {exc}") from None
        problem = parameter_problem(fitted)
        if problem is not None:
            raise HorizonError(f"{where}: feature {feature!r}: {problem}")
    return FeatureSetResult(parameters=parameters, notes=notes)


def write_normalization(path: Path, feature_sets: Normalization) -> None:
    """Write ``normalization.json``: ``{"state_features": {id: parameters}, ...}``."""
    from horizon_engine.files import write_json

    write_json(
        path,
        {
            name: {feature: params.as_dict() for feature, params in sets.items()}
            for name, sets in feature_sets.items()
        },
    )


def read_normalization(path: Path, plugins: PluginHost | None = None) -> Normalization:
    """Read ``normalization.json`` as the normalization stage wrote it (or a user brought it).

    Each feature's parameters are validated by its type's own model and checked by the type
    (``FeatureType.check``), so a bad or missing field is an error naming the file, the
    feature and the field; an unknown type names the plugins that provide types.
    ``plugins`` is the process's plugin host by default.
    """
    from horizon_engine.plugins import get_plugin_host

    host = plugins if plugins is not None else get_plugin_host()
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HorizonError(f"{path}: cannot read normalization parameters: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(sets, dict) for sets in raw.values()):
        raise HorizonError(
            f"{path}: expected {{feature set: {{feature id: parameters}}}}, as the "
            "normalization stage writes it"
        )
    registered = {entry.name: entry for entry in host.components("feature_types")}
    normalization: Normalization = {}
    for name, sets in raw.items():
        normalization[name] = {}
        for feature, fields in sets.items():
            where = f"{path}: {name}: feature {feature!r}"
            type_name = fields.get("feature_type") if isinstance(fields, dict) else None
            if not isinstance(type_name, str):
                raise HorizonError(f"{where}: feature_type: a type name is required")
            entry = registered.get(type_name)
            if entry is None:
                raise HorizonError(f"{where}: {_unknown_type(type_name, host)}")
            parameters = _validated(entry.cls.Parameters, fields, where)
            try:
                entry.cls(entry.cls.Config()).check(parameters, feature)
            except HorizonError as exc:
                raise HorizonError(f"{path}: {name}: {exc}") from None
            problem = parameter_problem(parameters)
            if problem is not None:
                raise HorizonError(f"{where}: {problem}")
            normalization[name][feature] = parameters
    return normalization


def _unknown_type(type_name: str, host: PluginHost) -> str:
    """Why ``type_name`` cannot be read: which plugins provide which types (and which were
    not loaded or failed to, one of which may have been the type's)."""
    providers: dict[str, list[str]] = {}
    for entry in host.components("feature_types"):
        providers.setdefault(entry.plugin, []).append(entry.name)
    provided = "; ".join(f"{plugin}: {', '.join(names)}" for plugin, names in providers.items())
    message = (
        f"unknown normalization type {type_name!r}; the plugins that provide types: "
        f"{provided or 'none'}"
    )
    if host.left_out:
        message += f"; plugins not loaded: {', '.join(host.left_out)}"
    if host.failures:
        failed = ", ".join(failure.name for failure in host.failures)
        message += f"; plugins that failed to load: {failed}"
    return message
