"""The incident page made of hostile alerts runs nothing, without a browser (tests/test_page_chromium.py has one).

The page is rendered from an incident whose every alert-derived field carries a payload of
:mod:`tests.support.hostile`; its HTML, parsed as a browser would, holds no element, attribute or link
the page does not emit itself, and every payload comes back as text. The link rule: only absolute
``http``/``https`` URLs become links, anything else is shown as text. The collector's HTML answers carry a
strict Content-Security-Policy (the page's own stylesheet allowed by its hash, nothing else),
``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and ``frame-ancestors 'none'``;
FastAPI's ``/docs`` and ``/redoc`` have their own policy, which allows their inline scripts by hash only.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from inferwatch.collector.api.app import create_app
from inferwatch.collector.incidents.markup import web_url
from inferwatch.collector.incidents.page import render
from inferwatch.collector.settings import CollectorSettings
from tests.support.alertmanager import alert, notification
from tests.support.hostile import ALL_MARKUP, MARKUP, NOW, URLS, audit, hostile_detail

READ_TOKEN = "read-token-for-the-test"


def test_a_hostile_incident_renders_as_text() -> None:
    page = render(hostile_detail(), now=NOW)
    found = audit(page)
    assert found.problems == []
    for name, payload in MARKUP.items():
        assert payload in found.text, f"the {name!r} payload is not shown as text"
    # the hostile runbook is shown, not linked; so is every hostile dashboard URL
    assert URLS["javascript"] in found.text
    assert all(u.startswith(("http://", "https://")) for u in found.hrefs)


@pytest.mark.parametrize("name", [n for n in URLS if not n.startswith("breakout")])
def test_only_http_urls_become_links(name: str) -> None:
    url = URLS[name]
    found = audit(render(hostile_detail(runbook=url, dashboards=[url]), now=NOW))
    assert found.problems == [] and found.hrefs == []
    assert found.text.count(url) >= 2, "the runbook and the dashboard URL are shown as text"


@pytest.mark.parametrize(
    "url",
    [
        "https://runbooks.example/ops.md#preemptions",
        "http://grafana:3000/d/x?var-model=a&var-engine=b",
        "HTTPS://Example.COM/a",
        URLS["breakout"],
        URLS["breakout-squote"],
    ],
)
def test_http_urls_are_links_and_stay_in_their_attribute(url: str) -> None:
    page = render(hostile_detail(runbook=url, dashboards=[url]), now=NOW)
    found = audit(page)
    assert found.problems == []
    assert found.hrefs == [url, url]  # the whole URL, decoded from its attribute: nothing broke out
    assert f'href="{html.escape(url)}"' in page


def test_the_page_has_no_inline_style_attribute() -> None:
    """The policy allows the page's ``<style>`` by hash; a ``style=`` attribute would need 'unsafe-inline'."""
    page = render(hostile_detail(), now=NOW)
    assert " style=" not in page
    found = audit(page)
    assert len(found.styles) == 1
    assert 'class="bar"' in page and "w25" in page  # the phase bars keep their widths, as classes


# --- headers ---------------------------------------------------------------------------------------------------------


def policy(header: str) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            directives[words[0]] = words[1:]
    return directives


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=None, read_tokens=[READ_TOKEN])
    with TestClient(create_app(settings)) as c:
        yield c


def hostile_incident(client: TestClient) -> int:
    labels = {"engine": MARKUP["script"], "model": MARKUP["dquote"], "severity": "page"}
    body: dict[str, Any] = alert(ALL_MARKUP, labels, starts=NOW - timedelta(minutes=2))
    body["annotations"] = {"summary": ALL_MARKUP, "runbook_url": URLS["javascript"]}
    r = client.post(
        "/api/v1/alerts/webhook", json=notification([body], group={"alertname": ALL_MARKUP, "x": MARKUP["img"]})
    )
    assert r.status_code == 200, r.text
    return int(r.json()["incidents"][0])


def assert_base_headers(headers: Any) -> None:
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"


def test_the_incident_page_sends_a_strict_policy(client: TestClient) -> None:
    incident = hostile_incident(client)
    r = client.get(f"/incidents/{incident}", headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert_base_headers(r.headers)
    assert r.headers["x-frame-options"] == "DENY"
    csp = policy(r.headers["content-security-policy"])
    (style,) = re.findall(r"<style>(.*?)</style>", r.text, re.S)
    assert csp == {
        "default-src": ["'none'"],
        "style-src": [sha256_source(style)],
        "base-uri": ["'none'"],
        "form-action": ["'none'"],
        "frame-ancestors": ["'none'"],
    }
    assert audit(r.text).problems == []


def test_every_answer_says_nosniff_and_no_referrer(client: TestClient) -> None:
    for path in ("/incidents/1", "/incidents/99", "/api/v1/incidents", "/openapi.json", "/healthz"):
        r = client.get(path)
        assert_base_headers(r.headers)
    r = client.get("/incidents/1", headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_the_api_docs_have_their_own_policy(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert_base_headers(r.headers)
    csp = policy(r.headers["content-security-policy"])
    assert csp["default-src"] == ["'none'"] and csp["frame-ancestors"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"] and csp["object-src"] == ["'none'"]
    scripts = csp["script-src"]
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
    inline = re.findall(r"<script>(.*?)</script>", r.text, re.S)
    assert inline or path == "/redoc"
    for body in inline:  # FastAPI's own inline scripts are allowed by their hash, nothing else inline
        assert sha256_source(body) in scripts


@pytest.mark.parametrize(
    ("url", "linked"),
    [
        ("http://a.example", True),
        ("https://a.example/b?c=d&e=f#g", True),
        ("HTTPS://A.EXAMPLE/", True),
        ("https://a.example/\"'<>", True),  # escaped in its attribute, see above
        (None, False),
        ("", False),
        ("https://", False),
        ("http:/a.example", False),
        ("//a.example/x", False),
        ("/incidents/1", False),
        (" https://a.example", False),  # a browser strips it; the rule does not guess
        ("https://a.example/x y", False),
        ("https://a.example/\tx", False),
        ("https://a.example/\nx", False),
        ("https://a.example/\x00", False),
        ("https://a.example/\u2028", False),
        ("ftp://a.example/", False),
        ("javascript://a.example/%0aalert(1)", False),
        *((url, False) for name, url in URLS.items() if not name.startswith("breakout")),
    ],
)
def test_the_link_rule(url: str | None, linked: bool) -> None:
    assert (web_url(url) is not None) is linked
