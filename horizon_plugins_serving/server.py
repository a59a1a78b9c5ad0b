"""``horizon serve MODEL``: decisions over HTTP/JSON, every one logged by a background writer.

The command::

    horizon serve MODEL [--host 127.0.0.1] [--port 8000] [--log decisions.jsonl]
        [--policy greedy|epsilon_greedy|softmax] [--epsilon E] [--temperature T]
        [--seed 0] [--max-body-bytes 1048576] [--max-batch 1024]
        [--target-send-rate R --send-action NAME]

applies the policy the model was exported with (its card's ``[export]`` policy; each of
``--policy``, ``--epsilon``, ``--temperature`` given overrides it: ``served_policy``),
listens on 127.0.0.1 unless told otherwise (``--port 0`` takes a free port), prints one line
with its URL, and on SIGINT or SIGTERM stops taking requests, answers those in flight, writes
every answered decision to the log, and exits 0. ``--log`` ending ``.parquet`` is a folder of
Parquet parts (``decision_log``).

Limits (``connections``): ``--request-timeout`` (5 s) to send a request whole, else 408;
``--max-connections`` (1000, or what the open-file limit allows) served at once: at the cap a
newcomer sheds the connection that has sent the least for longest (408), and gets 503 only when
every one is being answered; ``--keep-alive-timeout`` (5 s); a request head of 64 KiB, else 431.
A bearer token (``--token-file PATH`` or the environment's ``HORIZON_SERVE_TOKEN``) makes POST
/decisions answer 401 without ``Authorization: Bearer TOKEN`` (the scheme in any case). A
``--host`` that is not loopback needs one, or ``--insecure``. A second SIGINT or SIGTERM
during the shutdown is one log line; the shutdown goes on.

A model whose outputs on two check rows are not finite (its training went NaN) is refused at
load (``Predictor.check_outputs``); a row whose output is not finite all the same (values the
model overflows on) gets its request a 500 naming the row and one log line, nothing decided or
logged for it, while the requests decided with it are answered.

The endpoints:

- ``GET /health`` -> ``{"status": "ok", "model_id", "action_type", "actions", "policy",
  "served_policy", "decisions_logged", "featureless_rows"}`` (and ``action_feature_ids`` for a
  parametric or continuous model). ``served_policy`` is ``{"label", "from"}``: the policy
  every logged row records (``epsilon_greedy(epsilon=0.1)``) and where each of its settings
  came from (``model card``, the flag, ``default``): by default the policy the model was
  exported with (``served_policy``). ``featureless_rows`` counts the rows decided on the
  model's defaults alone, none of their state features being one the model uses
  (``--strict-features`` refuses them with 422 instead).
  ``decisions_logged`` counts the decisions the writer has handed to the log; answered ones
  still queued are not counted yet. When the log has failed: 503 with ``"status": "failed"``.
- ``POST /decisions`` with ``{"rows": [ROW, ...]}``, each ROW a ``horizon score`` input line:
  200 ``{"decisions": [{"decision_id", "action", "action_probability", "timestamp",
  "scores"}, ...]}`` in row order. ``scores`` maps each action to its score (a parametric
  model's: each offered candidate's index, as a string); a continuous actor's decision has no
  ``scores`` and its ``action`` maps the action feature ids to values; a parametric decision's
  ``action`` is the chosen candidate's map. ``timestamp`` is the logged row's, for timing the
  rewards that come later.
- Errors, each ``{"error": message}`` and nothing logged: 400 the body is not JSON; 413 the
  body is over ``--max-body-bytes`` (by its Content-Length before reading, else while reading
  it: an oversized body is never held whole) or has more rows than ``--max-batch``; 422 the
  body is not ``{"rows": [...]}`` or a row is bad, named by its index in ``rows`` (from 0):
  ``row 3: state feature 'x': found 'a', expected a number`` (``Predictor.row_problem``);
  503 the decision log failed (its error given), so no more decisions are made.

In Python (the closed loop's tests and examples run it this way)::

    app = build_app(predictor, open_decision_log(path), max_body_bytes=1 << 20, max_batch=1024)
    with BackgroundServer(app) as server:      # uvicorn in a thread, 127.0.0.1, a free port
        ...  # plain HTTP to server.url, e.g. "http://127.0.0.1:43121"
    # here the server has stopped and every answered decision is in the log, which is closed

``build_app`` takes the log over: the app's lifespan starts its writer and, at shutdown, drains
it and closes the log (so run the app with its lifespan: uvicorn does, and starlette's
``TestClient`` as a context manager). A JSONL log is written before each answer is sent
(``LogWriter``). For a Parquet log the writer is one asyncio task: each answer's rows go
into a bounded queue (when it is full the request waits for room, so a slow disk slows the
answers instead of losing decisions) and the task appends what has gathered with one
``DecisionLog.append`` in a worker thread, so answers never wait on the disk; an idle second
flushes a Parquet log's gathered rows.

Scoring runs inline on the event loop, not in the thread pool: the hop to a worker thread and
back costs more than the model's tens of microseconds, ``run_in_threadpool`` would need a lock
besides (for the seeded draws), and a large request's time is mostly Python that a worker
thread would run under the same GIL (measured: docs/measurements.md#inline_scoring).

Requests whose bodies arrive in the same turn of the event loop are decided together
(``DecisionService._decide_waiting``): one model run, one log write and one set of numpy calls
for all of them, at most ``--max-batch`` rows at a time, the log written before any of them
answers. POST /decisions bypasses Starlette's routing (``DecisionApp``), and JSON is read by
orjson. With the Predictor's pruned graph and one-row binding, these nearly doubled the
batch-1 throughput and cut the server's CPU time a request to a third (measured:
docs/measurements.md#decision_batching). From ``LINES_ROWS`` rows, a JSONL log's lines and a
discrete model's answers are put together from templates and the batch's values, encoded a
column at a time where they are numbers: no Python dict per row (``decision_lines``,
``DecisionService.answers``). The command freezes its startup objects and has malloc keep
freed memory (``freeze_startup_objects``, ``keep_freed_memory``). Together these took batch
64's p99 from 67 ms to 13 ms and the server's CPU time a request from 5.0 to 2.2 times the
bare app's (measured: docs/measurements.md#decision_lines).

Send/drop models: ``--target-send-rate R --send-action NAME`` decides a two-action model by
the paper's rule (``Predictor.send_or_drop``) instead of ``--policy``; a
``SendRateController`` moves the threshold after every ``SEND_RATE_WINDOW`` decisions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import errno
import gc
import hmac
import ipaddress
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from horizon_engine import HorizonError
from horizon_plugins_serving.commands import MAX_BATCH, MAX_BODY_BYTES
from horizon_plugins_serving.connections import (
    BACKLOG,
    KEEP_ALIVE_TIMEOUT,
    REQUEST_TIMEOUT,
    ConnectionLimits,
    connection_cap,
    limited_protocol,
    raise_file_limit,
)
from horizon_plugins_serving.decision_log import (
    DecisionLines,
    DecisionLog,
    decision_lines,
    decision_rows,
    json_ids,
    json_numbers,
    json_value,
    json_values,
)
from horizon_plugins_serving.predictor import NonFiniteOutput
from horizon_plugins_serving.request_body import BodyError, decode_body

if TYPE_CHECKING:
    import uvicorn

    from horizon_plugins_serving.decision_log import ParquetDecisionLog
    from horizon_plugins_serving.predictor import Predictions, Predictor, SendRateController
    from horizon_plugins_serving.served_policy import PolicyFlags

Headers = Sequence[tuple[bytes, bytes]]
"""An ASGI request's or response's headers."""

QUEUED_ANSWERS = 1024
"""Answered requests whose rows may wait for the writer before new requests wait instead."""
IDLE_FLUSH_SECONDS = 1.0
RETRY_SECONDS = 1.0
"""How often a log that cannot write for now (``PASSING_ERRORS``) is tried again."""
PASSING_ERRORS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.ENOSPC, errno.EDQUOT}
)
"""A log write failing with one of these may succeed later (files closed, room made): the
decisions stay in the log's hands and the writer tries again, answering 503 meanwhile."""
KEPT_FREE_BYTES = 64 << 20
"""Freed memory glibc's malloc keeps for the next allocations instead of handing it back to
the kernel (``keep_freed_memory``)."""
LARGEST_HEAP_ALLOCATION = 4 << 20
"""Allocations up to this size come from the heap (1 MiB bodies, a 1,024-row batch's log
lines), larger ones from their own mapping."""
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt``'s parameters, from glibc's malloc.h."""
LINES_ROWS = 16
"""The fewest rows a JSONL log is given as lines (``decision_lines``) and a discrete model's
answers put together from a template, rather than as dicts (``decision_rows``, which
``DecisionLog.append`` encodes): making the templates and encoding the columns costs more than
a few dicts. Deciding, logging and answering took 64 against 58 microseconds as lines at 8
rows, 82 against 80 at 16, 107 against 116 at 32 and 159 against 190 at 64 (minimum of 20
interleaved repeats)."""
SEND_RATE_WINDOW = 200
"""Decisions per controller update: the batch size its default gains were tuned on."""

logger = logging.getLogger("horizon.serve")


class RequestError(Exception):
    """A request answered with a 4xx or 5xx status and ``{"error": message}`` (and
    ``headers``)."""

    def __init__(self, status: int, message: str, headers: Headers = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


class ClientGone(Exception):
    """The client closed its connection before its request arrived whole."""


def _header(headers: Headers, name: bytes) -> bytes | None:
    """The first value of the header ``name`` (lower case, as ASGI gives the names)."""
    for key, value in headers:
        if key == name:
            return value
    return None


async def _respond(send: Send, status: int, body: bytes, headers: Headers = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class LogWriter:
    """Appends answered decisions to the log; see the module docstring.

    A JSONL log is appended inline, before the answer is sent: one ``os.write`` of a few
    hundred bytes into the page cache, cheaper than the hop to a worker thread, and a kill of
    the process then cannot lose an answered decision. A Parquet log's rows go through the
    queue to one asyncio task that appends them in a worker thread, since writing a part takes
    long enough to stall every other request.

    ``logged`` counts the rows handed to the log; ``failure`` is the log's error once an
    append or flush has failed for good: the app answers 503 from then on, and the rows already
    queued are counted in ``lost`` (and left out of the log) so that no request waits for ever.
    A write that fails with one of ``PASSING_ERRORS`` (no file descriptor left, a full disk)
    leaves its rows with the log (``DecisionLog.append``'s promise): ``stalled`` says why while
    the writer tries the log's ``flush`` again every ``RETRY_SECONDS``, and the app answers 503
    meanwhile instead of deciding."""

    def __init__(self, log: DecisionLog | ParquetDecisionLog) -> None:
        self.log = log
        self.inline = isinstance(log, DecisionLog)
        self.logged = 0
        self.lost = 0
        self.failure: str | None = None
        self.stalled: str | None = None
        self._queue: asyncio.Queue[list[dict[str, Any]] | None] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._queue = asyncio.Queue(QUEUED_ANSWERS)
        self._task = asyncio.create_task(self._write())

    async def put(self, rows: DecisionLines | list[dict[str, Any]]) -> None:
        """Log an answer's rows (a JSONL log's made into lines already, ``decision_lines``):
        written now (JSONL) or queued, waiting while the queue is full."""
        if self._queue is None:
            raise RuntimeError("the log writer is not running: run the app with its lifespan")
        if isinstance(rows, DecisionLines):
            self._count(rows, self._call_now(self.log.append_lines, rows))
        elif self.inline:
            self._count(rows, self._call_now(self.log.append, rows))
        else:
            await self._queue.put(rows)

    async def stop(self) -> None:
        """Write every queued row, then close the log (the rows it still holds when that
        fails are counted in ``lost``)."""
        if self._task is not None and self._queue is not None:
            await self._queue.put(None)
            await self._task
        try:
            await asyncio.to_thread(self.log.close)
        except Exception as exc:
            self.failure = self.failure or f"{type(exc).__name__}: {exc}"
            self.lost += self.log.pending
            self.logged -= self.log.pending

    def _count(self, rows: DecisionLines | list[dict[str, Any]], handed: bool) -> None:
        if handed:
            self.logged += len(rows)
        else:
            self.lost += len(rows)

    async def _flush(self) -> None:
        if self.inline:
            self._call_now(self.log.flush)
        else:
            await self._call(self.log.flush)

    async def _write(self) -> None:
        assert self._queue is not None
        queue = self._queue
        stopping = False
        while not stopping:
            try:
                first = await asyncio.wait_for(queue.get(), IDLE_FLUSH_SECONDS)
            except TimeoutError:
                await self._flush()
                continue
            stopping = first is None
            rows = list(first or [])
            while not queue.empty() and not stopping:
                more = queue.get_nowait()
                stopping = more is None
                rows += more or []
            if rows:
                self._count(rows, await self._call(self.log.append, rows))
            while self.stalled and not self.failure:
                await asyncio.sleep(RETRY_SECONDS)
                await self._flush()

    async def _call(self, method: Any, *args: Any) -> bool:
        """Call a log method in a worker thread: ``_call_now``'s answer."""
        if self.failure:
            return False
        try:
            await asyncio.to_thread(method, *args)
        except Exception as exc:
            return self._failed(exc)
        return self._wrote()

    def _call_now(self, method: Any, *args: Any) -> bool:
        """Call a log method; False (and ``failure`` set) once one fails for good. One
        failing with a passing error leaves its rows with the log and sets ``stalled``
        (the answer is True: the rows are the log's); the next success clears it."""
        if self.failure:
            return False
        try:
            method(*args)
        except Exception as exc:
            return self._failed(exc)
        return self._wrote()

    def _wrote(self) -> bool:
        if self.stalled:
            logger.warning("decision log %s writes again", self.log.path)
            self.stalled = None
        return True

    def _failed(self, exc: Exception) -> bool:
        if isinstance(exc, OSError) and exc.errno in PASSING_ERRORS:
            if not self.stalled:
                logger.warning(
                    "decision log %s cannot write for now (%s): answering 503, trying again "
                    "every %g s",
                    self.log.path,
                    exc,
                    RETRY_SECONDS,
                )
            self.stalled = f"{type(exc).__name__}: {exc}"
            return True
        self.failure = f"{type(exc).__name__}: {exc}"
        logger.error("decision log %s failed, no more decisions: %s", self.log.path, exc)
        return False


class DecisionService:
    """The app's two endpoints on a Predictor and a LogWriter."""

    def __init__(
        self,
        predictor: Predictor,
        writer: LogWriter,
        max_body_bytes: int,
        max_batch: int,
        send_rate: SendRateController | None,
        send_action: str | None,
        token: str | None = None,
    ) -> None:
        self.predictor = predictor
        self.token = None if token is None else token.encode()
        self.writer = writer
        self.max_body_bytes = max_body_bytes
        self.max_batch = max_batch
        self.send_rate = send_rate
        self.send_drop: tuple[str, str] | None = None
        self._sent: list[bool] = []
        self._waiting: collections.deque[
            tuple[list[dict[str, Any]], asyncio.Future[list[bytes]]]
        ] = collections.deque()
        self._decider: asyncio.Task[None] | None = None
        self._action_json = {action: json_value(action) for action in predictor.actions}
        self._answer_start = b'{"decision_id":%s,"action":%s,"action_probability":%s,"timestamp":'
        self._answer_scores = b',"scores":{%s}}' % b",".join(
            json_value(action).replace(b"%", b"%%") + b":%s" for action in predictor.actions
        )
        if send_rate is not None:
            others = [action for action in predictor.actions if action != send_action]
            if len(predictor.actions) != 2 or len(others) != 1:
                raise HorizonError(
                    f"send/drop needs a two-action model and --send-action one of them; "
                    f"the model's actions are {predictor.actions}, --send-action {send_action!r}"
                )
            self.send_drop = (str(send_action), others[0])

    @property
    def policy(self) -> str:
        return "send_drop" if self.send_drop else self.predictor.exploration.policy

    @property
    def policy_label(self) -> str:
        """The policy each logged row records (``decision_rows``' ``policy``)."""
        if self.send_drop:
            return f"send_drop(target={self.send_rate.target})"
        return self.predictor.served.label

    def describe_policy(self) -> str:
        """The policy and where it came from, for the startup line."""
        if self.send_drop:
            return f"{self.policy_label} (--target-send-rate, --send-action {self.send_drop[0]})"
        return self.predictor.served.describe()

    def served_policy(self) -> dict[str, Any]:
        """What ``GET /health`` says of the policy: the label each logged row records and
        where each of its settings came from."""
        if self.send_drop:
            return {"label": self.policy_label, "from": {"policy": "--target-send-rate"}}
        return self.predictor.served.as_dict()

    async def health(self, request: Request) -> JSONResponse:
        predictor = self.predictor
        body: dict[str, Any] = {
            "status": "failed" if self.writer.failure else "ok",
            "model_id": predictor.model_id,
            "action_type": predictor.action_type,
            "actions": predictor.actions,
            "policy": self.policy,
            "served_policy": self.served_policy(),
            "decisions_logged": self.writer.logged,
            "featureless_rows": predictor.featureless_rows,
        }
        if predictor.action_feature_ids:
            body["action_feature_ids"] = predictor.action_feature_ids
        if self.writer.failure:
            body["error"] = f"the decision log failed: {self.writer.failure}"
        return JSONResponse(body, 503 if self.writer.failure else 200)

    def authorized(self, headers: Headers) -> bool:
        """Whether the request carries the bearer token (compared in constant time), or no
        token is asked for. The scheme's name is case-insensitive (RFC 7235: ``bearer`` is
        ``Bearer``), the token is not."""
        if self.token is None:
            return True
        scheme, _, credentials = (_header(headers, b"authorization") or b"").partition(b" ")
        given = credentials.strip(b" ") if scheme.lower() == b"bearer" else b""
        return hmac.compare_digest(given, self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /decisions, as a plain ASGI app (``DecisionApp`` calls it without Starlette's
        routing, and Starlette's route to it answers 405 to other methods)."""
        try:
            if not self.authorized(scope["headers"]):
                raise RequestError(
                    401,
                    "missing or wrong bearer token (Authorization: Bearer TOKEN)",
                    [(b"www-authenticate", b"Bearer")],
                )
            if self.writer.failure:
                raise RequestError(503, f"the decision log failed: {self.writer.failure}")
            if self.writer.stalled:
                raise RequestError(
                    503, f"the decision log cannot write for now, retrying: {self.writer.stalled}"
                )
            rows = self.parse(await self.read_body(scope["headers"], receive))
        except RequestError as exc:
            await _respond(send, exc.status, json.dumps({"error": str(exc)}).encode(), exc.headers)
            return
        except ClientGone:
            client = "{}:{}".format(*scope["client"]) if scope.get("client") else "a client"
            logger.warning("%s closed before its request arrived whole", client)
            return  # nothing to answer: the connection is gone
        try:
            answers = await self.decided(rows)
        except NonFiniteOutput as exc:
            client = "{}:{}".format(*scope["client"]) if scope.get("client") else "a client"
            message = (
                f"row {exc.rows[0]}: the model's {exc.output} is {exc.found} (not finite) for "
                "its values; nothing decided or logged"
            )
            logger.error("%s: answered 500, %s", client, message)
            await _respond(send, 500, json.dumps({"error": message}).encode())
            return
        await _respond(send, 200, b'{"decisions":[%s]}' % b",".join(answers))

    async def decided(self, rows: list[dict[str, Any]]) -> list[bytes]:
        """The answers to a request's checked rows, each as JSON, once they are decided and
        handed to the log along with those of the requests that came in with it
        (``_decide_waiting``)."""
        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        self._waiting.append((rows, answered))
        if self._decider is None:
            self._decider = loop.create_task(self._decide_waiting())
        return await answered

    async def _decide_waiting(self) -> None:
        """Decide the waiting requests' rows together, up to ``max_batch`` rows at a time (or
        one request), hand them to the log in one append, then let the requests answer.

        Requests whose bodies arrive in the same turn of the event loop wait here for one
        another: under concurrent load one model run, one log write and one set of numpy
        calls serve them all, which at batch 1 is most of a request's time. A lone client
        waits for nothing but that one turn. The log is written before any of them answers;
        an error deciding (or a request whose task is gone) fails the batch's requests, each
        answered 500 by uvicorn, and nothing of theirs is logged."""
        batch: list[tuple[list[dict[str, Any]], asyncio.Future[list[bytes]]]] = []
        try:
            while self._waiting:
                batch = [self._waiting.popleft()]
                count = len(batch[0][0])
                while self._waiting and count + len(self._waiting[0][0]) <= self.max_batch:
                    batch.append(self._waiting.popleft())
                    count += len(batch[-1][0])
                try:
                    logged, answers = self.decide([row for rows, _ in batch for row in rows])
                    await self.writer.put(logged)
                except NonFiniteOutput as exc:
                    self._waiting.extendleft(reversed(self._refuse_rows(batch, exc)))
                    continue
                except Exception as exc:
                    for _, answered in batch:
                        if not answered.done():
                            answered.set_exception(exc)
                    continue
                start = 0
                for rows, answered in batch:
                    if not answered.done():
                        answered.set_result(answers[start : start + len(rows)])
                    start += len(rows)
        finally:
            self._decider = None
            for _, answered in [*batch, *self._waiting]:
                answered.cancel()  # a no-op for those answered
            self._waiting.clear()

    @staticmethod
    def _refuse_rows(
        batch: list[tuple[list[dict[str, Any]], asyncio.Future[list[bytes]]]],
        error: NonFiniteOutput,
    ) -> list[tuple[list[dict[str, Any]], asyncio.Future[list[bytes]]]]:
        """Fail the requests of ``batch`` holding a row whose output is not finite, each with
        its own rows' indexes; the others, to be decided again without them."""
        bad = set(error.rows)
        kept = []
        start = 0
        for rows, answered in batch:
            own = [row - start for row in range(start, start + len(rows)) if row in bad]
            start += len(rows)
            if not own:
                kept.append((rows, answered))
            elif not answered.done():
                answered.set_exception(NonFiniteOutput(own, error.output, error.found))
        return kept

    async def read_body(self, headers: Headers, receive: Receive) -> bytes:
        """The body, refused with 413 as soon as it is known to be over the cap."""
        limit = self.max_body_bytes
        declared = _header(headers, b"content-length")
        if declared is not None:
            if not declared.isdigit():
                shown = declared.decode("latin-1")
                raise RequestError(400, f"Content-Length {shown!r} is not a number")
            if int(declared) > limit:
                raise RequestError(
                    413,
                    f"body of {declared.decode()} bytes is over the limit of {limit} "
                    "(--max-body-bytes)",
                )
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"body over the limit of {limit} bytes (--max-body-bytes)")
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def parse(self, body: bytes) -> list[dict[str, Any]]:
        """The checked rows of a request body."""
        try:
            payload = decode_body(body)
        except BodyError as exc:
            raise RequestError(400, str(exc)) from None
        rows = payload.get("rows") if isinstance(payload, dict) else None
        if not isinstance(rows, list):
            raise RequestError(422, 'expected a JSON object {"rows": [row, ...]}')
        if len(rows) > self.max_batch:
            raise RequestError(
                413, f"{len(rows)} rows, more than the limit of {self.max_batch} (--max-batch)"
            )
        predictor = self.predictor
        bad = predictor.rows_problem(rows)
        if self.send_drop:
            unfit = f"send/drop decisions take both actions {predictor.actions} or none"
            for number, row in enumerate(rows[: len(rows) if bad is None else bad[0]]):
                if row.get("possible_actions") not in (None, predictor.actions):
                    bad = number, unfit
                    break
        if bad is not None:
            raise RequestError(422, f"row {bad[0]}: {bad[1]}")
        return rows

    def decide(
        self, rows: Sequence[dict[str, Any]]
    ) -> tuple[DecisionLines | list[dict[str, Any]], list[bytes]]:
        """The decisions to log (a JSONL log's as lines, ``decision_lines``, from
        ``LINES_ROWS`` rows; else as rows) and each row's answer as JSON, in row order."""
        predictor = self.predictor
        states = [row["state_features"] for row in rows]
        if self.send_drop:
            result = predictor.send_or_drop(states, self.send_rate, *self.send_drop, update=False)
            self._update_send_rate([action == self.send_drop[0] for action in result.actions])
            actions, possible = result.actions, [row.get("possible_actions") for row in rows]
        else:
            result, actions, possible = predictor.decide(rows)
        states_only = max(map(len, rows), default=1) == 1  # no row has mdp_id or sequence_number
        decided = (
            states,
            actions,
            result.propensities,
            predictor.model_id,
            possible,
            predictor.actions,
            None if states_only else [row.get("mdp_id") for row in rows],
            None if states_only else [row.get("sequence_number", 0) for row in rows],
        )
        if self.writer.inline and len(rows) >= LINES_ROWS:
            lines = decision_lines(*decided, policy=self.policy_label)
            return lines, self.answers(lines.ids, lines.timestamp, actions, result, possible)
        records = decision_rows(*decided, policy=self.policy_label)
        ids = [record["decision_id"] for record in records]
        timestamp = records[0]["timestamp"] if records else ""
        return records, self.answers(ids, timestamp, actions, result, possible)

    def answers(
        self,
        ids: list[str],
        timestamp: str,
        actions: list[Any],
        result: Predictions,
        possible: Sequence[Any] | None,
    ) -> list[bytes]:
        """Each decision's answer as JSON: from ``LINES_ROWS`` rows, a discrete model's put
        together from one template (its fields, its scores' action names) and the batch's
        numbers encoded in two orjson calls, no Python dict per row; else from a dict each."""
        predictor = self.predictor
        chances = np.asarray(result.propensities, np.float64).tolist()
        discrete = not predictor.parametric and not predictor.continuous
        if discrete and len(ids) >= LINES_ROWS:
            template = self._answer_start + json_value(timestamp) + self._answer_scores
            named = self._action_json
            scores = json_numbers(result.scores.ravel().tolist())
            width = len(predictor.actions)
            return [
                template % values
                for values in zip(
                    json_ids(ids),
                    list(map(named.__getitem__, actions)),
                    json_numbers(chances),
                    *(scores[column::width] for column in range(width)),
                    strict=True,
                )
            ]
        answers = [
            {
                "decision_id": own,
                "action": action,
                "action_probability": chance,
                "timestamp": timestamp,
            }
            for own, action, chance in zip(ids, actions, chances, strict=True)
        ]
        if predictor.parametric:
            for answer, offered, scores in zip(
                answers, possible, result.scores.tolist(), strict=True
            ):
                answer["scores"] = {str(i): scores[i] for i in range(len(offered))}
        elif discrete:
            names = predictor.actions
            for answer, scores in zip(answers, result.scores.tolist(), strict=True):
                answer["scores"] = dict(zip(names, scores, strict=True))
        return json_values(answers)

    def _update_send_rate(self, sent: list[bool]) -> None:
        assert self.send_rate is not None
        self._sent += sent
        while len(self._sent) >= SEND_RATE_WINDOW:
            self.send_rate.update(self._sent[:SEND_RATE_WINDOW])
            del self._sent[:SEND_RATE_WINDOW]


class DecisionApp(Starlette):
    """``build_app``'s app: POST /decisions goes straight to the ``DecisionService`` (an ASGI
    app), everything else (GET /health, the lifespan, 404 and 405) through Starlette. Starlette's
    middleware, routing, ``Request`` and ``JSONResponse`` cost as much a request as reading,
    checking and logging a row of it (measured: docs/measurements.md#decision_batching)."""

    def __init__(self, service: DecisionService, **options: Any) -> None:
        super().__init__(**options)
        self.service = service
        self.state.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/decisions":
            await self.service(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def build_app(
    predictor: Predictor,
    log: DecisionLog | ParquetDecisionLog,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_batch: int = MAX_BATCH,
    send_rate: SendRateController | None = None,
    send_action: str | None = None,
    token: str | None = None,
) -> DecisionApp:
    """The decision server's ASGI app; it takes ``log`` over and closes it at shutdown.

    With ``send_rate`` (and ``send_action``, one of a two-action model's actions) decisions
    follow the send/drop rule instead of the predictor's exploration. With ``token``, POST
    /decisions answers 401 unless the request carries ``Authorization: Bearer <token>``
    (GET /health stays open, for load balancers)."""
    writer = LogWriter(log)
    service = DecisionService(
        predictor, writer, max_body_bytes, max_batch, send_rate, send_action, token
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        writer.start()
        try:
            yield
        finally:
            await writer.stop()

    return DecisionApp(
        service,
        routes=[
            Route("/health", service.health, methods=["GET"]),
            Route("/decisions", service, methods=["POST"]),
        ],
        lifespan=lifespan,
    )


def uvicorn_server(
    app: Any, host: str = "127.0.0.1", port: int = 0, limits: ConnectionLimits | None = None
) -> uvicorn.Server:
    """uvicorn serving ``app`` under ``limits`` (``ConnectionLimits()`` when None), on uvloop
    and httptools: the benchmark's bare baseline runs on this same server."""
    import uvicorn

    limits = limits or ConnectionLimits()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="auto",  # uvloop where it is installed (a dependency but on Windows)
        http=limited_protocol(limits),
        limit_concurrency=limits.max_connections + 1,  # the protocol refuses the one over
        timeout_keep_alive=limits.keep_alive_timeout,
        backlog=BACKLOG,
        log_level="warning",
        access_log=False,
    )

    class GracefulServer(uvicorn.Server):
        """uvicorn's server, whose graceful shutdown a second signal does not cut short:
        uvicorn took SIGINT during a shutdown as "force exit", skipped the app's shutdown
        (leaving the decision log undrained and unclosed: a Parquet log's queued rows lost)
        and printed the cancelled log writer's traceback. The shutdown lasts as long as the
        requests in flight take, bounded by ``--request-timeout``."""

        def __init__(self, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.repeated: set[int] = set()

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                super().handle_exit(sig, frame)  # re-raised once the server has stopped
            elif sig not in self.repeated:
                self.repeated.add(sig)
                logger.warning(
                    "%s while stopping: still answering the requests in flight and writing "
                    "the decision log",
                    signal.Signals(sig).name,
                )

    return GracefulServer(config)


def _url(address: Sequence[Any]) -> str:
    host, port = address[0], address[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class BackgroundServer:
    """``app`` on uvicorn in a thread, bound to ``host`` (``port`` 0: a free port); ``url`` is
    where it listens. Leaving the context stops it: requests in flight are answered, then the
    app's shutdown writes every decision to the log and closes it."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 60.0,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self.server = uvicorn_server(app, host, port, limits)
        self.start_timeout = start_timeout
        self.url = ""
        self._thread = threading.Thread(target=self.server.run, name="horizon-serve", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                self._thread.join()
                raise HorizonError("the decision server did not start (its log says why)")
            time.sleep(0.01)
        self.url = _url(self.server.servers[0].sockets[0].getsockname())
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join()


class _Stopped(Exception):
    """SIGINT or SIGTERM, raised once uvicorn has shut down gracefully and re-raised it."""


def _stopping() -> Any:
    """A handler for SIGINT and SIGTERM: the first one, re-raised by uvicorn once it has
    stopped, raises ``_Stopped``; one after it, while ``serve`` writes its last lines, is
    ignored rather than a traceback."""
    stopped_by: list[str] = []

    def stop(signum: int, frame: object) -> None:
        if not stopped_by:
            stopped_by.append(signal.Signals(signum).name)
            raise _Stopped(stopped_by[0])

    return stop


def _listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port``, made with protocol ``IPPROTO_TCP``: asyncio
    sets TCP_NODELAY on the connections it accepts only then, and without it every answer
    waited about 40 ms for the client's delayed acknowledgement."""
    family, kind, protocol, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    listening = socket.socket(family, kind, protocol)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(address)
    listening.listen(BACKLOG)
    return listening


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is this machine's loopback (a name that does not
    resolve is not)."""
    try:
        addresses = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return all(ipaddress.ip_address(address[4][0]).is_loopback for address in addresses)


def freeze_startup_objects() -> None:
    """Take every object alive now (the imports', the model's: some 50,000, none of them
    garbage) out of the garbage collector's reach, having collected startup's garbage first.

    The rows of a batch live across its awaits, so enough of them survive the young
    generations to start a full collection every few hundred requests at batch 64, and each
    full collection walked all of startup's objects: 15 to 40 ms with the event loop stopped
    (the whole of the p99's tail at batch 64) and a fifth of the server's CPU time
    (measured: docs/measurements.md#frozen_startup_objects). Process-wide, so only the command
    does it, not ``build_app``."""
    gc.collect()
    gc.freeze()


def keep_freed_memory() -> None:
    """Have glibc's malloc keep up to ``KEPT_FREE_BYTES`` of freed memory (a no-op where the C
    library is not glibc).

    A batch of a few hundred rows makes a thousand small ``bytes`` (orjson's output starts in a
    kilobyte and shrinks), which spread the heap by a megabyte or so; freed together, they left
    more than glibc's default 128 KiB free at the heap's top, which it handed back to the
    kernel, only to ask for it again, page faults and all, for the next batch: with the
    threshold raised, the server's system time at batch 64 fell from 2.2 s to 0.3 s in
    one measured run of 6,000 requests (measured: docs/measurements.md#kept_freed_memory).
    Setting it turns off glibc's moving of the threshold between the heap and a mapping of its
    own, so that is set too (``LARGEST_HEAP_ALLOCATION``)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no C library by that name, or not glibc
        return
    mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES)
    mallopt(M_MMAP_THRESHOLD, LARGEST_HEAP_ALLOCATION)


def serve(
    model: Path,
    flags: PolicyFlags,
    *,
    host: str,
    port: int,
    log_path: Path,
    seed: int,
    max_body_bytes: int,
    max_batch: int,
    target_send_rate: float | None,
    send_action: str | None,
    request_timeout: float = REQUEST_TIMEOUT,
    max_connections: int | None = None,
    keep_alive_timeout: int = KEEP_ALIVE_TIMEOUT,
    token: str | None = None,
    insecure: bool = False,
    strict_features: bool = False,
) -> None:
    """``horizon serve``: serve MODEL on ``host:port`` until SIGINT or SIGTERM, then exit
    once the requests in flight are answered and every answered decision is in the log
    (with status 1, saying why, when the model, the socket or the log fails, or when a host
    other than loopback is asked for without a token or ``insecure``)."""
    from horizon_plugins_serving.decision_log import open_decision_log
    from horizon_plugins_serving.predictor import Predictor, SendRateController

    try:
        if token is None and not insecure and not is_loopback(host):
            raise HorizonError(
                f"--host {host} takes requests from other machines: give a bearer token "
                "(--token-file PATH or HORIZON_SERVE_TOKEN) or, on a network you trust, "
                "--insecure"
            )
        limits = ConnectionLimits(
            request_timeout, connection_cap(max_connections, raise_file_limit()), keep_alive_timeout
        )
        predictor = Predictor(model, seed=seed, strict_features=strict_features, flags=flags)
        send_rate = None
        if target_send_rate is not None:
            send_rate = SendRateController(target_send_rate)
        elif send_action is not None:
            raise HorizonError("--send-action is for send/drop decisions: add --target-send-rate")
        log = open_decision_log(log_path)
        app = build_app(
            predictor,
            log,
            max_body_bytes=max_body_bytes,
            max_batch=max_batch,
            send_rate=send_rate,
            send_action=send_action,
            token=token,
        )
        listening = _listening_socket(host, port)
    except (HorizonError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    service: DecisionService = app.state.service
    click.echo(
        f"serving {model} (model_id {predictor.model_id}, policy {service.describe_policy()}) on "
        f"{_url(listening.getsockname())}; logging decisions to {log_path}"
    )
    click.echo(
        f"limits: {limits.max_connections} connections, {limits.request_timeout:g} s to send "
        f"a request, {max_body_bytes} bytes and {max_batch} rows a request; "
        + ("bearer token required" if token else "no token")
        + ("; rows without a known feature refused" if strict_features else "")
    )
    stop = _stopping()
    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    freeze_startup_objects()
    keep_freed_memory()
    stopped_by = "the server's end"
    try:  # the handlers stay until the last line: a late signal is ignored, not a traceback
        try:
            uvicorn_server(app, limits=limits).run(sockets=[listening])
        except _Stopped as exc:
            stopped_by = str(exc)
        _report_stop(service.writer, log_path, stopped_by)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _report_stop(writer: LogWriter, log_path: Path, stopped_by: str) -> None:
    """``serve``'s last line: what was logged, or, with status 1, how the log failed."""
    if writer.failure:
        click.echo(
            f"error: the decision log failed: {writer.failure}; {writer.logged} decisions "
            f"logged to {log_path}, {writer.lost} answered but not logged",
            err=True,
        )
        sys.exit(1)
    click.echo(f"stopped on {stopped_by}; decisions logged to {log_path}: {writer.logged}")
