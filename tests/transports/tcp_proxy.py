"""A TCP forwarder between a receiver and a sender's control socket, for fault tests: it can reset
every connection through it (RST, as a middlebox or a peer's kernel would) or hold new ones off."""

from __future__ import annotations

import selectors
import socket
import struct
import threading


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port) on a thread of its own."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.resets = 0
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._selector.select(0.05):
                with self._lock:
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.fileobj in self._pairs:
                        self._forward(key.fileobj)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        upstream = socket.create_connection(self.target, timeout=5)
        for sock in (client, upstream):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ)
        self._pairs[client], self._pairs[upstream] = upstream, client

    def _forward(self, sock: socket.socket) -> None:
        other = self._pairs[sock]
        try:
            data = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(sock)
            return
        try:
            other.setblocking(True)
            other.sendall(data)
            other.setblocking(False)
        except OSError:
            self._close(sock)

    def _close(self, sock: socket.socket, *, rst: bool = False) -> None:
        other = self._pairs.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self._pairs.pop(s, None)
            try:
                self._selector.unregister(s)
            except (KeyError, ValueError):
                pass
            if rst:  # SO_LINGER 0: close() sends RST, not FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def reset(self) -> int:
        """Reset every connection through the proxy (both sides get RST); how many were reset."""
        with self._lock:
            clients = {s for s in self._pairs}
            count = len(clients) // 2
            while self._pairs:
                self._close(next(iter(self._pairs)), rst=True)
            self.resets += count
        return count

    def hold(self) -> None:
        """Accept no new connection until :meth:`release`: a client's connect completes in the
        kernel's backlog and what it sends waits there (its handshake and first frames, in order)."""
        with self._lock:
            self._selector.unregister(self.listener)

    def release(self) -> None:
        """Forward the connections :meth:`hold` kept waiting, and new ones."""
        with self._lock:
            self._selector.register(self.listener, selectors.EVENT_READ)

    def connections(self) -> int:
        with self._lock:
            return len(self._pairs) // 2

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        with self._lock:
            while self._pairs:
                self._close(next(iter(self._pairs)), rst=True)
        self._selector.close()
        self.listener.close()
