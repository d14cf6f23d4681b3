"""Debian's ``haproxy`` as a real HTTP load balancer in front of services on loopback, for end-to-end tests.

:func:`haproxy_binary` finds the binary (skips without it, fails under ``CI``); :class:`BalancerConfig`
renders a configuration (HTTP mode, round robin, an HTTP health check, short timeouts, a stats page);
:class:`HAProxy` checks the file with ``haproxy -c``, runs ``haproxy -db`` (foreground) as a child of a
:class:`~tests.support.stack.Processes`, which stops it with the rest, and reads the servers' states and
counters from the stats page's CSV.

Every answer relayed from a server carries ``X-Served-By: <server name>``, so a client can tell which
replica answered it.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.stack import Processes

SERVED_BY = "X-Served-By"
BACKEND = "replicas"
SBIN_DIRS = ("/usr/sbin", "/sbin")
"""Where Debian installs haproxy; not on every user's PATH."""


def haproxy_binary() -> str:
    """Path of the haproxy binary; skip without it, but fail when ``CI`` is set."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    path = shutil.which("haproxy", path=search)
    if path is None:
        message = "haproxy not found (Debian package 'haproxy'; `make system-deps` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message + " and CI is set: this test must not be skipped")
        pytest.skip(message)
    return path


@dataclass(frozen=True)
class Server:
    name: str
    port: int
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class BalancerConfig:
    """One HTTP frontend on 127.0.0.1:``port`` balancing round robin over ``servers``; stats on ``stats_port``.

    Retries: haproxy re-sends a request only when ``retry_on`` says so; the default, ``conn-failure``, is a
    connection to the server that could not be established, so the request never reached it and sending it
    elsewhere (``redispatch``) is safe for any request. Conditions such as ``empty-response`` or ``503`` replay
    a request a server may already have acted on (a POST included): only for idempotent services, and only
    bodies that fit haproxy's buffer can be replayed at all.
    """

    port: int
    stats_port: int
    servers: Sequence[Server]
    check_path: str = "/readyz"
    check_interval_ms: int = 250
    fall: int = 2
    """failed checks before a server is marked DOWN."""
    rise: int = 2
    """passed checks before a DOWN server is marked UP again."""
    connect_timeout_ms: int = 500
    server_timeout_s: float = 12.0
    """longest wait for a server's answer: above the service's own deadline, so its answer (e.g. a 503 with
    Retry-After) reaches the client rather than haproxy's 504."""
    client_timeout_s: float = 15.0
    queue_timeout_s: float = 5.0
    server_maxconn: int = 64
    """requests in flight per server; more wait in haproxy's queue (instead of meeting the server's own cap)."""
    retries: int = 2
    retry_on: str = "conn-failure"
    redispatch: bool = True

    def render(self) -> str:
        servers = "\n".join(f"    server {s.name} {s.host}:{s.port} check" for s in self.servers)
        redispatch = "    option redispatch 1\n" if self.redispatch else ""
        return f"""\
global
    log stderr format raw local0 info
    maxconn 1024

defaults
    mode http
    log global
    option httplog
    option dontlognull
    option dontlog-normal
    timeout connect {self.connect_timeout_ms}ms
    timeout client {self.client_timeout_s:g}s
    timeout server {self.server_timeout_s:g}s
    timeout http-request {self.client_timeout_s:g}s
    timeout http-keep-alive 10s
    timeout queue {self.queue_timeout_s:g}s
    retries {self.retries}
    retry-on {self.retry_on}
{redispatch}
frontend ingest
    bind 127.0.0.1:{self.port}
    default_backend {BACKEND}

backend {BACKEND}
    balance roundrobin
    option httpchk
    http-check send meth GET uri {self.check_path}
    http-check expect status 200
    default-server inter {self.check_interval_ms}ms fastinter {self.check_interval_ms}ms \
downinter {self.check_interval_ms}ms fall {self.fall} rise {self.rise} maxconn {self.server_maxconn}
    http-response set-header {SERVED_BY} %[srv_name]
{servers}

frontend stats
    bind 127.0.0.1:{self.stats_port}
    stats enable
    stats uri /stats
    stats refresh 1s
"""


class HAProxy:
    """haproxy with ``config``, its file under ``workdir``, run by ``procs`` as ``name``."""

    def __init__(
        self, procs: Processes, binary: str, config: BalancerConfig, workdir: Path, name: str = "haproxy"
    ) -> None:
        self.procs = procs
        self.binary = binary
        self.config = config
        self.name = name
        self.path = workdir / f"{name}.cfg"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    @property
    def stats_url(self) -> str:
        return f"http://127.0.0.1:{self.config.stats_port}/stats"

    def start(self, timeout: float = 10.0) -> None:
        """Write and check the configuration, start haproxy in the foreground, wait for its stats page."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.config.render())
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(self.path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refuses {self.path.name}:\n{check.stdout}{check.stderr}")
        self.procs.spawn(self.name, [self.binary, "-db", "-f", str(self.path)])
        self.procs.wait_http(self.name, self.stats_url, timeout)

    def servers(self) -> dict[str, dict[str, str]]:
        """The backend's servers by name: the stats CSV row of each (``status`` UP/DOWN/…, ``stot`` sessions,
        ``wretr`` retries, ``wredis`` redispatches, ``econ`` connection errors, ``hrsp_2xx``…)."""
        text = httpx.get(f"{self.stats_url};csv", timeout=5).text.removeprefix("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {
            row["svname"]: row
            for row in rows
            if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def status(self, server: str) -> str:
        """UP, DOWN, or a transition such as ``UP 1/2`` / ``DOWN 1/2``."""
        return self.servers()[server]["status"]

    def wait_status(self, server: str, status: str, timeout: float = 15.0) -> float:
        """Until ``server`` is ``status`` (UP or DOWN, transitions excluded); the seconds it took."""
        start = time.monotonic()
        while True:
            current = self.status(server)
            if current == status:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"haproxy: {server} still {current!r}, not {status} after {timeout:g} s")
            time.sleep(0.05)

    def wait_all(self, status: str = "UP", timeout: float = 15.0) -> None:
        for server in self.config.servers:
            self.wait_status(server.name, status, timeout)
