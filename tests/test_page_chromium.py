"""A hostile incident page in headless Chromium: no script runs, no link leaves http(s), the style still applies.

An Alertmanager notification whose alert name, labels, annotations and runbook URL carry the payloads of
:mod:`tests.support.hostile` (``<script>``, ``<img onerror>``, SVG ``onload``, quotes that try to leave an
attribute, ``javascript:`` and ``data:`` URLs) opens an incident on a collector served on 127.0.0.1. Chromium
(over the DevTools protocol, :mod:`tests.support.chromium`) opens the page with its signed key and a probe
reads back what ran: every payload would set the title to ``PWNED-…`` and add a ``pwned-…`` element.

Three more loads of the same page, answered by the test itself, separate the two defences: the page
without its policy (the escaping alone runs nothing); the page with a script and an ``onerror`` handler
injected, with its policy (the policy alone blocks them, and says so in the log); the same injection
without the policy, the control: there the probe sees the payloads run, so the probe can see it. A last
load renders the unit tests' incident (hostile findings, requests, deliveries and dashboard URLs as well)
under the page's policy: nothing runs, and the phase bars keep their widths (classes of the stylesheet).

The API documentation has its own policy: ``/docs`` and ``/redoc`` load with stand-ins for the CDN's
Swagger UI and ReDoc (no network here) and start under it: the CDN script, FastAPI's inline script (by
hash), a blob worker and the fetch of ``/openapi.json`` are allowed, and nothing is reported blocked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferwatch.collector.api.app import create_app
from inferwatch.collector.incidents.enrich import incident_key
from inferwatch.collector.incidents.page import render
from inferwatch.collector.settings import CollectorSettings
from tests.conftest import served_in_thread
from tests.support.alertmanager import alert, notification
from tests.support.chromium import Browser, Loaded, chromium_binary, running_chromium
from tests.support.hostile import ALL_MARKUP, MARKUP, NOW, PROBE, SAFE_TAGS, URLS, hostile_detail, js

READ_TOKEN = "read-token-for-the-test"
FIRING_RED = "rgb(211, 47, 47)"
"""``.firing{background:#d32f2f}``: the badge has it only when the page's stylesheet applied."""
INJECTED = f'<script>{js("injected")}</script><img src=x onerror="{js("onerror")}">'
SERVED_URL = "https://incident.test/incidents/1"
"""where the test answers the page itself (the Fetch domain; no server, no DNS)."""
SWAGGER_STANDIN = b"""window.SwaggerUIBundle = function (config) {
  fetch(config.url).then(r => r.json()).then(spec => { document.title = 'started: ' + spec.info.title; });
  return {};
};
SwaggerUIBundle.presets = {apis: {}};
SwaggerUIBundle.SwaggerUIStandalonePreset = {};
"""
REDOC_STANDIN = b"""const spec = document.querySelector('redoc').getAttribute('spec-url');
const worker = new Worker(URL.createObjectURL(new Blob(['postMessage(1)'], {type: 'text/javascript'})));
worker.onmessage = () => fetch(spec).then(r => r.json()).then(s => { document.title = 'started: ' + s.info.title; });
"""
CDN = {
    "https://cdn.jsdelivr.net/*.js": (b"", {"content-type": "text/javascript"}),
    "https://cdn.jsdelivr.net/*.css": (b"body{margin:0}", {"content-type": "text/css"}),
    "https://fonts.googleapis.com/*": (b"", {"content-type": "text/css"}),
    "https://fastapi.tiangolo.com/*": (b"", {"content-type": "image/png"}),
}
TITLE_PROBE = "JSON.stringify(document.title)"


@dataclass
class Served:
    base: str
    url: str
    """the page with its signed key."""
    title: str
    """the incident's title, as the read API returns it."""
    body: bytes
    headers: dict[str, str]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("hostile-page")
    settings = CollectorSettings(
        data_dir=tmp / "collector",
        grpc_listen=None,
        read_tokens=[READ_TOKEN],
        grafana_url="https://grafana.example",
        public_url="https://inferwatch.example",
    )
    labels = {f"label_{i}": v for i, v in enumerate(MARKUP.values())}
    labels.update({"engine": MARKUP["dquote"], "model": MARKUP["script"], "severity": "page"})
    body: dict[str, Any] = alert(ALL_MARKUP, labels, starts=NOW - timedelta(minutes=2))
    body["annotations"] = {"summary": ALL_MARKUP, "description": MARKUP["svg"], "runbook_url": URLS["javascript"]}
    body["generatorURL"] = URLS["data"]
    group = {"alertname": ALL_MARKUP, "model": MARKUP["script"]}
    auth = {"Authorization": f"Bearer {READ_TOKEN}"}
    with served_in_thread(create_app(settings)) as base, httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/api/v1/alerts/webhook", json=notification([body], group=group))
        assert r.status_code == 200, r.text
        incident = int(r.json()["incidents"][0])
        deadline = time.monotonic() + 30
        detail = client.get(f"/api/v1/incidents/{incident}", headers=auth).json()
        while detail["enrichment_state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
            detail = client.get(f"/api/v1/incidents/{incident}", headers=auth).json()
        assert detail["enrichment_state"] == "done", detail
        assert detail["enrichment"]["runbook_url"] == URLS["javascript"]  # the hostile URL did reach the page
        url = f"{base}/incidents/{incident}?key={incident_key(settings.link_key(), incident)}"
        page = client.get(url)
        assert page.status_code == 200
        headers = {k: page.headers[k] for k in ("content-type", "content-security-policy") if k in page.headers}
        yield Served(base, url, detail["title"], page.content, headers)


def load_all(served: Served, workdir: Path) -> dict[str, Loaded]:
    """The five loads, in one browser."""
    injected = served.body.replace(b"</main>", INJECTED.encode() + b"</main>")
    assert injected != served.body
    bare = {"content-type": served.headers["content-type"]}
    rendered = render(hostile_detail(), now=NOW).encode()

    async def run() -> dict[str, Loaded]:
        async with running_chromium(chromium_binary(), workdir) as browser:
            return {
                "collector": await browser.load(served.url, PROBE),
                "no-policy": await load(browser, served.body, bare),
                "injected": await load(browser, injected, served.headers),
                "control": await load(browser, injected, bare),
                "rendered": await load(browser, rendered, served.headers),
                "docs": await docs(browser, f"{served.base}/docs", SWAGGER_STANDIN),
                "redoc": await docs(browser, f"{served.base}/redoc", REDOC_STANDIN),
            }

    return asyncio.run(run())


async def load(browser: Browser, body: bytes, headers: dict[str, str]) -> Loaded:
    return await browser.load(SERVED_URL, PROBE, serve={SERVED_URL: (body, headers)})


async def docs(browser: Browser, url: str, standin: bytes) -> Loaded:
    scripts = {"https://cdn.jsdelivr.net/*.js": (standin, {"content-type": "text/javascript"})}
    return await browser.load(url, TITLE_PROBE, serve={**CDN, **scripts}, settle_s=1.0)


@pytest.fixture(scope="module")
def loads(served: Served, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Loaded]:
    started = time.monotonic()
    found = load_all(served, tmp_path_factory.mktemp("chromium"))
    assert time.monotonic() - started < 30, "the browser part must stay under 30 s"
    return found


def assert_ran_nothing(page: Loaded, title: str) -> None:
    probe = page.probe
    assert probe["pwned"] == [] and probe["title"] == f"{title} · inferwatch", page.url
    assert probe["handlers"] == [] and probe["sources"] == []
    assert set(probe["tags"]) <= SAFE_TAGS | {"tbody"}, set(probe["tags"]) - SAFE_TAGS  # tbody: the parser adds it
    assert probe["anchors"], "the dashboards are links"
    for href in probe["anchors"]:
        assert href.startswith(("http://", "https://")), href
    for name, payload in MARKUP.items():  # shown as text, not dropped
        assert payload.strip() in probe["text"] or name == "close-tag", name
    assert URLS["javascript"] in probe["text"]


def test_the_collector_page_runs_nothing(loads: dict[str, Loaded], served: Served) -> None:
    page = loads["collector"]
    assert_ran_nothing(page, served.title)
    assert page.probe["badge"] == FIRING_RED, "the page's stylesheet did not apply under its policy"
    assert page.policy_violations() == []


def test_the_escaping_alone_runs_nothing(loads: dict[str, Loaded], served: Served) -> None:
    assert_ran_nothing(loads["no-policy"], served.title)


def test_the_policy_alone_blocks_an_injected_script(loads: dict[str, Loaded], served: Served) -> None:
    page = loads["injected"]
    assert page.probe["pwned"] == [] and page.probe["title"] == f"{served.title} · inferwatch"
    assert page.probe["badge"] == FIRING_RED
    violations = "\n".join(page.policy_violations())
    assert "inline script" in violations and "inline event handler" in violations, page.log


def test_the_probe_sees_a_script_run(loads: dict[str, Loaded]) -> None:
    """The control: the same injection without the policy runs, so the probe would have seen it above."""
    probe = loads["control"].probe
    assert set(probe["pwned"]) == {"pwned-injected", "pwned-onerror"}
    assert probe["title"].startswith("PWNED-")


def test_every_hostile_field_under_the_policy(loads: dict[str, Loaded]) -> None:
    page = loads["rendered"]
    assert_ran_nothing(page, ALL_MARKUP)
    assert page.probe["badge"] == FIRING_RED and page.policy_violations() == []
    assert page.probe["bars"] == [[25, 25, 25, 25]]  # the request's four phases, a quarter each


@pytest.mark.parametrize("page", ["docs", "redoc"])
def test_the_api_docs_start_under_their_policy(loads: dict[str, Loaded], page: str) -> None:
    assert loads[page].probe == "started: inferwatch collector", loads[page].log
    assert loads[page].policy_violations() == []
