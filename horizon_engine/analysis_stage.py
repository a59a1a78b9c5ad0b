"""The work of a stage that analyses the timeline's data with a trainer (``AnalyzesData``).

A plugin whose trainer can analyse data registers the stage itself, naming this function as
its run (the world model's ``analysis`` stage): the core sets the chosen trainer up for the
timeline's problem as the train stage does, and hands it both splits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from horizon_engine.capabilities import AnalyzesData
from horizon_engine.errors import HorizonError

if TYPE_CHECKING:
    from horizon_engine.config import Choice, PipelineSpec
    from horizon_engine.run_context import StageReport, StageRun


def analyze_timeline(run: StageRun, choice: Choice) -> StageReport:
    """Analyse the timeline's data with the section's trainer's ``analyze``, before or without
    training: the trainer is set up for the timeline's problem and handed the train and eval
    splits with the state preprocessor's output; it writes its files and returns the report."""
    from horizon_engine.driver import load_split, set_up_trainer, timeline_problem
    from horizon_engine.training import resolve_device

    description, normalization = timeline_problem(run)
    device = resolve_device(choice.config.device)
    trainer, problem = set_up_trainer(choice, description, normalization, run.plugins, device)
    if not isinstance(trainer, AnalyzesData):
        section = choice.section
        raise HorizonError(f"[{section}] kind = {trainer.name!r} does not analyse data")
    splits = [
        load_split(run, description, split, device).with_preprocessed(problem.state_preprocessor)
        for split in ("train", "eval")
    ]
    return trainer.analyze(run, problem, splits)


def analysis_problems(spec: PipelineSpec, section: str) -> list[str]:
    """The ``check`` of a stage run by ``analyze_timeline``: ``[section]`` chooses a trainer
    that analyses data, or the run would stop at the stage."""
    choice = spec.sections.get(section)
    if choice is None or issubclass(choice.component.cls, AnalyzesData):
        return []
    return [
        f"{spec.where(section, 'kind')}: [{section}] kind = {choice.component.name!r} is a "
        "trainer that does not analyse data (it does not implement analyze)"
    ]
