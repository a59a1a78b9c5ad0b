"""``horizon evaluate RUN_DIR``: a finished run's policy, evaluated on its own or other data.

Registered through ``horizon_register_commands``. It restores the run's latest checkpoint and
runs the run's ``[[evaluation]]`` entries (every CPE estimator when it has none) on the
run's eval split, or with ``--data`` on another run's timeline (the same actions and state
features), prints the estimates as a table and writes them as JSON. The work is the core's
``evaluate_run``; this module is the command line around it.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from horizon_engine import (
    HorizonError,
    RunFolder,
    atomic_output,
    command,
    estimates_table,
    evaluate_run,
    verdict_lines,
)

RECORD_FIELDS = ("run_dir", "data", "entries", "final")
"""What every record ``horizon evaluate`` writes holds: ``-o`` replaces only such a file."""

RECORD_BYTES = 64 * 2**20
"""The largest file at ``-o`` read to tell whether it is such a record."""


@command("evaluate")
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option(
    "--data",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Evaluate on this timeline instead of the run's eval split: another run's folder, "
    "its timeline folder, or a folder of timeline Parquet files (its eval split when it has "
    "one), with the run's actions and state features.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override a key of the run's config, e.g. --set evaluation.0.weight_clip=10.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"JSON file to write the estimates to [default: RUN_DIR/{RunFolder.CPE_EVALUATE}].",
)
def evaluate_command(
    run_dir: Path, data: Path | None, overrides: tuple[str, ...], output: Path | None
) -> None:
    """Evaluate RUN_DIR's trained policy (a `horizon run` folder) with its [[evaluation]]
    entries, or every CPE estimator when it has none, on its eval split or on --data."""
    from horizon_plugins_cpe.estimators import KINDS

    output = output or RunFolder(run_dir).file(RunFolder.CPE_EVALUATE)
    check_output(output)
    record = evaluate_run(run_dir, data, [{"kind": kind} for kind in KINDS], overrides)
    with atomic_output(output) as temporary:
        temporary.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    click.echo(f"{run_dir}'s {record['checkpoint']} on {record['data']}:")
    click.echo(estimates_table(record))
    click.echo(f"wrote {output}")
    for line in verdict_lines(record["verdict"]):
        click.echo(line)


def check_output(output: Path) -> None:
    """Refuse (``HorizonError``), before evaluating, an ``-o`` that names a file other than a
    record ``horizon evaluate`` wrote: ``-o RUN/manifest.json`` once replaced the run's
    manifest with the estimates."""
    if not (output.exists() or output.is_symlink()):
        return
    try:
        small = output.is_file() and output.stat().st_size <= RECORD_BYTES
        record = json.loads(output.read_text(encoding="utf-8")) if small else None
    except (OSError, ValueError, RecursionError):
        record = None
    if not (isinstance(record, dict) and all(field in record for field in RECORD_FIELDS)):
        raise HorizonError(
            f"-o {output}: there is a file there that horizon evaluate did not write; nothing "
            "was written: move it, or name another file"
        )
