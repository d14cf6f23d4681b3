"""Open HTTP connections of one server, bounded: what the collector and the proxy share against slow clients.

A slowloris client opens connections and sends its request a byte at a time: each one holds a file
descriptor, and a server that counts connections against its concurrency cap (uvicorn's
``limit_concurrency``) answers everyone else 503 for as long as the dribblers stay. The servers bound them in
two ways:

- **time**: a request's line and headers must arrive within a deadline (the header timeout), its body
  within another, and an idle keep-alive connection is closed after a third (each server arms them on its
  own protocol: :mod:`inferwatch.collector.api.slowclients`, :mod:`inferwatch.proxy.limits`);
- **count** (:class:`ConnectionGate`): at most ``limit`` connections are open, fewer than the file descriptors
  the process may open (:func:`connection_cap`). At the cap a new connection makes room by closing the one
  that has been *waiting* longest: idle between two requests, or still sending its request's head. A
  connection whose request is being received or answered is never closed for another; when every open
  connection has one, the new connection is refused (the server answers it 503 and closes it).

So dribblers compete only with each other, and a health check, whose head arrives in one packet, always
finds a place. A request cap (the collector's ``max_requests``) counts requests being handled, not
connections.
"""

from __future__ import annotations

from typing import Final, Protocol

FD_RESERVE: Final = 256
"""File descriptors kept for what is not a client connection: the database, the spool, logs, worker pipes."""
MIN_CONNECTIONS: Final = 32
MAX_AUTO_CONNECTIONS: Final = 16_384


class Member(Protocol):
    """A connection the gate may close to make room for a new one."""

    def evict(self) -> None: ...


class ConnectionGate:
    """The open connections of one server, at most :attr:`limit`; those waiting for a request in the order they
    began to wait (oldest first)."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the connection limit must be positive, got {limit}")
        self.limit = limit
        self.members: set[Member] = set()
        self._waiting: dict[Member, None] = {}
        self.evicted = 0
        """connections closed to make room, since the start."""
        self.refused = 0
        """connections refused (every open connection had a request in progress), since the start."""

    @property
    def open(self) -> int:
        return len(self.members)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(self, member: Member) -> bool:
        """A new connection: joins (and waits for its request) when there is room, made by closing the oldest
        waiting connection at the cap; ``False`` when every open connection has a request in progress."""
        if len(self.members) >= self.limit:
            if not self._waiting:
                self.refused += 1
                return False
            oldest = next(iter(self._waiting))
            self.leave(oldest)
            self.evicted += 1
            oldest.evict()
        self.members.add(member)
        self._waiting[member] = None
        return True

    def wait(self, member: Member) -> None:
        """``member`` has no request in progress (its last answer ended): it may be closed for a newcomer."""
        if member in self.members:
            self._waiting.pop(member, None)
            self._waiting[member] = None  # the newest waiter

    def busy(self, member: Member) -> None:
        """A request's head arrived on ``member``: it is not closed for another until it waits again."""
        self._waiting.pop(member, None)

    def leave(self, member: Member) -> None:
        """``member`` closed (or is being closed); calling it twice is harmless."""
        self.members.discard(member)
        self._waiting.pop(member, None)


def fd_limit() -> int | None:
    """The process's soft limit of open file descriptors (``ulimit -n``); ``None`` where there is none."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(fds_per_connection: int = 1, limit: int | None = None) -> int:
    """The default connection cap: what the file descriptor limit leaves after :data:`FD_RESERVE`, divided by the
    descriptors one connection uses (a proxied connection holds two: the client's and the engine's), between
    :data:`MIN_CONNECTIONS` and :data:`MAX_AUTO_CONNECTIONS`. Below it the server closes or refuses connections
    itself, before ``accept`` or a connection to the engine fails for want of descriptors."""
    fds = fd_limit() if limit is None else limit
    if fds is None:
        return MAX_AUTO_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_AUTO_CONNECTIONS, (fds - FD_RESERVE) // fds_per_connection))
