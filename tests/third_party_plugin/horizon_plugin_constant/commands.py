"""``horizon reminder-rows``: the ``reminder_rows`` source's rows as a JSONL file.

The same rows the source yields for the same seed, written where the built-in ``jsonl`` source
(or any tool) reads them: to look at the data, or to run it without this plugin installed.
Built with ``horizon_engine.command``, as every ``horizon`` command: a user's mistake or a full
disk is one ``error:`` line, not a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from horizon_engine import atomic_output, command
from horizon_plugin_constant.reminders import reminder_rows


@command("reminder-rows")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file to write the pre-timeline rows to.",
)
@click.option("--users", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--days", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int, help="The run's seed.")
def reminder_rows_command(output: Path, users: int, days: int, seed: int) -> None:
    """Write the reminder decisions [source] kind = "reminder_rows" logs, as JSON lines."""
    with atomic_output(output) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for row in reminder_rows(users, days, seed):
            handle.write(json.dumps(row) + "\n")
    click.echo(f"wrote {users * days} rows of {users} users to {output}")
