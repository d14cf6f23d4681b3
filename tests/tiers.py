"""Test tiers and components: the markers ``tests/conftest.py`` gives every collected test.

**Components.** Every test file belongs to one component, the part of the package it tests
(:data:`COMPONENTS`); its tests carry that marker, so ``pytest -m collector`` (or
``make test-fast C=collector``) runs one component's tests. ``tests/test_tiers.py`` fails when a test
file is missing from the table, so a new file cannot be forgotten.

**Integration.** A test is marked ``integration`` when

1. its file is in :data:`INTEGRATION_FILES`: every test in it drives real processes end to end
   (Prometheus, Alertmanager, Chromium, HAProxy, VictoriaMetrics, the built wheel, ``inferwatch``
   commands) or runs for many seconds by design (property-based fuzzing of the HTTP API and the spool);
2. it runs on PostgreSQL: a parameter of the test has the value ``postgresql`` (the ``sqlite`` /
   ``postgresql`` backend fixtures), or the test or a fixture without parameters calls
   ``postgres_schema`` itself;
3. it starts a process or needs a real tool: the test, its fixtures, or the functions and classes of
   the test suite they use (followed through ``tests.*``, not into the product) name ``subprocess``,
   ``multiprocessing``, ``os.fork``/``exec*``, ``asyncio.create_subprocess_*`` or ``require_tool``
   (the ``promtool`` fixture, amtool, Chromium, HAProxy, ...);
4. it is in :data:`SLOW_TESTS`: in-process, but waits out deadlines for seconds by design.

Everything else is the fast tier (``make test-fast``: ``-m "not integration and not real_vllm"``):
unit tests and in-process component tests, among them the FastAPI ``TestClient`` tests on SQLite,
servers in threads on 127.0.0.1, fake engines, and the simulators in virtual time. ``make test``
runs both tiers; it is what CI runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from types import CodeType, ModuleType
from typing import Any

import pytest

COMPONENT_HELP: dict[str, str] = {
    "core": "inferwatch.core: vocabulary, launch lines, capacity, quantiles",
    "exporters": "inferwatch.exporters: engine adapters, goldens, the exporter serving",
    "collector": "inferwatch.collector: store, stats, read API, diagnosis, incidents, webhook",
    "alerts": "inferwatch.alerts: the SLO rule and Alertmanager generator",
    "dashboards": "inferwatch.dashboards: the Grafana dashboard generator",
    "simulator": "inferwatch.simulator: the simulated engines, `simulate` and `demo`",
    "proxy": "inferwatch.proxy: the streaming sidecar proxy",
    "cli": "inferwatch.cli: the command line as users type it",
    "stack": "the shipped whole: deploy/ and docker-compose, the wheel, end-to-end runs across components",
}
"""Marker name → what its tests cover (registered in ``pytest_configure``)."""

COMPONENTS: dict[str, str | None] = {
    # core
    "test_capacity.py": "core",
    "test_drift.py": "core",
    "test_headroom_model.py": "core",
    "test_mutants_burn.py": "core",
    "test_mutants_symptoms.py": "core",
    "test_headroom_inputs.py": "core",
    "test_bench_headroom.py": "core",
    "test_bench_checks.py": "core",
    "test_headroom_rules.py": "alerts",
    "test_headroom_api.py": "collector",
    "test_launch.py": "core",
    "test_quantile.py": "core",
    "test_vocabulary.py": "core",
    # exporters
    "test_coverage.py": "exporters",
    "test_engine_isolation.py": "exporters",
    "test_exporter_coalescing.py": "exporters",
    "test_exporter_httpd.py": "exporters",
    "test_exporter_wire.py": "exporters",
    "test_mutants_rebucket.py": "exporters",
    "test_exporter_hardening.py": "exporters",
    "test_exporter_memo.py": "exporters",
    "test_exporter_redirects.py": "exporters",
    "test_exporter_gpus.py": "exporters",
    "test_exporter_serve.py": "exporters",
    "test_goldens.py": "exporters",
    "test_llamacpp.py": "exporters",
    "test_textparse.py": "exporters",
    "test_sglang.py": "exporters",
    "test_tgi.py": "exporters",
    "test_triton.py": "exporters",
    "test_trtllm.py": "exporters",
    "test_vllm.py": "exporters",
    # collector
    "test_alert_webhook.py": "collector",
    "test_alertmanager_e2e.py": "collector",
    "test_checklist.py": "collector",
    "test_collector_app.py": "collector",
    "test_collector_durability.py": "collector",
    "test_collector_input.py": "collector",
    "test_collector_openapi.py": "collector",
    "test_collector_sources.py": "collector",
    "test_ingest_workers.py": "collector",
    "test_collector_sources_validation.py": "collector",
    "test_collector_source_sglang.py": "collector",
    "test_collector_storage.py": "collector",
    "test_collector_write_ahead.py": "collector",
    "test_collector_writer.py": "collector",
    "test_diagnose.py": "collector",
    "test_diagnose_e2e.py": "collector",
    "test_diagnose_gpu_e2e.py": "collector",
    "test_diagnose_gpu.py": "collector",
    "test_diagnose_gpu_prometheus.py": "collector",
    "test_diagnose_proxy_fallback.py": "collector",
    "test_fault_partition.py": "collector",
    "test_grpc_protocol.py": "collector",
    "test_incident_page.py": "collector",
    "test_message_escaping.py": "collector",
    "test_notify_config.py": "collector",
    "test_notify_outbox.py": "collector",
    "test_openapi_fuzz.py": "collector",
    "test_page_chromium.py": "collector",
    "test_page_hostile.py": "collector",
    "test_read_api_edges.py": "collector",
    "test_scale_collectors.py": "collector",
    "test_slow_clients.py": "collector",
    "test_spool_model.py": "collector",
    "test_mutants_ranks.py": "collector",
    "test_mutants_spool.py": "collector",
    "test_stats_rollups.py": "collector",
    "test_rollup_process.py": "collector",
    "test_stats_folding.py": "collector",
    "test_stats_values_merge.py": "collector",
    "test_percentile_ranks.py": "collector",
    "test_stats_sides.py": "collector",
    "test_collector_usage.py": "collector",
    "test_collector_usage_cost.py": "collector",
    "test_webhook_hostile.py": "collector",
    # alerts and dashboards
    "test_alert_rules.py": "alerts",
    "test_alerts_generate.py": "alerts",
    "test_cost.py": "alerts",
    "test_dashboards.py": "dashboards",
    "test_dashboards_headroom.py": "dashboards",
    # simulator
    "test_sim_cli.py": "simulator",
    "test_sim_model.py": "simulator",
    "test_sim_profiles.py": "simulator",
    "test_sim_llamacpp.py": "simulator",
    "test_sim_tgi.py": "simulator",
    "test_sim_sglang.py": "simulator",
    "test_sim_triton.py": "simulator",
    "test_sim_trtllm.py": "simulator",
    "test_sim_vllm.py": "simulator",
    "test_simulator_gpu.py": "simulator",
    # proxy
    "test_proxy.py": "proxy",
    "test_proxy_engines_next.py": "proxy",
    "test_proxy_fast_paths.py": "proxy",
    "test_mutants_ttft.py": "proxy",
    "test_proxy_passthrough.py": "proxy",
    "test_proxy_slow_clients.py": "proxy",
    "test_proxy_upstream.py": "proxy",
    "test_proxy_tenants.py": "proxy",
    "test_proxy_tenants_e2e.py": "proxy",
    # cli
    "test_cli.py": "cli",
    "test_demo_view.py": "cli",
    "test_oncall_cli.py": "cli",
    # the whole
    "test_e2e_prometheus.py": "stack",
    "test_engine_parts.py": "stack",
    "test_house.py": "stack",
    "test_kubernetes.py": "stack",
    "test_kubernetes_autoscaling.py": "stack",
    "test_kubernetes_probes.py": "stack",
    "test_kubernetes_validate.py": "stack",
    "test_kubernetes_gpus.py": "stack",
    "test_scale_metrics.py": "stack",
    "test_stack.py": "stack",
    "test_wheel.py": "stack",
    # the test suite itself: no component
    "test_tiers.py": None,
}
"""Test file → its component: the one place a test file is assigned."""

INTEGRATION_FILES: frozenset[str] = frozenset(
    {
        "test_alertmanager_e2e.py",
        "test_diagnose_e2e.py",
        "test_diagnose_gpu_e2e.py",
        "test_e2e_prometheus.py",
        "test_fault_partition.py",
        "test_incident_page.py",
        "test_openapi_fuzz.py",
        "test_page_chromium.py",
        "test_scale_collectors.py",
        "test_scale_metrics.py",
        "test_sim_cli.py",
        "test_spool_model.py",
        "test_wheel.py",
    }
)
"""Files whose every test is integration (rule 1)."""

SLOW_TESTS: frozenset[str] = frozenset(
    {
        # a disk made slow on purpose while /readyz and the read API are timed (8 s)
        "test_collector_durability.py::test_a_slow_disk_does_not_starve_readyz_or_the_read_api",
        # scrapes of a stuck engine wait out their deadline (3.5 s)
        "test_exporter_hardening.py::test_concurrent_scrapes_of_a_stuck_target_share_its_request_and_do_not_queue",
        # hundreds of dribbling connections closed after their 2 s deadlines (3 s each)
        "test_proxy_slow_clients.py::test_proxy_closes_slow_clients_and_keeps_answering",
        "test_proxy_slow_clients.py::test_proxy_at_its_connection_cap_closes_the_longest_waiting_then_refuses_with_503",
    }
)
"""``file::test`` (without parameters) of in-process tests that take seconds by design (rule 4): 3 s and more
in ``make test-fast --durations`` on 2 cores."""

PROCESS_NAMES = frozenset(
    {
        "subprocess",
        "Popen",
        "multiprocessing",
        "ProcessPoolExecutor",
        "fork",
        "execv",
        "execve",
        "execvp",
        "execvpe",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "require_tool",
    }
)
"""Names whose use means a process is started or a real tool is needed (rule 3)."""

POSTGRES_NAMES = frozenset({"postgres_schema"})
POSTGRES_PARAM = "postgresql"


def _code_names(code: CodeType) -> set[str]:
    """The global and attribute names a code object uses, its nested functions and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _code_names(const)
    return names


def _is_suite_code(obj: Any) -> bool:
    """Whether ``obj`` (a module, function or class) is part of the test suite, ``tests.*``."""
    module = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "tests" or module.startswith("tests."))


def _functions_of(obj: Any) -> Iterator[Any]:
    """The plain functions behind ``obj``: itself (decorators unwrapped), or a test-suite class's methods."""
    if inspect.isclass(obj):
        if _is_suite_code(obj):
            for member in vars(obj).values():
                if isinstance(member, classmethod | staticmethod):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                yield from _functions_of(member)
        return
    func = inspect.unwrap(obj) if callable(obj) else None
    if inspect.isfunction(func) and _is_suite_code(func):
        yield func


class Scanner:
    """Which names a function reaches, following the test suite's own functions, classes and modules."""

    def __init__(self) -> None:
        self._reach: dict[Any, frozenset[str]] = {}

    def reaches(self, roots: Iterable[Any]) -> frozenset[str]:
        names: set[str] = set()
        for root in roots:
            for func in _functions_of(root):
                names |= self._reached(func)
        return frozenset(names)

    def _reached(self, start: Any) -> frozenset[str]:
        if start in self._reach:
            return self._reach[start]
        names: set[str] = set()
        seen = {start}
        todo = [start]
        while todo:
            func = todo.pop()
            used = _code_names(func.__code__)
            names |= used
            scopes: list[dict[str, Any] | ModuleType] = [func.__globals__]
            scopes += [m for m in (func.__globals__.get(n) for n in used) if isinstance(m, ModuleType)]
            for scope in scopes:
                if isinstance(scope, ModuleType) and not _is_suite_code(scope):
                    continue
                space = vars(scope) if isinstance(scope, ModuleType) else scope
                for name in used:
                    for found in _functions_of(space.get(name)):
                        if found not in seen:
                            seen.add(found)
                            todo.append(found)
        self._reach[start] = frozenset(names)
        return self._reach[start]


def fixture_functions(item: pytest.Item) -> list[tuple[Any, bool]]:
    """The functions of the fixtures ``item`` uses, each with whether the fixture has parameters."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    found = []
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            found.append((fixturedef.func, fixturedef.params is not None))
    return found


def is_integration(item: pytest.Item, scanner: Scanner) -> bool:
    """Rules 1–4 of the module docstring."""
    file = item.path.name
    if file in INTEGRATION_FILES:
        return True
    if f"{file}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS:
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(value == POSTGRES_PARAM for value in callspec.params.values()):
        return True
    test = getattr(item, "function", None)
    fixtures = fixture_functions(item)
    own = [test] + [func for func, parametrized in fixtures if not parametrized]
    if any(POSTGRES_NAMES & _code_names(f.__code__) for root in own for f in _functions_of(root)):
        return True
    return bool(PROCESS_NAMES & scanner.reaches([test, *(func for func, _ in fixtures)]))


def component(item: pytest.Item) -> str | None:
    return COMPONENTS.get(item.path.name)


def apply_markers(items: list[pytest.Item]) -> None:
    """Give each test its component's marker, and ``integration`` by the rules above."""
    scanner = Scanner()
    for item in items:
        name = component(item)
        if name is not None:
            item.add_marker(getattr(pytest.mark, name))
        if is_integration(item, scanner):
            item.add_marker(pytest.mark.integration)


def register_markers(config: pytest.Config) -> None:
    for name, text in COMPONENT_HELP.items():
        config.addinivalue_line("markers", f"{name}: {text} (tests/tiers.py)")
    config.addinivalue_line(
        "markers",
        "integration: starts processes or real tools, uses PostgreSQL, or takes seconds; "
        "not in `make test-fast` (tests/tiers.py)",
    )
