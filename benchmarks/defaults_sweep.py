"""Which trainer defaults learn offline: a sweep over logged datasets.

    .venv/bin/python benchmarks/defaults_sweep.py --list               # datasets and settings
    .venv/bin/python benchmarks/defaults_sweep.py --datasets cartpole horizon_discrete \\
        --settings defaults previous_defaults --seeds 0 1 2 --jobs 2   # minutes
    .venv/bin/python benchmarks/defaults_sweep.py --pivot --json results.json ...  # README's

Each run goes through the real pipeline (``Engine().run``) as a user who names only what they
know: the source, the action names, the trainer's kind and the setting's options; the
timeline, normalization and export run at their defaults. The exported ``model.onnx`` then
plays the dataset's environment greedily, run by onnxruntime on raw observations, over 50
episodes of seeds 1000-1049. The table gives each dataset x setting's mean return over those
episodes for every seed (``--pivot``: the mean over the seeds and the worst seed's).

The datasets:

- uniformly random play logged by the gym source, once per seed: CartPole-v1 (1,370
  episodes, about 30k transitions), Acrobot-v1 (60 episodes, about 30k), LunarLander-v3 (300
  episodes, about 27k; needs ``pip install "gymnasium[box2d]"``, skipped without it);
- ``cartpole_mediocre``: 200 CartPole episodes logged epsilon-greedily (0.2) around a dqn
  trained for 3 epochs on the seed's random rows (the table shows the logged episodes' mean
  return beside the learned policy's);
- Horizon's own rows (``reference-data/reagent``, or ``$HORIZON_REFERENCE_DATA``): discrete
  and parametric CartPole, and Pendulum for the actor-critic kinds. Those are timeline rows
  already, which hold no n-step windows: there a setting's ``n_step`` is 1;
- ``closed_loop_bandit`` and ``closed_loop_mdp``: ``examples/closed_loop``'s four rounds for
  the seed, the setting's options added to the template's ``[trainer]``; the score is the
  last round's exact true value, and the table lists every round's.

Settings name the options they change from the defaults; ``defaults`` names only the
trainer's kind. One thread per run (``torch.set_num_threads(1)``, as the learning tests);
``--jobs`` runs in parallel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REFERENCE = Path(
    os.environ.get("HORIZON_REFERENCE_DATA")
    or Path(__file__).resolve().parents[2] / "shared" / "reference-data"
)


@dataclass(frozen=True)
class Dataset:
    """Logged rows to learn from and the environment the learned policy is played in."""

    env: str
    actions: list[str] | None
    """Discrete action names; None for Horizon's parametric and continuous rows."""
    episodes: int = 0
    """Random episodes the gym source logs; 0 for a file of Horizon's rows."""
    path: Path | None = None
    eval_episodes: int = 50
    """Greedy episodes played, of seeds 1000, 1001, ..."""
    cut_as_terminal: bool = False
    """A control: log time-limit truncations as ends of the task (no ``truncated`` field), as
    the gym source did before it marked them."""
    kind: str = "dqn"
    """The trainer a setting gets unless it names its own ``kind``."""
    logger_epochs: int = 0
    """Above 0: ``episodes`` are logged epsilon-greedily (``logger_epsilon``) around a dqn
    trained with its defaults for this many epochs on ``logger_rows``' random rows of the same
    seed: a mediocre logger, whose return the table shows beside the learned policy's."""
    logger_epsilon: float = 0.2
    logger_rows: str = "cartpole"
    loop: str | None = None
    """A product of ``examples/closed_loop``: four rounds of its loop (random play, then three
    retrainings on every round's joined decisions), the setting's options added to the
    template's ``[trainer]``; the score is the last round's exact true value."""

    @property
    def timeline_rows(self) -> bool:
        """Horizon's rows went through its Timeline job: no n-step windows can be built."""
        return self.path is not None


DATASETS = {
    "cartpole": Dataset("CartPole-v1", ["0", "1"], episodes=1370),
    "acrobot": Dataset("Acrobot-v1", ["0", "1", "2"], episodes=60),
    "acrobot_cut_as_terminal": Dataset(
        "Acrobot-v1", ["0", "1", "2"], episodes=60, cut_as_terminal=True
    ),
    "cartpole_mediocre": Dataset("CartPole-v1", ["0", "1"], episodes=200, logger_epochs=3),
    "lunarlander": Dataset("LunarLander-v3", ["0", "1", "2", "3"], episodes=300),
    "horizon_discrete": Dataset(
        "CartPole-v1",
        ["0", "1"],
        path=REFERENCE / "reagent" / "discrete_action" / "cartpole_training.json.bz2",
    ),
    "horizon_parametric": Dataset(
        "CartPole-v1",
        None,
        path=REFERENCE / "reagent" / "parametric_action" / "cartpole_training.json.bz2",
        kind="parametric_dqn",
    ),
    "closed_loop_bandit": Dataset("", None, loop="bandit"),
    "closed_loop_mdp": Dataset("", None, loop="mdp"),
    "horizon_pendulum": Dataset(
        "Pendulum-v1",
        None,
        path=REFERENCE / "reagent" / "continuous_action" / "pendulum_training.json.bz2",
        kind="sac",
    ),
}


@dataclass(frozen=True)
class Setting:
    """A candidate: ``[trainer]`` options, and an ``n_step`` for the trainer and the timeline
    alike (1 on timeline rows)."""

    trainer: dict[str, Any] = field(default_factory=dict)
    n_step: int | None = None


SETTINGS = {
    "defaults": Setting(),
    # The defaults before issue 22: CQL 1.0 whatever the logs cover, 20 epochs.
    "previous_defaults": Setting({"cql_alpha": 1.0, "cql_weighting": "constant", "epochs": 20}),
    "no_cql": Setting({"cql_alpha": 0.0}),
    "cql_covered0.15": Setting({"cql_covered": 0.15}),
    "cql_alpha3": Setting({"cql_alpha": 3.0}),
    "e60": Setting({"epochs": 60}),
    "updates5000": Setting({"epochs": "auto", "min_updates": 5000}),
    # Acrobot's recipe: one step (set by n_step on the timeline and trainer), 150 epochs.
    "one_step_e150": Setting({"epochs": 150}, n_step=1),
    **{
        f"{kind}{suffix}": Setting({"kind": kind, **options})
        for kind in ("sac", "td3", "ddpg")
        for suffix, options in (
            ("", {}),
            ("_bc0.2", {"bc_weight": 0.2}),
            ("_e300", {"epochs": 300}),
        )
    },
    **{
        f"{kind}_layers{width}": Setting({"kind": kind, "layers": [width, width]})
        for kind in ("sac", "td3", "ddpg")
        for width in (64, 128)
    },
    "sac_entropy-3": Setting({"kind": "sac", "target_entropy": -3.0}),
    **{
        f"sac_bc{weight}_e300": Setting({"kind": "sac", "bc_weight": weight, "epochs": 300})
        for weight in (0.2, 1.0)
    },
}


def pipeline_config(
    dataset: Dataset, setting: Setting, rows: Path, seed: int, output: Path
) -> dict[str, Any]:
    """The pipeline of one run, as a user would write it in pipeline.toml."""
    timeline: dict[str, Any] = {"eval_fraction": 0.1}
    if dataset.actions is not None:
        timeline["actions"] = dataset.actions
    trainer = {"kind": dataset.kind, **setting.trainer}
    if setting.n_step is not None:
        n_step = 1 if dataset.timeline_rows else setting.n_step
        timeline["n_step"] = trainer["n_step"] = n_step
    return {
        "pipeline": {"output_dir": str(output), "seed": seed},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": timeline,
        "trainer": trainer,
    }


def logged_rows(name: str, dataset: Dataset, seed: int, folder: Path) -> Path:
    """The dataset's rows as a file: Horizon's, or play logged once per seed (random, or
    epsilon-greedy around a partly trained logger)."""
    if dataset.path is not None:
        return dataset.path
    path = folder / f"{name}-seed{seed}.jsonl"
    if path.exists():
        return path
    from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows

    source = GymSourceConfig(env=dataset.env, episodes=dataset.episodes, ds="2019-01-01")
    if dataset.logger_epochs:
        logger = train_logger(dataset, seed, folder)
        source = source.model_copy(
            update={"policy": "epsilon_greedy", "epsilon": dataset.logger_epsilon, "model": logger}
        )
    partial = path.with_suffix(".partial")
    returns: dict[Any, float] = {}
    with partial.open("w", encoding="utf-8") as handle:
        for _, row in collect_rows(source, seed):
            if dataset.cut_as_terminal:
                row.pop("truncated", None)
            returns[row["mdp_id"]] = returns.get(row["mdp_id"], 0.0) + _reward(row)
            handle.write(json.dumps(row) + "\n")
    logger_return(path).write_text(json.dumps(statistics.fmean(returns.values())))
    partial.rename(path)
    return path


def _reward(row: dict[str, Any]) -> float:
    """The environment's reward of a gym source row (its ``reward`` metric)."""
    return float(row["metrics"]["reward"])


def logger_return(rows: Path) -> Path:
    """Where the mean return of the episodes in ``rows`` is kept."""
    return rows.with_suffix(".return.json")


def train_logger(dataset: Dataset, seed: int, folder: Path) -> str:
    """A partly trained dqn's ``model.onnx``: ``logger_epochs`` epochs of the defaults on the
    seed's random rows of ``logger_rows``."""
    import torch

    from horizon_engine.pipeline import Engine

    rows = logged_rows(dataset.logger_rows, DATASETS[dataset.logger_rows], seed, folder)
    output = folder / f"logger-{dataset.logger_rows}-e{dataset.logger_epochs}-seed{seed}"
    shutil.rmtree(output, ignore_errors=True)
    torch.set_num_threads(1)
    config = {
        "pipeline": {"output_dir": str(output), "seed": seed},
        "source": {"kind": "jsonl", "path": str(rows)},
        "timeline": {"actions": dataset.actions},
        "trainer": {"kind": "dqn", "epochs": dataset.logger_epochs},
    }
    Engine(show_progress=False).run(config)
    return str(output / "model.onnx")


def greedy_returns(model: Path, env_id: str, episodes: int) -> list[float]:
    """Returns of the exported model's ``action`` over episodes of seeds 1000, 1001, ...

    A parametric model is offered every action as one-hot candidates, in the order of its
    ``action_feature_ids`` (the gym source's and Horizon's one-hot actions)."""
    import gymnasium
    import onnxruntime

    from horizon_engine import ModelInputs, ModelOutputs, model_card_of_session

    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    candidates: dict[str, np.ndarray] = {}
    card = model_card_of_session(session, str(model))
    if card.parametric:
        offered = np.eye(len(card.action_feature_ids), dtype=np.float32)[None]
        mask = np.ones(offered.shape[:2], dtype=np.float32)
        candidates = dict(zip(ModelInputs.PER_CANDIDATE, (offered, offered, mask), strict=True))
    env = gymnasium.make(env_id)
    returns = []
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=1000 + episode)
            total, done = 0.0, False
            while not done:
                features = np.asarray(observation, dtype=np.float32).reshape(1, -1)
                state = (features, np.ones_like(features))
                inputs = dict(zip(ModelInputs.STATE, state, strict=True)) | candidates
                action = session.run([ModelOutputs.ACTION], inputs)[0][0]
                if action.ndim == 0:  # a discrete action's index
                    action = int(action)
                observation, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns


@dataclass(frozen=True)
class Result:
    dataset: str
    setting: str
    seed: int
    mean_return: float | None
    mean_q: float | None
    error: str | None = None
    logger: float | None = None
    """The mean return of the logged episodes (play logged by a policy, not Horizon's rows)."""
    rounds: list[float] | None = None
    """A closed loop's true value in every round, random play's first."""


def run_one(dataset_name: str, setting_name: str, seed: int, folder: str) -> Result:
    """One pipeline run and the greedy play of its export (in a worker process)."""
    import torch

    from horizon_engine.errors import HorizonError
    from horizon_engine.pipeline import Engine

    torch.set_num_threads(1)
    dataset, setting = DATASETS[dataset_name], SETTINGS[setting_name]
    if dataset.loop is not None:
        return run_loop(dataset_name, setting_name, seed, Path(folder))
    rows = logged_rows(dataset_name, dataset, seed, Path(folder))
    output = Path(folder) / f"{dataset_name}-{setting_name}-seed{seed}"
    shutil.rmtree(output, ignore_errors=True)  # the sweep's own run of an earlier sweep
    config = pipeline_config(dataset, setting, rows, seed, output)
    try:
        manifest = Engine(show_progress=False).run(config)
    except HorizonError as exc:
        return Result(dataset_name, setting_name, seed, None, None, str(exc).splitlines()[0])
    returns = greedy_returns(output / "model.onnx", dataset.env, dataset.eval_episodes)
    logged = logger_return(rows)
    return Result(
        dataset_name,
        setting_name,
        seed,
        float(np.mean(returns)),
        mean_q(manifest),
        logger=json.loads(logged.read_text()) if logged.exists() else None,
    )


def run_loop(dataset_name: str, setting_name: str, seed: int, folder: Path) -> Result:
    """The closed loop's rounds for one seed; ``logger`` is round 0's random play, the score
    the last round's true value, ``rounds`` every trained round's."""
    import contextlib
    import io

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "closed_loop"))
    import run_loop as loop

    trainer = SETTINGS[setting_name].trainer
    template = loop.pipeline_config

    def with_setting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        config = template(*args, **kwargs)
        config["trainer"] |= trainer
        return config

    loop.pipeline_config = with_setting
    out = folder / f"{dataset_name}-{setting_name}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    with contextlib.redirect_stdout(io.StringIO()):
        rounds = loop.run_loop(DATASETS[dataset_name].loop, 4, out, seed)
    values = [result.true_value for result in rounds]
    return Result(
        dataset_name, setting_name, seed, values[-1], None, logger=values[0], rounds=values
    )


def mean_q(manifest: dict[str, Any]) -> float | None:
    """The eval split's mean Q over actions after the last epoch, where the trainer reports it."""
    last = manifest["stages"]["train"]["details"]["last_epoch"]
    values = [value for name, value in last.items() if name.startswith("Evaluation/mean_q")]
    return float(np.mean(values)) if values else None


def table(results: Iterable[Result], datasets: list[str], settings: list[str]) -> str:
    """Markdown: dataset x setting, mean return over seeds and each seed's."""
    by_key: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        by_key.setdefault((result.dataset, result.setting), []).append(result)
    lines = [
        "| dataset | setting | mean return | per seed | mean Q |",
        "|---|---|---:|---|---:|",
    ]
    for dataset in datasets:
        for setting in settings:
            runs = sorted(by_key.get((dataset, setting), []), key=lambda r: r.seed)
            if not runs:
                continue
            scores = [r.mean_return for r in runs if r.mean_return is not None]
            errors = [r.error for r in runs if r.error]
            qs = [r.mean_q for r in runs if r.mean_q is not None]
            mean = score_text(statistics.fmean(scores), 1) if scores else "failed"
            per_seed = ", ".join(
                score_text(r.mean_return, 1) if r.mean_return is not None else "error" for r in runs
            )
            q = f"{statistics.fmean(qs):.1f}" if qs else ""
            note = f" ({errors[0]})" if errors else ""
            loops = [r.rounds for r in runs if r.rounds]
            if loops:
                note += (
                    " (rounds: "
                    + "; ".join(", ".join(f"{value:.3f}" for value in rounds) for rounds in loops)
                    + ")"
                )
            loggers = [r.logger for r in runs if r.logger is not None and not r.rounds]
            if loggers:
                note += f" (logged: {', '.join(f'{value:.1f}' for value in loggers)})"
            lines.append(f"| {dataset} | {setting} | {mean} | {per_seed}{note} | {q} |")
    return "\n".join(lines)


def score_text(score: float, decimals: int) -> str:
    """A return with ``decimals`` decimals, a closed loop's true value (below 2) with 3."""
    return f"{score:.3f}" if abs(score) < 2 else f"{score:.{decimals}f}"


def pivot(results: Iterable[Result], datasets: list[str], settings: list[str]) -> str:
    """Markdown for the README: setting x dataset, each cell the mean return over the seeds
    and the worst seed's in brackets."""
    by_key: dict[tuple[str, str], list[float]] = {}
    for result in results:
        if result.mean_return is not None:
            by_key.setdefault((result.dataset, result.setting), []).append(result.mean_return)
    lines = [
        f"| setting | {' | '.join(datasets)} |",
        f"|---|{'---|' * len(datasets)}",
    ]
    for setting in settings:
        cells = [
            f"{score_text(statistics.fmean(scores), 0)} ({score_text(min(scores), 0)})"
            if (scores := by_key.get((dataset, setting)))
            else ""
            for dataset in datasets
        ]
        lines.append(f"| {setting} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel, one thread each")
    parser.add_argument("--workdir", type=Path, help="keep rows and runs here (default: temp)")
    parser.add_argument("--json", type=Path, help="also write every run's result here")
    parser.add_argument("--list", action="store_true", help="list datasets and settings")
    parser.add_argument(
        "--pivot", action="store_true", help="one row per setting: mean (worst seed) per dataset"
    )
    parser.add_argument("--from-json", type=Path, help="tabulate an earlier --json's results")
    args = parser.parse_args(argv)
    if args.list:
        for name, dataset in DATASETS.items():
            print(f"dataset {name}: {dataset}")
        for name, setting in SETTINGS.items():
            print(f"setting {name}: {setting}")
        return 0
    render = pivot if args.pivot else table
    if args.from_json:
        results = [Result(**entry) for entry in json.loads(args.from_json.read_text())]
        print(render(results, args.datasets, args.settings))
        return 0
    datasets = [name for name in args.datasets if _available(name)]
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.workdir or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        # Rows first, once per dataset and seed, so parallel runs never log the same rows twice.
        for name in datasets:
            for seed in args.seeds:
                if DATASETS[name].loop is None:
                    logged_rows(name, DATASETS[name], seed, folder)
        jobs = [
            (dataset, setting, seed, str(folder))
            for dataset in datasets
            for setting in args.settings
            for seed in args.seeds
        ]
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = []
            for result in pool.map(run_one, *zip(*jobs, strict=True)):
                print(result, file=sys.stderr, flush=True)
                results.append(result)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1) + "\n")
    print(render(results, datasets, args.settings))
    return 0


def _available(name: str) -> bool:
    """Whether a dataset can run here: its file exists, its environment can be made."""
    dataset = DATASETS[name]
    if dataset.path is not None and not dataset.path.is_file():
        print(f"skipping {name}: no {dataset.path}", file=sys.stderr)
        return False
    if dataset.loop is not None:
        return True
    import gymnasium

    try:
        gymnasium.make(dataset.env).close()
    except (gymnasium.error.Error, ImportError) as exc:
        print(f"skipping {name}: {exc}", file=sys.stderr)
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
