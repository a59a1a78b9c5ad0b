"""``horizon_engine.command``: a plugin's command, built once, runs under the error-to-exit
wrapper every ``horizon`` command runs under."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from horizon_engine import HorizonError, command


@command("greet")
@click.option("--name", required=True)
def greet(name: str) -> None:
    """Greet NAME, refusing an empty one."""
    if not name:
        raise HorizonError("--name is empty: give someone to greet")
    click.echo(f"hello {name}")


@click.group()
def family() -> None:
    """A group a plugin adds subcommands to."""


@command("crash", group=family)
def crash() -> None:
    """A bug, not a user's mistake."""
    raise ZeroDivisionError("division by zero")


def test_a_command_keeps_its_name_options_and_help():
    result = CliRunner().invoke(greet, ["--name", "Ada"])

    assert isinstance(greet, click.Command) and greet.name == "greet"
    assert result.exit_code == 0 and result.output == "hello Ada\n"
    assert "Greet NAME" in CliRunner().invoke(greet, ["--help"]).output


def test_a_users_mistake_is_one_error_line_and_exit_status_1():
    result = CliRunner().invoke(greet, ["--name", ""])

    assert result.exit_code == 1
    assert result.output == "error: --name is empty: give someone to greet\n"


def test_a_subcommand_of_a_group_runs_under_the_wrapper_and_a_bug_keeps_its_traceback():
    assert family.commands["crash"] is crash
    result = CliRunner().invoke(family, ["crash"])

    assert isinstance(result.exception, ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        crash.main([], standalone_mode=False)
