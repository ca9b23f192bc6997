"""A fault-injecting TCP proxy on 127.0.0.1 for partition tests: forwards to a target until ``partition()``,
after which it blackholes (existing connections stop carrying bytes, with no RST, and new ones are
accepted but never forwarded), as a cut cable does; ``heal()`` forwards again for new connections.
Every thread and socket ends with ``close()``."""

from __future__ import annotations

import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, target: tuple[str, int] | None = None):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._partitioned = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def partition(self) -> None:
        self._partitioned.set()

    def heal(self) -> None:
        self._partitioned.clear()

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            if self._partitioned.is_set() or self.target is None:
                continue  # accepted, never answered: a blackhole
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.append(upstream)
            thread = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while not self._closed.is_set():
                for key, _ in sel.select(0.1):
                    try:
                        data = key.fileobj.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    if self._partitioned.is_set():
                        continue  # read and dropped: the peer sees silence, not a reset
                    try:
                        key.data.sendall(data)
                    except OSError:
                        return

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(5)
        with self._lock:
            for s in self._sockets:
                s.close()
