"""A TCP proxy a test can cut: a store server that goes away and comes back.

``TcpProxy(port).start()`` listens on 127.0.0.1 at a port of its own and forwards each
connection to ``port``. ``cut()`` closes every connection through it and stops
listening (a new connection is refused, as by a server that is down); ``restore()``
listens on the same port again. Used by the writer's tests to give one job a PostgreSQL
store that is unreachable for a while, the other jobs keeping theirs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

ACCEPT_POLL_S = 0.1


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0  # chosen at the first start, kept across cuts
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._listener: threading.Thread | None = None

    def start(self) -> TcpProxy:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        server.settimeout(ACCEPT_POLL_S)  # so that cut() ends the accept loop promptly
        self.port = server.getsockname()[1]
        self._listening.set()
        self._listener = threading.Thread(target=self._accept, args=(server,), daemon=True)
        self._listener.start()
        return self

    def url(self, url: str) -> str:
        """``url`` (a server on 127.0.0.1 at the target port) through the proxy."""
        parts = urlsplit(url)
        netloc = parts.netloc.replace(f":{self.target_port}", f":{self.port}")
        return urlunsplit(parts._replace(netloc=netloc))

    def cut(self) -> None:
        """Drop every connection and refuse new ones until ``restore``."""
        self._listening.clear()
        if self._listener is not None:
            self._listener.join()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._sockets.clear()

    def restore(self) -> None:
        self.start()

    def close(self) -> None:
        self.cut()

    def _accept(self, server: socket.socket) -> None:
        with server:
            while self._listening.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target_port))
                except OSError:
                    client.close()
                    continue
                with self._lock:
                    self._sockets.update((client, upstream))
                for src, dst in ((client, upstream), (upstream, client)):
                    threading.Thread(target=_pump, args=(src, dst), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes one way until either side closes; then close the other side too."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for sock in (src, dst):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
