"""The core's training driver, driving a tiny third-party trainer: epochs, checkpoints, warm
start, batch callbacks, the run folder's description of the problem, the split prepared once
(the preprocessor's output) and gathered as read, ``[trainer] threads``,
``horizon_on_epoch_end`` and the TensorBoard reporter's event files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from horizon_engine.batch_schema import check_batch
from horizon_engine.config import build_spec
from horizon_engine.dataset import Minibatch
from horizon_engine.driver import ProblemDescription, TrainingDriver, load_split, timeline_problem
from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.run_context import StageRun
from horizon_engine.schema import ActionType
from horizon_engine.training import (
    PARALLEL_UPDATE_WORK,
    TrainerConfig,
    load_checkpoint,
    resolve_threads,
)


def pipeline(output: Path, **trainer: object) -> dict:
    return {
        "pipeline": {"output_dir": str(output), "seed": 1},
        "source": {"kind": "gym", "episodes": 10, "ds": "2019-01-01"},
        # With seed 1, eval_fraction 0.5 puts episodes 3 and 8 of the ten in the eval split.
        "timeline": {"actions": ["0", "1"], "reward": {"reward": 2.0}, "eval_fraction": 0.5},
        "normalization": {},
        "trainer": {"kind": "mean_reward", "epochs": 3, "minibatch_size": 64, **trainer},
    }


@pytest.mark.parametrize(
    ("bounds", "epochs", "why"),
    [
        ({"min_updates": 10}, 20, "the trainer's 20"),
        ({"min_updates": 30}, 30, "min_updates = 30"),
        ({"min_updates": 1, "max_updates": 7}, 7, "max_updates = 7"),
    ],
)
def test_unset_epochs_train_the_default_passes_within_the_update_bounds(
    trainer_host, tmp_path, bounds, epochs, why
):
    """The train split's rows fit one minibatch of 256: one update a pass. 20 passes unless
    that is below ``min_updates`` or above ``max_updates``; the manifest and ``horizon run``
    say how many and why."""
    config = pipeline(tmp_path, minibatch_size=256, **bounds)
    del config["trainer"]["epochs"]
    manifest = Engine(plugins=trainer_host, show_progress=False).run(config)
    details = manifest["stages"]["train"]["details"]
    assert details["epochs"] == epochs and details["updates"] == epochs
    assert (
        details["length"]
        == f"{epochs} epochs of 1 minibatch, {epochs} updates (epochs auto: {why})"
    )
    assert details["applied"] == {"threads": 1, "device": "cpu", "epochs": epochs}


def test_update_bounds_out_of_order_are_refused():
    with pytest.raises(ValidationError, match="min_updates = 10 is above max_updates = 5"):
        TrainerConfig(min_updates=10, max_updates=5)


def test_epochs_checkpoints_and_epoch_hook(trainer_host, tmp_path):
    host = trainer_host
    manifest = Engine(plugins=host, show_progress=False).run(pipeline(tmp_path))
    stage = manifest["stages"]["train"]
    assert stage["details"]["epochs"] == 3
    assert stage["details"]["device"] == "cpu"
    first, last = stage["details"]["first_epoch"], stage["details"]["last_epoch"]
    # Every reward is 2 (weight 2.0 on CartPole's reward of 1): the loss falls towards 0.
    assert last["Training/loss"] < first["Training/loss"]
    assert last["Evaluation/mc_loss"] < first["Evaluation/mc_loss"]
    names = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch-0001.pt", "epoch-0002.pt", "epoch-0003.pt", "latest.pt"]
    latest = torch.load(tmp_path / "checkpoints" / "latest.pt", weights_only=False)
    assert latest["epoch"] == 3
    epochs = host.pm.get_plugin("mean_reward").EPOCHS
    assert [epoch for epoch, _ in epochs] == [1, 2, 3]
    assert epochs[-1][1] == last
    assert stage["outputs"][:6] == [  # then the TensorBoard reporter's event file
        "problem.json",
        "check_rows.pt",
        "checkpoints/latest.pt",
        "checkpoints/epoch-0001.pt",
        "checkpoints/epoch-0002.pt",
        "checkpoints/epoch-0003.pt",
    ]


def test_the_run_folder_describes_the_problem_and_keeps_eval_rows_to_check_on(
    trainer_host, tmp_path
):
    """What export needs and nothing more: the problem the trainer was set up for, and the
    first eval rows' policy inputs (the timeline's n-step window is the data's, 3 by default)."""
    Engine(plugins=trainer_host, show_progress=False).run(pipeline(tmp_path))
    assert json.loads((tmp_path / "problem.json").read_text()) == {
        "action_type": "discrete",
        "actions": ["0", "1"],
        "feature_ids": ["0", "1", "2", "3"],
        "action_feature_ids": [],
        "n_step": 3,
        "seed": 1,
        "max_feature_value": 6.0,
        "online": False,
    }
    description = ProblemDescription.read(tmp_path)
    assert description.action_type is ActionType.DISCRETE
    rows = torch.load(tmp_path / "check_rows.pt", weights_only=True)
    run = StageRun.start(build_spec(pipeline(tmp_path), trainer_host), trainer_host, "x")
    evaluation = load_split(run, description, "eval", torch.device("cpu"))
    assert sorted(rows) == ["state", "state_presence"]
    assert torch.equal(rows["state"], evaluation.state[:1024])
    assert torch.equal(rows["state_presence"], evaluation.state_presence[:1024])


def test_batch_callbacks_see_every_batch_and_their_metrics_join_the_epochs(trainer_host, tmp_path):
    """A model trained beside the policy (here: a count of rows) gets each batch after the
    trainer's update, and what it returns is averaged into the epoch's metrics."""
    engine = Engine(plugins=trainer_host, show_progress=False)
    config = pipeline(tmp_path, epochs=2)
    engine.run(config, stages=["source", "timeline", "normalization"])
    run = StageRun.start(build_spec(config, trainer_host), trainer_host, "callbacks")
    seen = []

    def rows(batch):
        seen.append(len(batch["reward"]))
        return {"rows": float(len(batch["reward"]))}

    description, normalization = timeline_problem(run)
    choice = run.spec.sections["trainer"]
    driver = TrainingDriver(
        run, choice, description, normalization, callbacks=[rows], plugins=trainer_host
    )
    train = load_split(run, description, "train", driver.device)
    history = driver.train_epochs(train)
    assert sum(seen) == 2 * len(train) and driver.updates == len(seen)
    per_epoch = len(seen) // 2
    assert history[0]["Training/rows"] == pytest.approx(sum(seen[:per_epoch]) / per_epoch)
    assert set(history[0]) == {"Training/loss", "Training/rows"}  # no eval data given
    assert driver.checkpoints == ["checkpoints/epoch-0001.pt", "checkpoints/epoch-0002.pt"]


def driven(host, folder: Path, callbacks=(), **trainer: object) -> tuple[TrainingDriver, Any]:
    """A driver for a pipeline's run folder (timeline and normalization built), and its run."""
    config = pipeline(folder, **trainer)
    Engine(plugins=host, show_progress=False).run(
        config, stages=["source", "timeline", "normalization"]
    )
    run = StageRun.start(build_spec(config, host), host, "driven")
    description, normalization = timeline_problem(run)
    choice = run.spec.sections["trainer"]
    driver = TrainingDriver(run, choice, description, normalization, callbacks, plugins=host)
    return driver, description


def test_epochs_train_on_the_preprocessors_output_computed_once_beside_the_raw_features(
    trainer_host, tmp_path
):
    """Normalization does not change while training: ``prepare`` runs the state preprocessor
    over the split once, and every batch carries its output (as the batch schema declares)
    beside the raw features, the rows of one permutation."""
    seen = []
    driver, description = driven(trainer_host, tmp_path, callbacks=[seen.append], epochs=1)
    train = load_split(driver.run, description, "train", driver.device)
    prepared = driver.prepare(train)
    preprocessor = driver.problem.state_preprocessor
    for name in ("state", "next_state", "next_n_state"):
        expected = preprocessor(getattr(train, name), getattr(train, f"{name}_presence"))
        assert torch.equal(getattr(prepared, f"{name}_preprocessed"), expected)
        assert getattr(train, f"{name}_preprocessed") is None  # the split itself is unchanged
    driver.train_epochs(train)
    assert sum(len(batch["reward"]) for batch in seen) == len(train)
    rows = torch.cat([batch["step"] * 100_000 + batch["episode_id"] for batch in seen])
    assert sorted(rows.tolist()) == sorted((train.step * 100_000 + train.episode_id).tolist())
    for batch in seen:
        check_batch(batch, ActionType.DISCRETE)
        expected = preprocessor(batch["next_n_state"], batch["next_n_state_presence"])
        assert torch.equal(batch["next_n_state_preprocessed"], expected)


def test_a_minibatch_is_a_read_only_mapping_of_the_chosen_rows(trainer_host, tmp_path):
    """A ``Minibatch`` gathers a tensor's rows when it is read; to a trainer it is a mapping
    like a dict of the gathered tensors."""
    driver, description = driven(trainer_host, tmp_path)
    train = load_split(driver.run, description, "train", driver.device)
    index = torch.tensor([5, 0, 3])
    batch = Minibatch(train.tensors(), index)
    eager = {name: tensor[index] for name, tensor in train.tensors().items()}
    assert len(batch) == len(eager) and list(batch) == list(eager)
    assert "next_n_rewards" in batch and "state_preprocessed" not in batch
    assert torch.equal(batch["reward"], train.reward[index])
    assert batch["reward"] is batch["reward"]  # gathered once
    assert batch.get("state_preprocessed") is None
    gathered = dict(batch)
    assert all(torch.equal(gathered[name], eager[name]) for name in eager)
    with pytest.raises(TypeError):
        batch["reward"] = train.reward[:3]  # type: ignore[index]


def test_trainer_threads_hold_while_epochs_train_and_are_restored_after(trainer_host, tmp_path):
    """``[trainer] threads`` is torch's thread count from the first batch to the last epoch's
    end; the count from before comes back after (here 3, whatever the machine's cores)."""
    threads = []
    driver, description = driven(
        trainer_host,
        tmp_path,
        callbacks=[lambda batch: threads.append(torch.get_num_threads())],
        threads=2,
        epochs=1,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        driver.train_epochs(load_split(driver.run, description, "train", driver.device))
        assert set(threads) == {2}
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_numpy_blas_threads_follow_the_trainers_while_epochs_train(trainer_host, tmp_path):
    """numpy's BLAS computes on ``[trainer] threads`` threads while training (an OpenBLAS
    thread of its own took the training thread's core from the estimators' numpy beside it),
    and on as many as before after."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> set[int]:
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    seen: list[set[int]] = []
    driver, description = driven(
        trainer_host, tmp_path, callbacks=[lambda batch: seen.append(blas_threads())], threads=1
    )
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        driver.train_epochs(load_split(driver.run, description, "train", driver.device))
        assert blas_threads() == before
    assert seen
    assert all(threads == {1} for threads in seen)


def test_automatic_threads_are_one_for_small_updates_and_on_a_gpu(trainer_host, tmp_path):
    """``threads = "auto"``: one thread unless an update's rows times parameters reach
    ``PARALLEL_UPDATE_WORK`` on the CPU; a number is taken as it is."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_threads("auto", cpu, PARALLEL_UPDATE_WORK - 1) == 1
    assert resolve_threads("auto", cpu, PARALLEL_UPDATE_WORK) == torch.get_num_threads()
    assert resolve_threads("auto", cuda, PARALLEL_UPDATE_WORK) == 1
    assert resolve_threads(4, cpu, 0) == 4
    for wrong in (0, "many"):
        with pytest.raises(ValidationError, match="give a number of threads"):
            TrainerConfig(threads=wrong)
    driver, _ = driven(trainer_host, tmp_path)  # the mean_reward policy: one weight
    assert driver.config.threads == "auto" and driver.threads == 1


def test_warm_start_continues_from_the_earlier_runs_weights(trainer_host, tmp_path):
    host = trainer_host
    engine = Engine(plugins=host, show_progress=False)
    first = engine.run(pipeline(tmp_path / "yesterday", learning_rate=0.01))
    second = engine.run(
        pipeline(
            tmp_path / "today", learning_rate=0.01, warm_start_from=str(tmp_path / "yesterday")
        )
    )
    scratch = engine.run(pipeline(tmp_path / "scratch", learning_rate=0.01))
    yesterday_end = first["stages"]["train"]["details"]["last_epoch"]["Training/loss"]
    today_start = second["stages"]["train"]["details"]["first_epoch"]["Training/loss"]
    scratch_start = scratch["stages"]["train"]["details"]["first_epoch"]["Training/loss"]
    # An epoch's loss is the mean over its minibatches while the weight improves, so a run that
    # goes on from yesterday's final weight starts below yesterday's last epoch mean, and far
    # below a run from scratch (which starts at the same loss yesterday's run started at).
    assert today_start < yesterday_end < scratch_start
    assert scratch_start == first["stages"]["train"]["details"]["first_epoch"]["Training/loss"]
    latest = torch.load(tmp_path / "today" / "checkpoints" / "latest.pt", weights_only=False)
    # Three epochs of ~9 minibatches on top of yesterday's: the step count carried over.
    assert (
        latest["trainer"]["steps"]
        == 2
        * torch.load(tmp_path / "yesterday" / "checkpoints" / "latest.pt", weights_only=False)[
            "trainer"
        ]["steps"]
    )


def test_warm_start_without_a_checkpoint_names_the_path(trainer_host, tmp_path):
    """Found before the first stage runs, so no earlier stage's output is written for nothing;
    ``horizon validate`` finds it too."""
    engine = Engine(plugins=trainer_host, show_progress=False)
    config = pipeline(tmp_path / "run", warm_start_from=str(tmp_path / "nothing"))
    expected = r"\[trainer\] warm_start_from = '.*nothing' does not exist"
    with pytest.raises(HorizonError, match=expected):
        engine.validate(config)
    with pytest.raises(HorizonError, match=expected):
        engine.run(config)
    assert not (tmp_path / "run").exists()
    (tmp_path / "nothing").mkdir()
    with pytest.raises(HorizonError, match=r"nothing' has no checkpoints/latest\.pt"):
        engine.run(config)


def test_cuda_without_a_gpu_is_a_clear_error(trainer_host, tmp_path):
    host = trainer_host
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    engine = Engine(plugins=host, show_progress=False)
    config = pipeline(tmp_path / "run", device="cuda")
    with pytest.raises(HorizonError, match='device = "cuda", but torch finds no CUDA device'):
        engine.validate(config)
    with pytest.raises(HorizonError, match='device = "cuda", but torch finds no CUDA device'):
        engine.run(config)
    assert not (tmp_path / "run").exists()


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Read TensorBoard event files: TFRecord framing around Event protos."""
    from tensorboardX.proto.event_pb2 import Event

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        position = 0
        while position < len(data):
            (length,) = struct.unpack("<Q", data[position : position + 8])
            record = data[position + 12 : position + 12 + length]
            position += 12 + length + 4
            event = Event.FromString(record)
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_tensorboard_event_files_hold_every_epochs_metrics(trainer_host, tmp_path):
    host = trainer_host
    manifest = Engine(plugins=host, show_progress=False).run(pipeline(tmp_path))
    written = scalars(tmp_path / "tensorboard")
    assert sorted(written) == ["Evaluation/mc_loss", "Training/loss"]
    assert [step for step, _ in written["Training/loss"]] == [1, 2, 3]
    last = manifest["stages"]["train"]["details"]["last_epoch"]
    assert written["Evaluation/mc_loss"][-1][1] == pytest.approx(last["Evaluation/mc_loss"])


class _RunsCodeWhenLoaded:
    """Unpickling this calls ``print``: a checkpoint holding it would run code when loaded."""

    def __reduce__(self):
        return (print, ("a checkpoint ran code",))


def test_a_checkpoint_holding_code_is_refused_not_run(tmp_path, capsys):
    folder = tmp_path / "elsewhere" / "checkpoints"
    folder.mkdir(parents=True)
    torch.save({"epoch": 1, "trainer": _RunsCodeWhenLoaded()}, folder / "latest.pt")
    with pytest.raises(HorizonError, match="holds more than tensors and plain data"):
        load_checkpoint(tmp_path / "elsewhere")
    assert "a checkpoint ran code" not in capsys.readouterr().out
