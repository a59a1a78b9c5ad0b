"""The ``horizon`` command line.

Only click and the core's light modules are imported at start-up; each command imports what
it needs, so ``horizon --help`` and ``horizon plugins`` stay fast. A ``HorizonError`` (a user's
mistake) is printed as a message without a traceback and exits with status 1, as is an
exception a plugin's component raised, named by plugin and component (``PluginHost.blame``).
Every command first warns of each plugin that failed to load.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from horizon_engine import __version__, command_errors
from horizon_engine.command_errors import INTERRUPTED_EXIT_STATUS, sigterm_as_interrupt
from horizon_engine.run_folder import RunFolder

if TYPE_CHECKING:
    from horizon_engine.plugins import PluginHost


def _plugin_host() -> PluginHost:
    """The process's plugin host; ``main`` has warned of the plugins that failed to load."""
    from horizon_engine.plugins import get_plugin_host

    return get_plugin_host()


def _warn_of_plugin_failures() -> None:
    """One line on stderr for each plugin that failed to load, with how to disable it: a
    command without a plugin the user installed must not pass for one with it."""
    from horizon_engine.plugins import get_plugin_host

    host = get_plugin_host()
    for failure in host.failures:
        click.echo(f"warning: {failure}; {failure.remedy} (see `horizon plugins`)", err=True)
    for deprecation in host.deprecations:
        click.echo(f"warning: {deprecation}", err=True)


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
@click.pass_context
def main(ctx: click.Context) -> None:
    """Horizon Engine: from logged decisions to a trained, evaluated, exported policy."""
    # `horizon plugins` lists the failures itself, with the plugins that loaded.
    if not ctx.resilient_parsing and ctx.invoked_subcommand != "plugins":
        _warn_of_plugin_failures()


@command_errors.command(group=main)
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
@click.option(
    "--resume",
    is_flag=True,
    help="Finish output_dir's killed, interrupted or failed run: its complete stages are kept, "
    "training continues from its last complete epoch, and the result is the uninterrupted "
    "run's (the config must be the one it ran with).",
)
@click.option(
    "--nproc",
    type=int,
    metavar="N",
    help="Train on N processes on this machine (data-parallel; the other stages run once), "
    "started by torch's launcher. On several machines, start `horizon run` with torchrun "
    "instead (README: Scaling out); the output folder must be shared by every process.",
)
def run(
    pipeline: Path,
    overrides: tuple[str, ...],
    stages: str | None,
    overwrite: bool,
    resume: bool,
    nproc: int | None,
) -> None:
    """Run the stages configured in PIPELINE (a pipeline.toml)."""
    from horizon_engine import distributed
    from horizon_engine.pipeline import Engine, NothingToResume

    if nproc is not None:
        flags = [f"--set={value}" for value in overrides]
        flags += [f"--stages={stages}"] if stages else []
        flags += ["--overwrite"] * overwrite + ["--resume"] * resume
        command = [sys.executable, "-m", "horizon_engine.cli", "run", str(pipeline), *flags]
        try:
            distributed.launch_local(nproc, command)
        except KeyboardInterrupt:
            again = ["horizon", "run", str(pipeline), *flags[: len(overrides)], "--nproc"]
            continuing = shlex.join([*again, str(nproc)])
            click.echo(f"interrupted; continue this run with: {continuing} --resume", err=True)
            sys.exit(INTERRUPTED_EXIT_STATUS)
        return
    selected = [name.strip() for name in stages.split(",") if name.strip()] if stages else None
    try:
        with sigterm_as_interrupt():
            manifest = Engine(_plugin_host()).run(pipeline, overrides, selected, overwrite, resume)
    except NothingToResume as exc:
        click.echo(str(exc))
        return
    except KeyboardInterrupt:
        if distributed.is_writer():
            command = shlex.join(
                ["horizon", "run", str(pipeline), *(f"--set={value}" for value in overrides)]
            )
            click.echo(f"interrupted; continue this run with: {command} --resume", err=True)
        sys.exit(INTERRUPTED_EXIT_STATUS)
    if not distributed.is_writer():
        return
    output_dir = manifest["config"]["pipeline"]["output_dir"]
    for warning in manifest["warnings"]:
        click.echo(f"warning: {warning}")
    for name, report in manifest["stages"].items():
        if name not in manifest["executed"]:
            stale = f", stale: {report['stale']}" if report.get("stale") else ""
            click.echo(f"{name}: not run, outputs of run {report['run_id']}{stale}")
            continue
        if "page" in report["details"]:
            click.echo(f"{name}: {report['details']['page']}, {report['seconds']:.2f} s")
            continue
        dropped = sum(report["dropped"].values())
        importing = report.get("import_seconds", 0.0)
        click.echo(
            f"{name}: {report['rows_in']} rows in, {report['rows_out']} out, "
            f"{dropped} dropped, {report['seconds']:.2f} s"
            + (f" ({importing:.2f} s of it importing)" if importing >= 0.05 else "")
        )
        if "length" in report["details"]:
            click.echo(f"  training: {report['details']['length']}")
        for warning in report["warnings"]:
            click.echo(f"  warning: {warning}")
    if "evaluation" in manifest["executed"]:
        _echo_estimates(Path(output_dir))
    manifest_path = RunFolder(output_dir).file(RunFolder.MANIFEST)
    click.echo(f"run {manifest['run_id']} {manifest['status']}: {manifest_path}")
    if "evaluation" in manifest["executed"] and isinstance(manifest.get("verdict"), dict):
        from horizon_engine.verdict import verdict_lines

        for line in verdict_lines(manifest["verdict"]):
            click.echo(line)


def _echo_estimates(run_dir: Path) -> None:
    """The evaluation stage's estimates (``cpe.json``) as a table."""
    from horizon_engine.evaluation import estimates_table

    folder = RunFolder(run_dir)
    click.echo(estimates_table(folder.cpe()))
    click.echo(f"(every figure, and each epoch's: {folder.file(RunFolder.CPE)})")


@command_errors.command(group=main)
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@_set_option
def validate(pipeline: Path, overrides: tuple[str, ...]) -> None:
    """Check PIPELINE without running it; list the stages a run executes, each with its
    component and where its settings come from (a section of the file, or its defaults)."""
    from horizon_engine.pipeline import Engine, planned_stages

    host = _plugin_host()
    spec = Engine(host).validate(pipeline, overrides)
    planned = planned_stages(spec, host.stages())
    click.echo(f"{pipeline}: valid; a run executes {len(planned)} stage{'s' * (len(planned) > 1)}:")
    name_width = max(len(stage.name) for stage in planned)
    component_width = max(len(stage.component) for stage in planned)
    for stage in planned:
        click.echo(
            f"  {stage.name:<{name_width}}  {stage.component:<{component_width}}  {stage.settings}"
        )


@command_errors.command(group=main)
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
def plugins(as_json: bool) -> None:
    """List plugins, their versions, hooks, stages and components with their options."""
    from horizon_engine.plugins import get_plugin_host

    root = click.get_current_context().find_root()
    root.command.list_commands(root)
    host = get_plugin_host()
    listing = host.describe()
    failures = host.load_failures()
    sections = _sections(root.command)
    if as_json:
        deprecations = [asdict(deprecation) for deprecation in host.deprecations]
        found = {
            "sections": sections,
            "plugins": listing,
            "failures": failures,
            "deprecations": deprecations,
        }
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
        for stage in plugin["stages"]:
            reads = ", ".join(stage["reads"]) or "nothing"
            if stage["reads_all"]:
                reads = "every other stage's outputs (it runs last)"
            click.echo(
                f"  stage: {stage['name']} [{stage['section']}]  reads {reads}; "
                f"writes {', '.join(stage['writes'])}"
            )
        for component in plugin["components"]:
            click.echo(f"  {component['family']}: {component['name']}  {component['summary']}")
            _echo_options(component["options"], "      ")
    for failure in failures:
        click.echo(
            f"FAILED {failure['name']} [{failure['entry_point']}]: {failure['error']}", err=True
        )
    for deprecation in host.deprecations:
        click.echo(f"DEPRECATED {deprecation}", err=True)


def _sections(cli: click.Group) -> list[dict[str, Any]]:
    """Every section a user can write, listed before the plugins' components: the core's own
    ``[pipeline]``, then each section a command reads that no component owns, which the
    command declares as ``config_sections`` (section name -> its config model), as
    ``horizon gym train`` declares ``[gym]``."""
    from horizon_engine.components import config_options
    from horizon_engine.config import PipelineSection

    sections = [
        {
            "section": "pipeline",
            "summary": "options of the run as a whole (pipeline.toml)",
            "options": config_options(PipelineSection),
        }
    ]
    for path, command in _commands(cli, "horizon"):
        for name, model in getattr(command, "config_sections", {}).items():
            summary = (model.__doc__ or name).strip().splitlines()[0].rstrip(".")
            sections.append(
                {
                    "section": name,
                    "summary": f"{summary[:1].lower()}{summary[1:]} ({path})",
                    "command": path,
                    "options": config_options(model),
                }
            )
    return sections


def _commands(group: click.Group, path: str) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` (groups' subcommands too), with its command line."""
    for name, command in group.commands.items():
        yield f"{path} {name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path} {name}")


def _echo_options(options: list[dict[str, Any]], indent: str) -> None:
    for option in options:
        default = "required" if option["required"] else f"default {option['default']!r}"
        click.echo(f"{indent}{option['name']}: {option['type']} ({default})  {option['help']}")


@command_errors.command(group=main)
@click.argument(
    "run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path)
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="Where to write the page.",
)
@click.option("--title", help="The page's title (the run's name or folder by default).")
def report(run_dirs: tuple[Path, ...], output: Path, title: str | None) -> None:
    """Write one self-contained HTML page about RUN_DIRS: the run, its rows, normalization,
    training, counterfactual evaluation, actions and export. With several runs (oldest first),
    each section shows them side by side, and every run's policy is evaluated on the last
    run's eval data. `horizon run` writes the page of each run into its folder
    (report.html)."""
    from horizon_engine.report import check_report_output, write_report

    check_report_output(output)
    written = write_report(list(run_dirs), output, _plugin_host(), title)
    click.echo(f"wrote {written} ({written.stat().st_size:,} bytes)")


@command_errors.command(group=main)
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@_set_option
def export(run_dir: Path, overrides: tuple[str, ...]) -> None:
    """Export the trained policy of RUN_DIR (the output folder of `horizon run`, or of a
    command that trains, such as `horizon gym train`) as its [export] says (ONNX by default),
    from the run's own manifest and latest checkpoint."""
    from horizon_engine.export_stage import export_run_folder
    from horizon_engine.pipeline import Engine

    plugins = _plugin_host()
    config = RunFolder(run_dir).manifest()["config"]
    if "pipeline" not in config:
        exported = export_run_folder(run_dir, overrides, plugins)
        _echo_export(run_dir, exported["outputs"], exported["details"])
        return
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


if __name__ == "__main__":  # the command each rank of ``horizon run --nproc`` runs
    main()
