"""The ``torch_program`` exporter: the policy as a ``torch.export`` program, ``policy.pt2``.

The program takes the raw state ``features`` and their ``presence`` (``[batch, features]``
float32, a dynamic batch axis, the normalization inside) and returns what ``PolicyOutput``
holds for discrete actions: ``scores``, ``probabilities`` under the ``[export]`` exploration,
and the chosen ``action``. ``torch.export.load("policy.pt2").module()`` runs it in any Python
with torch, no Horizon Engine needed; the feature ids (the input's column order), the action
names, the exploration and the run id travel inside the file as ``horizon.json`` (read them with
``torch.export.load(path, extra_files={"horizon.json": ""})``). Before the file takes its name,
it is loaded back and run on the bundle's check rows: its outputs must equal the policy's, or
the export fails and leaves no file behind.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from horizon_engine import (
    ActionType,
    ExportConfig,
    ExporterBase,
    HorizonError,
    PolicyBundle,
    atomic_output,
    policy_output,
)

if TYPE_CHECKING:
    import torch

    from horizon_engine import RunContext

PROGRAM_FILE = "policy.pt2"
SCORE_TOLERANCE = 1e-5
"""Largest difference allowed between the program's scores and the policy's, relative to the
largest score: both run the same torch kernels, so they agree to a rounding step or two."""


class TorchProgram(ExporterBase):
    """A torch.export program (policy.pt2): scores, probabilities and the chosen action."""

    name = "torch_program"

    def export(self, run: RunContext, bundle: PolicyBundle) -> list[str]:
        """Export, reload and check on the bundle's sample rows, then rename into place."""
        import torch

        if bundle.parametric:
            raise HorizonError(
                "[export] kind = 'torch_program' exports discrete-action policies; this one "
                "scores candidate actions"
            )
        head = _policy_head(bundle.model, self.config)
        values, presence = bundle.sample_values, bundle.sample_presence
        # torch.export specializes a batch axis of size 1; two rows keep it dynamic.
        example = (values[:1].repeat(2, 1), presence[:1].repeat(2, 1))
        batch = torch.export.Dim("batch")
        program = torch.export.export(head, example, dynamic_shapes=({0: batch}, {0: batch}))
        description = {
            "feature_ids": bundle.feature_ids,
            "actions": bundle.actions,
            "exploration": self.config.model_dump(mode="json"),
            "run_id": bundle.run_id,
        }
        with atomic_output(run.output_dir / PROGRAM_FILE) as temporary:
            extra_files = {"horizon.json": json.dumps(description)}
            torch.export.save(program, temporary, extra_files=extra_files)
            self.details = _check(torch.export.load(temporary).module(), head, values, presence)
        return [PROGRAM_FILE]


def _policy_head(model: torch.nn.Module, config: ExportConfig) -> torch.nn.Module:
    """The policy and ``policy_output`` as one module: what the program computes."""
    import torch

    class PolicyHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, features: torch.Tensor, presence: torch.Tensor) -> tuple:
            output = policy_output(self.model, ActionType.DISCRETE, features, presence, config)
            return output.scores, output.probabilities, output.action

    return PolicyHead().eval()


def _check(
    program: torch.nn.Module,
    head: torch.nn.Module,
    values: torch.Tensor,
    presence: torch.Tensor,
) -> dict[str, float]:
    """Raise a ``HorizonError`` unless the reloaded program gives the policy's outputs on the
    check rows; the figures for the manifest otherwise."""
    import torch

    with torch.no_grad():
        scores, probabilities, action = program(values, presence)
        expected_scores, expected_probabilities, expected_action = head(values, presence)
    difference = float((scores - expected_scores).abs().max())
    scale = max(1.0, float(expected_scores.abs().max()))
    if difference > SCORE_TOLERANCE * scale:
        raise HorizonError(
            f"[export] {PROGRAM_FILE}: its scores differ from the policy's by {difference:.3g} "
            f"on the {len(values)} check rows"
        )
    if not torch.equal(action, expected_action) or not torch.allclose(
        probabilities, expected_probabilities
    ):
        raise HorizonError(
            f"[export] {PROGRAM_FILE}: its actions or probabilities differ from the policy's "
            f"on the {len(values)} check rows"
        )
    return {"verified_rows": len(values), "max_abs_difference": difference}
