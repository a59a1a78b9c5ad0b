"""The torch half of ``horizon_engine.preprocessor``: the modules a preprocessor is made of.

Kept apart so that ``horizon_engine.preprocessor`` (which plugins import for
``FeatureType``) does not import torch; this module is imported when a preprocessor is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from horizon_engine.errors import HorizonError


def _buffer(value: Any) -> torch.Tensor:
    tensor = torch.as_tensor(np.asarray(value) if isinstance(value, list) else value)
    return tensor.to(torch.float32) if tensor.is_floating_point() else tensor


class FeatureModule(torch.nn.Module):
    """``function(x, **buffers, **constants)``: one normalization type's transform.

    Built by ``horizon_engine.preprocessor.feature_module``: array values become buffers (float
    ones as float32), Python numbers stay constants.
    """

    def __init__(
        self,
        function: Callable[..., torch.Tensor],
        values: dict[str, Any],
        inverse: Callable[..., torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.function = function
        self.inverse_function = inverse
        self.constants: dict[str, bool | int | float] = {}
        self.buffer_names: list[str] = []
        for name, value in values.items():
            if isinstance(value, bool | int | float):
                self.constants[name] = value
            else:
                self.register_buffer(name, _buffer(value))
                self.buffer_names.append(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buffers = {name: getattr(self, name) for name in self.buffer_names}
        return self.function(x, **buffers, **self.constants)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``inverse(y, **buffers, **constants)``: the raw values ``forward`` maps to ``y``,
        for a type built with an inverse (``continuous_action``); an error for the others."""
        if self.inverse_function is None:
            raise HorizonError(
                f"normalization type function {self.extra_repr()!r} has no inverse: only "
                "types built with one (continuous_action) map outputs back to raw values"
            )
        buffers = {name: getattr(self, name) for name in self.buffer_names}
        return self.inverse_function(y, **buffers, **self.constants)

    def extra_repr(self) -> str:
        return getattr(self.function, "__name__", repr(self.function))


class Preprocessor(torch.nn.Module):
    """Raw features plus presence mask -> the network's input (see ``horizon_engine.preprocessor``).

    ``feature_ids`` names the input columns, ``output_names`` the output columns (the feature
    id, or ``id=value`` for an enum's one-hot columns). Built by ``build_preprocessor``.
    The input is reordered once (grouped by type, in output order), so that each type's module
    reads a slice of it rather than gathering its own columns.
    """

    def __init__(
        self,
        feature_ids: list[str],
        groups: list[tuple[np.ndarray, torch.nn.Module]],
        output_features: np.ndarray,
        output_names: list[str],
    ) -> None:
        super().__init__()
        self.feature_ids = list(feature_ids)
        self.output_names = list(output_names)
        self.types = torch.nn.ModuleList(module for _, module in groups)
        ends = np.cumsum([len(columns) for columns, _ in groups]).tolist()
        self.slices = list(zip([0, *ends[:-1]], ends, strict=True))
        order = np.concatenate([columns for columns, _ in groups])
        self.register_buffer("input_order", torch.as_tensor(order, dtype=torch.long))
        self.register_buffer("output_features", torch.as_tensor(output_features, dtype=torch.long))

    @classmethod
    def build(
        cls,
        feature_ids: list[str],
        groups: list[tuple[np.ndarray, torch.nn.Module]],
        output_features: np.ndarray,
        output_names: list[str],
    ) -> Preprocessor:
        """An ``InvertiblePreprocessor`` when every feature has one output column and every
        type's module an inverse (action features normalized as ``continuous_action``), else a
        ``Preprocessor``: whether it has ``inverse`` is its type
        (``horizon_engine.capabilities.InvertiblePreprocessing``)."""
        one_column_each = len(output_names) == len(feature_ids)
        inverses = all(
            getattr(module, "inverse_function", None) is not None for _, module in groups
        )
        kind = InvertiblePreprocessor if one_column_each and inverses else Preprocessor
        return kind(feature_ids, groups, output_features, output_names)

    def forward(self, x: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        """``x`` and ``presence`` are ``[batch, len(feature_ids)]``, ``presence`` 1.0 where a
        feature is present and 0.0 where it is missing; returns ``[batch, len(output_names)]``,
        +0.0 in every column of a missing feature. A present feature's column that its transform
        made NaN is 0 as well (a NaN raw value: no reader lets one through)."""
        x = x.index_select(1, self.input_order)
        out = torch.cat(
            [
                module(x[:, start:end])
                for module, (start, end) in zip(self.types, self.slices, strict=True)
            ],
            dim=1,
        )
        # A missing value (NaN, Horizon's sentinel, anything) goes through its type's transform
        # like any other and is then replaced: each output column depends on its own feature
        # only, so whatever the transform made of it is discarded here. A product by the float
        # mask, not `where` (over ten times slower on the CPU: so is anything that reads a
        # boolean tensor): 0 + out * 0 is +0 for any finite out, and the NaN that an infinity
        # or a NaN times 0 makes is then replaced by 0. Infinities of present features stay.
        present = presence.index_select(1, self.output_features)
        masked = torch.addcmul(out.new_zeros(()), out, present)
        return masked.nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)


class InvertiblePreprocessor(Preprocessor):
    """A preprocessor that maps its output back to raw values (``inverse``): one output column
    per feature, every type's module with an inverse."""

    def __init__(
        self,
        feature_ids: list[str],
        groups: list[tuple[np.ndarray, torch.nn.Module]],
        output_features: np.ndarray,
        output_names: list[str],
    ) -> None:
        super().__init__(feature_ids, groups, output_features, output_names)
        # Where each input column's (one) output column is: not saved with the module's
        # state, as it follows from ``input_order``.
        order = self.input_order.cpu().numpy()
        self.register_buffer(
            "inverse_order", torch.as_tensor(np.argsort(order), dtype=torch.long), persistent=False
        )

    def inverse(self, out: torch.Tensor) -> torch.Tensor:
        """The raw values ``[batch, len(feature_ids)]``, in ``feature_ids`` order, that
        ``forward`` maps to ``out`` ``[batch, len(output_names)]`` (the features present): how
        an actor's normalized action goes back to the user's units. Export-friendly (slices,
        elementwise math and a gather by a constant index)."""
        raw = torch.cat(
            [
                module.inverse(out[:, start:end])
                for module, (start, end) in zip(self.types, self.slices, strict=True)
            ],
            dim=1,
        )
        return raw.index_select(1, self.inverse_order)
