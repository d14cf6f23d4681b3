"""Every engine the core registers has every part of the checklist, docs/adding-an-engine.md.

The engines are those of :func:`inferwatch.core.engines.builtin_profiles`; each part is looked up in
its own registry (the exporters', the simulator's, the span sources', the proxy's, the fixtures on
disk, the coverage matrix), never in a list kept here, so a new engine missing a part fails with a
message naming the part and the checklist's step. The dashboards and the rules, which read the
canonical vocabulary only, must name no engine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from inferwatch.collector.ingest.sources import SOURCES, genai
from inferwatch.core import vocabulary as V
from inferwatch.core.config import SimEngine
from inferwatch.core.engines import builtin_profiles
from inferwatch.exporters.coverage import matrix
from inferwatch.exporters.engines import builtin_registry
from inferwatch.proxy.apis import ENGINE_APIS, ENGINE_UPSTREAM
from inferwatch.simulator import server as simulator
from tests.conftest import ENGINE_FIXTURES, ROOT, fixture_dirs
from tests.support.fixtures import fixture_payloads, load_fixture_meta
from tests.tiers import COMPONENTS

CHECKLIST = ROOT / "docs" / "adding-an-engine.md"
PROFILES = builtin_profiles()
ENGINES = sorted(PROFILES)
STEPS = {
    "reference": "1. The reference",
    "profile": "2. Core profile",
    "adapter": "3. Exporter adapter",
    "source": "4. Span source",
    "simulator": "5. Simulator",
    "proxy": "6. Proxy",
    "fixtures": "7. Fixtures and goldens",
    "coverage": "8. Coverage row",
    "compose": "9. Compose stack and demo",
    "tests": "10. Tests and docs",
    "unchanged": "11. Dashboards and rules do not change",
}
"""Part → the heading of its step in the checklist."""
NO_SOURCE_HEADING = "### Engines without a span source of their own"
SIMULATOR_DIR = ROOT / "inferwatch" / "simulator" / "engines"


def missing(engine: str, what: str, step: str) -> str:
    return f"engine {engine!r}: {what}; see docs/adding-an-engine.md, step {STEPS[step]!r}"


def without_span_source() -> dict[str, str]:
    """Engine → why it has no span source module, from the checklist's table."""
    lines = CHECKLIST.read_text().splitlines()
    start = lines.index(NO_SOURCE_HEADING)
    rows = {}
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        match = re.match(r"\|\s*`([^`]+)`\s*\|([^|]*)\|", line)
        if match:
            rows[match.group(1)] = match.group(2).strip()
    return rows


def span_sources() -> set[str]:
    """The engines with a span source module (``genai`` is everyone's, no engine's)."""
    return {source.NAME for source in SOURCES} - {genai.NAME}


def compose_services(path: Path) -> set[str]:
    return set(yaml.safe_load(path.read_text()).get("services") or {})


def test_the_checklist_has_every_step() -> None:
    headings = {line.removeprefix("## ") for line in CHECKLIST.read_text().splitlines() if line.startswith("## ")}
    assert set(STEPS.values()) <= headings, set(STEPS.values()) - headings
    assert without_span_source(), f"{NO_SOURCE_HEADING} lists no engine"


def test_no_registry_holds_an_engine_the_core_does_not_register() -> None:
    """Step 2 comes first: every engine any registry knows has a core profile."""
    fixtures = {d.relative_to(ENGINE_FIXTURES).parts[0] for d in fixture_dirs()}
    registries = {
        "V.ENGINES (inferwatch/core/vocabulary.py)": set(V.ENGINES),
        "builtin_registry() (inferwatch/exporters/engines/__init__.py)": set(builtin_registry().names()),
        "ENGINES (inferwatch/simulator/server.py)": set(simulator.ENGINES),
        "SimEngine (inferwatch/core/config.py)": set(get_args(SimEngine)),
        "SOURCES (inferwatch/collector/ingest/sources/__init__.py)": span_sources(),
        "ENGINE_APIS (inferwatch/proxy/apis.py)": set(ENGINE_APIS),
        "ENGINE_UPSTREAM (inferwatch/proxy/apis.py)": set(ENGINE_UPSTREAM),
        "tests/fixtures/engines/": fixtures,
        NO_SOURCE_HEADING: set(without_span_source()),
    }
    strays = [
        missing(engine, f"in {registry} but has no core profile in builtin_profiles()", "profile")
        for registry, engines in registries.items()
        for engine in sorted(engines - PROFILES.keys())
    ]
    assert not strays, "\n".join(strays)


@pytest.mark.parametrize("engine", ENGINES)
def test_core_profile(engine: str) -> None:
    profile = PROFILES[engine]
    assert profile.name == engine
    assert engine in V.ENGINES, missing(engine, "not in V.ENGINES (inferwatch/core/vocabulary.py)", "profile")
    assert (ROOT / "inferwatch" / "core" / "engines" / f"{engine}.py").is_file(), missing(
        engine, f"no module inferwatch/core/engines/{engine}.py", "profile"
    )
    assert profile.commands, missing(engine, "the profile names no command line that starts it", "profile")


@pytest.mark.parametrize("engine", ENGINES)
def test_exporter_adapter(engine: str) -> None:
    registry = builtin_registry()
    assert engine in registry.names(), missing(
        engine, "no exporter adapter in builtin_registry() (inferwatch/exporters/engines/__init__.py)", "adapter"
    )
    assert (ROOT / "inferwatch" / "exporters" / "engines" / f"{engine}.py").is_file(), missing(
        engine, f"no module inferwatch/exporters/engines/{engine}.py", "adapter"
    )
    assert registry.get(engine).unsupported == PROFILES[engine].unsupported, missing(
        engine, "the adapter's unsupported reasons are not its profile's (unsupported=PROFILE.unsupported)", "adapter"
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_span_source_or_the_reason_it_has_none(engine: str) -> None:
    reasons = without_span_source()
    if engine in span_sources():
        assert engine not in reasons, missing(
            engine, f"has a span source but is listed under {NO_SOURCE_HEADING!r}: take it out", "source"
        )
        assert (ROOT / "inferwatch" / "collector" / "ingest" / "sources" / f"{engine}.py").is_file(), missing(
            engine, f"its span source is not inferwatch/collector/ingest/sources/{engine}.py", "source"
        )
        assert (SIMULATOR_DIR / engine / "spans.py").is_file(), missing(
            engine,
            f"has a span source but its simulator sends no spans (simulator/engines/{engine}/spans.py)",
            "simulator",
        )
    else:
        assert reasons.get(engine), missing(
            engine,
            "no span source in SOURCES (inferwatch/collector/ingest/sources/__init__.py) "
            f"and no reason why under {NO_SOURCE_HEADING!r}",
            "source",
        )


@pytest.mark.parametrize("engine", ENGINES)
def test_simulator(engine: str) -> None:
    assert engine in simulator.ENGINES, missing(
        engine, "no simulator in ENGINES (inferwatch/simulator/server.py)", "simulator"
    )
    assert engine in get_args(SimEngine), missing(
        engine, "not in SimEngine (inferwatch/core/config.py): `inferwatch simulate --engine` refuses it", "simulator"
    )
    for part in ("__init__.py", "api.py", "metrics.py"):
        assert (SIMULATOR_DIR / engine / part).is_file(), missing(
            engine, f"no inferwatch/simulator/engines/{engine}/{part}", "simulator"
        )
    assert callable(simulator.engine_factory(engine)), missing(
        engine, "its simulator package has no create()", "simulator"
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_proxy_knows_its_apis(engine: str) -> None:
    assert engine in ENGINE_APIS, missing(engine, "no entry in ENGINE_APIS (inferwatch/proxy/apis.py)", "proxy")
    assert engine in ENGINE_UPSTREAM, missing(engine, "no entry in ENGINE_UPSTREAM (inferwatch/proxy/apis.py)", "proxy")


@pytest.mark.parametrize("engine", ENGINES)
def test_fixtures_with_their_source_and_goldens(engine: str) -> None:
    dirs = [d for d in fixture_dirs() if d.relative_to(ENGINE_FIXTURES).parts[0] == engine]
    assert dirs, missing(engine, f"no fixture under tests/fixtures/engines/{engine}/<version>/fixture.yaml", "fixtures")
    for d in dirs:
        where = d.relative_to(ROOT)
        source = d / "SOURCE.md"
        assert source.is_file() and source.read_text().strip(), missing(
            engine, f"{where} has no SOURCE.md saying where it comes from", "reference"
        )
        meta = load_fixture_meta(d)
        assert meta.get("engine") == engine, missing(
            engine, f"{where}/fixture.yaml names engine {meta.get('engine')!r}", "fixtures"
        )
        for payload in fixture_payloads(meta):
            assert (d / payload).is_file(), missing(
                engine, f"{where}/fixture.yaml names {payload}, which is missing", "fixtures"
            )
            golden = d / f"{Path(payload).stem}.expected.prom"
            assert golden.is_file(), missing(
                engine, f"no golden {golden.relative_to(ROOT)}: run `make goldens`", "fixtures"
            )


@pytest.mark.parametrize("engine", ENGINES)
def test_coverage_row(engine: str) -> None:
    rows = matrix(builtin_registry())
    assert engine in rows, missing(
        engine, "no row in the coverage matrix (its exporter adapter is missing)", "coverage"
    )
    every = {spec.key for spec in V.CANONICAL_METRICS}
    assert set(rows[engine]) == every, missing(
        engine, f"canonical metrics neither mapped nor unsupported: {sorted(every - set(rows[engine]))}", "coverage"
    )
    header = next(
        line
        for line in (ROOT / "docs" / "coverage.md").read_text().splitlines()
        if line.startswith("| canonical metric |")
    )
    assert engine in [cell.strip() for cell in header.split("|")], missing(
        engine, "docs/coverage.md has no column for it: run `make goldens`", "coverage"
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_compose_services(engine: str) -> None:
    services = compose_services(ROOT / "docker-compose.yml")
    for service in (f"sim-{engine}", f"exporter-{engine}"):
        assert service in services, missing(engine, f"docker-compose.yml has no service {service}", "compose")
    assert f"exporter-{engine}" in compose_services(ROOT / "docker-compose.real-engines.yml"), missing(
        engine, f"docker-compose.real-engines.yml does not point exporter-{engine} at a real engine", "compose"
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_tests(engine: str) -> None:
    for name in (f"test_{engine}.py", f"test_sim_{engine}.py"):
        assert (ROOT / "tests" / name).is_file(), missing(engine, f"no tests/{name}", "tests")
        assert name in COMPONENTS, missing(engine, f"tests/{name} is not in COMPONENTS (tests/tiers.py)", "tests")


def _queries(node: Any) -> list[str]:
    """Every PromQL and SQL text of a dashboard: targets' ``expr``, ``rawSql``, templating ``query``."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "rawSql", "query") and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, dict):
                found.append(json.dumps(value))
            else:
                found += _queries(value)
    elif isinstance(node, list):
        for value in node:
            found += _queries(value)
    return found


def test_dashboards_and_rules_name_no_engine() -> None:
    """They read the canonical vocabulary only: no engine name, no engine's own metric family."""
    generated = ROOT / "inferwatch"
    rules = yaml.safe_load((generated / "alerts" / "generated" / "rules.yml").read_text())
    queries = {f"rule {r.get('record') or r.get('alert')}": r["expr"] for g in rules["groups"] for r in g["rules"]}
    for board in sorted((generated / "dashboards" / "generated").glob("*.json")):
        for i, text in enumerate(_queries(json.loads(board.read_text()))):
            queries[f"{board.name} query {i}"] = text
    assert len(queries) > 10
    registry = builtin_registry()
    for engine in ENGINES:
        names = {engine, *(registry.get(engine).prefixes if engine in registry.names() else ())}
        pattern = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(re.escape(n) for n in sorted(names)) + ")")
        for where, text in queries.items():
            found = pattern.search(text)
            assert found is None, missing(engine, f"{where} names {found.group(1)!r}: {text[:120]!r}", "unchanged")
