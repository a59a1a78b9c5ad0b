"""Errors a user can meet. Each carries a message that names the place and the mistake.

The CLI prints a ``HorizonError`` as one clear message without a traceback; anything else is a
bug in Horizon Engine or a plugin and keeps its traceback.
"""

from __future__ import annotations


class HorizonError(Exception):
    """A mistake in the user's input, configuration or installed plugins."""


class ConfigError(HorizonError):
    """pipeline.toml (or a config dict, or a ``--set`` override) is not valid."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class PluginError(HorizonError):
    """A plugin cannot be used: duplicate component names, unknown component, bad hook."""


BAD_ROWS_SHOWN = 20
"""How many bad rows an error message lists before summarising the rest by kind."""


class BadRowsError(HorizonError):
    """Input rows failed validation and ``on_bad_rows = "fail"``."""

    def __init__(self, message: str, bad_rows: list) -> None:
        self.bad_rows = bad_rows
        super().__init__(message)


class StageInputError(HorizonError):
    """A stage's input files, written by an earlier stage, are missing or were left
    incomplete by a run that was interrupted or failed while writing them."""


class NothingToResume(HorizonError):
    """``--resume`` on a folder whose run completed every stage (or, for a command that runs
    its own training, finished it): there is nothing to do, which the command says and exits
    with success."""
