"""Who sent a request (its tenant), and which tenants the metrics name (the busiest few).

**The tenant.** By default a keyed hash of the request's API key (``Authorization: Bearer KEY``):
HMAC-SHA256 under a secret of the proxy's, the first :data:`HASH_HEX` hex digits. The key itself is
read from the header, hashed and dropped: it is never stored, counted, logged, exported or put in an
error. A keyed hash, not a plain one: API keys can be guessed or leaked lists tried, and SHA-256 of a
key is a lookup table away from the key; without the secret the hash names no key. The secret comes
from a file (``--tenant-key-file``) or the environment (:data:`KEY_ENV`); without either, a random
one for this process, so tenant ids change when the proxy restarts (said in a warning). With
``--tenant-header NAME`` the tenant is that header's value instead (validated: :data:`HEADER_VALUE`,
other values count as :data:`~inferwatch.core.vocabulary.TENANT_OTHER`). No key, or no header:
:data:`~inferwatch.core.vocabulary.TENANT_ANONYMOUS`.

**The bound.** Every tenant goes on the request's span (the collector's rows: chargeback by
tenant), but a label value per tenant would make the ``llm_client_*`` series unbounded: clients pick
their keys. :class:`TopTenants` keeps at most ``top`` tenant values; every other request is counted
as ``other``. Which ones: first come while there is room, then every ``period`` the busiest by
requests (a space-saving counter of bounded size, decayed by half each period, so the ranking follows
the recent traffic), and a tenant that drops out has its series removed (Prometheus sees them end).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from inferwatch.core import vocabulary as V

log = logging.getLogger(__name__)

KEY_ENV: Final = "INFERWATCH_TENANT_KEY"
"""The environment variable holding the hash's secret (when no ``--tenant-key-file`` is given)."""
HASH_HEX: Final = 16
"""Hex digits of the keyed hash kept: 64 bits (birthday bound: among 100 million keys, two share an id with a
chance of about 3 in 10,000)."""
MIN_KEY_BYTES: Final = 16
MAX_KEY_BYTES: Final = 4096
DEFAULT_TOP: Final = 10
MAX_TOP: Final = 1000
DEFAULT_PERIOD_S: Final = 600.0
HEADER_VALUE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
"""A tenant header's value: 1-64 characters, letters, digits and ``._:@-``, starting with a letter or a digit
(a label value, a CSV cell and a log line all take it as it is)."""
HEADER_NAME: Final = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}")
"""RFC 9110 token, bounded."""
SECRET_HEADERS: Final = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})
"""Headers that hold credentials: never a tenant's name (it would go into metrics and spans as it is)."""
RESERVED: Final = frozenset({V.TENANT_ANONYMOUS, V.TENANT_OTHER})


class TenantKeyError(ValueError):
    """The hash's secret cannot be read, or is not fit to be one."""


@dataclass(frozen=True)
class TenantSettings:
    """How the proxy names tenants (``inferwatch proxy --tenant-*``)."""

    key: bytes | None = field(default=None, repr=False)
    """the secret of the keyed hash (never shown); None: a random one per process (with a warning)."""
    header: str | None = None
    """the tenant is this header's value instead of the API key's hash."""
    top: int = DEFAULT_TOP
    """tenant values the metrics keep (the rest are ``other``)."""
    period: float = DEFAULT_PERIOD_S
    """seconds between two rankings of the busiest tenants."""


def check_header_name(name: str) -> str:
    """``name`` as a tenant header (lowercase), or ValueError: a bounded token, and no credential header."""
    if not HEADER_NAME.fullmatch(name):
        raise ValueError(f"--tenant-header must be an HTTP header name (letters, digits, '-'), got {name[:70]!r}")
    if name.lower() in SECRET_HEADERS:
        raise ValueError(f"--tenant-header {name}: a header that holds credentials cannot name tenants")
    return name.lower()


def check_key(secret: bytes, source: str) -> bytes:
    """The secret as read from ``source`` (trailing whitespace and newline dropped), or TenantKeyError."""
    secret = secret.rstrip(b" \t\r\n")
    if len(secret) < MIN_KEY_BYTES:
        raise TenantKeyError(f"the tenant key from {source} is shorter than {MIN_KEY_BYTES} bytes")
    if len(secret) > MAX_KEY_BYTES:
        raise TenantKeyError(f"the tenant key from {source} is longer than {MAX_KEY_BYTES} bytes")
    return secret


def load_key(path: Path | None, environ: Mapping[str, str]) -> tuple[bytes | None, str]:
    """The hash's secret and where it came from: the file ``path``, else :data:`KEY_ENV`, else (None, "none").
    Errors name the file or the variable, never the secret."""
    if path is not None:
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_KEY_BYTES + 2)
        except OSError as exc:
            raise TenantKeyError(f"--tenant-key-file {path}: cannot read: {exc.strerror}") from None
        return check_key(raw, f"--tenant-key-file {path}"), "--tenant-key-file"
    value = environ.get(KEY_ENV)
    if value:
        return check_key(value.encode("utf-8", "surrogateescape"), KEY_ENV), KEY_ENV
    return None, "none"


def hashed(secret: bytes, api_key: str) -> str:
    """The tenant id of ``api_key``: HMAC-SHA256 under ``secret``, :data:`HASH_HEX` hex digits."""
    digest = hmac.new(secret, api_key.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
    return digest[:HASH_HEX]


def api_key(authorization: str) -> str | None:
    """The credential of an ``Authorization`` value: the token of ``Bearer TOKEN`` (any case), else the whole
    value (another scheme's credentials identify the client as well); None when empty."""
    value = authorization.strip()
    scheme, _, rest = value.partition(" ")
    if scheme.lower() == "bearer":
        value = rest.strip()
    return value or None


class Tenants:
    """The tenant of a request, from its headers (:meth:`of`)."""

    def __init__(self, settings: TenantSettings) -> None:
        self.header = check_header_name(settings.header) if settings.header else None
        self._secret = settings.key
        if self.header is None and self._secret is None:
            self._secret = secrets.token_bytes(32)
            log.warning(
                "no tenant key (--tenant-key-file or %s): tenant ids are hashed with a random key of this "
                "process and change when it restarts",
                KEY_ENV,
            )

    def of(self, headers: Mapping[str, str]) -> str:
        """The tenant id: the header's value (``other`` when not a valid one), or the API key's keyed hash;
        ``anonymous`` without either."""
        if self.header is not None:
            value = headers.get(self.header)
            if value is None or not value.strip():
                return V.TENANT_ANONYMOUS
            value = value.strip()
            return value if HEADER_VALUE.fullmatch(value) else V.TENANT_OTHER
        authorization = headers.get("Authorization")
        key = api_key(authorization) if authorization is not None else None
        if key is None:
            return V.TENANT_ANONYMOUS
        assert self._secret is not None
        return hashed(self._secret, key)


class TopTenants:
    """At most ``top`` tenant label values: first come while there is room, then the busiest by requests.

    A space-saving counter (Metwally et al., 2005) of ``capacity`` entries counts the requests per tenant:
    a tenant it does not hold takes the place of the least counted one, inheriting its count (recorded as
    the entry's possible overcount), so a tenant with more than 1/capacity of the requests is always held.
    Every ``period`` seconds (checked at each request) the tenants with the highest counts less overcount
    become the labelled ones and the counts are halved (once per period elapsed): the ranking follows the
    recent periods' traffic. Tenants no longer labelled go to ``on_evict`` (their series are removed).
    :data:`~inferwatch.core.vocabulary.TENANT_ANONYMOUS` and ``other`` are always their own value, outside
    the ``top``. Memory: ``capacity`` entries, whatever the number of tenants.
    """

    def __init__(
        self,
        top: int,
        period: float,
        *,
        capacity: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[set[str]], None] | None = None,
    ) -> None:
        if not 0 <= top <= MAX_TOP:
            raise ValueError(f"top must be within 0..{MAX_TOP}")
        if not period > 0:
            raise ValueError("period must be positive")
        self.top = top
        self.period = period
        self.capacity = capacity if capacity is not None else max(64, 8 * top)
        self.clock = clock
        self.on_evict = on_evict
        self.labelled: dict[str, None] = {}
        """the tenant values kept (insertion-ordered); mutated in place, so a reader may hold it."""
        self._counts: dict[str, int] = {}
        self._over: dict[str, int] = {}
        self._buckets: dict[int, dict[str, None]] = {}
        """count -> tenants with it (a stream summary: the least counted found without a scan)."""
        self._least = 0
        self._next = clock() + period

    def label(self, tenant: str) -> str:
        """The label value of one request of ``tenant`` (counted)."""
        if tenant in RESERVED:
            return tenant
        now = self.clock()
        if now >= self._next:
            self.rerank(now)
        self._count(tenant)
        if tenant in self.labelled:
            return tenant
        if len(self.labelled) < self.top:
            self.labelled[tenant] = None
            return tenant
        return V.TENANT_OTHER

    def kept(self, label: str) -> str:
        """``label`` if it is still a labelled value (or a reserved one) now, else ``other``."""
        return label if label in self.labelled or label in RESERVED else V.TENANT_OTHER

    def counts(self) -> dict[str, tuple[int, int]]:
        """tenant -> (count, possible overcount), as the counter holds them now (for tests and docs)."""
        return {t: (c, self._over[t]) for t, c in self._counts.items()}

    # -- the counter --------------------------------------------------------------------------------------
    def _move(self, tenant: str, old: int, new: int) -> None:
        if old:
            bucket = self._buckets[old]
            del bucket[tenant]
            if not bucket:
                del self._buckets[old]
        self._buckets.setdefault(new, {})[tenant] = None

    def _count(self, tenant: str) -> None:
        count = self._counts.get(tenant)
        if count is not None:
            self._counts[tenant] = count + 1
            self._move(tenant, count, count + 1)
            if count == self._least and count not in self._buckets:
                self._least = count + 1
            return
        if len(self._counts) < self.capacity:
            self._counts[tenant], self._over[tenant] = 1, 0
            self._move(tenant, 0, 1)
            self._least = 1
            return
        least = self._least
        victim = next(iter(self._buckets[least]))
        del self._counts[victim], self._over[victim]
        del self._buckets[least][victim]
        if not self._buckets[least]:
            del self._buckets[least]
        self._counts[tenant], self._over[tenant] = least + 1, least
        self._move(tenant, 0, least + 1)
        if least not in self._buckets:
            self._least = least + 1

    def _halve(self, times: int) -> None:
        """Every count (and overcount) divided by 2**times; the entries left at 0 go."""
        entries = [(t, c >> times, self._over[t] >> times) for t, c in self._counts.items()]
        self._counts, self._over, self._buckets = {}, {}, {}
        for tenant, count, over in entries:
            if count > 0:
                self._counts[tenant], self._over[tenant] = count, over
                self._buckets.setdefault(count, {})[tenant] = None
        self._least = min(self._buckets, default=0)

    # -- the ranking --------------------------------------------------------------------------------------
    def rerank(self, now: float) -> set[str]:
        """The busiest tenants become the labelled ones (ties: the labelled first); the counts halve once per
        period elapsed (those before the ranking, the last after it). Returns (and hands ``on_evict``) the
        tenants no longer labelled."""
        periods = min(63, 1 + int((now - self._next) // self.period))
        if periods > 1:  # idle periods since the last ranking: what was counted is that much older
            self._halve(periods - 1)
        incumbent = set(self.labelled)
        ranked = sorted(
            self._counts,
            key=lambda t: (self._counts[t] - self._over[t], self._counts[t], t in incumbent),
            reverse=True,
        )
        chosen = ranked[: self.top]
        evicted = incumbent - set(chosen)
        self.labelled.clear()
        self.labelled.update(dict.fromkeys(chosen))
        self._halve(1)
        self._next = now + self.period
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)
        return evicted
