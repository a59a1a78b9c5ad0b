"""What ``horizon serve`` lets a connection take: time to send its request, a place among a
bounded number of connections, and file descriptors it cannot exhaust.

Without these a client sending its body at one byte a second held its connection for ever, and
1,100 such clients used up the process's file descriptors: ``accept`` failed in a loop, each
failure logged with its traceback, and the server answered nobody even after they left.

- **A deadline per request** (``ConnectionLimits.request_timeout``): a request must arrive whole,
  headers and body, within that many seconds of its first byte (of the connection's opening,
  for its first request). Past it the client gets ``408`` with a JSON reason and the connection
  is closed, and the one log line says so.
- **A cap on connections** (``max_connections``): a connection beyond it is answered ``503`` and
  closed at once, before it is read, so that it holds its file descriptor for no time.
- **File descriptors**: ``raise_file_limit`` lifts the process's soft limit to its hard one, and
  ``connection_cap`` keeps the cap, the listening socket's backlog (connections the kernel has
  accepted for us to take in one go) and ``RESERVED_FILES`` (the model, the log's part files,
  the libraries) within that limit, so that ``accept`` and the decision log never meet
  ``EMFILE``.

The deadline and the cap live in ``limited_protocol``, a subclass of uvicorn's httptools
protocol: uvicorn times out an idle keep-alive connection but not a request being sent.
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
    """uvicorn's httptools protocol with ``limits``' request deadline and connection cap."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    too_many = _answer(
        503,
        "Service Unavailable",
        f"over the limit of {limits.max_connections} connections (--max-connections)",
    )
    too_slow = _answer(
        408,
        "Request Timeout",
        f"the request did not arrive whole within {limits.request_timeout:g} s (--request-timeout)",
    )

    class LimitedProtocol(HttpToolsProtocol):
        """One connection: refused when over the cap, closed when a request is too slow."""

        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(too_many)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None:  # the first byte of a request
                self._arm()
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not cycle.response_complete:
                self._disarm()  # read whole: answering it is the app's business

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

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
            cycle = self.cycle
            if cycle is None or not cycle.response_started:
                self.transport.write(too_slow)
            if cycle is None or cycle.response_complete:  # else the app, reading it, logs it
                client = "{}:{}".format(*self.client) if self.client else "a client"
                logger.warning(
                    "%s sent no whole request within %g s (--request-timeout): closed",
                    client,
                    limits.request_timeout,
                )
            self.transport.close()

    return LimitedProtocol
