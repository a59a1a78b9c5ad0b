"""The base classes of the deprecated ``horizon_register_transforms`` hook.

Before timeline engines, normalization engines and feature types had a hook each, all three
were registered through one hook and told apart by their ``name`` ("timeline",
"normalization", anything else a feature type) plus an ``engine``. A plugin written then still
loads: ``from horizon_engine import TimelineTransform`` (with a ``DeprecationWarning``) gives
the class below, whose ``engine`` becomes the ``name`` its family selects it by, and the plugin
host routes each class the old hook registers to the family of its base class, reporting the
plugin as deprecated. New plugins subclass ``TimelineEngine``, ``NormalizationEngine`` or
``FeatureType`` and register them with their own hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from horizon_engine.normalization import NormalizationEngine, NormalizationParameters
from horizon_engine.preprocessor import FeatureType
from horizon_engine.timeline import TimelineEngine

if TYPE_CHECKING:
    import numpy as np

    from horizon_engine.normalization import NormalizationConfig

DEPRECATED_BASES: dict[str, str] = {
    "TimelineTransform": "TimelineEngine",
    "NormalizationTransform": "NormalizationEngine",
    "FeatureTransform": "FeatureType",
}
"""Each deprecated base class, by name, and the family base that replaces it."""


class TimelineTransform(TimelineEngine):
    """Deprecated: subclass ``TimelineEngine`` and name it what ``engine`` said."""

    engine: ClassVar[str] = "local"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.engine


class NormalizationTransform(NormalizationEngine):
    """Deprecated: subclass ``NormalizationEngine`` and name it what ``engine`` said."""

    engine: ClassVar[str] = "local"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.engine


class FeatureTransform(FeatureType):
    """Deprecated: subclass ``FeatureType``, which fits its own parameters (``fit``).

    A type written before ``fit`` existed got the sample's minimum and maximum only, and still
    does, in Horizon's fields (``NormalizationParameters``), which it read its parameters from."""

    Parameters = NormalizationParameters

    def fit(self, values: np.ndarray, config: NormalizationConfig) -> NormalizationParameters:
        return NormalizationParameters(
            feature_type=self.name, min_value=float(values.min()), max_value=float(values.max())
        )
