"""The report's sections for one run folder: what each shows, read from the folder's files.

Each builder reads the files it needs through ``RunFolder`` and returns a ``ReportSection``:
shown, or absent with the reason (the stage did not run, the file is missing). A folder may
come from anywhere: a file that cannot be read or holds the wrong shapes makes its section
say so (``guarded``), never the page fail.

- verdict (first, where the manifest records one): is the trained policy better than the
  logged one, by the recommended estimate, with why; then every estimate considered, each
  marked trusted or not with the checks it failed, and its diagnostics;
- run: the config as resolved, plugins and versions, each stage's seconds and import time;
- rows: the funnel from rows in to the train and eval splits, every reason rows were dropped;
- normalization: each feature's type and parameters, the worst-behaved features' samples
  before and after their transform (``feature_badness`` says what worst means), the rest
  listed under a fold;
- training: every epoch's metrics (``training_epochs.json``);
- counterfactual evaluation: each estimator's estimate per epoch relative to the logged
  policy, with its interval, and the final table (``cpe.json``, ``cpe_epochs.json``);
- actions: the logged against the trained policy's actions on the eval split;
- export: the model's inputs and outputs, its card, the check's tolerance and rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from html import escape
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizon_engine import figures
from horizon_engine.errors import HorizonError
from horizon_engine.report_page import (
    ReportSection,
    html_charts,
    html_folded,
    html_heading,
    html_list,
    html_paragraph,
    html_preformatted,
    html_table,
    html_verdict_box,
    number,
)
from horizon_engine.run_folder import RunFolder

if TYPE_CHECKING:
    import numpy as np

    from horizon_engine.plugins import PluginHost

SAMPLE_ROWS = 5_000
"""Training rows the normalization section draws its histograms from."""
DRAWN_FEATURES = 12
"""Features whose samples the normalization section draws, the worst-behaved first."""
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError)
"""What a section's reading of a folder from elsewhere can raise besides a ``HorizonError``:
the section is then absent with the error, and the other sections are still built."""


def guarded(
    key: str, title: str, build: Callable[[], ReportSection], folder: RunFolder
) -> ReportSection:
    """``build()``, or the section absent with why it could not be built: a ``HorizonError``'s
    own message (meant for the user), or what reading the folder raised."""
    try:
        return build()
    except HorizonError as exc:
        return ReportSection(key, title, absent=str(exc))
    except READ_ERRORS as exc:
        return ReportSection(
            key,
            title,
            absent=f"{folder.path} could not be read for it: {type(exc).__name__}: {exc}",
        )


def run_section(folder: RunFolder, manifest: Mapping[str, Any]) -> ReportSection:
    """The run: when and where, the plugins, each stage's time, the config as resolved."""
    facts = [
        ("run id", manifest.get("run_id")),
        ("status", manifest.get("status")),
        ("started", manifest.get("started_at")),
        ("finished", manifest.get("finished_at")),
        ("host", manifest.get("host")),
        ("seed", manifest.get("seed")),
        ("config file", manifest.get("config_file")),
        ("Horizon Engine", manifest.get("horizon_version")),
    ]
    body = [html_table(("", ""), [(name, _text(value)) for name, value in facts])]
    if manifest.get("error"):
        body.append(html_paragraph(f"The run failed: {manifest['error']}", "warning"))
    stages = _mapping(manifest.get("stages"))
    executed = set(manifest.get("executed") or [])
    rows = []
    for name, record in stages.items():
        record = _mapping(record)
        seconds = _float(record.get("seconds"))
        imports = _float(record.get("import_seconds"))
        rows.append(
            (
                name,
                "this run" if name in executed else "an earlier run",
                seconds,
                imports,
                None if seconds is None or imports is None else seconds - imports,
                len(record.get("warnings") or []),
                str(record["stale"]) if record.get("stale") else "",
            )
        )
    header = ("stage", "run by", "seconds", "importing", "working", "warnings", "stale")
    if not any(row[-1] for row in rows):
        header, rows = header[:-1], [row[:-1] for row in rows]
    body.append(html_heading("Stages"))
    body.append(html_table(header, rows) if rows else html_paragraph("No stage ran.", "absent"))
    warnings = [*(manifest.get("warnings") or [])]
    for name, record in stages.items():
        warnings += [f"{name}: {text}" for text in _mapping(record).get("warnings") or []]
    if warnings:
        body.append(html_heading("Warnings"))
        body.append(
            "<ul>" + "".join(f"<li>{escape(str(text))}</li>" for text in warnings) + "</ul>"
        )
    plugins = _mapping(manifest.get("plugins"))
    listed = ", ".join(f"{name} {_text(version)}" for name, version in sorted(plugins.items()))
    body.append(html_paragraph(f"Plugins: {listed or 'none'}."))
    for failure in manifest.get("plugin_failures") or []:
        body.append(html_paragraph(f"Left out: {_text(failure)}", "warning"))
    config = manifest.get("config")
    body.append(
        html_folded("The config as resolved", html_preformatted(json.dumps(config, indent=2)))
    )
    return ReportSection("run", "The run", "".join(body))


ONLINE_COMMAND = "horizon gym train"
"""The ``command`` an online run's manifest records: it played in an environment, so it has
no logged rows, no splits and no stages, but its evaluations' returns."""


def rows_section(manifest: Mapping[str, Any]) -> ReportSection:
    """The funnel: rows in per stage, each reason rows were dropped, the splits."""
    stages = _mapping(manifest.get("stages"))
    if manifest.get("command") == ONLINE_COMMAND:
        result = _mapping(manifest.get("result"))
        facts = [(name, _float(result.get(name))) for name in ("episodes", "steps", "updates")]
        intro = html_paragraph(f"An online run ({ONLINE_COMMAND}): it played, logging no rows.")
        return ReportSection("rows", "Rows", intro + html_table(("", ""), facts))
    if not stages:
        return ReportSection("rows", "Rows", absent="no stage ran")
    labels: list[str] = []
    counts: list[float] = []
    rows = []
    for name in ("source", "timeline", "normalization", "train", "evaluation"):
        record = _mapping(stages.get(name))
        if not record:
            continue
        rows_in = _float(record.get("rows_in"))
        if name in ("source", "timeline") and rows_in is not None:
            labels.append(f"{name}: rows in")
            counts.append(rows_in)
        kept = [
            str(output)
            for output in record.get("outputs") or []
            if str(output) in (RunFolder.SOURCE_QUARANTINE, RunFolder.TIMELINE_QUARANTINE)
        ]
        verb = "quarantined" if kept else "dropped"
        for reason, count in _mapping(record.get("dropped")).items():
            labels.append(f"{name}: {verb}, {reason}")
            counts.append(_float(count) or 0.0)
            rows.append((name, verb, reason, _float(count), ", ".join(kept) or "-"))
    details = _mapping(_mapping(stages.get("timeline")).get("details"))
    for split in ("train", "eval"):
        value = _float(details.get(f"{split}_rows"))
        if value is not None:
            labels.append(f"timeline: {split} split")
            counts.append(value)
    if not labels:
        return ReportSection("rows", "Rows", absent="the stages recorded no row counts")
    body = [figures.count_bars(labels, counts, title="Rows through the pipeline").html()]
    if rows:
        body.append(html_table(("stage", "rows", "because", "count", "kept in"), rows))
    else:
        body.append(html_paragraph("No row was dropped or quarantined."))
    episodes = [
        (split, _float(details.get(f"{split}_episodes")), _float(details.get(f"{split}_rows")))
        for split in ("train", "eval")
    ]
    if any(value is not None for _, value, _ in episodes):
        body.append(html_table(("split", "episodes", "rows"), episodes))
    return ReportSection("rows", "Rows", "".join(body))


def normalization_section(
    folder: RunFolder, manifest: Mapping[str, Any], plugins: PluginHost
) -> ReportSection:
    """Each feature's type and parameters; the worst-behaved features' samples before and
    after their transform (clamped at the run's ``max_feature_value``), drawn; the rest in a
    folded table."""
    from horizon_engine.normalization import NormalizationConfig

    if not folder.file(RunFolder.NORMALIZATION).is_file():
        return ReportSection(
            "normalization", "Normalization", absent="the run has no normalization.json"
        )
    normalization = folder.normalization(plugins)
    configured = _mapping(_mapping(manifest.get("config")).get("normalization"))
    limit = _float(configured.get("max_feature_value"))
    limit = limit if limit and limit > 0 else NormalizationConfig().max_feature_value
    body = []
    for feature_set, parameters in normalization.items():
        column = "state_features" if feature_set == "state_features" else "action"
        found = _feature_samples(folder, column, parameters, plugins, limit)
        order = sorted(parameters, key=lambda feature: -found[feature]["badness"])
        drawn = order[:DRAWN_FEATURES]
        title = f"{feature_set}: {len(parameters)} features"
        body.append(html_heading(title))
        if any(found[feature]["before"].size for feature in drawn):
            pairs = {
                f"{feature} ({parameters[feature].feature_type})": (
                    found[feature]["before"],
                    found[feature]["after"],
                )
                for feature in drawn
            }
            body.append(
                figures.histogram_pairs(
                    pairs, title=f"The {len(drawn)} worst-behaved, as logged and normalized"
                ).html()
            )
        else:
            body.append(html_paragraph("The training split holds no rows to draw.", "absent"))
        rows = [_feature_row(feature, parameters[feature], found[feature]) for feature in order]
        header = ("feature", "type", "parameters", "missing", "at a bound", "skewness")
        shown, rest = rows[:DRAWN_FEATURES], rows[DRAWN_FEATURES:]
        body.append(html_table(header, shown))
        if rest:
            body.append(html_folded(f"The other {len(rest)} features", html_table(header, rest)))
    return ReportSection("normalization", "Normalization", "".join(body))


def feature_badness(missing: float, at_bound: float, skewness: float | None) -> float:
    """How far a feature's normalized sample is from what a network learns from best: present
    (``missing``, the share of rows without it), inside the transform's range (``at_bound``,
    the share clipped to its bound or matching no enum value) and symmetric (|skewness|,
    capped at 10 and counted a tenth). Shares add: a feature missing from half the rows ranks
    above one clipped in a tenth of them."""
    skew = 0.0 if skewness is None or not math.isfinite(skewness) else min(abs(skewness), 10.0)
    return missing + at_bound + skew / 10.0


def _feature_samples(
    folder: RunFolder,
    column: str,
    parameters: Mapping[str, Any],
    plugins: PluginHost,
    limit: float,
) -> dict[str, dict[str, Any]]:
    """Per feature: its logged values (present rows), normalized values, and how it behaves."""
    import numpy as np
    import pyarrow.dataset as ds
    import torch

    from horizon_engine.dataset import dense_features
    from horizon_engine.preprocessor import build_preprocessor

    feature_ids = list(parameters)
    split = folder.split("train")
    rows = 0
    if any(split.glob("*.parquet")):
        sample = ds.dataset(split, format="parquet").head(SAMPLE_ROWS, columns=[column])
        rows = sample.num_rows
    found: dict[str, dict[str, Any]] = {}
    if not rows:
        for feature in feature_ids:
            found[feature] = {"before": np.zeros(0), "after": np.zeros(0), "missing": 0.0}
            found[feature].update(at_bound=0.0, skewness=None, badness=0.0)
        return found
    values, presence = dense_features(sample[column].combine_chunks(), feature_ids)
    preprocessor = build_preprocessor(feature_ids, parameters, limit, plugins)
    with torch.no_grad():
        output = preprocessor(torch.from_numpy(values), torch.from_numpy(presence)).numpy()
    sources = preprocessor.output_features.numpy()
    for index, feature in enumerate(feature_ids):
        present = presence[:, index] > 0
        columns = output[present][:, sources == index]
        if columns.shape[1] == 1:
            after = columns[:, 0].astype(np.float64)
            bounded = np.abs(after) >= limit * (1 - 1e-6)
        else:
            after = columns.argmax(axis=1).astype(np.float64) if columns.size else np.zeros(0)
            bounded = columns.sum(axis=1) == 0 if columns.size else np.zeros(0, bool)
        share = float(present.mean())
        at_bound = float(bounded.mean()) if len(after) else 0.0
        skewness = _skewness(after) if columns.shape[1] == 1 else None
        found[feature] = {
            "before": values[present, index].astype(np.float64),
            "after": after,
            "missing": 1.0 - share,
            "at_bound": at_bound,
            "skewness": skewness,
            "badness": feature_badness(1.0 - share, at_bound, skewness),
        }
    return found


def _skewness(values: np.ndarray) -> float | None:
    import numpy as np

    if len(values) < 3:
        return None
    spread = float(values.std())
    if spread == 0 or not math.isfinite(spread):
        return None
    return float(np.mean(((values - values.mean()) / spread) ** 3))


def _feature_row(feature: str, parameters: Any, found: Mapping[str, Any]) -> tuple[object, ...]:
    fields = parameters.model_dump(exclude_none=True, exclude={"feature_type"})
    shown = ", ".join(f"{name}={_compact(value)}" for name, value in fields.items())
    return (
        feature,
        parameters.feature_type,
        shown,
        f"{found['missing']:.1%}",
        f"{found['at_bound']:.1%}",
        None if found["skewness"] is None else round(found["skewness"], 3),
    )


def training_section(folder: RunFolder, manifest: Mapping[str, Any]) -> ReportSection:
    """Every epoch's training metrics, one small chart each (mean Q per action together); the
    metrics that never changed are listed instead (a coverage of 1, a weight of 0)."""
    online = manifest.get("command") == ONLINE_COMMAND
    if not online and "train" not in _mapping(manifest.get("stages")):
        return ReportSection("training", "Training", absent="the run did not train")
    epochs = folder.training_epochs()
    evaluations = _online_evaluations(_mapping(manifest.get("result"))) if online else ""
    if not epochs:
        if evaluations:
            return ReportSection("training", "Training", evaluations)
        return ReportSection(
            "training",
            "Training",
            absent=f"the run has no {RunFolder.TRAINING_EPOCHS} (written since this report "
            "was added: train again to see the curves)",
        )
    x = [entry["epoch"] for entry in epochs]
    names: list[str] = []
    for entry in epochs:
        names += [name for name in entry["metrics"] if name not in names]
    panels: dict[str, list[figures.Series]] = {}
    constant = []
    for name in names:
        values = [entry["metrics"].get(name) for entry in epochs]
        if name.startswith("CPE/"):
            continue
        if len(epochs) > 1 and len(set(values)) == 1:
            constant.append(name)
            continue
        group, _, action = name.rpartition("/")
        if group.endswith("mean_q"):
            panels.setdefault(f"{group} per action", []).append(figures.Series(action, values))
        else:
            panels[name] = [figures.Series(name.rpartition("/")[2], values)]
    last = epochs[-1]["metrics"]
    body = [evaluations] + (
        []
        if not constant
        else [
            html_paragraph(
                "The same at every epoch (not drawn): "
                + ", ".join(f"{name} = {number(_float(last.get(name)))}" for name in constant)
            )
        ]
    )
    if panels:
        body.append(
            figures.small_multiples(
                x, panels, title=f"Training metrics over {len(epochs)} epochs", xlabel="epoch"
            ).html()
        )
    body += [
        html_folded(
            f"Epoch {x[-1]}'s metrics",
            html_table(("metric", "value"), [(name, _float(last.get(name))) for name in names]),
        ),
    ]
    return ReportSection("training", "Training", "".join(body))


def _online_evaluations(result: Mapping[str, Any]) -> str:
    """An online run's evaluations: the greedy policy's mean return at each, and the bar."""
    evaluations = [_mapping(entry) for entry in result.get("evaluations") or []]
    if not evaluations:
        return html_paragraph("The online run never evaluated its policy.", "absent")
    x = [_float(entry.get("timestep")) for entry in evaluations]
    returns = [_float(entry.get("mean_return")) for entry in evaluations]
    bar = _float(result.get("score_bar"))
    chart = figures.small_multiples(
        x,
        {"mean return of the greedy policy": [figures.Series("mean return", returns)]},
        title=f"{result.get('env')}: evaluations while training online",
        xlabel="environment steps",
        reference=None if bar is None else (bar, "score bar"),
    )
    reached = "reached" if result.get("reached") else "did not reach"
    verdict = html_paragraph(
        f"The run {reached} the score bar ({number(bar)}); best mean return "
        f"{number(_float(result.get('best_mean_return')))}."
    )
    return verdict + chart.html()


def cpe_section(folder: RunFolder) -> ReportSection:
    """Each estimator's estimate per epoch relative to the logged policy, with its interval,
    and the final estimates."""
    final: Mapping[str, Any] = {}
    epochs: Sequence[Any] = []
    if folder.file(RunFolder.CPE).is_file():
        record = folder.cpe()
        final = _mapping(record.get("final"))
        epochs = record.get("epochs") or []
    elif folder.file(RunFolder.CPE_EPOCHS).is_file():
        epochs = folder.cpe_epochs()
    if not final and not epochs:
        return ReportSection(
            "cpe",
            "Counterfactual evaluation",
            absent="the run has no [[evaluation]] estimators (cpe.json)",
        )
    body = []
    panels: dict[str, list[figures.Series]] = {}
    x = [_float(_mapping(entry).get("epoch")) for entry in epochs]
    for label, metric in _estimates(final, epochs):
        values = [_estimate(entry, label, metric) for entry in epochs]
        panels[f"{label}: {metric}"] = [
            figures.Series(
                "relative",
                [value.get("relative") for value in values],
                [value.get("relative_low") for value in values],
                [value.get("relative_high") for value in values],
            )
        ]
    if panels and epochs:
        body.append(
            figures.small_multiples(
                x,
                panels,
                title="Estimated value relative to the logged policy, per epoch",
                xlabel="epoch",
                reference=(1.0, "logged policy"),
            ).html()
        )
    if final:
        rows = []
        for label, estimates in final.items():
            for metric, value in _mapping(estimates).items():
                if isinstance(value, Mapping):
                    rows.append(
                        (
                            label,
                            metric,
                            interval_text(value, "relative"),
                            interval_text(value, "value", "low", "high"),
                            _float(value.get("logged_value")),
                            _float(value.get("effective_sample_size")),
                            value.get("note") or "",
                        )
                    )
                else:
                    rows.append((label, metric, "", number(_float(value)), None, None, ""))
        body.append(html_heading("After training"))
        header = ("estimator", "metric", "relative [interval]", "value [interval]")
        body.append(html_table((*header, "logged", "ESS", "note"), rows))
    return ReportSection("cpe", "Counterfactual evaluation", "".join(body))


VERDICT_TITLE = "Verdict"
ESTIMATORS_TITLE = "Estimators behind the verdict"
DECISION_HEADLINES = {
    "better": "Better than the logged policy",
    "worse": "Worse than the logged policy",
    "unclear": "Unclear whether it is better than the logged policy",
}
"""The verdict's headline per decision (the manifest's ``verdict.decision``)."""
SHOWN_TEXT = 400
"""Characters of one string from the verdict shown; the rest are counted. A manifest can come
from anywhere, and a reason of megabytes would push the page over ``MAX_PAGE_BYTES``."""
SHOWN_ITEMS = 10
"""Items of one list in the verdict shown (reasons, one estimate's failed checks), the rest
counted."""
SHOWN_CANDIDATES = 20
"""Estimates the estimators' table shows, the recommended first; the rest are counted."""
LONGEST_INT = 10**15
"""An integer from the verdict at least this large is shown as text (cut at ``SHOWN_TEXT``),
not formatted as a number: JSON integers may have thousands of digits."""
SHOWN_DIAGNOSTICS = 12
"""Diagnostics (columns) the diagnostics' table shows, in the order first met; the rest are
counted."""


def verdict_section(manifest: Mapping[str, Any]) -> ReportSection:
    """The run's answer (the manifest's ``verdict``): the decision, the recommended estimate
    with its interval in the user's unit against the logged policy's value, the reasons, what
    would settle an unclear one, and the checkpoint shipped; a box coloured by the decision.
    Every field may be missing or of the wrong type (a folder from elsewhere): what is there is
    shown as text, bounded, and what is not is left out of the sentence."""
    verdict = manifest.get("verdict")
    if not isinstance(verdict, Mapping):
        return ReportSection(
            "verdict",
            VERDICT_TITLE,
            absent=f"the manifest's verdict is {_kind(verdict)}, not an object",
        )
    decision = verdict.get("decision")
    headline = DECISION_HEADLINES.get(decision) if isinstance(decision, str) else None
    if headline is None:
        headline = (
            "No decision recorded"
            if decision is None
            else f"An unknown decision: {_shown(decision)}"
        )
    body = [html_paragraph(headline, "headline"), html_paragraph(_figures(verdict), "figures")]
    source = _source(verdict)
    if source:
        body.append(html_paragraph(source))
    reasons = verdict.get("reasons")
    if reasons is not None:
        listed = reasons if isinstance(reasons, list) else [reasons]
        shown = [_shown(reason) for reason in listed[:SHOWN_ITEMS]]
        if len(listed) > SHOWN_ITEMS:
            shown.append(f"and {len(listed) - SHOWN_ITEMS:,} more reasons, not shown")
        body.append(html_list(shown))
    if verdict.get("settle") is not None:
        body.append(html_paragraph(f"What would settle it: {_shown(verdict['settle'])}"))
    checkpoint = verdict.get("checkpoint")
    if checkpoint is not None:
        body.append(_checkpoint(checkpoint))
    known = decision if isinstance(decision, str) else "unknown"
    return ReportSection("verdict", VERDICT_TITLE, html_verdict_box(known, "".join(body)))


def estimators_section(manifest: Mapping[str, Any]) -> ReportSection:
    """Every estimate the verdict considered (``verdict.candidates``, the recommended first):
    its unit, estimate, interval and value relative to the logged policy, whether it passed its
    checks (a row that did not is greyed) and why not; their diagnostics folded below."""
    verdict = _mapping(manifest.get("verdict"))
    candidates = verdict.get("candidates")
    if candidates is None:
        return ReportSection(
            "estimators", ESTIMATORS_TITLE, absent="the verdict lists no candidates"
        )
    if not isinstance(candidates, list):
        return ReportSection(
            "estimators",
            ESTIMATORS_TITLE,
            absent=f"the verdict's candidates is {_kind(candidates)}, not a list",
        )
    if not candidates:
        return ReportSection(
            "estimators", ESTIMATORS_TITLE, absent="the verdict considered no estimate"
        )
    shown = candidates[:SHOWN_CANDIDATES]
    recommended = verdict.get("estimator")
    rows, classes = [], []
    marked = False
    for index, entry in enumerate(shown):
        if not isinstance(entry, Mapping):
            rows.append((f"(entry {index + 1} is {_kind(entry)}, not an object)", *[""] * 7))
            classes.append("untrusted")
            continue
        label = _shown(entry.get("estimator"))
        trusted = entry.get("trusted")
        is_recommended = (
            not marked
            and isinstance(recommended, str)
            and entry.get("estimator") == recommended
            and trusted is not False
        )
        marked = marked or is_recommended
        rows.append(
            (
                f"{label} (recommended)" if is_recommended else label,
                _shown(entry.get("unit")),
                _cell(entry.get("estimate")),
                _interval(entry.get("interval")) or "-",
                _cell(entry.get("logged")),
                _with_interval(entry.get("relative"), entry.get("relative_interval")) or "-",
                _trusted(trusted),
                _failed(entry.get("failed")),
            )
        )
        classes.append(
            "recommended" if is_recommended else "untrusted" if trusted is False else None
        )
    header = (
        "estimator",
        "unit",
        "estimate",
        "interval",
        "logged",
        "relative [interval]",
        "trusted",
        "failed checks",
    )
    body = [html_table(header, rows, classes)]
    if len(candidates) > len(shown):
        body.append(
            html_paragraph(
                f"{len(candidates) - len(shown):,} more estimates were considered; the first "
                f"{len(shown)} are shown.",
                "warning",
            )
        )
    diagnostics = _diagnostics_table(shown)
    if diagnostics:
        body.append(html_folded("Diagnostics of each estimate", diagnostics))
    return ReportSection(
        "estimators", ESTIMATORS_TITLE, f'<div class="estimates">{"".join(body)}</div>'
    )


def _figures(verdict: Mapping[str, Any]) -> str:
    """The verdict's numbers as one sentence: the estimate with its interval in its unit (over
    at most ``horizon`` steps), against the logged policy's value, their ratio, and the
    interval of their difference that decided."""
    unit = verdict.get("unit")
    unit_text = f" {_shown(unit)}" if unit is not None else ""
    if verdict.get("horizon") is not None:
        unit_text += f" (over at most {_shown(verdict['horizon'])} steps)"
    estimate = _with_interval(verdict.get("estimate"), verdict.get("interval"))
    sentence = f"Estimated {estimate}{unit_text}" if estimate else "No estimate recorded"
    if verdict.get("logged") is not None:
        sentence += f", against {_shown(verdict['logged'])} for the logged policy"
    relative = _with_interval(verdict.get("relative"), verdict.get("relative_interval"))
    if relative:
        sentence += f"; {relative} times the logged policy's value"
    difference = _interval(verdict.get("difference_interval"))
    if difference:
        sentence += f"; the interval of the difference {difference}"
    return sentence + "."


def _source(verdict: Mapping[str, Any]) -> str:
    """Which estimator the verdict rests on (the recommended one, or the closest where none
    passed its checks: ``trusted`` false), on which metric and how many eval episodes."""
    if "estimator" not in verdict:
        return ""
    estimator = verdict["estimator"]
    if estimator is None:
        text = "No estimator passed its checks"
    elif verdict.get("trusted") is False:
        text = f"No estimator passed its checks; the closest is {_shown(estimator)}"
    else:
        text = f"By {_shown(estimator)}, the estimator recommended"
    if verdict.get("metric") is not None:
        text += f", on the metric {_shown(verdict['metric'])}"
    if verdict.get("eval_episodes") is not None:
        text += f", over {_shown(verdict['eval_episodes'])} eval episodes"
    return text + "."


def _checkpoint(checkpoint: Any) -> str:
    """The checkpoint the run ships (``verdict.ship_choice``'s record): its epoch, why, and
    each epoch evaluated to choose it, in a table."""
    if not isinstance(checkpoint, Mapping):
        return html_paragraph(f"Checkpoint: {_shown(checkpoint)}.")
    text = f"Checkpoint shipped: epoch {_shown(checkpoint.get('epoch'))}"
    if checkpoint.get("reason") is not None:
        text += f": {_shown(checkpoint['reason'])}"
    parts = [html_paragraph(text + ".")]
    candidates = checkpoint.get("candidates")
    if isinstance(candidates, list) and candidates:
        entries = [_mapping(entry) for entry in candidates[:SHOWN_CANDIDATES]]
        rows = [
            (
                _cell(entry.get("epoch")),
                _shown(entry.get("decision")),
                _shown(entry.get("estimator")),
                f"{_shown(entry.get('estimate'))} {_interval(entry.get('interval'))}",
                _interval(entry.get("difference_interval")),
            )
            for entry in entries
        ]
        shipped = [
            "recommended" if entry.get("epoch") == checkpoint.get("epoch") else None
            for entry in entries
        ]
        parts.append(
            html_table(
                ("epoch", "decision", "estimator", "estimate [interval]", "difference"),
                rows,
                shipped,
            )
        )
    return "".join(parts)


def _failed(failed: Any) -> str:
    """One estimate's failed checks, their reasons joined; the ones past ``SHOWN_ITEMS``
    counted."""
    if failed is None:
        return ""
    if not isinstance(failed, list):
        return _shown(failed)
    shown = [_shown(reason) for reason in failed[:SHOWN_ITEMS]]
    if len(failed) > SHOWN_ITEMS:
        shown.append(f"and {len(failed) - SHOWN_ITEMS:,} more")
    return "; ".join(shown)


def _diagnostics_table(candidates: Sequence[Any]) -> str:
    """The estimates' diagnostics side by side, one row per estimate, one column per
    diagnostic (the first ``SHOWN_DIAGNOSTICS`` met, the rest counted); "" where none has any."""
    entries = [_mapping(entry) for entry in candidates]
    names: list[str] = []
    left_out: set[str] = set()
    for entry in entries:
        for name in _mapping(entry.get("diagnostics")):
            if name in names or name in left_out:
                continue
            if len(names) < SHOWN_DIAGNOSTICS:
                names.append(name)
            else:
                left_out.add(name)
    if not names:
        return ""
    rows = [
        (
            _shown(entry.get("estimator")),
            *(_cell(_mapping(entry.get("diagnostics")).get(name)) for name in names),
        )
        for entry in entries
    ]
    table = html_table(("estimate", *(_clipped(name, 60) for name in names)), rows)
    if left_out:
        table += html_paragraph(f"{len(left_out):,} more diagnostics are not shown.", "warning")
    return table


def _trusted(trusted: Any) -> str:
    """Whether an estimate passed its checks, as a mark that reads at a glance."""
    if trusted is True:
        return "✓ yes"
    if trusted is False:
        return "✗ no"
    return _shown(trusted)


def _with_interval(value: Any, interval: Any) -> str:
    """``value [low, high]``, or the value alone; "" where there is no value."""
    if value is None:
        return ""
    bounds = _interval(interval)
    return f"{_shown(value)} {bounds}" if bounds else _shown(value)


def _interval(interval: Any) -> str:
    """``[low, high]`` as written: a list's items (bounded), any other value as text."""
    if interval is None:
        return ""
    return f"[{_shown(interval)}]"


def _cell(value: Any) -> object:
    """A value from the verdict as a table cell: a number as the table formats numbers
    (right-aligned), anything else as bounded text."""
    if isinstance(value, float) or (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) < LONGEST_INT
    ):
        return value
    return _shown(value)


def _shown(value: Any, nested: bool = False) -> str:
    """Any JSON value from the verdict as text, bounded: a number as the tables show it, a
    string cut at ``SHOWN_TEXT`` characters, a list's first ``SHOWN_ITEMS`` items and an
    object's first ``SHOWN_ITEMS`` fields (one level deep: deeper ones are counted)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _clipped(number(value))
    if isinstance(value, str):
        return _clipped(value)
    if isinstance(value, list):
        if nested:
            return f"({len(value):,} values)"
        items = [_shown(item, nested=True) for item in value[:SHOWN_ITEMS]]
        more = f" and {len(value) - SHOWN_ITEMS:,} more" if len(value) > SHOWN_ITEMS else ""
        return _clipped(", ".join(items) + more)
    if isinstance(value, Mapping):
        if nested:
            return f"({len(value):,} fields)"
        fields = [
            f"{_clipped(str(name), 60)}: {_shown(item, nested=True)}"
            for name, item in islice(value.items(), SHOWN_ITEMS)
        ]
        more = f" and {len(value) - SHOWN_ITEMS:,} more" if len(value) > SHOWN_ITEMS else ""
        return _clipped("{" + ", ".join(fields) + more + "}")
    return _clipped(str(value))


def _clipped(text: str, limit: int = SHOWN_TEXT) -> str:
    """``text`` cut at ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def _kind(value: Any) -> str:
    """What a JSON value is, for a message about a field of the wrong type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({_shown(value)})"
    if isinstance(value, str):
        return f"a string ({_clipped(value, 60)!r})"
    if isinstance(value, list):
        return f"a list of {len(value):,} values"
    return "an object"


def actions_section(folder: RunFolder, plugins: PluginHost) -> ReportSection:
    """The logged against the trained policy's actions on the eval split."""
    from horizon_engine.policy_actions import compare_actions

    if not folder.file(RunFolder.LATEST_CHECKPOINT).is_file():
        return ReportSection("actions", "Actions", absent="the run trained no policy")
    if folder.manifest().get("command") == ONLINE_COMMAND:
        return ReportSection(
            "actions",
            "Actions",
            absent="an online run logs no eval split to compare its actions on (its policy "
            "was evaluated in the environment: Training)",
        )
    found = compare_actions(folder.path, plugins)
    intro = html_paragraph(
        f"On the first {found.rows:,} eval rows; the trained policy as exported ({found.policy})."
    )
    if found.action_type == "continuous":
        drawn = [
            figures.histograms(
                {"logged": found.logged[:, index], "trained": found.trained[:, index]},
                title=f"action {name}",
                xlabel="value",
            ).html()
            for index, name in enumerate(found.names)
        ]
        return ReportSection("actions", "Actions", intro + html_charts(drawn))
    chart = figures.grouped_bars(
        found.names,
        {"logged": list(found.logged), "trained": list(found.trained)},
        title="Share of each action",
        ylabel="share of rows",
    )
    rows = [
        (name, float(logged), float(trained))
        for name, logged, trained in zip(found.names, found.logged, found.trained, strict=True)
    ]
    return ReportSection(
        "actions",
        "Actions",
        intro + chart.html() + html_table(("action", "logged", "trained"), rows),
    )


def export_section(folder: RunFolder, manifest: Mapping[str, Any]) -> ReportSection:
    """The exported model's inputs, outputs and card, and the check against torch."""
    from horizon_engine.model_card import read_model_card

    stages = _mapping(manifest.get("stages"))
    record = _mapping(stages.get("export") if stages else manifest.get("export"))
    path = folder.file(RunFolder.MODEL)
    if not record or not path.is_file():
        return ReportSection("export", "Export", absent="the run exported no model")
    details = _mapping(record.get("details"))
    tolerance = _mapping(details.get("score_tolerance"))
    checks = [
        ("file", f"{RunFolder.MODEL}, {number(_float(details.get('bytes')))} bytes"),
        ("policy", _text(details.get("policy"))),
        ("rows compared with torch", _float(details.get("verified_rows"))),
        ("largest difference", _float(details.get("max_abs_difference"))),
        (
            "tolerance (rtol, atol)",
            f"{_text(tolerance.get('rtol'))}, {_text(tolerance.get('atol'))}"
            if tolerance
            else None,
        ),
        ("rows whose action was compared", _float(details.get("compared_action_rows"))),
        ("rows with tied scores", _float(details.get("tied_rows"))),
    ]
    body = [html_table(("", ""), [(name, value) for name, value in checks if value is not None])]
    inputs, outputs = _model_signature(path)
    body.append(html_heading("Inputs and outputs"))
    body.append(html_table(("", "name", "type", "shape"), [*inputs, *outputs]))
    card = read_model_card(path)
    facts = [
        ("action type", card.action_type),
        ("actions", ", ".join(card.actions) or "-"),
        ("state features", len(card.feature_ids)),
        ("action features", ", ".join(card.action_feature_ids) or "-"),
        ("policy", json.dumps(card.policy) if card.policy else "-"),
        ("run id", card.run_id),
        ("Horizon Engine", card.horizon_version),
    ]
    body.append(html_heading("Model card"))
    body.append(html_table(("", ""), facts))
    return ReportSection("export", "Export", "".join(body))


def _model_signature(path: Path) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def described(kind: str, value: Any) -> tuple[str, ...]:
        tensor = value.type.tensor_type
        shape = [dim.dim_param or str(dim.dim_value) for dim in tensor.shape.dim]
        element = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
        return (kind, value.name, element, f"[{', '.join(shape)}]")

    return (
        [described("input", value) for value in model.graph.input],
        [described("output", value) for value in model.graph.output],
    )


def _estimates(final: Mapping[str, Any], epochs: Sequence[Any]) -> list[tuple[str, str]]:
    """(estimator, metric) pairs that carry an interval, in the order first seen."""
    pairs: list[tuple[str, str]] = []
    sources = [final, *(_mapping(_mapping(entry).get("estimates")) for entry in epochs)]
    for estimates in sources:
        for label, metrics in _mapping(estimates).items():
            for metric, value in _mapping(metrics).items():
                if isinstance(value, Mapping) and (label, metric) not in pairs:
                    pairs.append((label, metric))
    return pairs


def _estimate(entry: Any, label: str, metric: str) -> Mapping[str, Any]:
    return _mapping(_mapping(_mapping(_mapping(entry).get("estimates")).get(label)).get(metric))


def interval_text(value: Mapping[str, Any], key: str, low: str = "", high: str = "") -> str:
    """An estimate's ``key`` with its interval (``key_low``, ``key_high`` unless named), as
    the tables show it: "1.2 [0.9, 1.5]", the value alone where the interval is missing."""
    low, high = low or f"{key}_low", high or f"{key}_high"
    middle, bottom, top = (_float(value.get(name)) for name in (key, low, high))
    if middle is None:
        return "-"
    if bottom is None or top is None:
        return number(middle)
    return f"{number(middle)} [{number(bottom)}, {number(top)}]"


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` where it is a JSON object, else an empty one (a field of the wrong type in a
    file from elsewhere reads as missing)."""
    return value if isinstance(value, Mapping) else {}


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _compact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) > 6:
        return f"[{', '.join(_compact(item) for item in value[:3])}, ... {len(value)} values]"
    if isinstance(value, list):
        return f"[{', '.join(_compact(item) for item in value)}]"
    return str(value)
