"""A TCP proxy for fault injection: forwards 127.0.0.1:<port> to a target, and can go silent.

``silence()`` stops forwarding in both directions while every connection stays open: the proxy's
kernel keeps acknowledging what the client sends, nothing reaches the server and nothing comes back,
which is what a database behind a broken NAT, a dead load balancer or a partitioned network looks
like from the client (TCP keepalives are answered, the connection never errors). New connections
are accepted and held the same way. ``resume()`` lets the held bytes through and forwarding go on;
``cut()`` closes every connection (a hard failure the client sees at once).

Threads, no asyncio: usable from synchronous tests and next to an app served in a thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

POLL_S = 0.05
CHUNK = 65536


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class TcpProxy:
    """``with TcpProxy(host, port) as proxy:`` listens on ``proxy.port`` (loopback, a free port)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.accepted = 0
        self._spawn(self._accept_loop, "proxy-accept")

    # --- control ---

    @property
    def silent(self) -> bool:
        return not self._flowing.is_set()

    def silence(self) -> None:
        """Stop forwarding (both ways); connections stay open, new ones are accepted and held."""
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again, the held bytes first."""
        self._flowing.set()

    def cut(self) -> None:
        """Close every open connection (the listener stays)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def close(self) -> None:
        self._stop.set()
        self._flowing.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        for thread in list(self._threads):
            thread.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    @property
    def connections(self) -> int:
        with self._lock:
            return sum(1 for p in self._pairs if not p.closed.is_set())

    # --- the threads ---

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.settimeout(POLL_S)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
                self.accepted += 1
            self._spawn(self._pump, "proxy-up", pair, client, upstream)
            self._spawn(self._pump, "proxy-down", pair, upstream, client)

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        held = bytearray()
        try:
            while not pair.closed.is_set() and not self._stop.is_set():
                if held and self._flowing.is_set():
                    dst.sendall(held)
                    held.clear()
                if not self._flowing.is_set() and len(held) >= 4 * CHUNK:
                    pair.closed.wait(POLL_S)  # hold at most this much: the sender's buffers fill up then
                    continue
                try:
                    data = src.recv(CHUNK)
                except TimeoutError:
                    continue
                if not data:
                    break
                held += data
        except OSError:
            pass
        finally:
            pair.close()


@contextlib.contextmanager
def proxied(host: str, port: int) -> Iterator[TcpProxy]:
    proxy = TcpProxy(host, port)
    try:
        yield proxy
    finally:
        proxy.close()
