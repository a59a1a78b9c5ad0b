"""The base classes a plugin subclasses to register a component in one of the families.

A component is a class with a ``name`` (what pipeline.toml selects it by), a pydantic ``Config``
model that validates its section of pipeline.toml, and the methods its family needs. The core
instantiates it with the validated config. Keeping the config model on the class lets
``horizon plugins`` list every option without running anything.
"""

from __future__ import annotations

import types
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Literal,
    Union,
    get_args,
    get_origin,
)

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import pyarrow as pa

    from horizon_engine.run_context import RunContext
    from horizon_engine.schema import BadRow, RowLayout


class ComponentConfig(BaseModel):
    """Base of every component's config model: unknown keys are errors, not silently ignored,
    and no float option, an item of a list or a value of a map included, takes infinity or
    NaN (TOML's ``inf``, ``nan``): no option means "unbounded" by it, and in a run it turns
    every number it touches into infinity or NaN. A float option beyond ``FLOAT_LIMIT`` is
    refused too, where its model sets no bound of its own (``horizon_engine.config``)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False
    )


def _distinct(names: str | list[str]) -> str | list[str]:
    if isinstance(names, list):
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None:
            raise ValueError(f"lists {repeated!r} more than once")
    return names


DistinctNames = Annotated[list[str], AfterValidator(_distinct)]
"""A list option whose entries name things (actions, stages): naming one twice is a mistake.
Lists where repeating means something (one activation per layer) stay plain lists."""

PathPatterns = Annotated[str | list[str], AfterValidator(_distinct)]
"""A source's ``path``: one file, folder or glob, or a list of them, none given twice."""

MAX_LEARNING_RATE = 10.0
"""The largest learning rate an optimizer option takes (``LearningRate``). Adam moves every
weight by about the learning rate per update, and the networks' weights start within about
1/sqrt(width) of 0, so past 1 one update already overturns them; the rates that train here are
1e-5 to 1e-2 (the defaults: 3e-4 to 3e-3). 10 leaves plain SGD on small gradients room and
refuses only what no run can mean: 1e30 turns the weights to infinity in the first update."""

LearningRate = Annotated[float, Field(gt=0.0, le=MAX_LEARNING_RATE)]
"""An optimizer's learning rate (step size): above 0, at most ``MAX_LEARNING_RATE``; every
trainer's learning rate options are of this type."""


def _metric_names(weights: dict[str, float]) -> dict[str, float]:
    if not weights:
        raise ValueError(
            "weighs no metric, so every reward would be 0; name a metric's weight, or leave "
            "the option out to keep the logged reward"
        )
    for name in weights:
        if not name.strip():
            raise ValueError(f"a weight's key {name!r} names no metric")
        if name != name.strip():
            raise ValueError(
                f"metric {name!r} has spaces around its name; metric names are matched exactly"
            )
    return weights


MetricWeights = Annotated[dict[str, float], AfterValidator(_metric_names)]
"""Weights of logged metrics by name (``reward = {clicks = 1.0, cost = -0.1}``): at least one,
each name a metric's (not empty, no spaces around it, as a row's metric is matched exactly),
each weight finite (as every float option: ``ComponentConfig``)."""


class Component(ABC):
    """What every registered component has: a name, a family, a config model and a docstring.

    A family's contract marks the methods a component must implement ``abstractmethod``; the
    plugin host refuses, at registration, a class that leaves one out."""

    family: ClassVar[str]
    name: ClassVar[str]
    Config: ClassVar[type[ComponentConfig]] = ComponentConfig

    def __init__(self, config: ComponentConfig) -> None:
        self.config = config

    @classmethod
    def summary(cls) -> str:
        """The first line of the class docstring, shown by ``horizon plugins``."""
        lines = (cls.__doc__ or "").strip().splitlines()
        return lines[0] if lines else ""


@dataclass
class SourceBatch:
    """Rows a data source read, already shaped to the row schema, plus the rows it could not use.

    ``locations`` gives, for each row of ``table``, where it came from (``file:line`` for JSONL,
    ``file:row`` for Parquet, ``episode:step`` for gym), so later value checks can name it.
    """

    table: pa.Table
    layout: RowLayout
    locations: list[str]
    bad_rows: list[BadRow] = field(default_factory=list)
    ignored_fields: dict[str, int] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)
    """What the source read as something else, with its count of rows: the stage warns once
    for each (``schema.INTEGER_ACTION_NOTE``)."""


class SourceConfig(ComponentConfig):
    """Options every data source accepts besides its own."""

    row_format: Literal["auto", "pre_timeline", "timeline"] = "auto"
    """Whether rows are logged decisions (pre-timeline) or Horizon's timeline output."""
    action_type: Literal["auto", "discrete", "parametric", "continuous"] = "auto"
    """Discrete action names, parametric action feature maps, or continuous action maps."""


class DataSource(Component):
    """Reads logged rows and yields them in batches shaped to the row schema."""

    family = "data_sources"
    Config: ClassVar[type[ComponentConfig]] = SourceConfig

    @abstractmethod
    def read(self, run: RunContext) -> Iterator[SourceBatch]:
        """Yield the rows, batch by batch. Structural problems become ``bad_rows``."""

    def problems(self) -> list[str]:
        """What is wrong before any row is read (a path that matches no file), checked by
        ``horizon validate`` and before a run's first stage; one message per problem."""
        return []


class Trainer(Component):
    """Learns a policy from the timeline table (the training loop is the core's)."""

    family = "trainers"


class Estimator(Component):
    """Estimates, offline, the value of a trained policy from logged data."""

    family = "estimators"


class Exporter(Component):
    """Writes a trained policy in a portable form."""

    family = "exporters"


FAMILIES: tuple[str, ...] = (
    "data_sources",
    "timeline_engines",
    "normalization_engines",
    "feature_types",
    "trainers",
    "estimators",
    "exporters",
)
"""The component families, in pipeline order, named as in their ``horizon_register_<family>``
hooks. The bases of the three that build and normalize features (``TimelineEngine``,
``NormalizationEngine``, ``FeatureType``) live beside the code that runs them
(``horizon_engine.timeline``, ``horizon_engine.normalization``, ``horizon_engine.preprocessor``),
whose config models and types they need; ``horizon_engine.plugins.family_bases`` names each."""


def component_options(cls: type[Component]) -> list[dict[str, Any]]:
    """The options of a component's config model, as ``horizon plugins`` lists them."""
    return config_options(cls.Config)


def config_options(model: type[ComponentConfig]) -> list[dict[str, Any]]:
    """The options of a config model (a component's, or a section of the core's such as
    ``[pipeline]``), as ``horizon plugins`` lists them (a docstring written over several lines
    becomes one line of help)."""
    options = []
    for key, info in model.model_fields.items():
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        options.append(
            {
                "name": key,
                "type": _type_name(info.annotation),
                "required": info.is_required(),
                "default": default,
                "help": " ".join((info.description or "").split()),
            }
        )
    return options


def _type_name(annotation: Any) -> str:
    """A type as the user writes its values: an option type's (``DistinctNames``,
    ``LearningRate``) own type, without the checks it carries, and ``None`` for a union's
    ``NoneType`` (``list[str] | None``, not ``Optional``)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(repr(value) for value in get_args(annotation))
    if origin is Annotated:
        return _type_name(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(member) for member in get_args(annotation))
    if annotation is type(None):
        return "None"
    if origin is not None and get_args(annotation):
        members = ", ".join(_type_name(member) for member in get_args(annotation))
        return f"{getattr(origin, '__name__', None) or _type_name(origin)}[{members}]"
    return (getattr(annotation, "__name__", None) or repr(annotation)).replace("typing.", "")
