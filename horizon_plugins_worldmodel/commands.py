"""``horizon check-mdp pipeline.toml``: is the logged problem an MDP? Checked before training.

Registered through ``horizon_register_commands``. It runs the pipeline's data stages (source,
timeline, normalization) and then the ``analysis`` stage, in the pipeline's output folder, and
prints the report. The data stages are not run again when the folder already holds their
outputs from the same ``[source]``, ``[timeline]`` and ``[normalization]`` settings
(``--rebuild`` runs them anyway). A pipeline without ``[analysis]`` (or without ``[timeline]``
or ``[normalization]``) gets the section with its defaults.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from horizon_engine import Engine, HorizonError, RunFolder, command

DATA_STAGES = ("source", "timeline", "normalization")
"""The stages whose outputs the analysis reads, each configured by the section of its name."""

WORLD_MODEL = "world_model"
"""The analysis whose report this command prints: the world model's MDP check."""

DEFAULT_SECTIONS = {"analysis": f"analysis.kind={WORLD_MODEL}"}
"""What a pipeline without one of these sections is given (as a ``--set`` override); the
engine runs an absent ``[timeline]`` and ``[normalization]`` at their defaults itself."""


@command("check-mdp")
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a key of PIPELINE, e.g. --set analysis.epochs=60.",
)
@click.option(
    "--rebuild",
    is_flag=True,
    help="Run the source, timeline and normalization stages even where output_dir holds them "
    "from the same settings.",
)
def check_mdp_command(pipeline: Path, overrides: tuple[str, ...], rebuild: bool) -> None:
    """Check PIPELINE's logged data with a learned world model: do actions predict
    transitions, do state features predict the next state, do the features the actions move
    predict the reward, and which features explain nothing."""
    output_dir = check_mdp(pipeline, list(overrides), rebuild)
    folder = RunFolder(output_dir).file(RunFolder.ANALYSIS)
    click.echo((folder / "mdp_check.txt").read_text(encoding="utf-8"), nl=False)
    click.echo(
        f"every number: {folder / 'mdp_check.json'}; the chart: {folder / 'feature_importance.png'}"
    )


def check_mdp(pipeline: Path, overrides: list[str], rebuild: bool = False) -> Path:
    """Run the data stages that need running and the analysis; return the output folder."""
    engine = Engine(show_progress=sys.stdout.isatty())
    spec = engine.validate(pipeline, overrides, stages=["source"])
    missing = [DEFAULT_SECTIONS[name] for name in DEFAULT_SECTIONS if name not in spec.sections]
    overrides = [*overrides, *missing]
    spec = engine.validate(pipeline, overrides, stages=[*DATA_STAGES, "analysis"])
    kind = spec.sections["analysis"].component.name
    if kind != WORLD_MODEL:
        raise HorizonError(
            f"{spec.origin}: [analysis] kind = {kind!r}; check-mdp checks the data with "
            f"kind = {WORLD_MODEL!r} and prints its report. Run another analysis with "
            "`horizon run PIPELINE --stages analysis`, or pass --set analysis.kind=world_model"
        )
    output_dir = Path(spec.pipeline.output_dir)
    reusable = not rebuild and _data_stages_done(output_dir, spec.resolved())
    stages = ["analysis"] if reusable else [*DATA_STAGES, "analysis"]
    engine.run(pipeline, overrides, stages)
    return output_dir


def _data_stages_done(output_dir: Path, config: dict[str, Any]) -> bool:
    """Whether ``output_dir``'s manifest records the data stages as finished, current (not
    stale) and configured as ``config`` configures them, with the same seed (which splits
    the episodes)."""
    try:
        manifest = RunFolder(output_dir).manifest()
    except HorizonError:
        return False
    stages = manifest.get("stages", {})
    recorded = manifest.get("config", {})
    same_seed = recorded.get("pipeline", {}).get("seed") == config["pipeline"]["seed"]
    return same_seed and all(
        isinstance(stages.get(name), dict)
        and not stages[name].get("stale")
        and name not in manifest.get("incomplete_stages", {})
        and recorded.get(name) == config.get(name)
        for name in DATA_STAGES
    )
