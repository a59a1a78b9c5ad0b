"""The error-to-exit wrapper every ``horizon`` command runs under, built-in or a plugin's.

A user's mistake (``HorizonError``) is one ``error:`` line on stderr and exit status 1, never a
traceback; so is a full or unwritable disk, with what to do, and an exception a plugin's
component raised, named by plugin and component (``PluginHost.blame``). Anything else is a
bug and keeps its traceback. A plugin builds its commands with ``command`` (public as
``horizon_engine.command``), which runs them under ``user_errors``, rather than catching these
on its own. A command that runs long stops as cleanly on SIGTERM as on Ctrl-C
(``sigterm_as_interrupt``) and exits with ``INTERRUPTED_EXIT_STATUS``.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

import click

from horizon_engine.errors import HorizonError

INTERRUPTED_EXIT_STATUS = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it)."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler or ``kill`` stopping the command) raises ``KeyboardInterrupt``
    inside, as Ctrl-C does: the run stops as cleanly, recorded as interrupted."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def command(
    name: str | None = None, *, group: click.Group | None = None, **attrs: Any
) -> Callable[[Callable[..., Any]], click.Command]:
    """A decorator making a function a ``horizon`` command: ``click.command(name, **attrs)``
    (or ``group.command``, a subcommand of ``group``) whose body runs under ``user_errors``.
    Put the ``@click.option`` and ``@click.argument`` decorators under it, as under
    ``@click.command``."""
    make = click.command if group is None else group.command

    def decorate(function: Callable[..., Any]) -> click.Command:
        return make(name, **attrs)(user_errors(function))

    return decorate


def user_errors(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with a user's mistake, a refused write and a plugin component's exception
    each turned into one ``error:`` line and exit status 1 (put it under ``@click.command``)."""

    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except HorizonError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except OSError as exc:
            from horizon_engine.files import WRITE_REFUSED

            if exc.errno not in WRITE_REFUSED:
                raise
            click.echo(f"error: {refused_write(exc)}", err=True)
            sys.exit(1)
        except Exception as exc:
            from horizon_engine.plugins import get_plugin_host

            blamed = get_plugin_host().blame(exc)
            if blamed is None:
                raise
            click.echo(f"error: {blamed}", err=True)
            sys.exit(1)

    return wrapper


def refused_write(exc: OSError) -> str:
    """A full or unwritable disk, in one line: where, why, and what to do. Every command writes
    its files aside and moves them into place once whole; a pipeline's stages that finished
    keep theirs, and ``--resume`` runs the failed one (``failed_stage`` in manifest.json) and
    those after it."""
    import errno
    import os

    where = exc.filename or "the output folder"
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    remedy = "free space there" if full else "make it writable"
    return (
        f"{where}: {os.strerror(exc.errno)}. Nothing half-written was kept; {remedy} (or write "
        "elsewhere), then run the command again: `horizon run PIPELINE --resume` continues a "
        "pipeline from the stage that failed, the stages that finished keep their outputs"
    )
