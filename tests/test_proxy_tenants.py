"""Tenants in ``inferwatch proxy``: the keyed hash of the API key (stable for a key and a secret, another for
another secret, never the key), the tenant header, anonymous requests, the secret's sources, and the bound on
the tenant label values (first come, then the busiest, re-ranked; the series of a tenant that drops out go).

In process: the proxy in a thread (``tests/support/proxy_harness.py``) in front of a fake upstream. The real
command in front of a simulated engine, 1,000 requests from 50 keys: ``tests/test_proxy_tenants_e2e.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from pathlib import Path

import httpx
import pytest
from multidict import CIMultiDict
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.core import vocabulary as V
from inferwatch.proxy.client_metrics import ClientMetrics, registry_for, render
from inferwatch.proxy.tenants import (
    KEY_ENV,
    TenantKeyError,
    Tenants,
    TenantSettings,
    TopTenants,
    api_key,
    check_header_name,
    hashed,
    load_key,
)
from inferwatch.proxy.tracing import TENANT
from tests.helpers import samples, value
from tests.support.proxy_harness import echo_upstream, running_proxy

SECRET = b"0123456789abcdef-the-tenant-secret"
OTHER_SECRET = b"another-secret-of-at-least-16-bytes"


def tenant_values(metrics: str) -> set[str]:
    """Every ``tenant`` label value on the proxy's llm_client_* series."""
    return {
        labels[V.LABEL_TENANT]
        for name, labels, _ in samples(metrics)
        if name.startswith("llm_client_") and V.LABEL_TENANT in labels
    }


# -- the tenant of a request ----------------------------------------------------------------------------------
def test_the_hash_is_stable_for_a_key_and_a_secret_and_differs_for_another_secret() -> None:
    key = "sk-live-4f1c2a"
    first = hashed(SECRET, key)
    assert first == hashed(SECRET, key)  # stable: the same tenant across requests and restarts with the secret
    assert first == hmac.new(SECRET, key.encode(), hashlib.sha256).hexdigest()[:16]
    assert len(first) == 16 and int(first, 16) >= 0
    assert hashed(OTHER_SECRET, key) != first  # another secret: another id (no lookup table across proxies)
    assert hashed(SECRET, key + "x") != first
    assert hashlib.sha256(key.encode()).hexdigest()[:16] != first  # keyed, not a plain digest of the key
    tenants = Tenants(TenantSettings(key=SECRET))
    for authorization in (f"Bearer {key}", f"bearer   {key} ", f"BEARER {key}"):
        assert tenants.of(CIMultiDict({"Authorization": authorization})) == first
    assert Tenants(TenantSettings(key=OTHER_SECRET)).of(CIMultiDict({"authorization": f"Bearer {key}"})) != first


def test_no_key_is_anonymous_and_other_schemes_are_hashed_whole() -> None:
    tenants = Tenants(TenantSettings(key=SECRET))
    assert tenants.of(CIMultiDict()) == V.TENANT_ANONYMOUS
    assert tenants.of(CIMultiDict({"Authorization": ""})) == V.TENANT_ANONYMOUS
    assert tenants.of(CIMultiDict({"Authorization": "Bearer "})) == V.TENANT_ANONYMOUS
    assert api_key("Basic dXNlcjpwYXNz") == "Basic dXNlcjpwYXNz"
    assert tenants.of(CIMultiDict({"Authorization": "Basic dXNlcjpwYXNz"})) == hashed(SECRET, "Basic dXNlcjpwYXNz")
    assert repr(TenantSettings(key=SECRET)).find(SECRET.decode()) < 0  # the settings never show the secret


def test_the_tenant_header_names_tenants_validated() -> None:
    tenants = Tenants(TenantSettings(header="X-Tenant"))
    assert tenants.of(CIMultiDict({"x-tenant": "team-a.prod:7@eu"})) == "team-a.prod:7@eu"
    assert tenants.of(CIMultiDict({"X-Tenant": "  team-b  "})) == "team-b"
    assert tenants.of(CIMultiDict({"Authorization": "Bearer k"})) == V.TENANT_ANONYMOUS  # the header, not the key
    assert tenants.of(CIMultiDict({"X-Tenant": " "})) == V.TENANT_ANONYMOUS
    for hostile in ("=cmd|' /C calc'!A0", "a" * 65, 'a"b', "a b", "t\u00e9", "-leading", "<script>", "a\\b"):
        assert tenants.of(CIMultiDict({"X-Tenant": hostile})) == V.TENANT_OTHER, hostile
    for secret_header in ("Authorization", "cookie", "X-Api-Key", "Proxy-Authorization"):
        with pytest.raises(ValueError, match="credentials"):
            check_header_name(secret_header)
    with pytest.raises(ValueError, match="header name"):
        check_header_name("X Tenant")


def test_the_secret_comes_from_the_file_then_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "tenant.key"
    path.write_bytes(SECRET + b"\n")
    assert load_key(path, {KEY_ENV: OTHER_SECRET.decode()}) == (SECRET, "--tenant-key-file")
    assert load_key(None, {KEY_ENV: OTHER_SECRET.decode()}) == (OTHER_SECRET, KEY_ENV)
    assert load_key(None, {}) == (None, "none")
    short = tmp_path / "short.key"
    short.write_bytes(b"tiny-secret\n")
    with pytest.raises(TenantKeyError) as exc:
        load_key(short, {})
    assert "shorter than 16 bytes" in str(exc.value) and "tiny-secret" not in str(exc.value)
    with pytest.raises(TenantKeyError, match=KEY_ENV) as exc:
        load_key(None, {KEY_ENV: "tiny-secret"})
    assert "tiny-secret" not in str(exc.value)
    with pytest.raises(TenantKeyError, match="cannot read"):
        load_key(tmp_path / "missing.key", {})


def test_without_a_secret_a_random_one_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="inferwatch.proxy.tenants"):
        one, two = Tenants(TenantSettings()), Tenants(TenantSettings())
    assert "change when it restarts" in caplog.text and KEY_ENV in caplog.text
    headers = CIMultiDict({"Authorization": "Bearer sk-abc"})
    assert one.of(headers) == one.of(headers) != two.of(headers)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="inferwatch.proxy.tenants"):
        Tenants(TenantSettings(header="X-Tenant"))  # no hash: no secret needed
    assert not caplog.text


# -- the bound ------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_first_come_then_the_busiest_by_requests() -> None:
    clock = Clock()
    evicted: list[set[str]] = []
    top = TopTenants(2, 60.0, clock=clock, on_evict=evicted.append)
    assert [top.label(t) for t in ("a", "b", "c", "a", "c")] == ["a", "b", V.TENANT_OTHER, "a", V.TENANT_OTHER]
    assert top.label(V.TENANT_ANONYMOUS) == V.TENANT_ANONYMOUS  # always its own value, outside the top
    for _ in range(10):
        top.label("c")
    assert top.label("c") == V.TENANT_OTHER  # no ranking before the period ends
    clock.now += 60
    assert top.label("c") == "c"  # the period ended: c (12) and a (2) are the busiest, b (1) drops out
    assert evicted == [{"b"}] and set(top.labelled) == {"a", "c"}
    assert top.label("b") == V.TENANT_OTHER
    assert top.kept("b") == V.TENANT_OTHER and top.kept("a") == "a" and top.kept(V.TENANT_ANONYMOUS) != V.TENANT_OTHER
    # the counts halve at each ranking: a busy newcomer overtakes within a period or two
    assert top.counts()["c"] == (7, 0)  # 13 // 2 (halved at the ranking), then this request
    for _ in range(20):
        top.label("d")
    clock.now += 60
    top.label("d")
    assert set(top.labelled) == {"c", "d"} and evicted[-1] == {"a"}
    clock.now += 600  # ten idle periods: the counts halve ten times (to nothing)
    top.label("e")
    assert set(top.labelled) == {"e"}  # nobody left counted but e: first come fills the room again
    assert top.label("f") == "f" and top.label("g") == V.TENANT_OTHER


def test_the_counter_is_bounded_and_keeps_the_heavy_hitters() -> None:
    """Space-saving: 200,000 distinct tenants (one request each) never hold more than ``capacity`` entries, and
    a tenant with more than 1/capacity of the requests is always among them, ranked first."""
    clock = Clock()
    top = TopTenants(3, 60.0, clock=clock, capacity=64)
    for i in range(200_000):
        top.label(f"noise-{i}")
        if i % 20 == 0:
            top.label("heavy-1")
        if i % 25 == 0:
            top.label("heavy-2")
    assert len(top.counts()) <= 64
    counts = top.counts()
    assert counts["heavy-1"][0] - counts["heavy-1"][1] > 0 and "heavy-2" in counts
    clock.now += 60
    top.label("heavy-1")
    assert {"heavy-1", "heavy-2"} <= set(top.labelled)
    with pytest.raises(ValueError, match="top"):
        TopTenants(1001, 60)


def test_client_metrics_forget_a_tenant_that_dropped_out() -> None:
    clock = Clock()
    top = TopTenants(1, 60.0, clock=clock)
    metrics = ClientMetrics("vllm", V.Vocabulary(), top.kept)
    top.on_evict = metrics.forget
    label_a = top.label("a")
    metrics.observe(V.CLIENT_TIME_TO_FIRST_TOKEN, "m", 0.1, label_a)
    metrics.finished("m", V.OUTCOME_STOP, 1.0, (5, False), (7, False), label_a)
    metrics.finished("m", V.OUTCOME_STOP, 1.0, None, (1, True), top.label("b"))
    text = render(registry_for(metrics, process=False)).decode()
    assert tenant_values(text) == {"a", V.TENANT_OTHER}
    assert value(text, V.CLIENT_PROMPT_TOKENS.name, tenant="a", model="m", estimated=V.FALSE) == 5
    for _ in range(3):
        top.label("b")
    clock.now += 60
    assert top.label("b") == "b"  # b is the busiest now: a's series go
    metrics.finished("m", V.OUTCOME_STOP, 1.0, None, None, label_a)  # a request of a that began before: other
    text = render(registry_for(metrics, process=False)).decode()
    assert tenant_values(text) == {V.TENANT_OTHER}
    assert value(text, V.CLIENT_REQUESTS.name, tenant=V.TENANT_OTHER) == 2


# -- through the proxy ------------------------------------------------------------------------------------------
def test_the_proxy_labels_its_metrics_and_spans_by_tenant() -> None:
    keys = [f"sk-test-key-{i}-3b7e9a" for i in range(5)]
    settings = TenantSettings(key=SECRET, top=2)
    with echo_upstream() as echo, running_proxy(echo.url, tenants=settings) as run:
        for i, key in enumerate(keys):
            for _ in range(i + 1):
                r = httpx.post(
                    run.url + "/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {key}"}
                )
                assert r.status_code == 207
        httpx.post(run.url + "/v1/chat/completions", json={"model": "m"})  # no key
        text = run.metrics()
        records = run.records(16)
        assert echo.requests[0][2]["authorization"] == [f"Bearer {keys[0]}"]  # passed on unchanged
    ids = [hashed(SECRET, k) for k in keys]
    assert tenant_values(text) == {ids[0], ids[1], V.TENANT_OTHER, V.TENANT_ANONYMOUS}  # first come: keys 0 and 1
    assert value(text, V.CLIENT_REQUESTS.name, tenant=V.TENANT_OTHER) == 3 + 4 + 5
    assert value(text, V.CLIENT_REQUEST_DURATION.name + "_count", tenant=ids[1]) == 2
    # every tenant on the spans (the collector's rows: chargeback), never a key
    expected = [ids[i] for i in range(5) for _ in range(i + 1)] + [V.TENANT_ANONYMOUS]
    assert sorted(r.tenant or "" for r in records) == sorted(expected)
    assert all(TENANT not in r.attributes for r in records)
    for key in keys:
        assert key not in text and all(key not in repr(r) for r in records)


def test_the_proxy_reranks_and_drops_the_series_of_a_tenant_that_dropped_out() -> None:
    settings = TenantSettings(header="X-Team", top=1, period=1.0)
    with echo_upstream() as echo, running_proxy(echo.url, tenants=settings) as run:

        def send(team: str | None) -> None:
            headers = {"X-Team": team} if team else {}
            httpx.post(run.url + "/v1/chat/completions", json={"model": "m"}, headers=headers)

        send("early")
        for _ in range(3):
            send("busy")
        send(None)
        send("=SUM(A1)")
        assert tenant_values(run.metrics()) == {"early", V.TENANT_OTHER, V.TENANT_ANONYMOUS}
        time.sleep(1.1)
        send("busy")
        text = run.metrics()
        records = run.records(7)
    assert tenant_values(text) == {"busy", V.TENANT_OTHER, V.TENANT_ANONYMOUS}
    assert value(text, V.CLIENT_REQUESTS.name, tenant="busy") == 1  # its earlier requests stay in other
    expected = ["early", *["busy"] * 4, V.TENANT_ANONYMOUS, V.TENANT_OTHER]
    assert sorted(r.tenant or "" for r in records) == sorted(expected)


def test_the_command_refuses_bad_tenant_options(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["proxy", "--upstream", "http://127.0.0.1:9"]
    short = tmp_path / "short.key"
    short.write_text("tiny-secret\n")
    cases = [
        (["--tenant-top", "1001"], "--tenant-top"),
        (["--tenant-top", "-1"], "--tenant-top"),
        (["--tenant-period", "0"], "--tenant-period"),
        (["--tenant-header", "Authorization"], "credentials"),
        (["--tenant-header", "bad header"], "header name"),
        (["--tenant-key-file", str(short)], "shorter than 16 bytes"),
        (["--tenant-key-file", str(tmp_path / "none")], "cannot read"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*base, *args], env={KEY_ENV: ""})
        assert result.exit_code == 2, (args, result.output)
        assert message in " ".join(result.output.split()), (args, result.output)
        assert "tiny-secret" not in result.output
    result = runner.invoke(app, ["proxy", "--help"], env={"COLUMNS": "200"})
    assert KEY_ENV in result.output and "--tenant-top" in result.output and "default: 10" in result.output


def test_a_key_file_with_a_tenant_header_is_refused() -> None:
    """The key file keys the hash of API keys; with a header naming the tenant it would be silently unused."""
    from typer.testing import CliRunner

    from inferwatch.cli import app

    args = ["proxy", "--upstream", "http://127.0.0.1:1", "--tenant-header", "x-tenant", "--tenant-key-file", "k"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "with --tenant-header the header names the tenant" in " ".join(result.output.split())
