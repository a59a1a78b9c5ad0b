"""The built-in ``onnx`` exporter: one ``model.onnx`` with the normalization inside.

Inputs: ``features`` (raw dense state features, in the order the metadata's ``feature_ids``
lists) and ``presence`` (1.0 present, 0.0 missing), both ``[batch, features]`` float32 with a
dynamic batch axis. A parametric model also takes each row's candidate actions:
``candidates`` and ``candidate_presence`` ``[batch, candidates, action features]`` (in the
order of the metadata's ``action_feature_ids``) and ``candidate_mask`` ``[batch, candidates]``
(1.0 for a real candidate, 0.0 for padding), the candidates axis dynamic too. Outputs:
``scores`` (per action or candidate), ``probabilities`` (under the configured policy) and
``action`` (the index of the policy's most probable action or candidate). Feature ids, action
names, normalization, policy settings, run id and Horizon version travel in the model's
metadata.

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


STATE_INPUTS = ("features", "presence")
CANDIDATE_INPUTS = ("candidates", "candidate_presence", "candidate_mask")
OUTPUTS = ("scores", "probabilities", "action")


def _policy_head(bundle: PolicyBundle, config: ExportConfig) -> torch.nn.Module:
    """The policy model plus its action probabilities and chosen action, as one module."""
    import torch

    from horizon_engine.policies import action_probabilities

    def outputs(scores: torch.Tensor, possible: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probabilities = action_probabilities(
            scores, possible, config.policy, config.epsilon, config.temperature
        )
        return scores, probabilities, probabilities.argmax(dim=1)

    class PolicyHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = bundle.model

        def forward(self, features: torch.Tensor, presence: torch.Tensor) -> tuple:
            scores = self.model(features, presence)
            return outputs(scores, torch.ones_like(scores))

    class ParametricPolicyHead(PolicyHead):
        def forward(  # type: ignore[override]
            self,
            features: torch.Tensor,
            presence: torch.Tensor,
            candidates: torch.Tensor,
            candidate_presence: torch.Tensor,
            candidate_mask: torch.Tensor,
        ) -> tuple:
            scores = self.model(features, presence, candidates, candidate_presence)
            return outputs(scores, candidate_mask)

    return (ParametricPolicyHead() if bundle.parametric else PolicyHead()).eval()


def _sample_inputs(bundle: PolicyBundle) -> dict[str, torch.Tensor]:
    """The check rows as the model's inputs, by input name."""
    inputs = dict(zip(STATE_INPUTS, (bundle.sample_values, bundle.sample_presence), strict=True))
    if bundle.sample_candidates is not None:
        inputs |= dict(zip(CANDIDATE_INPUTS, bundle.sample_candidates, strict=True))
    return inputs


def _dynamic_axes(parametric: bool) -> dict[str, dict[int, str]]:
    """Batch everywhere; for a parametric model the candidates axis of the candidate inputs
    and of the per-candidate outputs too."""
    axes: dict[str, dict[int, str]] = {name: {0: "batch"} for name in STATE_INPUTS + OUTPUTS}
    if parametric:
        for name in (*CANDIDATE_INPUTS, "scores", "probabilities"):
            axes[name] = {0: "batch", 1: "candidates"}
    return axes


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
        inputs = _sample_inputs(bundle)
        with torch.no_grad():
            expected = [output.numpy() for output in head(*inputs.values())]
        with atomic_output(run.output_dir / MODEL_FILE) as temporary:
            with warnings.catch_warnings():
                # torch 2.13 marks the TorchScript exporter as deprecated; the dynamo exporter
                # needs onnxscript, not a dependency yet.
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(
                    head,
                    tuple(tensor[:2] for tensor in inputs.values()),
                    str(temporary),
                    input_names=list(inputs),
                    output_names=list(OUTPUTS),
                    dynamic_axes=_dynamic_axes(bundle.parametric),
                    opset_version=OPSET,
                    dynamo=False,
                )
            model = onnx.load(str(temporary))
            self._describe(model, bundle)
            onnx.checker.check_model(model)
            onnx.save(model, str(temporary))
            feeds = {name: tensor.numpy() for name, tensor in inputs.items()}
            worst = self._verify(str(temporary), feeds, expected)
        self.details = {
            "policy": self.config.policy,
            "verified_rows": len(bundle.sample_values),
            "max_abs_difference": worst,
            "bytes": (run.output_dir / MODEL_FILE).stat().st_size,
        }
        return [MODEL_FILE]

    def _describe(self, model: onnx.ModelProto, bundle: PolicyBundle) -> None:
        from horizon_engine import __version__

        metadata = {
            "feature_ids": json.dumps(bundle.feature_ids),
            "actions": json.dumps(bundle.actions),
            "action_feature_ids": json.dumps(bundle.action_feature_ids),
            "normalization": json.dumps(bundle.normalization),
            "policy": json.dumps(self.config.model_dump()),
            "run_id": bundle.run_id,
            "horizon_version": __version__,
        }
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value

    def _verify(self, path: str, feeds: dict[str, np.ndarray], expected: list[np.ndarray]) -> float:
        """Run the model with onnxruntime; the largest difference from PyTorch, or an error."""
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = session.run(None, feeds)
        worst = 0.0
        for name, ours, theirs in zip(OUTPUTS, expected, got, strict=True):
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
