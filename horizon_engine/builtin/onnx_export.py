"""The built-in ``onnx`` exporter: one ``model.onnx`` with the normalization inside.

Inputs: ``features`` (raw dense state features, in the order the metadata's ``feature_ids``
lists) and ``presence`` (1.0 present, 0.0 missing), both ``[batch, features]`` float32 with a
dynamic batch axis. Outputs: ``scores`` (per action), ``probabilities`` (under the configured
policy) and ``action`` (the policy's most probable action). Feature ids, action names,
normalization, policy settings, run id and Horizon version travel in the model's metadata.

The written model is checked with ``onnx.checker`` and run with onnxruntime on eval rows; its
outputs must equal PyTorch's within ``TOLERANCE``, or the export fails naming the worst
difference, and no model file is left behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from horizon_engine.errors import HorizonError
from horizon_engine.export import ExportConfig, ExporterBase, PolicyBundle
from horizon_engine.files import atomic_output
from horizon_engine.hookspecs import hookimpl

if TYPE_CHECKING:
    import onnx
    import torch

    from horizon_engine.pipeline import RunContext

MODEL_FILE = "model.onnx"
TOLERANCE = 1e-5
OPSET = 17


def _policy_head(bundle: PolicyBundle, config: ExportConfig) -> torch.nn.Module:
    """The policy model plus its action probabilities and chosen action, as one module."""
    import torch

    from horizon_engine.policies import action_probabilities

    class PolicyHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = bundle.model

        def forward(
            self, features: torch.Tensor, presence: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            scores = self.model(features, presence)
            possible = torch.ones_like(scores)
            probabilities = action_probabilities(
                scores, possible, config.policy, config.epsilon, config.temperature
            )
            return scores, probabilities, probabilities.argmax(dim=1)

    return PolicyHead().eval()


class OnnxExporter(ExporterBase):
    """Exports the policy, normalization included, as an ONNX model checked with onnxruntime."""

    name = "onnx"
    Config = ExportConfig
    config: ExportConfig

    def export(self, run: RunContext, bundle: PolicyBundle) -> list[str]:
        import warnings

        import onnx
        import torch

        head = _policy_head(bundle, self.config)
        values, presence = bundle.sample_values, bundle.sample_presence
        with torch.no_grad():
            expected = [output.numpy() for output in head(values, presence)]
        with atomic_output(run.output_dir / MODEL_FILE) as temporary:
            with warnings.catch_warnings():
                # torch 2.13 marks the TorchScript exporter as deprecated; the dynamo exporter
                # needs onnxscript, not a dependency yet.
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(
                    head,
                    (values[:2], presence[:2]),
                    str(temporary),
                    input_names=["features", "presence"],
                    output_names=["scores", "probabilities", "action"],
                    dynamic_axes={
                        name: {0: "batch"}
                        for name in ("features", "presence", "scores", "probabilities", "action")
                    },
                    opset_version=OPSET,
                    dynamo=False,
                )
            model = onnx.load(str(temporary))
            self._describe(model, bundle)
            onnx.checker.check_model(model)
            onnx.save(model, str(temporary))
            worst = self._verify(str(temporary), values.numpy(), presence.numpy(), expected)
        self.details = {
            "policy": self.config.policy,
            "verified_rows": len(values),
            "max_abs_difference": worst,
            "bytes": (run.output_dir / MODEL_FILE).stat().st_size,
        }
        return [MODEL_FILE]

    def _describe(self, model: onnx.ModelProto, bundle: PolicyBundle) -> None:
        from horizon_engine import __version__

        metadata = {
            "feature_ids": json.dumps(bundle.feature_ids),
            "actions": json.dumps(bundle.actions),
            "normalization": json.dumps(bundle.normalization),
            "policy": json.dumps(self.config.model_dump()),
            "run_id": bundle.run_id,
            "horizon_version": __version__,
        }
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value

    def _verify(
        self,
        path: str,
        values: np.ndarray,
        presence: np.ndarray,
        expected: list[np.ndarray],
    ) -> float:
        """Run the model with onnxruntime; the largest difference from PyTorch, or an error."""
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = session.run(None, {"features": values, "presence": presence})
        worst = 0.0
        names = ("scores", "probabilities", "action")
        for name, ours, theirs in zip(names, expected, got, strict=True):
            difference = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
            if not difference.size:
                continue
            at = int(difference.argmax())
            largest = float(difference.flat[at])
            if largest > TOLERANCE:
                where = tuple(int(i) for i in np.unravel_index(at, difference.shape))
                raise HorizonError(
                    f"[export] the ONNX model's {name!r} differs from PyTorch's by {largest:.3g} "
                    f"at {where}: {ours.flat[at]!r} vs {theirs.flat[at]!r} "
                    f"(tolerance {TOLERANCE})"
                )
            worst = max(worst, largest)
        return worst


@hookimpl
def horizon_register_exporters(register: Callable[[type], None]) -> None:
    register(OnnxExporter)
