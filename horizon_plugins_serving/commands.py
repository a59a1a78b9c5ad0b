"""``horizon score MODEL ROWS.jsonl -o DECISIONS.jsonl``, offline scoring into a decision log,
and the ``horizon serve`` command's options (its server is ``server.serve``, imported when it
runs).

Each input line is a JSON object with a ``state_features`` map (feature id -> number) and,
optionally, ``possible_actions`` (a list of the model's action names), ``mdp_id`` and
``sequence_number``, which the decision row keeps. For a parametric model ``possible_actions``
is required, a list of candidate action feature maps, and the logged action is the chosen
candidate's map; a continuous actor's action is logged as a map of its action feature ids to
the model's values, with exp(log_density) as its probability (1 for a deterministic actor).
A bad line is named (line number and what is wrong) and fails the command, or with
``--skip-bad-rows`` is counted and skipped; the count and the first lines named are printed,
never dropped silently. A line whose values the model's output is not finite for is bad too;
a model whose outputs are not finite on its check rows is refused before any line is read
(``Predictor.check_outputs``).

The output is written atomically: the decision log (JSONL, or a folder of Parquet parts when
its name ends ``.parquet``) is written to a temporary name beside it and renamed into place
when every row is scored, so a crash leaves no half-written output (offline scoring is simply
run again); ``horizon serve``'s log is the one appended as it goes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from horizon_engine import (
    BadLine,
    HorizonError,
    atomic_output,
    command,
    parse_json_line,
    read_lines,
)

BATCH = 1024
"""Rows scored per session call."""
MAX_BODY_BYTES = 1 << 20
"""``horizon serve``'s default cap on a request's body (1 MiB)."""
MAX_BATCH = 1024
"""``horizon serve``'s default cap on a request's rows."""
TOKEN_VARIABLE = "HORIZON_SERVE_TOKEN"
"""The environment variable that may hold ``horizon serve``'s bearer token."""


def exploration_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--policy``, ``--epsilon``, ``--temperature`` and ``--seed``: how ``horizon score`` and
    ``horizon serve`` explore. The first three default to the model card's policy (the
    ``[export]`` section's), each one given overriding it (``served_policy.served_policy``)."""
    options = [
        click.option(
            "--policy",
            type=click.Choice(["greedy", "epsilon_greedy", "softmax"]),
            help="How the action is drawn from the model's scores. Default: the policy the "
            "model was exported with ([export] policy, recorded in its card), else greedy.",
        ),
        click.option(
            "--epsilon",
            type=float,
            help="epsilon_greedy's chance of a uniform draw over the possible actions. "
            "Default: the model card's when it records epsilon_greedy, else 0.1.",
        ),
        click.option(
            "--temperature",
            type=float,
            help="softmax's temperature: exp(score / temperature). Default: the model "
            "card's when it records softmax, else 1.0.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Seeds the draws."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


strict_features_option = click.option(
    "--strict-features",
    is_flag=True,
    help="Refuse a row none of whose state features the model uses (empty or all unknown) "
    "instead of deciding on the model's defaults (such rows are counted and warned about).",
)
"""``horizon score`` and ``horizon serve`` alike: ``Predictor(strict_features=...)``."""


@command("score")
@click.argument("model", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.argument("rows", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Decision log to write: JSONL, one pre-timeline row per line, or Parquet parts in a "
    "folder when the name ends .parquet.",
)
@exploration_options
@click.option(
    "--skip-bad-rows", is_flag=True, help="Count and skip bad input rows instead of failing."
)
@strict_features_option
def score_command(
    model: Path,
    rows: Path,
    output: Path,
    policy: str | None,
    epsilon: float | None,
    temperature: float | None,
    seed: int,
    skip_bad_rows: bool,
    strict_features: bool,
) -> None:
    """Score ROWS.jsonl's state_features with MODEL (an exported model.onnx) and write a
    decision log with each chosen action and its propensity under the policy the model was
    exported with, or --policy."""
    from horizon_engine import refuse_output_over_inputs
    from horizon_plugins_serving.decision_log import (
        DecisionLog,
        ParquetDecisionLog,
        decision_rows,
    )
    from horizon_plugins_serving.predictor import NonFiniteOutput, Predictor
    from horizon_plugins_serving.served_policy import PolicyFlags

    inputs = {"rows file": rows, "model": model}
    refuse_output_over_inputs(f"-o {output}", output, inputs, "score", "decision log")
    predictor = Predictor(
        model,
        seed=seed,
        strict_features=strict_features,
        flags=PolicyFlags(policy, epsilon, temperature),
    )
    bad: list[tuple[int, str]] = []
    scored = 0
    log_kind = ParquetDecisionLog if output.name.endswith(".parquet") else DecisionLog
    with atomic_output(output) as temporary, log_kind(temporary) as log:
        batch: list[dict[str, Any]] = []
        numbers: list[int] = []

        def flush() -> None:
            """Score and log the batch; a row whose output is not finite is a bad row."""
            nonlocal scored
            try:
                result, actions, possible = predictor.decide(batch)
            except NonFiniteOutput as exc:
                if not skip_bad_rows:
                    raise HorizonError(
                        f"{rows}, line {numbers[exc.rows[0]]}: the model's {exc.output} is "
                        f"{exc.found} (not finite) for its values (--skip-bad-rows counts and "
                        "skips such rows)"
                    ) from None
                for index in reversed(exc.rows):
                    problem = f"the model's {exc.output} is not finite for its values"
                    bad.append((numbers.pop(index), problem))
                    del batch[index]
                scored -= len(exc.rows)
                bad.sort()
                if batch:
                    flush()
                return
            log.append(
                decision_rows(
                    [row["state_features"] for row in batch],
                    actions,
                    result.propensities,
                    predictor.model_id,
                    possible,
                    predictor.actions,
                    [row.get("mdp_id") for row in batch],
                    [row.get("sequence_number", 0) for row in batch],
                    policy=predictor.served.label,
                )
            )
            batch.clear()
            numbers.clear()

        with open(rows, "rb") as handle:
            for number, line in read_lines(handle):
                if not line.strip():
                    continue
                try:
                    row = parse_json_line(line)
                except BadLine as exc:
                    problem: str | None = f"not JSON ({exc})"
                else:
                    problem = predictor.row_problem(row)
                if problem is not None:
                    if not skip_bad_rows:
                        raise HorizonError(
                            f"{rows}, line {number}: {problem} "
                            "(--skip-bad-rows counts and skips such rows)"
                        )
                    bad.append((number, problem))
                    continue
                batch.append(row)
                numbers.append(number)
                scored += 1
                if len(batch) == BATCH:
                    flush()
        if batch:
            flush()
    for number, problem in bad[:10]:
        click.echo(f"skipped {rows}, line {number}: {problem}", err=True)
    if len(bad) > 10:
        click.echo(f"... and {len(bad) - 10} more bad rows", err=True)
    click.echo(
        f"scored {scored} rows with {model} (model_id {predictor.model_id}, policy "
        f"{predictor.served.describe()}), "
        f"skipped {len(bad)} bad rows; wrote {output}"
    )


@command("serve")
@click.argument("model", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; the default keeps the server to this machine.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="0 takes a free port; the URL is printed once listening.",
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path),
    default=Path("decisions.jsonl"),
    show_default=True,
    help="Decision log: JSONL, or a folder of Parquet parts when the name ends .parquet.",
)
@exploration_options
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=MAX_BODY_BYTES,
    show_default=True,
    help="Larger request bodies are refused (413) before they are read whole.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=MAX_BATCH,
    show_default=True,
    help="Requests with more rows are refused (413).",
)
@click.option(
    "--target-send-rate",
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    help="Send/drop decisions holding this send rate (a two-action model; --send-action).",
)
@click.option("--send-action", help="The model's action that means send (with --target-send-rate).")
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds a client has to send a request whole (headers and body); past it: 408.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    help="Connections served at once; more are answered 503. Default: 1000, or what the "
    "open-file limit allows.",
)
@click.option(
    "--keep-alive-timeout",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Seconds an idle keep-alive connection is kept open.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A file holding the bearer token POST /decisions requires (or set "
    "HORIZON_SERVE_TOKEN); never on the command line, where ps shows it.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Serve a host other than loopback without a token (a network you trust).",
)
@strict_features_option
def serve_command(
    model: Path,
    host: str,
    port: int,
    log_path: Path,
    policy: str | None,
    epsilon: float | None,
    temperature: float | None,
    seed: int,
    max_body_bytes: int,
    max_batch: int,
    target_send_rate: float | None,
    send_action: str | None,
    request_timeout: float,
    max_connections: int | None,
    keep_alive_timeout: int,
    token_file: Path | None,
    insecure: bool,
    strict_features: bool,
) -> None:
    """Serve MODEL's decisions over HTTP (POST /decisions, GET /health), each one logged,
    under the policy the model was exported with, or --policy.

    SIGINT or SIGTERM stops the server once the requests in flight are answered and every
    answered decision is in the log. A host other than loopback needs a bearer token
    (--token-file or HORIZON_SERVE_TOKEN) or --insecure."""
    from horizon_engine import refuse_output_over_inputs
    from horizon_plugins_serving.served_policy import PolicyFlags
    from horizon_plugins_serving.server import serve

    inputs = {"model": model, **({"token file": token_file} if token_file else {})}
    refuse_output_over_inputs(
        f"--log {log_path}", log_path, inputs, "server", "decision log", appends=True
    )
    token = serve_token(token_file, os.environ.get(TOKEN_VARIABLE))
    serve(
        model,
        PolicyFlags(policy, epsilon, temperature),
        host=host,
        port=port,
        log_path=log_path,
        seed=seed,
        max_body_bytes=max_body_bytes,
        max_batch=max_batch,
        target_send_rate=target_send_rate,
        send_action=send_action,
        request_timeout=request_timeout,
        max_connections=max_connections,
        keep_alive_timeout=keep_alive_timeout,
        token=token,
        insecure=insecure,
        strict_features=strict_features,
    )


def serve_token(token_file: Path | None, from_environment: str | None) -> str | None:
    """The bearer token ``horizon serve`` asks for: the file's text (whitespace around it
    dropped) or else the environment's; None when neither is given. An empty token, or one
    with characters an HTTP header cannot carry, is refused."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise HorizonError(f"--token-file {token_file}: not readable as text ({exc})") from None
        where = f"--token-file {token_file}"
    elif from_environment is not None:
        token, where = from_environment.strip(), TOKEN_VARIABLE
    else:
        return None
    if not token or not all(33 <= ord(char) < 127 for char in token):
        raise HorizonError(f"{where}: the token must be printable ASCII without spaces")
    return token
