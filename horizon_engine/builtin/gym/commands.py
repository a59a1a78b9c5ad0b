"""``horizon gym``: ``collect`` logs a policy's decisions in an environment as pre-timeline rows,
``train`` trains a policy online (``train_gym``). The gym plugin adds the group to the command
line through ``horizon_register_commands``; ``train`` carries the ``[gym]`` section it reads
(``config_sections``), which ``horizon plugins`` lists beside the core's own.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from horizon_engine import (
    INTERRUPTED_EXIT_STATUS,
    NothingToResume,
    command,
    sigterm_as_interrupt,
)
from horizon_engine.builtin.gym.config import GymSection, load_gym_spec


@click.group()
def gym() -> None:
    """Work with Gymnasium environments."""


@command(group=gym)
@click.option("--env", "env_id", default="CartPole-v1", show_default=True, help="Environment id.")
@click.option("--episodes", default=200, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--epsilon",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Chance of a uniform random action; 1.0 is a random policy.",
)
@click.option(
    "--model",
    type=click.Path(exists=True, dir_okay=False),
    help="ONNX model to be greedy about.",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--ds", help="The ds date written into every row (default: today).")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file to write the pre-timeline rows to.",
)
def collect(
    env_id: str,
    episodes: int,
    epsilon: float,
    model: str | None,
    seed: int,
    ds: str | None,
    output: Path,
) -> None:
    """Log a random or epsilon-greedy policy's decisions as pre-timeline JSON rows."""
    from horizon_engine import atomic_output, progress_bar, refuse_output_over_inputs
    from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows

    if model is not None:
        refuse_output_over_inputs(f"-o {output}", output, {"model": Path(model)}, "collect", "rows")
    _check_env_option(env_id)
    if epsilon < 1.0 and model is None:
        raise click.UsageError(
            f"--epsilon {epsilon:g} is epsilon-greedy, which needs --model PATH.onnx to be "
            "greedy about (--epsilon 1.0 is the uniform random policy)"
        )
    config = GymSourceConfig(
        env=env_id,
        episodes=episodes,
        policy="random" if epsilon == 1.0 and model is None else "epsilon_greedy",
        epsilon=epsilon,
        model=model,
        ds=ds,
    )
    count = 0
    with (
        atomic_output(output) as temporary,
        temporary.open("w", encoding="utf-8") as handle,
        progress_bar(f"{env_id} episodes", episodes, sys.stdout.isatty()) as advance,
    ):
        for _, row in collect_rows(config, seed):
            handle.write(json.dumps(row) + "\n")
            count += 1
            advance(int(row["sequence_number"] == 0))
    click.echo(f"wrote {count} rows from {episodes} episodes of {env_id} to {output}")


def _check_outputs(
    gym_toml: Path, output_dir: Path, reward_history: Path | None, rows: Path | None
) -> None:
    """Refuse, before anything runs, a ``-r`` or ``-f`` file that is the gym file, the other
    one, or lies in the run's folder (whose files are the run's own)."""
    from horizon_engine import refuse_output_over_inputs

    outputs = {"-r": reward_history, "-f": rows}
    for option, path in outputs.items():
        if path is None:
            continue
        others = {"gym file": gym_toml, "run folder": output_dir}
        others |= {
            f"{other} file": given
            for other, given in outputs.items()
            if other != option and given is not None
        }
        refuse_output_over_inputs(f"{option} {path}", path, others, "training", "file")


def _check_env_option(env_id: str) -> None:
    """Make the ``--env`` environment once before collecting, so that an unknown or
    uninstallable environment is blamed on the option the user typed; the gym source it is
    collected with would blame a ``[source]`` section the user never wrote."""
    import gymnasium

    try:
        environment = gymnasium.make(env_id)
    except gymnasium.error.Error as exc:
        raise click.BadParameter(str(exc), param_hint="'--env'") from None
    environment.close()


@command("train", group=gym)
@click.argument("gym_toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a key of the gym file, e.g. --set gym.seed=3.",
)
@click.option(
    "-s", "--score-bar", type=float, help="Stop once an evaluation's mean return reaches it."
)
@click.option(
    "-r",
    "--reward-history",
    type=click.Path(dir_okay=False, path_type=Path),
    help="CSV file for the evaluations: timestep, episode, mean_return.",
)
@click.option(
    "-f",
    "--rows",
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file for every training transition, as pre-timeline rows.",
)
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The run's folder (default: [gym] output_dir).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Finish the folder's killed, interrupted or failed run from its last complete "
    "evaluation, to the uninterrupted run's result (the same config and -f file).",
)
def gym_train(
    gym_toml: Path,
    overrides: tuple[str, ...],
    score_bar: float | None,
    reward_history: Path | None,
    rows: Path | None,
    output_dir: Path | None,
    resume: bool,
) -> None:
    """Train a policy online in a Gymnasium environment, as GYM_TOML (a gym.toml) says."""
    from horizon_engine.builtin.gym.runner import train_gym

    settings = list(overrides)
    if score_bar is not None:
        settings.append(f"gym.score_bar={score_bar!r}")
    if output_dir is not None:
        settings.append(f"gym.output_dir={json.dumps(str(output_dir))}")
    spec = load_gym_spec(gym_toml, None, settings)
    _check_outputs(gym_toml, Path(spec.gym.output_dir), reward_history, rows)
    try:
        with sigterm_as_interrupt():
            result = train_gym(spec, None, rows, reward_history, sys.stdout.isatty(), resume)
    except NothingToResume as exc:
        click.echo(str(exc))
        return
    except KeyboardInterrupt:
        command = ["horizon", "gym", "train", str(gym_toml)]
        command += [f"--set={value}" for value in overrides]
        if score_bar is not None:
            command += ["--score-bar", repr(score_bar)]
        for option, path in (("-r", reward_history), ("-f", rows), ("-o", output_dir)):
            if path is not None:
                command += [option, str(path)]
        click.echo(f"interrupted; continue this run with: {shlex.join(command)} --resume", err=True)
        sys.exit(INTERRUPTED_EXIT_STATUS)
    for line in result.report(spec.gym.avg_over_num_episodes, (rows, reward_history)):
        click.echo(line)


# What `horizon plugins` lists of this command: the sections of gym.toml it alone reads.
gym_train.config_sections = {"gym": GymSection}
