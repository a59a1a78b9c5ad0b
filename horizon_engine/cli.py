"""The ``horizon`` command line.

Only click and the core's light modules are imported at start-up; each command imports what
it needs, so ``horizon --help`` and ``horizon plugins`` stay fast. A ``HorizonError`` (a user's
mistake) is printed as a message without a traceback and exits with status 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from horizon_engine import __version__
from horizon_engine.errors import HorizonError

if TYPE_CHECKING:
    from horizon_engine.plugins import PluginHost


def _user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HorizonError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)

    return wrapper


def _plugin_host() -> PluginHost:
    """The plugin host, after a warning on stderr for each plugin that failed to load: a run
    without a plugin the user installed must not pass for a run with it."""
    from horizon_engine.plugins import get_plugin_host

    host = get_plugin_host()
    for failure in host.failures:
        click.echo(f"warning: {failure} (see `horizon plugins`)", err=True)
    return host


_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a key of the pipeline file, e.g. --set trainer.learning_rate=0.01.",
)


class HorizonCli(click.Group):
    """The ``horizon`` group: the core's commands, and those plugins add through
    ``horizon_register_commands``, loaded the first time a command is not a core one (or the
    commands are listed), so that ``horizon run`` never waits for another plugin's command."""

    plugin_commands_loaded = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            self._load_plugin_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_plugin_commands()
        return super().list_commands(ctx)

    def _load_plugin_commands(self) -> None:
        if not self.plugin_commands_loaded:
            self.plugin_commands_loaded = True
            from horizon_engine.plugins import get_plugin_host

            get_plugin_host().register_commands(self)


@click.group(cls=HorizonCli)
@click.version_option(__version__, prog_name="horizon")
def main() -> None:
    """Horizon Engine: from logged decisions to a trained, evaluated, exported policy."""


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@_set_option
@click.option(
    "--stages",
    metavar="A,B",
    help="Run only these stages (comma-separated), continuing the output folder's run: they "
    "replace their own earlier outputs and read the other stages' files.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an earlier run's outputs in output_dir (files Horizon did not write are kept).",
)
@_user_errors
def run(pipeline: Path, overrides: tuple[str, ...], stages: str | None, overwrite: bool) -> None:
    """Run the stages configured in PIPELINE (a pipeline.toml)."""
    from horizon_engine.pipeline import Engine

    selected = [name.strip() for name in stages.split(",") if name.strip()] if stages else None
    manifest = Engine(_plugin_host()).run(pipeline, overrides, selected, overwrite)
    output_dir = manifest["config"]["pipeline"]["output_dir"]
    for warning in manifest["warnings"]:
        click.echo(f"warning: {warning}")
    for name, report in manifest["stages"].items():
        if name not in manifest["executed"]:
            stale = f", stale: {report['stale']}" if report.get("stale") else ""
            click.echo(f"{name}: not run, outputs of run {report['run_id']}{stale}")
            continue
        dropped = sum(report["dropped"].values())
        click.echo(
            f"{name}: {report['rows_in']} rows in, {report['rows_out']} out, "
            f"{dropped} dropped, {report['seconds']:.2f} s"
        )
        for warning in report["warnings"]:
            click.echo(f"  warning: {warning}")
    click.echo(f"run {manifest['run_id']} {manifest['status']}: {output_dir}/manifest.json")


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@_set_option
@_user_errors
def validate(pipeline: Path, overrides: tuple[str, ...]) -> None:
    """Check PIPELINE without running it."""
    from horizon_engine.pipeline import Engine

    spec = Engine(_plugin_host()).validate(pipeline, overrides)
    chosen = ", ".join(
        f"[{name}] {choice.component.label}"
        for name, choice in [*spec.sections.items(), *((c.section, c) for c in spec.evaluation)]
    )
    click.echo(f"{pipeline}: valid ({chosen})")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
@_user_errors
def plugins(as_json: bool) -> None:
    """List plugins, their versions, hooks and components with their options."""
    from horizon_engine.plugins import get_plugin_host

    root = click.get_current_context().find_root()
    root.command.list_commands(root)
    host = get_plugin_host()
    listing = host.describe()
    failures = host.load_failures()
    sections = _core_sections()
    if as_json:
        found = {"sections": sections, "plugins": listing, "failures": failures}
        click.echo(json.dumps(found, indent=2, default=str))
        return
    for section in sections:
        click.echo(f"[{section['section']}]  {section['summary']}")
        _echo_options(section["options"], "  ")
    for plugin in listing:
        click.echo(f"{plugin['name']} {plugin['version']}  [{plugin['source']}]")
        click.echo(f"  hooks: {', '.join(plugin['hooks']) or 'none'}")
        if plugin["commands"]:
            click.echo(f"  commands: {', '.join(f'horizon {name}' for name in plugin['commands'])}")
        for component in plugin["components"]:
            engine = f" (engine {component['engine']})" if "engine" in component else ""
            click.echo(
                f"  {component['family']}: {component['name']}{engine}  {component['summary']}"
            )
            _echo_options(component["options"], "      ")
    for failure in failures:
        click.echo(
            f"FAILED {failure['name']} [{failure['entry_point']}]: {failure['error']}", err=True
        )


def _core_sections() -> list[dict[str, Any]]:
    """The sections the core itself reads, listed before the plugins' components: every
    section a user can write is in the listing."""
    from horizon_engine.components import config_options
    from horizon_engine.config import PipelineSection
    from horizon_engine.online.config import GymSection

    return [
        {
            "section": "pipeline",
            "summary": "options of the run as a whole (pipeline.toml)",
            "options": config_options(PipelineSection),
        },
        {
            "section": "gym",
            "summary": "online training in a Gymnasium environment (horizon gym train)",
            "options": config_options(GymSection),
        },
    ]


def _echo_options(options: list[dict[str, Any]], indent: str) -> None:
    for option in options:
        default = "required" if option["required"] else f"default {option['default']!r}"
        click.echo(f"{indent}{option['name']}: {option['type']} ({default})  {option['help']}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@_set_option
@_user_errors
def export(run_dir: Path, overrides: tuple[str, ...]) -> None:
    """Export the trained policy of RUN_DIR (the output folder of `horizon run` or of
    `horizon gym train`) as its [export] says (ONNX by default), from the run's own manifest
    and latest checkpoint."""
    from horizon_engine.errors import HorizonError
    from horizon_engine.online.export import export_gym_run, is_gym_run
    from horizon_engine.pipeline import Engine

    plugins = _plugin_host()
    if is_gym_run(run_dir):
        exported = export_gym_run(run_dir, overrides, plugins)
        _echo_export(run_dir, exported["outputs"], exported["details"])
        return
    manifest_path = run_dir / "manifest.json"
    try:
        config = json.loads(manifest_path.read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise HorizonError(f"{manifest_path}: not a run's manifest ({exc})") from None
    config["pipeline"]["output_dir"] = str(run_dir)
    config["pipeline"]["stages"] = None
    config.setdefault("export", {"kind": "onnx"})
    manifest = Engine(plugins).run(config, overrides, ["export"])
    stage = manifest["stages"]["export"]
    _echo_export(run_dir, stage["outputs"], stage["details"])


def _echo_export(run_dir: Path, outputs: list[str], details: dict[str, Any]) -> None:
    for output in outputs:
        click.echo(f"wrote {run_dir / output}")
    if "max_abs_difference" in details:
        click.echo(
            f"checked on {details['verified_rows']} rows: largest difference from PyTorch "
            f"{details['max_abs_difference']:.2g}"
        )


@main.group()
def gym() -> None:
    """Work with Gymnasium environments."""


@gym.command()
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
@_user_errors
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
    from horizon_engine.builtin.gym_source import GymSourceConfig, collect_rows
    from horizon_engine.files import atomic_output
    from horizon_engine.progress import progress_bar

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


@gym.command("train")
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
@_user_errors
def gym_train(
    gym_toml: Path,
    overrides: tuple[str, ...],
    score_bar: float | None,
    reward_history: Path | None,
    rows: Path | None,
    output_dir: Path | None,
) -> None:
    """Train a policy online in a Gymnasium environment, as GYM_TOML (a gym.toml) says."""
    from horizon_engine.online.config import load_gym_spec
    from horizon_engine.online.runner import train_gym

    settings = list(overrides)
    if score_bar is not None:
        settings.append(f"gym.score_bar={score_bar!r}")
    if output_dir is not None:
        settings.append(f"gym.output_dir={json.dumps(str(output_dir))}")
    plugins = _plugin_host()
    spec = load_gym_spec(gym_toml, plugins, settings)
    result = train_gym(spec, plugins, rows, reward_history, sys.stdout.isatty())
    for line in result.report(spec.gym.avg_over_num_episodes, (rows, reward_history)):
        click.echo(line)
