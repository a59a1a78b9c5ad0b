"""What ``horizon validate`` and a run check before the first stage (``preflight``): each
mistake named with the file and line, before any stage writes an output."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from horizon_engine.cli import main
from horizon_engine.errors import ConfigError
from horizon_engine.pipeline import Engine


def write_pipeline(folder: Path, output_dir: Path, source_path: Path, n_step: int = 1) -> Path:
    path = folder / "pipeline.toml"
    path.write_text(
        f'[pipeline]\noutput_dir = "{output_dir}"\n\n'
        f'[source]\nkind = "jsonl"\npath = "{source_path}"\n\n'
        '[timeline]\nactions = ["0", "1"]\nn_step = 1\n\n'
        "[normalization]\n\n"
        f'[trainer]\nkind = "dqn"\nn_step = {n_step}\n'
    )
    return path


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"mdp_id": "0", "sequence_number": 0, "state_features": {"0": 1.0}, "action": "0", '
        '"reward": 1.0, "action_probability": 0.5}\n'
    )
    return path


def test_an_output_dir_that_is_a_file_is_a_config_error(tmp_path, rows):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    pipeline = write_pipeline(tmp_path, taken, rows)
    expected = f"{pipeline}:2: [pipeline] output_dir = '{taken}' is a file; name a folder"
    result = CliRunner().invoke(main, ["validate", str(pipeline)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {expected}"
    result = CliRunner().invoke(main, ["run", str(pipeline)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    below = write_pipeline(tmp_path, taken / "run", rows)
    with pytest.raises(ConfigError, match=f"is under {taken}, which is a file"):
        Engine(show_progress=False).validate(below)


def test_a_source_path_that_matches_nothing_is_found_before_running(tmp_path, rows):
    missing = tmp_path / "logs" / "*.jsonl"
    pipeline = write_pipeline(tmp_path, tmp_path / "run", missing)
    with pytest.raises(ConfigError) as caught:
        Engine(show_progress=False).validate(pipeline)
    assert str(caught.value) == (
        f"{pipeline}:6: [source] path '{missing}': no file or folder matches"
    )
    with pytest.raises(ConfigError):
        Engine(show_progress=False).run(pipeline)
    assert not (tmp_path / "run").exists()


def test_a_trainer_n_step_the_timeline_does_not_build_is_found_before_running(tmp_path, rows):
    pipeline = write_pipeline(tmp_path, tmp_path / "run", rows, n_step=3)
    with pytest.raises(ConfigError) as caught:
        Engine(show_progress=False).validate(pipeline)
    assert str(caught.value) == (
        f"{pipeline}:16: [trainer] n_step = 3, but [timeline] ({pipeline}:10) builds n_step = 1; "
        "set both to the same value (or leave the trainer's out: it follows the timeline)"
    )


def test_the_n_step_of_a_timeline_on_disk_counts_when_only_training(tmp_path, rows):
    """``--stages train`` without [timeline]: the timeline an earlier run wrote decides."""
    (tmp_path / "run" / "timeline").mkdir(parents=True)
    info = tmp_path / "run" / "timeline" / "timeline.json"
    info.write_text('{"n_step": 1}')
    config = {
        "pipeline": {"output_dir": str(tmp_path / "run")},
        "normalization": {},
        "trainer": {"kind": "dqn", "n_step": 2},
    }
    with pytest.raises(ConfigError, match=f"n_step = 2, but {info} builds n_step = 1"):
        Engine(show_progress=False).run(config, stages=["train"])
