"""The exporter follows an engine's redirects only within the engine's origin unless told otherwise.

An engine (or whatever answers on its address) that redirects a scrape to another scheme, host or
port would make the exporter fetch, and re-expose as the engine's metrics, whatever lives there: an
internal service the exporter can reach and Prometheus cannot. By default (``same-origin``) such a
redirect is refused and the target is down with ``reason="redirect"``; ``none`` refuses every
redirect, ``any`` follows every one (still at most five). Fake engines bind 127.0.0.1
(tests/support/fake_engines.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import EngineRegistry
from tests.conftest import ENGINE_FIXTURES, free_port
from tests.helpers import value
from tests.support import fake_engines as fake
from tests.test_exporter_hardening import assert_down, assert_up, make_exporter

CAPTURE = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt"


@pytest.fixture(scope="module")
def real_page() -> bytes:
    return CAPTURE.read_bytes()


def scrape(registry: EngineRegistry, url: str, **target: object) -> str:
    exporter = make_exporter(registry, url, **target)
    try:
        return exporter.metrics()
    finally:
        exporter.stop(grace=1)


@pytest.mark.parametrize("elsewhere", ["other-port", "other-host", "other-scheme"])
def test_a_redirect_to_another_origin_is_refused_by_default(
    registry: EngineRegistry, real_page: bytes, elsewhere: str
) -> None:
    """Before, the exporter fetched the other origin and served its page as the engine's (up 1)."""
    with fake.FakeEngine({"/metrics": fake.page(real_page)}) as other:
        port = other.url.rsplit(":", 1)[1]
        location = {
            "other-port": other.url + "/metrics",
            "other-host": f"http://localhost:{port}/metrics",
            "other-scheme": "",  # filled in below: https on the engine's own host and port
        }[elsewhere]
        with fake.FakeEngine({}) as engine:
            if elsewhere == "other-scheme":
                location = engine.url.replace("http://", "https://") + "/metrics"
            engine.routes["/metrics"] = fake.redirect(location)
            text = scrape(registry, engine.url + "/metrics")
        assert other.hits.get("/metrics", 0) == 0, "the exporter fetched the other origin"
    assert_down(text, V.SCRAPE_ERROR_REDIRECT)


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_a_same_origin_redirect_is_followed_by_default(
    registry: EngineRegistry, real_page: bytes, absolute: bool
) -> None:
    with fake.FakeEngine({"/metrics/": fake.page(real_page)}) as engine:
        engine.routes["/metrics"] = fake.redirect((engine.url if absolute else "") + "/metrics/")
        text = scrape(registry, engine.url + "/metrics")
    assert_up(text)
    assert value(text, V.PROMPT_TOKENS.name) == 5610


def test_any_follows_a_redirect_to_another_origin(registry: EngineRegistry, real_page: bytes) -> None:
    with fake.FakeEngine({"/metrics": fake.page(real_page)}) as other:
        with fake.FakeEngine({"/metrics": fake.redirect(other.url + "/metrics")}) as engine:
            text = scrape(registry, engine.url + "/metrics", follow_redirects="any")
        assert other.hits["/metrics"] == 1
    assert_up(text)


def test_none_refuses_even_a_same_origin_redirect(registry: EngineRegistry, real_page: bytes) -> None:
    with fake.FakeEngine({"/metrics/": fake.page(real_page), "/metrics": fake.redirect("/metrics/")}) as engine:
        text = scrape(registry, engine.url + "/metrics", follow_redirects="none")
        assert engine.hits.get("/metrics/", 0) == 0
    assert_down(text, V.SCRAPE_ERROR_REDIRECT)


def test_a_redirect_loop_is_bounded(registry: EngineRegistry) -> None:
    with fake.FakeEngine({"/a": fake.redirect("/b"), "/b": fake.redirect("/a")}) as engine:
        text = scrape(registry, engine.url + "/a")
        assert engine.hits["/a"] + engine.hits["/b"] <= 6
    assert_down(text, V.SCRAPE_ERROR_REDIRECT)


def test_the_policy_is_a_flag_and_a_config_field(registry: EngineRegistry, tmp_path: Path) -> None:
    from inferwatch.cli.exporter import _serve_config

    url = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "exporter.yaml"
    path.write_text(f"targets:\n  - {{url: '{url}', follow_redirects: none}}\n")
    no_flags: dict[str, object] = {"follow_redirects": None}
    (target,) = _serve_config(registry, path, None, "auto", None, None, {}, no_flags).targets
    assert target.follow_redirects == "none"
    flag: dict[str, object] = {"follow_redirects": "any"}
    (target,) = _serve_config(registry, path, None, "auto", None, None, {}, flag).targets
    assert target.follow_redirects == "any"
    (target,) = _serve_config(registry, None, [url], "auto", None, None, {}, no_flags).targets
    assert target.follow_redirects == "same-origin"
    with pytest.raises(typer.Exit):
        _serve_config(registry, None, [url], "auto", None, None, {}, {"follow_redirects": "sometimes"})
