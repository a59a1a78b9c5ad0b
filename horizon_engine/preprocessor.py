"""The preprocessor: normalization applied inside the network, one vectorized operation per type.

Horizon applied each feature's normalization in the network's forward pass, so changing the
normalization never means regenerating data, and the exported model takes raw features. This
module does the same with a torch module built from ``normalization.json``'s parameters:

- the input is a dense float32 ``[batch, F]`` tensor of raw features (in ``feature_ids`` order)
  and a presence mask of the same shape (1.0 present, 0.0 missing);
- features are grouped by type; each type's ``FeatureType`` (a component registered through
  ``horizon_register_feature_types``, so a plugin can add a type) builds ONE module that transforms
  all its k features at once, their parameters stacked into buffers. The forward pass loops
  over types (a handful), never over features or rows;
- the output columns follow Horizon's order: by type (the core's types in the order it
  registers them, then plugin types by name), then by feature id (numerically when every id is
  an integer); an enum expands to one column per possible value;
- a missing feature's columns are exactly +0.0, whatever its raw value holds (NaN, infinity,
  Horizon's -1337.1337): every output column depends on its own feature only, so the columns are
  simply zeroed after the transforms, by a product with the mask whose NaN (an infinity times 0)
  is then replaced by 0; ``where`` reads a boolean tensor, which is over ten times slower on the
  CPU. Substituting a value before transforming would be one more pass over the input and is
  not needed for this.

Only ONNX-exportable operations are used (gathers by constant indices, elementwise math,
sums over a fixed axis): no boolean-mask indexing and no data-dependent shapes, so the
exported graph has a dynamic batch axis and gives the same numbers.

Importing this module does not import torch: ``horizon plugins`` imports the built-in feature
types, which subclass ``FeatureType``, and must start fast. The torch modules
(``Preprocessor``, ``FeatureModule``) live in ``horizon_engine.preprocessor_modules``, imported
when a preprocessor is built; they can be imported from here as well.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.components import Component
from horizon_engine.errors import HorizonError, PluginError
from horizon_engine.normalization import FeatureParameters, sort_feature_ids

if TYPE_CHECKING:
    import numpy as np
    import torch

    from horizon_engine.normalization import NormalizationConfig
    from horizon_engine.plugins import PluginHost
    from horizon_engine.preprocessor_modules import FeatureModule, Preprocessor

__all__ = [
    "FeatureModule",
    "FeatureType",
    "Preprocessor",
    "build_preprocessor",
    "feature_module",
    "sort_feature_ids",
]


class FeatureType(Component):
    """A normalization type: owns its parameters, fits them from a sample, and builds the
    module that transforms all features of its type from them.

    Register a subclass through ``horizon_register_feature_types``; its ``name`` is the type name
    that ``FeatureParameters.feature_type`` refers to (and that ``[normalization] overrides``
    name). ``Parameters`` is the model of what the type stores, a ``FeatureParameters``
    subclass with the type's own fields: ``fit`` returns one, ``module`` is built from them,
    ``normalization.json`` records them under their field names and is read back through the
    model. ``fit`` is how the normalization stage gets its parameters, for a type ``identify``
    picks and for one an override names alike. ``required`` lists fields the model leaves
    optional that the type still needs; ``check`` rejects parameters without them (or with
    non-finite values) before anything is built, naming the feature.
    """

    family = "feature_types"
    Parameters: ClassVar[type[FeatureParameters]]
    required: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def fit(self, values: np.ndarray, config: NormalizationConfig) -> FeatureParameters:
        """This type's ``Parameters`` for a feature whose sample is ``values`` (float64, finite,
        missing values removed, at least ``config.min_samples`` of them), with
        ``feature_type`` set to this type's ``name``."""

    def check(self, parameters: FeatureParameters, feature: str) -> None:
        """Raise a ``HorizonError`` naming ``feature`` if this type cannot use ``parameters``."""
        missing = [field for field in self.required if getattr(parameters, field) is None]
        if missing:
            raise HorizonError(
                f"feature {feature!r}: normalization type {self.name!r} needs "
                f"{', '.join(missing)}, which its parameters do not give"
            )
        for field in self.required:
            value = getattr(parameters, field)
            values = value if isinstance(value, list) else [value]
            if not all(math.isfinite(item) for item in values):
                raise HorizonError(
                    f"feature {feature!r}: normalization type {self.name!r}: {field} = {value} "
                    "is not finite"
                )

    def width(self, parameters: FeatureParameters) -> int:
        """How many output columns one feature of this type has (1 unless it expands)."""
        return 1

    def column_names(self, feature: str, parameters: FeatureParameters) -> list[str]:
        """The names of a feature's output columns: the id itself, or ``id:j`` when expanded."""
        width = self.width(parameters)
        return [feature] if width == 1 else [f"{feature}:{column}" for column in range(width)]

    @abstractmethod
    def module(
        self, parameters: list[FeatureParameters], max_feature_value: float
    ) -> torch.nn.Module:
        """A module mapping ``[batch, k]`` (the k features of this type, in the order of
        ``parameters``) to ``[batch, sum of widths]``, with one set of tensor operations for
        all k features; ``feature_module`` builds one from a function and its parameters.

        A feature's output columns must depend on its own input column only (a missing
        feature's columns are replaced by 0 afterwards, whatever the module made of its value),
        and only ONNX-exportable operations should be used.
        """


def feature_module(
    function: Callable[..., torch.Tensor],
    *,
    inverse: Callable[..., torch.Tensor] | None = None,
    **values: Any,
) -> FeatureModule:
    """A module computing ``function(x, **values)``, with array values kept as buffers.

    Arrays (lists, numpy arrays, tensors) become buffers (floating ones as float32), so they move
    with ``.to(device)``, save with ``state_dict`` and export to ONNX as initializers; Python
    numbers stay constants. ``function`` should be a module-level function, so the module pickles.
    ``inverse(y, **values)``, when given, maps outputs back to raw values (the module's
    ``inverse``, which ``InvertiblePreprocessor.inverse`` calls): a type of one output column per
    feature that actions are normalized with gives one, as ``continuous_action`` does.
    """
    from horizon_engine.preprocessor_modules import FeatureModule

    return FeatureModule(function, values, inverse)


def build_preprocessor(
    feature_ids: Sequence[str],
    parameters: Mapping[str, FeatureParameters],
    max_feature_value: float = 6.0,
    plugins: PluginHost | None = None,
) -> Preprocessor:
    """The preprocessor for inputs whose columns are ``feature_ids``, normalized by ``parameters``.

    ``parameters`` must cover every feature in ``feature_ids`` (it may hold more: a
    normalization.json serves state and action features alike). Each type is looked up among the
    ``feature_types`` components of ``plugins`` (the process-wide host by default); an unknown type
    is an error naming the feature. ``max_feature_value`` bounds continuous and Box-Cox outputs.
    """
    import numpy as np

    from horizon_engine.plugins import get_plugin_host
    from horizon_engine.preprocessor_modules import Preprocessor

    host = plugins if plugins is not None else get_plugin_host()
    columns = [str(feature) for feature in feature_ids]
    if not columns:
        raise HorizonError("no features to preprocess: feature_ids is empty")
    position: dict[str, int] = {}
    for index, feature in enumerate(columns):
        if feature in position:
            raise HorizonError(f"feature {feature!r} appears twice in the preprocessor's input")
        position[feature] = index
    missing = [feature for feature in columns if feature not in parameters]
    if missing:
        shown = ", ".join(repr(feature) for feature in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise HorizonError(f"no normalization parameters for feature(s) {shown}{more}")

    by_type: dict[str, list[str]] = {}
    for feature in sort_feature_ids(columns):
        by_type.setdefault(parameters[feature].feature_type, []).append(feature)

    groups = []
    output_names: list[str] = []
    output_features: list[int] = []
    for type_name in sorted(by_type, key=partial(_type_order, host)):
        features = by_type[type_name]
        transform = _feature_transform(host, type_name, features[0])
        group_parameters = [parameters[feature] for feature in features]
        for feature, feature_parameters in zip(features, group_parameters, strict=True):
            _check_model(transform, feature_parameters, feature)
            transform.check(feature_parameters, feature)
        module = transform.module(group_parameters, max_feature_value)
        width = 0
        for feature, feature_parameters in zip(features, group_parameters, strict=True):
            names = transform.column_names(feature, feature_parameters)
            output_names += names
            output_features += [position[feature]] * len(names)
            width += len(names)
        _check_width(module, host, type_name, len(features), width)
        groups.append((np.array([position[feature] for feature in features]), module))

    return Preprocessor.build(columns, groups, np.array(output_features), output_names)


CORE_TYPES_PLUGIN = "feature_types"
"""The built-in plugin whose types come first, in the order it registers them (Horizon's)."""


def _type_order(host: PluginHost, type_name: str) -> tuple[int, int, str]:
    """The core's types in registration order, then plugin types by name."""
    registered = host.components("feature_types")
    core = [entry.name for entry in registered if entry.plugin == CORE_TYPES_PLUGIN]
    if type_name in core:
        return (0, core.index(type_name), "")
    return (1, 0, type_name)


def _feature_transform(host: PluginHost, type_name: str, feature: str) -> FeatureType:
    try:
        entry = host.component("feature_types", type_name)
    except PluginError as exc:
        raise PluginError(
            f"feature {feature!r} has normalization type {type_name!r}: {exc}"
        ) from None
    return entry.cls(entry.cls.Config())


def _check_model(transform: FeatureType, parameters: FeatureParameters, feature: str) -> None:
    """Parameters built in code (not read from a file) may be another type's model."""
    if not isinstance(parameters, transform.Parameters):
        raise HorizonError(
            f"feature {feature!r}: normalization type {transform.name!r} stores "
            f"{transform.Parameters.__name__}, not {type(parameters).__name__}"
        )


def _check_width(
    module: torch.nn.Module, host: PluginHost, type_name: str, features: int, width: int
) -> None:
    """Run the type's module once on zeros: a wrong output shape is the plugin's bug, and is
    reported as such here rather than as a shape mismatch inside the network."""
    import torch

    with torch.no_grad():
        shape = tuple(module(torch.zeros(2, features)).shape)
    if shape != (2, width):
        plugin = host.component("feature_types", type_name).plugin
        raise PluginError(
            f"normalization type {type_name!r} (plugin '{plugin}') turned [2, {features}] into "
            f"{list(shape)}; its width() says [2, {width}]"
        )


def __getattr__(name: str) -> Any:
    """``Preprocessor`` and ``FeatureModule`` live in ``preprocessor_modules`` (they need torch);
    they are importable from here too, imported on first access."""
    if name in ("FeatureModule", "Preprocessor"):
        from horizon_engine import preprocessor_modules

        return getattr(preprocessor_modules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
