"""``RunContext`` hands a component what it uses of the run (folder, seed, id, progress, a
metrics emitter), never the pipeline's whole config or the plugin host."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from horizon_engine import RunContext


class RecordingHost:
    """The one hook caller a context uses: ``on_epoch_end``."""

    def __init__(self) -> None:
        self.epochs: list[tuple[RunContext, int, dict[str, float]]] = []

    def on_epoch_end(self, run: RunContext, epoch: int, metrics: dict[str, float]) -> None:
        self.epochs.append((run, epoch, metrics))


def test_a_components_context_holds_no_config_and_no_plugins(tmp_path):
    fields = {field.name for field in dataclasses.fields(RunContext)}

    assert fields == {"output_dir", "seed", "run_id", "show_progress"}
    run = RunContext(tmp_path, seed=3, run_id="r")
    run.emit_epoch_metrics(1, {"Training/loss": 0.5})  # made by hand: nowhere to send them
    assert not hasattr(run, "spec") and not hasattr(run, "plugins")


def test_a_commands_context_sends_epoch_metrics_to_the_processs_plugins(tmp_path, monkeypatch):
    from horizon_engine import plugins

    host = RecordingHost()
    monkeypatch.setattr(plugins, "get_plugin_host", lambda: host)

    run = RunContext.for_command(tmp_path, seed=3, run_id="r")
    run.emit_epoch_metrics(2, {"Training/loss": 0.25})

    assert host.epochs == [(run, 2, {"Training/loss": 0.25})]
    assert isinstance(run, RunContext) and run.output_dir == Path(tmp_path) and run.seed == 3
