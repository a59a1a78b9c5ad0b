"""The ``Predictor``: an exported ``model.onnx`` in onnxruntime, on raw feature maps, with
exploration by the core's numpy ``Exploration``.

The lean path: the state features' columns are computed once from the model's metadata, a
batch's dense ``features``/``presence`` arrays are made without Python bytecode per feature
when every row has every feature (``FeatureColumns``), a batch's rows are checked in a few
C-level passes when their values are plainly good (``Predictor.rows_problem``), and the
session is asked for ``scores`` only (``action`` for a continuous actor),
so the graph's ``probabilities`` and ``action`` outputs are never computed. Exploration
(greedy, epsilon-greedy, softmax with a temperature: ``horizon_engine.Exploration``, the one
implementation the gym and CPE's torch side agree with; or the paper's send/drop rule with a
``SendRateController``) is computed from the scores, impossible actions excluded, with a
seeded ``numpy.random.Generator``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from horizon_engine import (
    FLOAT32_MAX,
    Exploration,
    HorizonError,
    ModelInputs,
    ModelOutputs,
    feature_map_problem,
    integer_problem,
    model_card_of_session,
    shown_value,
    text_problem,
)
from horizon_plugins_serving.served_policy import PolicyFlags, ServedPolicy, served_policy

logger = logging.getLogger(__name__)


# -- the input rows -----------------------------------------------------------------------------


def check_row(row: Any, actions: Sequence[str], action_type: str) -> str | None:
    """What is wrong with an input row (a request's or a ``horizon score`` line's) for a model
    of ``action_type``, or None.

    Its values follow the rule every door follows (``horizon_engine``'s ``row_values``): a
    feature value that training's float32 cannot hold, or a string that is not valid Unicode,
    is refused here rather than logged, to be refused by the next ``horizon run``.
    """
    if not isinstance(row, dict):
        return f"expected a JSON object, found {type(row).__name__}"
    if not isinstance(row.get("state_features"), dict):
        return "no state_features map"
    problem = feature_map_problem(row["state_features"], "state feature")
    if problem is not None:
        return str(problem)
    return _fields_problem(row, actions, action_type)


def _fields_problem(row: dict[str, Any], actions: Sequence[str], action_type: str) -> str | None:
    """``check_row``'s answer for a row whose state features are good: what is wrong with its
    ``mdp_id``, ``sequence_number`` or ``possible_actions``, or None."""
    mdp_id = row.get("mdp_id")
    if mdp_id is not None and not isinstance(mdp_id, str):
        return f"mdp_id is {shown_value(mdp_id)}, expected a string"
    problem = text_problem(mdp_id) if mdp_id is not None else None
    if problem is not None:
        return f"mdp_id: {problem}"
    problem = integer_problem(row.get("sequence_number", 0))
    if problem is not None:
        return f"sequence_number: {problem}"
    possible = row.get("possible_actions")
    if action_type == "continuous":
        if possible is not None:
            return "possible_actions given to a continuous actor, which takes none"
        return None
    if action_type == "parametric":
        if not isinstance(possible, list) or not possible:
            return "a parametric model needs possible_actions, a non-empty list of feature maps"
        for number, candidate in enumerate(possible):
            problem = feature_map_problem(candidate, f"possible action {number}'s feature")
            if problem is not None:
                return str(problem)
        return None
    if possible is not None:
        if not isinstance(possible, list):
            return f"possible_actions is {shown_value(possible)}, expected a list of actions"
        unknown = [action for action in possible if action not in actions]
        if unknown:
            shown = shown_value(unknown)
            return f"possible action(s) {shown} not among the model's actions {list(actions)}"
    return None


NUMBER_TYPES = frozenset({int, float})
DICT_TYPE = frozenset({dict})
BATCH_CHECK_ROWS = 4
"""The fewest rows ``Predictor.rows_problem`` judges by ``plainly_good_states``: its dozen C
calls cost more than checking one or two rows a value at a time (measured: 3.8 against 1.7
microseconds for one row; 6 against 11 for eight)."""


def plainly_good_states(rows: Sequence[Any]) -> bool:
    """True when every row is a dict whose ``state_features`` is a dict of ASCII ids to ints and
    floats, finite and within float32's range: what ``feature_map_problem`` passes, judged for
    the whole batch at once (a few C-level passes over the ids and values, no Python bytecode
    per feature). False says only that some row needs the exact, one-value-at-a-time check:
    a non-ASCII id, say, may well be valid."""
    try:
        if not set(map(type, rows)) <= DICT_TYPE:
            return False
        states = [row["state_features"] for row in rows]
        if not set(map(type, states)) <= DICT_TYPE:
            return False
        if not "".join(chain.from_iterable(states)).isascii():
            return False
        values = list(chain.from_iterable(map(dict.values, states)))
        if not set(map(type, values)) <= NUMBER_TYPES:
            return False
        magnitudes = np.abs(np.fromiter(values, np.float64, len(values)))
    except (KeyError, TypeError, OverflowError):
        return False
    return bool((magnitudes <= FLOAT32_MAX).all())


@dataclass
class SendRateController:
    """A PID controller on the send/drop threshold that holds a target send rate.

    ``update(sent)`` takes the decisions of one batch (True for send) and moves the threshold
    by the error of the batch's send rate from ``target`` (positive when sending too often,
    which raises the threshold): ``threshold = initial + kp * error + ki * sum(errors) +
    kd * (error - previous error)``. The default gains (``kp = 1``, ``ki = 4``, ``kd = 0``)
    hold a 30% target within 1.6 points on every 2,000-decision window of a stream of
    200-decision batches whose Q-difference drifts by 3.5 (tests/test_serving.py)."""

    target: float
    kp: float = 1.0
    ki: float = 4.0
    kd: float = 0.0
    threshold: float = 0.0
    integral: float = field(default=0.0, init=False)
    previous_error: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.target < 1.0:
            raise HorizonError(f"target send rate {self.target}: expected a rate in (0, 1)")
        self.initial = self.threshold

    def update(self, sent: np.ndarray | Sequence[bool]) -> float:
        sent = np.asarray(sent, dtype=bool)
        if sent.size == 0:
            return self.threshold
        error = float(sent.mean()) - self.target
        self.integral += error
        derivative = 0.0 if self.previous_error is None else error - self.previous_error
        self.previous_error = error
        self.threshold = (
            self.initial + self.kp * error + self.ki * self.integral + self.kd * derivative
        )
        return self.threshold


def send_probabilities(difference: np.ndarray, threshold: float) -> np.ndarray:
    """The paper's rule: send with probability ``sigmoid(Q_send - Q_drop - threshold)``."""
    return 1.0 / (1.0 + np.exp(-(np.asarray(difference, dtype=np.float64) - threshold)))


class NonFiniteOutput(HorizonError):
    """The model's output for some rows of a batch is NaN or infinite: nothing of theirs may be
    answered or logged (a NaN score reads as ``null``, a NaN propensity breaks every estimate
    made from the log). ``rows`` are their indexes in the batch, ``output`` names the output."""

    def __init__(self, rows: list[int], output: str, found: float) -> None:
        super().__init__(
            f"the model's {output} is {found} (not finite) for {len(rows)} of the batch's rows"
        )
        self.rows = rows
        self.output = output
        self.found = found


SUMMED_OUTPUT = 64
"""The most values of an output ``non_finite_rows`` checks by their Python sum (a NaN or an
infinity makes it so; float32 values cannot overflow a float64 sum): 0.4 against 2.2
microseconds for ``numpy.isfinite`` on a one-row batch's two scores."""


def non_finite_rows(
    outputs: Sequence[np.ndarray], fetched: Sequence[str], candidate_mask: np.ndarray | None
) -> NonFiniteOutput | None:
    """The error naming the rows whose outputs are not finite, or None (the usual case, one
    ``isfinite`` pass over each output). A parametric model's padding candidates (mask 0) do
    not count; a ``log_density`` of minus infinity is a density of 0, which counts as finite."""
    for output, name in zip(outputs, fetched, strict=True):
        values = np.asarray(output)
        if values.size <= SUMMED_OUTPUT and math.isfinite(sum(values.ravel().tolist())):
            continue  # a sum in float64 is finite only when every value is
        finite = np.isfinite(values)
        if name == ModelOutputs.LOG_DENSITY:
            finite |= values == -np.inf
        if candidate_mask is not None and finite.shape == candidate_mask.shape:
            finite |= candidate_mask == 0
        if finite.all():
            continue
        bad = ~finite.reshape(len(finite), -1).all(axis=1)
        rows = np.flatnonzero(bad).tolist()
        first, good = np.atleast_1d(values[rows[0]]), np.atleast_1d(finite[rows[0]])
        return NonFiniteOutput(rows, name, float(first[~good][0]))
    return None


@dataclass
class Predictions:
    """A batch's decisions: ``actions`` (action names for a discrete model, candidate indexes
    for a parametric one, vectors in the user's units for a continuous one), each chosen
    action's ``propensities`` under the exploration (for a continuous actor, the density of
    ``log_density`` when the model has it, else 1), and ``scores`` (every action's or
    candidate's score, ``[rows, actions]``; a continuous actor's actions)."""

    actions: list[Any]
    propensities: np.ndarray
    scores: np.ndarray
    probabilities: np.ndarray | None = None
    """Every action's probability under the exploration (discrete and parametric)."""

    def __len__(self) -> int:
        return len(self.actions)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Predictor:
    """An exported model (``horizon export``'s ``model.onnx``) that scores raw feature maps.

    ``Predictor(path)`` loads it on onnxruntime's CPU provider with ``intra_op_threads``
    (one by default: a single request's latency) and reads its metadata: the state
    ``feature_ids``, the ``actions`` (or the parametric ``action_feature_ids``), the
    ``action_type`` and ``action_bounds``. ``model_id`` is the file's sha256, 16 hex digits.
    With ``flags`` (``horizon serve`` and ``horizon score``) the policy is the card's, each
    flag given overriding it (``served_policy``); else it is ``exploration`` (greedy when
    None). ``served`` says which policy applies and where it came from. A model whose outputs
    are not finite is refused at load (``check_outputs``), and a batch's rows whose outputs are
    not finite are refused by ``scores`` (``NonFiniteOutput``).
    """

    def __init__(
        self,
        model_path: str | Path,
        exploration: Exploration | None = None,
        seed: int | None = None,
        intra_op_threads: int = 1,
        strict_features: bool = False,
        flags: PolicyFlags | None = None,
    ) -> None:
        import onnxruntime

        self.path = Path(model_path)
        if not self.path.is_file():
            raise HorizonError(f"{self.path}: no such model file")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(
                str(self.path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise HorizonError(f"{self.path}: not a model onnxruntime can load ({exc})") from exc
        self.card = model_card_of_session(self.session, str(self.path))
        self.feature_ids: list[str] = list(self.card.feature_ids)
        self.actions: list[str] = list(self.card.actions)
        self.action_feature_ids: list[str] = list(self.card.action_feature_ids)
        self.action_type = self.card.action_type
        self.continuous = self.card.continuous
        self.parametric = self.card.parametric
        bounds = self.card.action_bounds
        self.action_bounds: dict[str, list[float | None]] | None = bounds and bounds.as_dict()
        self.model_id = file_digest(self.path)[:16]
        self.state_columns = FeatureColumns(self.feature_ids)
        self.columns = self.state_columns.index
        self.action_columns = FeatureColumns(self.action_feature_ids)
        self.action_index = {action: index for index, action in enumerate(self.actions)}
        self.action_names = np.array(self.actions, dtype=object)
        outputs = {output.name for output in self.session.get_outputs()}
        self.stochastic = ModelOutputs.LOG_DENSITY in outputs
        self.fetch = (
            list(ModelOutputs.of(self.action_type, self.stochastic))
            if self.continuous
            else [ModelOutputs.SCORES]
        )
        pruned = fetched_only(self.path, self.fetch)
        if pruned is not None:
            try:
                self.session = onnxruntime.InferenceSession(
                    pruned, options, providers=["CPUExecutionProvider"]
                )
            except Exception:  # pruning only saves time: a model it breaks is run whole
                logger.debug("%s: pruned to %s, onnxruntime refused it", self.path, self.fetch)
        self.one_row = OneRowBinding.for_model(self)
        if flags is not None:
            self.served = served_policy(self.card, flags)
        elif self.continuous:
            self.served = ServedPolicy(Exploration(), actor=True)
        else:
            self.served = ServedPolicy(exploration or Exploration(), {"policy": "the caller"})
        self.exploration = self.served.exploration
        self.rng = np.random.default_rng(seed)
        self.strict_features = strict_features
        self.featureless_rows = 0
        """Rows decided on without one state feature the model uses (empty or all unknown)."""
        self.check_outputs()

    def check_outputs(self) -> None:
        """Refuse a model whose outputs on two check rows (every state feature absent; every
        one present at 0, with one such candidate for a parametric model) are not finite, or
        which fails to run on them: a model whose training went NaN exports and loads like
        any other, and would be served answering ``"scores": null`` and logging null
        propensities. Finite there, a model may still give a non-finite output for some
        request's values: ``scores`` refuses those rows (``NonFiniteOutput``)."""
        states: list[dict[str, float]] = [{}, dict.fromkeys(self.feature_ids, 0.0)]
        feeds = self._feeds(states, [[{}], [dict.fromkeys(self.action_feature_ids, 0.0)]])
        try:
            outputs = self.session.run(self.fetch, feeds)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise HorizonError(
                f"{self.path}: the model fails on its check rows (every state feature absent, "
                f"then every one 0): {exc}"
            ) from None
        problem = non_finite_rows(outputs, self.fetch, feeds.get(ModelInputs.CANDIDATE_MASK))
        if problem is not None:
            which = ["every state feature absent", "every state feature 0"]
            on = " and ".join(which[row] for row in problem.rows)
            raise HorizonError(
                f"{self.path}: the model's {problem.output} is {problem.found} (not finite) on "
                f"its check rows ({on}): its training likely diverged (a NaN loss); refusing "
                "to load it"
            )

    # -- checking the input rows ----------------------------------------------------------

    def row_problem(self, row: Any) -> str | None:
        """What is wrong with an input row for this model (``check_row``), and with
        ``strict_features`` a row none of whose state features the model uses."""
        problem = check_row(row, self.actions, self.action_type)
        if problem is None and self.strict_features and self.featureless(row["state_features"]):
            problem = (
                f"none of the state features {_sample(row['state_features'])} is one the model "
                f"uses ({_sample(self.feature_ids)}); refused by --strict-features"
            )
        return problem

    def rows_problem(self, rows: Sequence[Any]) -> tuple[int, str] | None:
        """The first bad row of a batch, by its index, and what ``row_problem`` says of it;
        None when every row is good.

        Each row's state features are judged one value at a time only when the batch's are not
        all plainly good (``plainly_good_states``): then the first bad row and its reason are
        found exactly as ``row_problem`` finds them."""
        if self.parametric or len(rows) < BATCH_CHECK_ROWS or not plainly_good_states(rows):
            for number, row in enumerate(rows):
                problem = self.row_problem(row)
                if problem is not None:
                    return number, problem
            return None
        if not self.strict_features and max(map(len, rows), default=1) == 1:
            return None  # state features alone, and those good
        actions, action_type = self.actions, self.action_type
        for number, row in enumerate(rows):
            problem = None if len(row) == 1 else _fields_problem(row, actions, action_type)
            if problem is None and self.strict_features and self.featureless(row["state_features"]):
                problem = self.row_problem(row)
            if problem is not None:
                return number, problem
        return None

    def featureless(self, features: Mapping[str, float]) -> bool:
        """True when no key of ``features`` is a state feature the model uses."""
        return not any(key in self.columns for key in features)

    def _count_featureless(self, presence: np.ndarray) -> None:
        """Count the rows of a batch that the model sees as all-absent, and say so in the log
        at the 1st, 10th, 100th, ... such row: a model decides on them, but on its defaults."""
        rows, width = presence.shape
        if np.count_nonzero(presence) > (rows - 1) * width:
            return  # more present features than all rows but one can hold: none is empty
        count = int((presence.sum(axis=1) == 0).sum()) if presence.size else len(presence)
        if not count:
            return
        before, self.featureless_rows = self.featureless_rows, self.featureless_rows + count
        if len(str(before)) != len(str(self.featureless_rows)) or before == 0:
            logger.warning(
                "%s: %d rows so far had no state feature the model uses (empty, or every id "
                "unknown): decided on the model's defaults; --strict-features refuses them",
                self.path,
                self.featureless_rows,
            )

    # -- assembling the inputs ------------------------------------------------------------

    def state_arrays(self, states: Sequence[Mapping[str, float]]) -> tuple[np.ndarray, ...]:
        """The dense ``features`` and ``presence`` inputs of raw feature maps; keys the model
        does not use are ignored, features a row lacks are absent (presence 0)."""
        return self.state_columns.arrays(states)

    def candidate_arrays(
        self, candidates: Sequence[Sequence[Mapping[str, float]]]
    ) -> tuple[np.ndarray, ...]:
        """``candidates``, ``candidate_presence`` ``[rows, most candidates, action features]``
        and ``candidate_mask`` (0 for padding) of each row's candidate action feature maps."""
        width = max((len(row) for row in candidates), default=0)
        if width == 0:
            raise HorizonError("every row needs at least one candidate action")
        flat = [candidate for row in candidates for candidate in row]
        values, presence = self.action_columns.arrays(flat)
        shape = (len(candidates), width, len(self.action_feature_ids))
        dense, dense_presence = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        mask = np.zeros(shape[:2], np.float32)
        counts = np.array([len(row) for row in candidates])
        rows = np.repeat(np.arange(len(candidates)), counts)
        slots = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
        dense[rows, slots], dense_presence[rows, slots], mask[rows, slots] = values, presence, 1
        return dense, dense_presence, mask

    def possible_mask(self, possible_actions: Sequence[Sequence[str] | None]) -> np.ndarray:
        """``[rows, actions]``, True for each row's possible actions (every action for a row
        whose list is None or empty: it did not record them, as ``horizon_engine.Exploration``
        and the timeline read it)."""
        mask = np.zeros((len(possible_actions), len(self.actions)), dtype=bool)
        for row, names in enumerate(possible_actions):
            if not names:
                mask[row] = True
                continue
            try:
                mask[row, [self.action_index[name] for name in names]] = True
            except KeyError as exc:
                raise HorizonError(
                    f"row {row}: possible action {exc.args[0]!r} is not one of the model's "
                    f"actions {self.actions}"
                ) from None
        return mask

    # -- scoring --------------------------------------------------------------------------

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The session on prepared inputs, fetching only what the Predictor needs (one row of
        a discrete model through its ``OneRowBinding``)."""
        features = feeds[ModelInputs.FEATURES]
        if self.one_row is not None and len(feeds) == 2 and len(features) == 1:
            scores = self.one_row.run(features, feeds[ModelInputs.PRESENCE])
            if scores is not None:
                return [scores]
        return self.session.run(self.fetch, feeds)

    def scores(
        self,
        states: Sequence[Mapping[str, float]],
        candidates: Sequence[Sequence[Mapping[str, float]]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The model's scores (a continuous actor's actions), for a parametric model the
        candidate mask, and for a stochastic actor the ``log_density``."""
        feeds = self._feeds(states, candidates)
        self._count_featureless(feeds[ModelInputs.PRESENCE])
        mask = feeds.get(ModelInputs.CANDIDATE_MASK)
        outputs = self.run(feeds)
        problem = non_finite_rows(outputs, self.fetch, mask)
        if problem is not None:
            raise problem
        return outputs[0], mask, outputs[1] if len(outputs) > 1 else None

    def _feeds(
        self,
        states: Sequence[Mapping[str, float]],
        candidates: Sequence[Sequence[Mapping[str, float]]] | None = None,
    ) -> dict[str, np.ndarray]:
        """The model's inputs for raw feature maps (and a parametric model's candidates)."""
        feeds = dict(zip(ModelInputs.STATE, self.state_arrays(states), strict=True))
        if self.parametric:
            if candidates is None or len(candidates) != len(states):
                raise HorizonError("a parametric model needs a list of candidates for each row")
            offered = self.candidate_arrays(candidates)
            feeds |= dict(zip(ModelInputs.PER_CANDIDATE, offered, strict=True))
        return feeds

    def predict(
        self,
        states: Sequence[Mapping[str, float]],
        possible_actions: Sequence[Sequence[str] | None] | None = None,
        candidates: Sequence[Sequence[Mapping[str, float]]] | None = None,
        exploration: Exploration | None = None,
    ) -> Predictions:
        """Score a batch of raw feature maps and choose an action for each row under the
        exploration (the Predictor's own unless given): see ``Predictions``."""
        scores, candidate_mask, log_density = self.scores(states, candidates)
        if self.continuous:
            density = (
                np.exp(log_density.astype(np.float64))
                if log_density is not None
                else np.ones(len(scores))
            )
            return Predictions(list(scores), density, scores)
        if self.parametric:
            possible = candidate_mask.astype(bool)
        elif possible_actions is not None:
            if len(possible_actions) != len(states):
                raise HorizonError(
                    f"{len(possible_actions)} lists of possible actions for {len(states)} rows"
                )
            possible = self.possible_mask(possible_actions)
        else:
            possible = None
        exploration = exploration or self.exploration
        chosen, propensities, probabilities = exploration.choose(scores, possible, self.rng)
        actions = chosen.tolist() if self.parametric else self.action_names[chosen].tolist()
        return Predictions(actions, propensities, scores, probabilities)

    def decide(
        self, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[Predictions, list[Any], list[Any] | None]:
        """Decisions for input rows (``state_features`` and, optionally, ``possible_actions``:
        action names, or for a parametric model the candidates' feature maps) as the decision
        log records them: the ``Predictions``, each chosen action in its logged form (the
        action's name, the chosen candidate's map, or a continuous actor's map of action
        feature ids to values), and each row's possible actions (None for a continuous
        actor, which has none)."""
        states = [row["state_features"] for row in rows]
        possible = [row.get("possible_actions") for row in rows]
        if self.parametric:
            result = self.predict(states, candidates=possible)
            chosen = [offered[i] for offered, i in zip(possible, result.actions, strict=True)]
            return result, chosen, possible
        if self.continuous:
            result = self.predict(states)
            ids = self.action_feature_ids
            actions = [dict(zip(ids, map(float, a), strict=True)) for a in result.actions]
            return result, actions, None
        restricted = possible.count(None) < len(possible)
        result = self.predict(states, possible if restricted else None)
        return result, result.actions, possible

    def send_or_drop(
        self,
        states: Sequence[Mapping[str, float]],
        controller: SendRateController,
        send: str,
        drop: str,
        update: bool = True,
    ) -> Predictions:
        """The paper's rule for a two-action send/drop model: send when
        ``sigmoid(Q_send - Q_drop - threshold)`` wins a Bernoulli draw, the threshold the
        controller's; the controller sees the batch's sends when ``update``."""
        scores = self.scores(states)[0]
        difference = scores[:, self.action_index[send]] - scores[:, self.action_index[drop]]
        p_send = send_probabilities(difference, controller.threshold)
        sent = self.rng.random(len(p_send)) < p_send
        if update:
            controller.update(sent)
        propensities = np.where(sent, p_send, 1.0 - p_send)
        return Predictions([send if s else drop for s in sent], propensities, scores)


PRUNED_MODEL_BYTES = 64 << 20
"""The largest model file ``fetched_only`` prunes: a larger model's time is its arithmetic,
not the per-node overhead that pruning saves."""


def fetched_only(path: Path, fetch: Sequence[str]) -> bytes | None:
    """The model at ``path`` with only the nodes (and initializers) that ``fetch``'s outputs
    need, serialized; None when nothing would be left out, when the file is over
    ``PRUNED_MODEL_BYTES``, or when a node holds a subgraph (whose outer-scope inputs are not
    listed). onnxruntime runs every node of a graph whatever the outputs asked for: an
    exported model's ``probabilities`` and ``action`` doubled the nodes behind ``scores``,
    and a third of a one-row run's time."""
    import onnx

    if path.stat().st_size > PRUNED_MODEL_BYTES:
        return None
    try:
        model = onnx.load(str(path))
    except Exception:  # onnxruntime read it: whatever onnx cannot, is run whole
        return None
    graph = model.graph
    if any(
        attribute.g.node or attribute.graphs for node in graph.node for attribute in node.attribute
    ):
        return None
    needed = set(fetch)
    kept = []
    for node in reversed(graph.node):  # ONNX keeps nodes in topological order
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(node.input)
    if len(kept) == len(graph.node):
        return None
    initializers = [tensor for tensor in graph.initializer if tensor.name in needed]
    outputs = [output for output in graph.output if output.name in fetch]
    del graph.node[:], graph.initializer[:], graph.output[:]
    graph.node.extend(reversed(kept))
    graph.initializer.extend(initializers)
    graph.output.extend(outputs)
    return model.SerializeToString()


class OneRowBinding:
    """A discrete model's session bound to preallocated one-row ``features``, ``presence``
    and ``scores`` arrays: a batch of one row, what ``horizon serve`` mostly gets, then costs
    no new input or output arrays and none of ``InferenceSession.run``'s checks of the feeds,
    a fifth of the call's time.

    One caller at a time: ``run`` takes a lock without waiting, and answers None (run the
    session the usual way) while another thread holds it."""

    def __init__(self, session: Any, width: int, actions: int) -> None:
        import onnxruntime

        self.session = session
        self.features = np.zeros((1, width), np.float32)
        self.presence = np.zeros((1, width), np.float32)
        self.scores = np.zeros((1, actions), np.float32)
        self.binding = session.io_binding()
        # Each OrtValue shares its array's memory; kept for as long as the binding uses them.
        self.values = [
            onnxruntime.OrtValue.ortvalue_from_numpy(array)
            for array in (self.features, self.presence, self.scores)
        ]
        features, presence, scores = self.values
        self.binding.bind_ortvalue_input(ModelInputs.FEATURES, features)
        self.binding.bind_ortvalue_input(ModelInputs.PRESENCE, presence)
        self.binding.bind_ortvalue_output(ModelOutputs.SCORES, scores)
        self.lock = threading.Lock()

    @classmethod
    def for_model(cls, predictor: Predictor) -> OneRowBinding | None:
        """The binding of a discrete model whose inputs are ``features`` and ``presence``
        and whose ``scores`` have a column per action, by its declared shapes; else None."""
        session = predictor.session
        inputs = {node.name: node.shape for node in session.get_inputs()}
        outputs = {node.name: node.shape for node in session.get_outputs()}
        width, actions = len(predictor.feature_ids), len(predictor.actions)
        shapes = (
            inputs.get(ModelInputs.FEATURES),
            inputs.get(ModelInputs.PRESENCE),
            outputs.get(ModelOutputs.SCORES),
        )
        if (
            predictor.continuous
            or predictor.parametric
            or set(inputs) != set(ModelInputs.STATE)
            or any(shape is None or len(shape) != 2 for shape in shapes)
            or [shape[1] for shape in shapes] != [width, width, actions]
        ):
            return None
        return cls(session, width, actions)

    def run(self, features: np.ndarray, presence: np.ndarray) -> np.ndarray | None:
        """The scores of one row, or None while another thread runs the binding."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            self.features[...] = features
            self.presence[...] = presence
            self.session.run_with_iobinding(self.binding)
            return self.scores.copy()
        finally:
            self.lock.release()


def _sample(names: Any, shown: int = 5) -> str:
    """A few names of a list or map, for a reason that must stay one line."""
    names = list(names)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{names[:shown]}{more}"


COLUMN_WISE_ROWS = 256
"""The fewest rows ``FeatureColumns.arrays`` reads a column at a time: one ``fromiter`` per
feature over the maps, 23% faster than one over all the ids' values chained at 1,024 rows of 4
features (87 against 113 microseconds), 14% at 320; slower for a few rows, where the call per
feature costs more than the chaining."""


class FeatureColumns:
    """Where each feature id of a model's input goes in its dense ``[rows, width]`` arrays, and
    feature maps made into those arrays.

    A batch in which every map has every feature the model uses (what clients mostly send) is
    read by ``itemgetter`` and ``numpy.fromiter``: no Python bytecode per feature, a fifth of
    the time of filling lists a feature at a time, which remains for batches where some map
    lacks a feature (or holds a value that is not a number: it raises there as it always did).
    A batch of ``COLUMN_WISE_ROWS`` or more is read a column at a time."""

    def __init__(self, feature_ids: Sequence[str]) -> None:
        self.index = {feature: column for column, feature in enumerate(feature_ids)}
        self.width = len(self.index)
        self._every = itemgetter(*feature_ids) if self.width else None
        self._each = [itemgetter(feature) for feature in feature_ids]

    def arrays(self, maps: Sequence[Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        """``maps`` as float32 ``values`` and ``presence`` ``[rows, width]``: keys the model
        does not use are ignored, features a map lacks are absent (presence 0)."""
        shape = (len(maps), self.width)
        if self._every is not None:
            try:
                values = self._every_feature(maps, shape)
            except (KeyError, TypeError, ValueError, OverflowError):
                pass  # a map lacks a feature, or holds a value the one-at-a-time path judges
            else:
                return values, np.ones(shape, np.float32)
        return self._one_at_a_time(maps, shape)

    def _every_feature(
        self, maps: Sequence[Mapping[str, float]], shape: tuple[int, int]
    ) -> np.ndarray:
        """The values of maps that all have every feature (else ``arrays``' errors)."""
        rows, width = shape
        if rows >= COLUMN_WISE_ROWS:
            values = np.empty(shape, np.float32)
            for column, feature in enumerate(self._each):
                values[:, column] = np.fromiter(map(feature, maps), np.float32, rows)
            return values
        picked = map(self._every, maps)
        flat = picked if width == 1 else chain.from_iterable(picked)
        return np.fromiter(flat, np.float32, rows * width).reshape(shape)

    def _one_at_a_time(
        self, maps: Sequence[Mapping[str, float]], shape: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Flat Python lists filled through the id -> column index, then one array each."""
        width = self.width
        values = [0.0] * (shape[0] * width)
        presence = [0.0] * (shape[0] * width)
        get = self.index.get
        base = 0
        for features in maps:
            for key, value in features.items():
                column = get(key)
                if column is not None:
                    values[base + column] = value
                    presence[base + column] = 1.0
            base += width
        return (
            np.array(values, dtype=np.float32).reshape(shape),
            np.array(presence, dtype=np.float32).reshape(shape),
        )
