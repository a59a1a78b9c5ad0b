"""Serving and the closed loop: score with an exported model, explore, log every decision under
a key, join the rewards that arrive later.

Registered through the ``horizon`` entry point like any third-party plugin. Scoring needs only
onnxruntime and numpy: a serving process imports neither torch nor Spark (an import-linter
contract and a test hold it to that). ``predictor`` holds the ``Predictor`` and exploration,
``decision_log`` the decision logs, ``server`` the HTTP app, ``commands`` the ``horizon
score`` and ``horizon serve`` commands (light to import: the CLI lists them without loading
the HTTP stack), ``join`` and the ``join_*`` modules ``horizon join``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from horizon_engine import hookimpl

if TYPE_CHECKING:
    import click


@hookimpl
def horizon_register_commands(cli: click.Group) -> None:
    from horizon_plugins_serving.commands import score_command, serve_command
    from horizon_plugins_serving.join import join_command

    cli.add_command(score_command)
    cli.add_command(serve_command)
    cli.add_command(join_command)
