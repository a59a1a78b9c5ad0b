"""A run killed in any stage, then ``--resume``: the uninterrupted run's outputs, byte for byte.

The kill is injected at the worst moment of each stage: its work done and its outputs in
place, but not yet recorded in the manifest (so they count as incomplete). ``--resume`` must
carry over the stages before it, run that stage again (the train stage from its last complete
epoch: here, all of them) and the later ones, and end with every deterministic file
byte-identical to an uninterrupted run's (``conftest.assert_same_result``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from horizon_engine import Stage
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import get_plugin_host

pytestmark = pytest.mark.reliability


class InjectedKill(BaseException):
    """The process dies: a BaseException, which no stage catches."""


def killed_after_its_work(stage: Stage) -> Stage:
    """``stage``, killed once it has written its outputs, before they are recorded."""

    def run(*arguments: Any, **options: Any) -> Any:
        stage.run(*arguments, **options)
        raise InjectedKill

    return dataclasses.replace(stage, run=run)


@pytest.mark.parametrize(
    "killed", ["source", "timeline", "normalization", "train", "evaluation", "export"]
)
def test_a_run_killed_in_any_stage_resumes_to_the_uninterrupted_outputs(
    killed, tmp_path, monkeypatch, resume_config, uninterrupted, same_result
):
    config = resume_config(tmp_path / "run")
    host = get_plugin_host()
    stages = [
        killed_after_its_work(stage) if stage.name == killed else stage for stage in host.stages()
    ]
    with monkeypatch.context() as patch, pytest.raises(InjectedKill):
        patch.setattr(host, "stages", lambda: stages)
        Engine(show_progress=False).run(config)
    before = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert killed in before["incomplete_stages"]

    resumed = Engine(show_progress=False).run(config, resume=True)

    order = ["source", "timeline", "normalization", "train", "evaluation", "export", "report"]
    assert resumed["executed"] == order[order.index(killed) :]
    for name in order[: order.index(killed)]:
        assert resumed["stages"][name]["run_id"] == before["run_id"]
    same_result(uninterrupted("dqn"), tmp_path / "run")
