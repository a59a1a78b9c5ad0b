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
outputs must agree with PyTorch's as float32 arithmetic allows (``ScoreTolerance``), or the
export fails naming the worst difference, and no model file is left behind. Two libraries
computing the same network sum in different orders, so their scores differ by a few float32
rounding steps of the scores' magnitude: 6e-5 on Q-values near 145 is agreement, not a bug.
Where a row's two best scores are closer than that, either library may rank them either way, so
the chosen action (and the greedy part of the probabilities) is compared only on the other rows;
the details count both.

A continuous policy (``problem.json``'s action type ``continuous``) takes the same
``features`` and ``presence`` and outputs ``action`` ``[batch, action features]``, the action
in the user's units (the action preprocessor's inverse is inside the policy module, as the
normalization is), and for a stochastic policy, whose module returns ``(action,
log_density)``, ``log_density`` ``[batch]`` too. Its metadata adds ``action_type``
(``"continuous"``) and ``action_bounds`` (``{"low": [...], "high": [...]}`` in the order of
``action_feature_ids``: the ``continuous_action`` range of each action feature, which the
exported action cannot leave, as it is clamped there; null for a feature normalized
otherwise). It is checked on the
same rows: both outputs within a ``ScoreTolerance`` of their own magnitude (the log-density
widened where the squash makes it ill-conditioned, and not compared on rows whose action is
within ``SATURATED`` of a bound: ``_verify_continuous``). The ``[export]``
exploration options (``policy``, ``epsilon``, ``temperature``) choose among discrete actions
and do not apply to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from horizon_engine import (
    ActionBounds,
    ExplorationConfig,
    ExportConfig,
    ExporterBase,
    HorizonError,
    ModelCard,
    ModelInputs,
    ModelOutputs,
    PolicyBundle,
    RunFolder,
    atomic_output,
    hookimpl,
    recorded_possible,
    top_two_gap,
    write_model_card,
)

if TYPE_CHECKING:
    import onnx
    import torch

    from horizon_engine import RunContext

OPSET = 17

FLOAT32_EPSILON = float(np.finfo(np.float32).eps)
"""2**-23, float32's relative rounding step: what one rounding may change of a value."""

ROUNDINGS_PER_LAYER = 16
"""Rounding steps of the scores' magnitude allowed per layer of the network. A layer's dot
products, summed in another order by onnxruntime than by PyTorch, differ by a few steps of their
terms' magnitude; cancellation between terms and the error carried in from the layer before
make that more relative to the result. Measured differences were at most 3.1 steps; three layers
and the normalization allow 64, and a model 2e-5 off at its largest score still fails
(measured: docs/measurements.md#roundings_per_layer)."""

PROBABILITY_TOLERANCE = 4 * FLOAT32_EPSILON
"""Probabilities lie in [0, 1] and are computed by the same few operations in both libraries
from agreeing scores: a few rounding steps of 1 apart."""


def _policy_head(bundle: PolicyBundle, config: ExportConfig) -> torch.nn.Module:
    """The policy model with its ``PolicyOutput`` (scores, probabilities, action) as one module."""
    import torch

    from horizon_engine import ActionType, policy_output

    class PolicyHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = bundle.model

        def forward(self, features: torch.Tensor, presence: torch.Tensor) -> tuple:
            output = policy_output(self.model, ActionType.DISCRETE, features, presence, config)
            return output.scores, output.probabilities, output.action

    class ParametricPolicyHead(PolicyHead):
        def forward(  # type: ignore[override]
            self,
            features: torch.Tensor,
            presence: torch.Tensor,
            candidates: torch.Tensor,
            candidate_presence: torch.Tensor,
            candidate_mask: torch.Tensor,
        ) -> tuple:
            output = policy_output(
                self.model,
                ActionType.PARAMETRIC,
                features,
                presence,
                config,
                possible_actions=candidate_mask,
                candidates=(candidates, candidate_presence),
            )
            return output.scores, output.probabilities, output.action

    return (ParametricPolicyHead() if bundle.parametric else PolicyHead()).eval()


def _continuous_head(bundle: PolicyBundle) -> torch.nn.Module:
    """The continuous policy model with its ``PolicyOutput`` (action, and log-density for a
    stochastic policy) as one module; ``stochastic`` says which.

    The action is clamped to the action bounds (``_action_bounds``; none for a feature of
    another type): the policy module maps its (-1, 1) into them already, but onnxruntime's
    tanh may round a saturated value a step past 1 (measured: -2.0000002 for a [-2, 2]
    action), and the model's users are promised actions inside the bounds."""
    import torch

    from horizon_engine import ActionType, policy_output

    bounds = _action_bounds(bundle)
    low = [-math.inf if value is None else value for value in bounds["low"]]
    high = [math.inf if value is None else value for value in bounds["high"]]

    class ContinuousPolicyHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = bundle.model
            self.register_buffer("low", torch.tensor([low], dtype=torch.float32))
            self.register_buffer("high", torch.tensor([high], dtype=torch.float32))
            with torch.no_grad():
                sample = self.model(bundle.sample_values[:2], bundle.sample_presence[:2])
            self.stochastic = isinstance(sample, tuple)

        def forward(self, features: torch.Tensor, presence: torch.Tensor) -> tuple:
            output = policy_output(self.model, ActionType.CONTINUOUS, features, presence)
            action = torch.minimum(torch.maximum(output.action, self.low), self.high)
            if self.stochastic:
                return action, output.log_density
            return (action,)

    return ContinuousPolicyHead().eval()


def _action_bounds(bundle: PolicyBundle) -> dict[str, list[float | None]]:
    """Each action feature's ``continuous_action`` [min_value, max_value], in
    ``action_feature_ids`` order; None for a feature of another type."""
    parameters = bundle.normalization.get("action_features", {})
    bounds: dict[str, list[float | None]] = {"low": [], "high": []}
    for feature in bundle.action_feature_ids:
        found = parameters.get(feature, {})
        mapped = found.get("feature_type") == "continuous_action"
        bounds["low"].append(found.get("min_value") if mapped else None)
        bounds["high"].append(found.get("max_value") if mapped else None)
    return bounds


def _sample_inputs(bundle: PolicyBundle) -> dict[str, torch.Tensor]:
    """The check rows as the model's inputs, by input name."""
    state = (bundle.sample_values, bundle.sample_presence)
    inputs = dict(zip(ModelInputs.STATE, state, strict=True))
    if bundle.sample_candidates is not None:
        inputs |= dict(zip(ModelInputs.PER_CANDIDATE, bundle.sample_candidates, strict=True))
    return inputs


@dataclass(frozen=True)
class ScoreTolerance:
    """How far onnxruntime's scores may be from PyTorch's, as ``numpy.isclose`` puts it:
    ``|onnx - torch| <= atol + rtol * |torch|``.

    ``rtol`` is ``ROUNDINGS_PER_LAYER`` float32 rounding steps per layer with weights, plus one
    layer for the normalization in front. A score near zero can still carry the rounding of the
    large values it was computed from, so ``atol`` is ``rtol`` times the largest score checked.
    """

    rtol: float
    atol: float

    @classmethod
    def for_model(cls, model: torch.nn.Module, scores: np.ndarray) -> ScoreTolerance:
        """The tolerance for ``model`` (its layers counted as the modules holding weights: at
        least its depth, more for parallel heads) on the PyTorch ``scores`` checked."""
        layers = sum(
            1
            for module in model.modules()
            if next(module.parameters(recurse=False), None) is not None
        )
        rtol = FLOAT32_EPSILON * ROUNDINGS_PER_LAYER * (layers + 1)
        finite = np.abs(scores[np.isfinite(scores)])
        return cls(rtol=rtol, atol=rtol * float(finite.max(initial=0.0)))

    def bound(self, expected: np.ndarray) -> np.ndarray:
        """The largest allowed difference from each of PyTorch's ``expected`` scores."""
        return self.atol + self.rtol * np.abs(expected)


def _dynamic_axes(parametric: bool, outputs: tuple[str, ...]) -> dict[str, dict[int, str]]:
    """Batch everywhere; for a parametric model the candidates axis of the candidate inputs
    and of the per-candidate outputs too."""
    axes: dict[str, dict[int, str]] = {name: {0: "batch"} for name in ModelInputs.STATE + outputs}
    if parametric:
        for name in (*ModelInputs.PER_CANDIDATE, ModelOutputs.SCORES, ModelOutputs.PROBABILITIES):
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

        if bundle.continuous:
            head = _continuous_head(bundle)
            outputs = ModelOutputs.of(bundle.action_type.value, head.stochastic)
        else:
            head = _policy_head(bundle, self.config)
            outputs = ModelOutputs.of(bundle.action_type.value)
        inputs = _sample_inputs(bundle)
        with torch.no_grad():
            expected = [output.numpy() for output in head(*inputs.values())]
        with atomic_output(run.output_dir / RunFolder.MODEL) as temporary:
            with warnings.catch_warnings():
                # torch 2.13 marks the TorchScript exporter as deprecated; the dynamo exporter
                # needs onnxscript, not a dependency yet.
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(
                    head,
                    tuple(tensor[:2] for tensor in inputs.values()),
                    str(temporary),
                    input_names=list(inputs),
                    output_names=list(outputs),
                    dynamic_axes=_dynamic_axes(bundle.parametric, outputs),
                    opset_version=OPSET,
                    dynamo=False,
                )
            model = onnx.load(str(temporary))
            _declare_output_shapes(model, bundle)
            self._describe(model, bundle)
            onnx.checker.check_model(model)
            onnx.save(model, str(temporary))
            feeds = {name: tensor.numpy() for name, tensor in inputs.items()}
            if bundle.continuous:
                want = dict(zip(outputs, expected, strict=True))
                verified = _verify_continuous(str(temporary), feeds, want, bundle)
            else:
                tolerance = ScoreTolerance.for_model(bundle.model, expected[0])
                verified = self._verify(str(temporary), feeds, expected, tolerance)
        described: dict[str, Any] = {"policy": self.config.policy}
        if bundle.continuous:
            kind = "stochastic" if ModelOutputs.LOG_DENSITY in outputs else "deterministic"
            described = {"policy": kind, "outputs": list(outputs)}
        self.details = {
            **described,
            **verified,
            "bytes": (run.output_dir / RunFolder.MODEL).stat().st_size,
        }
        return [RunFolder.MODEL]

    def _describe(self, model: onnx.ModelProto, bundle: PolicyBundle) -> None:
        from horizon_engine import __version__

        bounds = None
        if bundle.continuous:
            found = _action_bounds(bundle)
            bounds = ActionBounds(tuple(found["low"]), tuple(found["high"]))
        card = ModelCard(
            feature_ids=tuple(bundle.feature_ids),
            actions=tuple(bundle.actions),
            action_feature_ids=tuple(bundle.action_feature_ids),
            action_type=bundle.action_type.value,
            action_bounds=bounds,
            normalization=bundle.normalization,
            policy=self.config.model_dump(include=set(ExplorationConfig.model_fields)),
            run_id=bundle.run_id,
            horizon_version=__version__,
        )
        write_model_card(card, model)

    def _verify(
        self,
        path: str,
        feeds: dict[str, np.ndarray],
        expected: list[np.ndarray],
        tolerance: ScoreTolerance,
    ) -> dict[str, Any]:
        """Run the model with onnxruntime and compare with PyTorch's outputs: the figures of
        the comparison for the details, or an error naming the worst disagreement.

        Scores within ``tolerance`` everywhere. A row whose two best possible scores are
        within twice a score's bound (each may move that far, in opposite directions) is a
        tie: its chosen action may differ, and so may greedy and epsilon-greedy probabilities,
        which follow the choice; the other rows must choose alike and agree within
        ``PROBABILITY_TOLERANCE``. Softmax probabilities change smoothly with the scores:
        moving each score by at most d changes p_i by at most 2 p_i (1 - p_i) d / temperature
        <= d / (2 temperature), so they are compared on every row within that, and the choice
        is also tied where the two largest probabilities are closer than twice it.
        """
        import onnxruntime
        import torch

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        want_scores, want_probabilities, want_action = expected
        got_scores, got_probabilities, got_action = session.run(list(ModelOutputs.SCORED), feeds)
        scores = want_scores.astype(np.float64)
        rule = f"rtol {tolerance.rtol:.3g}, atol {tolerance.atol:.3g}"
        worst = _check_close(
            ModelOutputs.SCORES, want_scores, got_scores, tolerance.bound(scores), rule
        )

        mask = torch.from_numpy(feeds.get(ModelInputs.CANDIDATE_MASK, np.ones_like(want_scores)))
        possible = recorded_possible(mask).numpy() > 0
        gap = top_two_gap(torch.from_numpy(scores), mask).numpy()
        # How far any possible action's score of the row may move.
        moves = tolerance.bound(np.where(possible, np.abs(scores), 0.0).max(axis=1))
        tied = gap <= 2 * moves
        softmax = self.config.policy == "softmax"
        if softmax:
            probability_bound = moves / (2 * self.config.temperature) + PROBABILITY_TOLERANCE
            # The choice is the most probable action; at a high temperature probabilities can
            # be closer than their own rounding where the scores are not.
            probabilities = torch.from_numpy(want_probabilities.astype(np.float64))
            tied |= top_two_gap(probabilities, mask).numpy() <= 2 * probability_bound
        else:
            probability_bound = np.full(len(scores), PROBABILITY_TOLERANCE)
        decided = ~tied
        differing = np.flatnonzero(decided & (want_action != got_action))
        if differing.size:
            row = int(differing[0])
            raise HorizonError(
                f"[export] the ONNX model chooses action {int(got_action[row])} where "
                f"PyTorch chooses {int(want_action[row])} at row {row}, whose two best "
                f"scores are {gap[row]:.3g} apart, more than twice the {moves[row]:.3g} a "
                f"score may move ({rule}); scores {want_scores[row].tolist()} vs "
                f"{got_scores[row].tolist()}"
            )
        compared = np.ones_like(decided) if softmax else decided
        _check_close(
            ModelOutputs.PROBABILITIES,
            want_probabilities[compared],
            got_probabilities[compared],
            probability_bound[compared, None],
            f"{self.config.policy} policy",
            rows=np.flatnonzero(compared),
        )
        return {
            "verified_rows": len(scores),
            "max_abs_difference": worst,
            "score_tolerance": {"rtol": tolerance.rtol, "atol": tolerance.atol},
            "compared_action_rows": int(decided.sum()),
            "tied_rows": int(tied.sum()),
        }


SATURATED = 1e-3
"""How close to a bound (as a fraction of half the action's range) a stochastic policy's action
may come before its ``log_density`` is too ill-conditioned to compare: a tanh squash's
log-density holds ``log(1 - y^2)``, which a rounding step of ``y`` near 1 moves by that step
over ``1 - |y|`` (0.018 measured at ``1 - |y|`` = 3e-6); such rows are counted, not compared."""


def _verify_continuous(
    path: str, feeds: dict[str, np.ndarray], want: dict[str, np.ndarray], bundle: PolicyBundle
) -> dict[str, Any]:
    """Run the continuous model with onnxruntime and compare with PyTorch's outputs, or raise
    an error naming the worst disagreement. There is no choice among actions to tie.

    ``action`` within a ``ScoreTolerance`` of its magnitude everywhere. ``log_density`` within
    one of its own, widened by the squash's conditioning: a rounding of the normalized action
    ``y`` (``rtol``) moves ``log(1 - y^2)`` by about ``rtol / (1 - |y|)``; rows whose action is
    within ``SATURATED`` of a bound are not compared (``saturated_rows``)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = dict(zip(want, session.run(list(want), feeds), strict=True))
    want_action, got_action = want[ModelOutputs.ACTION], got[ModelOutputs.ACTION]
    action = want_action.astype(np.float64)
    tolerance = ScoreTolerance.for_model(bundle.model, want_action)
    rule = f"rtol {tolerance.rtol:.3g}, atol {tolerance.atol:.3g}"
    worst = _check_close(
        ModelOutputs.ACTION, want_action, got_action, tolerance.bound(action), rule
    )
    verified: dict[str, Any] = {
        "verified_rows": len(action),
        "max_abs_difference": worst,
        "action_tolerance": {"rtol": tolerance.rtol, "atol": tolerance.atol},
    }
    if ModelOutputs.LOG_DENSITY not in want:
        return verified
    bounds = _action_bounds(bundle)
    low = np.array([np.nan if v is None else v for v in bounds["low"]], dtype=np.float64)
    high = np.array([np.nan if v is None else v for v in bounds["high"]], dtype=np.float64)
    half = np.where(high > low, (high - low) / 2, np.nan)
    margin = np.minimum(action - low, high - action) / half
    margin = np.nanmin(np.where(np.isnan(margin), 1.0, margin), axis=1, initial=1.0)
    compared = margin >= SATURATED
    density = want[ModelOutputs.LOG_DENSITY][compared]
    tolerance = ScoreTolerance.for_model(bundle.model, density)
    bound = tolerance.bound(density.astype(np.float64)) + tolerance.rtol / margin[compared]
    rule = f"rtol {tolerance.rtol:.3g}, atol {tolerance.atol:.3g}, + rtol / (1 - |y|)"
    rows = np.flatnonzero(compared)
    worst = _check_close(
        ModelOutputs.LOG_DENSITY,
        density,
        got[ModelOutputs.LOG_DENSITY][compared],
        bound,
        rule,
        rows=rows,
    )
    verified |= {
        "log_density_max_abs_difference": worst,
        "log_density_tolerance": {"rtol": tolerance.rtol, "atol": tolerance.atol},
        "saturated_rows": int((~compared).sum()),
    }
    return verified


def _check_close(
    name: str,
    ours: np.ndarray,
    theirs: np.ndarray,
    bound: np.ndarray,
    rule: str,
    rows: np.ndarray | None = None,
) -> float:
    """The largest difference between PyTorch's output ``ours`` and onnxruntime's ``theirs``,
    or an error naming the worst excess over ``bound`` (which ``rule`` describes). ``rows``
    numbers the rows of a selection, for the message.

    A value that is not finite on either side is an error of its own, naming the output: NaN
    agrees with NaN, but a model that scores NaN (a diverged training) is no model to serve.
    """
    broken = ~(np.isfinite(ours) & np.isfinite(theirs))
    if broken.any():
        at = int(broken.argmax())
        where = _position(at, broken.shape, rows)
        raise HorizonError(
            f"[export] the model's {name!r} is not finite in {int(broken.sum())} of the "
            f"{broken.size} values checked, first at {where}: {float(ours.flat[at])} in "
            f"PyTorch, {float(theirs.flat[at])} in ONNX; the trained policy gives no usable "
            f"{name} (was its training finite?)"
        )
    difference = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    difference[ours == theirs] = 0.0
    if not difference.size:
        return 0.0
    bound = np.broadcast_to(bound, difference.shape)
    excess = difference - bound
    at = int(excess.argmax())
    if excess.flat[at] > 0:
        raise HorizonError(
            f"[export] the ONNX model's {name!r} differs from PyTorch's by "
            f"{float(difference.flat[at]):.3g} at {_position(at, difference.shape, rows)}: "
            f"{ours.flat[at]!r} vs "
            f"{theirs.flat[at]!r} (allowed {float(bound.flat[at]):.3g}: {rule})"
        )
    return float(difference.max())


def _position(at: int, shape: tuple[int, ...], rows: np.ndarray | None) -> tuple[int, ...]:
    """The index of the flat position ``at`` in an output of ``shape``, its row numbered as
    ``rows`` numbers a selection's rows."""
    where = [int(i) for i in np.unravel_index(at, shape)]
    if rows is not None:
        where[0] = int(rows[where[0]])
    return tuple(where)


def _declare_output_shapes(model: onnx.ModelProto, bundle: PolicyBundle) -> None:
    """Each output's shape as the model's users read it: ``scores`` and ``probabilities``
    ``[batch, actions]`` (the number of actions) or ``[batch, candidates]``, ``action``
    ``[batch]``. The exporter's tracing cannot tell the width of ``probabilities`` (the
    one-hot of the choice takes it from the scores at run time) and named it after the batch.
    A continuous model's ``action`` is ``[batch, action features]``, ``log_density``
    ``[batch]``."""
    width: int | str = "candidates" if bundle.parametric else len(bundle.actions)
    shapes: dict[str, list[int | str]] = {
        ModelOutputs.SCORES: ["batch", width],
        ModelOutputs.PROBABILITIES: ["batch", width],
        ModelOutputs.ACTION: ["batch"],
    }
    if bundle.continuous:
        shapes = {
            ModelOutputs.ACTION: ["batch", len(bundle.action_feature_ids)],
            ModelOutputs.LOG_DENSITY: ["batch"],
        }
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        del dims[:]
        for size in shapes[output.name]:
            dim = dims.add()
            if isinstance(size, int):
                dim.dim_value = size
            else:
                dim.dim_param = size


@hookimpl
def horizon_register_exporters(register: Callable[[type], None]) -> None:
    register(OnnxExporter)
