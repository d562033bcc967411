"""A fault-injecting HTTP proxy for object-store servers on loopback (moto S3, Azurite, the GCS emulator).

It stands between a client library (s3fs, adlfs, gcsfs) and the server and does to chosen
requests what real object stores do under load or failure:

- ``error_after``: forward the request (the store applies it), then answer an error (500 by
  default): the client cannot tell that it happened;
- ``drop_after``: forward the request, then close the connection without a reply (a lost reply);
- ``error`` / ``throttle``: answer an error (503 SlowDown for ``throttle``) without forwarding;
- ``reset``: close the connection without forwarding (a reset before the store saw it);
- ``delay``: wait, then forward.

Requests are chosen by :class:`Rule`: a method, a regular expression on the path (query string
included), which matching requests (from the ``after``-th on, ``times`` of them), or a seeded
probability (:meth:`FaultProxy.random_faults`, for soaks). Every request and every fault applied
is logged in :attr:`FaultProxy.requests` / :attr:`FaultProxy.applied`, so a test can assert that
the fault it meant to inject really happened.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: Fault kinds that reach the store before failing: their outcome is unknown to the client.
AMBIGUOUS = ("error_after", "drop_after")
#: Fault kinds that fail before the store sees the request.
BEFORE = ("error", "throttle", "reset")
KINDS = (*AMBIGUOUS, *BEFORE, "delay")

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


@dataclass
class Rule:
    """Which requests get a fault, and which fault.

    :param kind: one of :data:`KINDS`.
    :param method: HTTP method to match (None: any).
    :param path: regular expression searched in the request's path and query (None: any).
    :param after: matching requests let through before the first fault.
    :param times: faults to apply at most (None: every matching request from ``after`` on).
    :param status: the error status (``error``, ``error_after``); ``throttle`` answers 503.
    :param delay_s: seconds to wait (``delay``).
    :param probability: the chance that a matching request gets the fault (drawn from the proxy's seeded RNG).
    """

    kind: str
    method: str | None = None
    path: str | None = None
    after: int = 0
    times: int | None = 1
    status: int = 500
    delay_s: float = 0.0
    probability: float = 1.0
    matched: int = 0
    applied: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}: one of {KINDS}")

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or re.search(self.path, path) is not None
        )


@dataclass
class FaultProxy:
    """A proxy on 127.0.0.1 in front of ``target`` (``http://127.0.0.1:PORT``); a context manager.

    :param target: the server's base URL.
    :param seed: the RNG seed for probabilistic rules.
    """

    target: str
    seed: int = 0
    rules: list[Rule] = field(default_factory=list)
    #: (method, path, fault kind or None) of every request, in order of arrival.
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = urlsplit(self.target)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, kind: str, **kwargs) -> Rule:
        """Add a :class:`Rule`; returns it (its ``applied`` counts the faults it made)."""
        rule = Rule(kind, **kwargs)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def random_faults(self, rate: float, kinds: tuple[str, ...] = (*AMBIGUOUS, *BEFORE), method: str | None = None):
        """Fault a share ``rate`` of all requests (or of ``method``'s), each with a kind drawn at random."""
        for kind in kinds:
            self.add(kind, method=method, times=None, probability=rate / len(kinds))

    @property
    def applied(self) -> list[tuple[str, str, str]]:
        """(method, path, kind) of every request that got a fault."""
        return [(m, p, k) for m, p, k in self.requests if k is not None]

    def _choose(self, method: str, path: str) -> Rule | None:
        with self._lock:
            chosen = None
            for rule in self.rules:
                if not rule.matches(method, path):
                    continue
                rule.matched += 1
                if chosen is not None or rule.matched <= rule.after:
                    continue
                if rule.times is not None and rule.applied >= rule.times:
                    continue
                if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                    continue
                rule.applied += 1
                chosen = rule
            self.requests.append((method, path, chosen.kind if chosen else None))
            return chosen


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    # The status line and headers, then the body, go out as separate small writes: with Nagle's
    # algorithm the body waits for the client's delayed ACK, about 40 ms on every request.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._body()
        rule = self.owner._choose(self.command, self.path)
        kind = rule.kind if rule else None
        if kind in ("reset",):
            self._drop()
            return
        if kind in ("error", "throttle"):
            status = 503 if kind == "throttle" else rule.status
            self._answer(status, _SLOW_DOWN if kind == "throttle" else _INTERNAL)
            return
        if kind == "delay":
            time.sleep(rule.delay_s)
        status, headers, payload = self._forward(body)
        if kind == "drop_after":
            self._drop()
            return
        if kind == "error_after":
            self._answer(rule.status, _INTERNAL)
            return
        self.send_response(status)
        head = self.command == "HEAD"  # its Content-Length is the object's, with no body
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and (head or name.lower() != "content-length"):
                self.send_header(name, value)
        if not head:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not head:
            self.wfile.write(payload)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.owner._host, self.owner._port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST", "PATCH"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _answer(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _drop(self) -> None:
        # A reset, not an orderly close: the client sees its request fail with no reply.
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle
