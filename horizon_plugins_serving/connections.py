"""What ``horizon serve`` lets a connection take: time to send its request, a place among a
bounded number of connections, and file descriptors it cannot exhaust.

Without these a client sending its body at one byte a second held its connection for ever, and
1,100 such clients used up the process's file descriptors: ``accept`` failed in a loop, each
failure logged with its traceback, and the server answered nobody even after they left.

- **A deadline per request** (``ConnectionLimits.request_timeout``): a request must arrive whole,
  headers and body, within that many seconds of its first byte (of the connection's opening,
  for its first request). Past it the client gets ``408`` with a JSON reason and the connection
  is closed, and the one log line says so.
- **A cap on connections** (``max_connections``): at the cap, a newcomer sheds the connection
  furthest behind ``MIN_DATA_RATE`` since it opened or was last answered (stalled and idle ones:
  a minimum data rate, as Apache's mod_reqtimeout has), which gets ``408`` naming the cap; only
  when every connection has a request being answered is the newcomer answered ``503`` and
  closed at once, before it is read, so that it holds its file descriptor for no time. Refusing
  the newcomer whatever the others did let 1,100 stalled clients turn away ordinary requests.
- **A cap on the request head** (``MAX_HEAD_BYTES``): a request line and headers over 64 KiB get
  ``431`` (httptools has no limit: a 30 MB header was read whole).
- **A half-closed connection** (the client shut its writing side after sending its requests,
  pipelined or not) is answered, then closed; a client that closes before its answers costs
  one log line, not uvicorn's traceback a request.
- **File descriptors**: ``raise_file_limit`` lifts the process's soft limit to its hard one, and
  ``connection_cap`` keeps the cap, the listening socket's backlog (connections the kernel has
  accepted for us to take in one go) and ``RESERVED_FILES`` (the model, the log's part files,
  the libraries) within that limit, so that ``accept`` and the decision log never meet
  ``EMFILE``.

All of these live in ``limited_protocol``, a subclass of uvicorn's httptools protocol: uvicorn
times out an idle keep-alive connection but not a request being sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

from horizon_engine import HorizonError

REQUEST_TIMEOUT = 5.0
"""Seconds a client has to send a request whole (1 MiB at 200 kB/s)."""
MAX_CONNECTIONS = 1000
KEEP_ALIVE_TIMEOUT = 5
"""Seconds an idle keep-alive connection is kept open."""
BACKLOG = 512
"""Connections the kernel queues for us, which ``accept`` may take in one go."""
RESERVED_FILES = 128
"""File descriptors kept for everything but connections: the model, the log, libraries."""
MIN_DATA_RATE = 500
"""Bytes a second a connection waiting on its client is expected to send (Apache
mod_reqtimeout's ``MinRate``): at the cap, the one furthest behind it is shed for a newcomer."""
LINGER_SECONDS = 1.0
"""How long a connection refused while its client is still sending is read and dropped
before it is closed (``_close_with``)."""
MAX_HEAD_BYTES = 64 << 10
"""The largest request line and headers taken; over it, 431 (httptools sets no limit: a 30 MB
header was read whole)."""

logger = logging.getLogger("horizon.serve")


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a request may take to arrive, how many connections are served at once, and how
    long an idle keep-alive connection is kept."""

    request_timeout: float = REQUEST_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    keep_alive_timeout: int = KEEP_ALIVE_TIMEOUT


def raise_file_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # the soft limit stays; connection_cap fits the cap to it
    return soft


def connection_cap(requested: int | None, file_limit: int) -> int:
    """The connection cap that fits ``file_limit`` with the backlog and the reserve:
    ``requested`` when it fits (refused with the reason when not), else the largest that fits,
    at most ``MAX_CONNECTIONS``."""
    room = file_limit - BACKLOG - RESERVED_FILES
    if requested is not None and requested > room:
        raise HorizonError(
            f"--max-connections {requested} needs {requested + BACKLOG + RESERVED_FILES} file "
            f"descriptors and this process may open {file_limit} (ulimit -n): raise the limit "
            f"or lower --max-connections to {max(room, 0)} at most"
        )
    cap = requested if requested is not None else min(MAX_CONNECTIONS, room)
    if cap < 1:
        raise HorizonError(
            f"this process may open {file_limit} files (ulimit -n), too few to serve: "
            f"{BACKLOG + RESERVED_FILES + 1} at least"
        )
    return cap


def _answer(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


def limited_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with ``limits``' request deadline, head size cap and
    connection cap, answering a half-closed connection's requests (``eof_received``)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    too_many = _answer(
        503,
        "Service Unavailable",
        f"over the limit of {limits.max_connections} connections (--max-connections), each "
        "one busy with a request",
    )
    too_slow = _answer(
        408,
        "Request Timeout",
        f"the request did not arrive whole within {limits.request_timeout:g} s (--request-timeout)",
    )
    shed = _answer(
        408,
        "Request Timeout",
        f"closed to make room: the server was at its limit of {limits.max_connections} "
        f"connections (--max-connections) and this one had sent the least for longest "
        f"(under {MIN_DATA_RATE} bytes a second)",
    )
    head_too_large = _answer(
        431,
        "Request Header Fields Too Large",
        f"the request line and headers are over the limit of {MAX_HEAD_BYTES} bytes",
    )

    class LimitedProtocol(HttpToolsProtocol):
        """One connection: closed when a request is too slow or its head too large; at the
        cap, the connection furthest behind ``MIN_DATA_RATE`` is shed to let a newcomer in."""

        _deadline: asyncio.TimerHandle | None = None
        _since = 0.0
        """When this connection began waiting on its client: its opening, or its last answer."""
        _received = 0
        """Bytes received since ``_since``."""
        _head_bytes = 0
        """Bytes of the request head being read (``_in_head``), or 0."""
        _in_head = True
        _half_closed = False
        _lingering = False
        _running: Any = None
        """The request being answered (uvicorn's ``cycle`` is the newest, maybe queued)."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._since = self.loop.time()
            if not self._room():
                transport.write(too_many)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # read and dropped, so that closing sends no reset
            self._received += len(data)
            if self._in_head:
                self._head_bytes += len(data)
            if self._deadline is None:  # the first byte of a request
                self._arm()
            super().data_received(data)
            if (
                self._in_head
                and self._head_bytes > MAX_HEAD_BYTES
                and not self.transport.is_closing()
            ):
                self._close_with(
                    head_too_large, f"sent a request head over {MAX_HEAD_BYTES} bytes", linger=True
                )
                return
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not cycle.response_complete:
                self._disarm()  # read whole: answering it is the app's business

        def on_headers_complete(self) -> None:
            self._in_head, self._head_bytes = False, 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_head = True
            super().on_message_complete()

        def on_response_complete(self) -> None:
            self._since, self._received = self.loop.time(), 0
            super().on_response_complete()
            running = self._running
            if (
                self._half_closed
                and not self.pipeline
                and (running is None or running.response_complete)
                and not self.transport.is_closing()
            ):
                self._unset_keepalive_if_required()
                self.transport.close()  # the last answer the client waited for is written

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def eof_received(self) -> bool | None:
            """The client will send no more: answer the requests that arrived whole (a client
            may half-close after pipelining them), then close; with none, close now."""
            if self._lingering:
                return None
            newest = self.cycle
            if (
                newest is not None
                and newest.more_body
                and self.pipeline
                and self.pipeline[0][0] is newest
            ):
                self.pipeline.popleft()  # queued and never to arrive whole: dropped
            running = self._running
            if self.pipeline or (
                running is not None and not running.response_complete and not running.more_body
            ):
                self._half_closed = True
                return True  # keep the transport open to write the answers
            return None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            running = self._running
            unanswered = len(self.pipeline)
            if running is not None and not running.response_complete and not running.more_body:
                unanswered += 1
                # uvicorn marks only the newest request disconnected: an earlier one, being
                # answered, would write to the closed transport (a traceback a request).
                running.disconnected = True
                running.message_event.set()
            super().connection_lost(exc)
            if unanswered:
                logger.warning(
                    "%s closed its connection before %d answer(s) were sent",
                    self._who(),
                    unanswered,
                )

        def behind(self, now: float) -> float | None:
            """Seconds this connection is behind ``MIN_DATA_RATE`` since it began waiting on its
            client (opened, or answered); None when it is not waiting on its client (a request
            read whole is being answered or is queued) or is closing."""
            cycle = self.cycle
            if (
                self.transport.is_closing()
                or self.pipeline
                or (cycle is not None and not cycle.response_complete and not cycle.more_body)
            ):
                return None
            return now - self._since - self._received / MIN_DATA_RATE

        def _room(self) -> bool:
            """Whether this new connection may stay: under the cap, or at it once the
            connection furthest behind ``MIN_DATA_RATE`` (an idle or stalled one: slowloris
            clients, idle keep-alives) is shed. Refusing the newcomer instead, as the cap did,
            let 1,100 stalled clients turn away ordinary requests until their deadlines."""
            live = [
                other
                for other in self.connections
                if other is not self and not other.transport.is_closing()
            ]
            if len(live) < limits.max_connections:
                return True
            now = self.loop.time()
            lags = [(lag, other) for other in live if (lag := other.behind(now)) is not None]
            if not lags:
                return False
            lag, furthest = max(lags, key=lambda pair: pair[0])
            if lag <= 0:
                return False
            furthest._close_with(
                shed,
                f"was shed at the connection cap ({limits.max_connections}, --max-connections) "
                f"after sending {furthest._received} bytes in {now - furthest._since:.1f} s",
            )
            self.connections.discard(furthest)
            return True

        def _close_with(self, answer: bytes, why: str, linger: bool = False) -> None:
            """Answer ``answer`` (unless an answer is being written) and close, logging ``why``
            unless the app, reading the request's body, logs its end itself. With ``linger``,
            for a client still sending: end the writing side and drop what comes for up to
            ``LINGER_SECONDS`` before closing, since closing a socket with unread data sends a
            reset, and a reset discards the answer before the client reads it."""
            running = self._running
            if running is None or running.response_complete or not running.response_started:
                self.transport.write(answer)  # no answer is being written: this one may be
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                logger.warning("%s %s: closed", self._who(), why)
            self._disarm()
            if linger and self.transport.can_write_eof():
                self._lingering = True
                self.transport.write_eof()
                self.loop.call_later(LINGER_SECONDS, self.transport.close)
            else:
                self.transport.close()

        def _who(self) -> str:
            return "{}:{}".format(*self.client) if self.client else "a client"

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.request_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            self._close_with(
                too_slow,
                f"sent no whole request within {limits.request_timeout:g} s (--request-timeout)",
            )

    return LimitedProtocol
