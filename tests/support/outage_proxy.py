"""A TCP proxy on loopback in front of a Ray dashboard, whose outages a test switches on and off.

What a client of the Jobs API sees during an outage of each kind (:data:`KINDS`):

- ``refused``: nothing listens on the port (the dashboard restarting, a head pod rescheduled);
- ``reset``: the connection is accepted, then reset;
- ``timeout``: the connection is accepted and never answered;
- ``502`` / ``503`` / ``504``: every request is answered with that status (an ingress or gateway
  whose backend is away, or in a rollout);
- ``500``: Ray's own answer while the head has no agent to run a job ("... try again later").

``fatal`` is not an outage: every request is answered ``500`` with an error that retrying cannot
fix, for tests that check such an answer is not retried.

Starting an outage cuts every open connection (keep-alive requests, a job's log stream), as a
restart does. Everything else is forwarded byte for byte, websockets included.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator

KINDS = ("refused", "reset", "timeout", "502", "503", "504", "500")
_REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_BODIES = {
    "500": b"No available agent to submit job, please try again later.",
    "fatal": b"Unexpected error: the job's runtime_env could not be parsed.",
}


class OutageProxy:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>``; a context manager.

    :attr:`faults` counts, by kind, the connections that met an outage (``refused`` counts
    outages, as refused connections never reach the proxy).
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.kind: str | None = None
        self.faults: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> OutageProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.kind = "closed"
        self._stop_listening()
        self._cut()

    def start_outage(self, kind: str) -> None:
        """From now on, connections meet ``kind``; open ones are cut."""
        if kind not in (*KINDS, "fatal"):
            raise ValueError(f"unknown outage kind {kind!r}: one of {KINDS} or 'fatal'")
        self.kind = kind
        if kind == "refused":
            self.faults[kind] += 1
            self._stop_listening()
        self._cut()

    def end_outage(self) -> None:
        """Forward again (on the same port)."""
        refused, self.kind = self.kind == "refused", None
        self._cut()  # connections held open by a ``timeout`` outage
        if refused:
            self._listen()

    @contextlib.contextmanager
    def outage(self, kind: str) -> Iterator[None]:
        self.start_outage(kind)
        try:
            yield
        finally:
            self.end_outage()

    def outage_after(self, delay_s: float, kind: str, duration_s: float) -> threading.Thread:
        """An outage of ``kind`` from ``delay_s`` from now, for ``duration_s``, in a thread (returned, started)."""

        def run() -> None:
            time.sleep(delay_s)
            with self.outage(kind):
                time.sleep(duration_s)

        thread = threading.Thread(target=run, name="outage", daemon=True)
        thread.start()
        return thread

    # --- sockets ------------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="outage-proxy", daemon=True).start()

    def _stop_listening(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def _track(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._open.update(sockets)

    def _cut(self) -> None:
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            _reset(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: an outage of kind ``refused``, or the end
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        kind = self.kind
        if kind is None:
            self._forward(client)
            return
        self.faults[kind] += 1
        if kind == "reset" or kind == "closed":
            _reset(client)
        elif kind == "timeout":
            self._track(client)  # held, unanswered, until the outage ends
        else:
            status = 500 if kind == "fatal" else int(kind)
            body = _BODIES.get(kind, f"<html><body>{status} {_REASONS[status]}</body></html>".encode())
            with contextlib.suppress(OSError):
                _read_head(client)
                client.sendall(
                    f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
            client.close()

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        self._track(client, upstream)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        _reset(sink)


def _read_head(sock: socket.socket) -> None:
    """Read a request's status line and headers (its body, if any, is dropped with the connection)."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return
        data += chunk


def _reset(sock: socket.socket) -> None:
    """Cut the connection: the peer's pending request fails with no reply.

    A reset (linger 0) where the socket can be closed at once; the shutdown first, because a
    close alone does not reach a socket that another thread is blocked reading (a pipe's).
    """
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
