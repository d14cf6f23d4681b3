"""The generated Grafana dashboards: goldens, dashboard-linter style hygiene, and PromQL checked by promtool."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.slo import SLOFile, alert_windows, load
from inferwatch.dashboards import panels as M
from inferwatch.dashboards import promql as P
from inferwatch.dashboards.boards import requests, slos
from inferwatch.dashboards.gaps import SQL_NO_DATA
from inferwatch.dashboards.generate import DASHBOARDS_PROVIDER_FILE, DATASOURCES_FILE, generate
from inferwatch.dashboards.layout_png import sketches, wrap
from inferwatch.dashboards.registry import UIDS, all_queries, dashboards
from inferwatch.exporters.coverage import matrix as coverage_matrix
from inferwatch.exporters.engines import builtin_registry
from tests.conftest import ROOT, require_tool

GENERATED = ROOT / "inferwatch" / "dashboards" / "generated"
SKETCHES = ROOT / "docs" / "dashboards"
SLO_FILE = ROOT / "inferwatch" / "alerts" / "slos.yaml"
RAW_ENGINE_PREFIXES = ("vllm:", "tgi_", "trtllm_", "nv_")
RANGE_FUNCTION = re.compile(r"\b(rate|increase|irate)\((?P<arg>[^\[]*)\[(?P<range>[^\]]+)\]")
VARIABLE = re.compile(r"\$\{?(?P<name>\w+)")
GRAFANA_GLOBALS = {"__rate_interval", "__range", "__interval", "__timeFilter", "__timeGroupAlias", "__all"}
CANONICAL_NAME = re.compile(r"(?<![\w:])(llm_[a-z0-9_]+?)(?:_bucket|_count|_sum)?(?![\w])")


@pytest.fixture(scope="module")
def spec() -> SLOFile:
    return load(SLO_FILE, V.Vocabulary())


@pytest.fixture(scope="module")
def files(spec: SLOFile) -> dict[str, str]:
    return generate(spec, V.Vocabulary())


@pytest.fixture(scope="module")
def boards(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {path: json.loads(text) for path, text in files.items() if path.endswith(".json")}


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _data_panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (p for p in _panels(board) if p["type"] != "row")


def _prom_targets(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in _data_panels(board):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel, target


# --- goldens -----------------------------------------------------------------------------------
def _committed(directory: Path, suffixes: tuple[str, ...]) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.suffix in suffixes
    }


def _write_goldens(directory: Path, wanted: dict[str, bytes], suffixes: tuple[str, ...]) -> None:
    for rel in set(_committed(directory, suffixes)) - set(wanted) if directory.exists() else ():
        (directory / rel).unlink()
    for rel, data in wanted.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_generated_dashboards_match_goldens(files: dict[str, str], update_goldens: bool) -> None:
    wanted = {rel: text.encode() for rel, text in files.items()}
    if update_goldens:
        _write_goldens(GENERATED, wanted, (".json", ".yaml"))
    committed = _committed(GENERATED, (".json", ".yaml"))
    assert sorted(committed) == sorted(wanted), "stale or missing files in dashboards/generated/"
    stale = [rel for rel in wanted if committed[rel] != wanted[rel]]
    assert not stale, f"regenerate with --update-goldens (or `inferwatch generate dashboards`): {stale}"


def test_sketches_match_goldens(spec: SLOFile, update_goldens: bool) -> None:
    wanted = sketches(spec, V.Vocabulary())
    if update_goldens:
        _write_goldens(SKETCHES, wanted, (".png",))
    committed = _committed(SKETCHES, (".png",))
    assert sorted(committed) == sorted(wanted)
    assert all(committed[name] == data for name, data in wanted.items()), "regenerate with --update-goldens"
    for data in wanted.values():
        assert data.startswith(b"\x89PNG\r\n\x1a\n")


def test_generation_is_deterministic(spec: SLOFile, files: dict[str, str]) -> None:
    assert generate(spec, V.Vocabulary()) == files
    for path, text in files.items():
        assert text.endswith("\n"), path
        if path.endswith(".json"):
            assert text == json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_without_slo_file_the_slo_dashboard_is_left_out(files: dict[str, str]) -> None:
    without = generate(None, V.Vocabulary())
    assert f"{slos.UID}.json" in files
    assert f"{slos.UID}.json" not in without
    assert set(without) == set(files) - {f"{slos.UID}.json"}
    assert all(uid != slos.UID for uid, _, _ in all_queries(None, V.Vocabulary()))


def test_six_dashboards_with_stable_uids(boards: dict[str, dict[str, Any]]) -> None:
    uids = {b["uid"] for b in boards.values()}
    assert uids == set(UIDS) and len(UIDS) == 6
    for path, board in boards.items():
        assert path == f"{board['uid']}.json"
        assert board["title"]
        assert "do not edit" in board["description"]
        assert board["editable"] is False


# --- hygiene (grafana/dashboard-linter rules, re-implemented) ------------------------------------
def test_panel_ids_unique(boards: dict[str, dict[str, Any]]) -> None:
    for path, board in boards.items():
        ids = [p["id"] for p in _panels(board)]
        assert len(ids) == len(set(ids)), path
        assert all(isinstance(i, int) and i > 0 for i in ids), path


def test_grid_positions_do_not_overlap(boards: dict[str, dict[str, Any]]) -> None:
    for path, board in boards.items():
        taken: dict[tuple[int, int], str] = {}
        for panel in _panels(board):
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["w"] > 0 and pos["h"] > 0 and pos["x"] + pos["w"] <= M.GRID_WIDTH, panel
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in taken, f"{path}: {panel['title']!r} overlaps {taken[(x, y)]!r}"
                    taken[(x, y)] = panel["title"]


def _variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def test_every_variable_used_is_defined(boards: dict[str, dict[str, Any]]) -> None:
    for path, board in boards.items():
        defined = set(_variables(board))
        text = json.dumps({"panels": board["panels"], "templating": board["templating"]})
        used = {m.group("name") for m in VARIABLE.finditer(text)} - GRAFANA_GLOBALS
        assert used <= defined, f"{path}: undefined variables {sorted(used - defined)}"


def test_datasources_are_template_variables(boards: dict[str, dict[str, Any]]) -> None:
    """panel-datasource-rule and template-datasource-rule: no hard-coded datasource uid of some Grafana."""
    for path, board in boards.items():
        variables = _variables(board)
        refs: list[Any] = []
        for panel in _data_panels(board):
            if panel["type"] != "text":
                refs.append(panel["datasource"])
                refs += [t["datasource"] for t in panel.get("targets", [])]
        refs += [v["datasource"] for v in variables.values() if v["type"] == "query"]
        for ref in refs:
            assert isinstance(ref, dict), f"{path}: datasource {ref!r} is not a reference object"
            m = re.fullmatch(r"\$\{(\w+)\}", ref["uid"])
            assert m, f"{path}: datasource uid {ref['uid']!r} is not a variable"
            var = variables[m.group(1)]
            assert var["type"] == "datasource"
            assert var["query"] == ref["type"]


def test_variables_reload_on_time_range_change(boards: dict[str, dict[str, Any]]) -> None:
    for board in boards.values():
        for var in _variables(board).values():
            if var["type"] == "query":
                assert var["refresh"] == 2, var["name"]
                assert var["allValue"] == P.ALL_VALUE


def test_units_and_descriptions(boards: dict[str, dict[str, Any]]) -> None:
    for path, board in boards.items():
        for panel in _data_panels(board):
            assert panel["description"], f"{path}: {panel['title']!r} has no description"
            if panel["type"] in ("timeseries", "stat", "heatmap"):
                unit = panel["fieldConfig"]["defaults"].get("unit")
                assert unit and unit != "none", f"{path}: {panel['title']!r} has no unit"
            if panel["type"] != "text":
                assert panel.get("targets"), f"{path}: {panel['title']!r} has no targets"


def test_descriptions_carry_the_help_texts(spec: SLOFile) -> None:
    for board in dashboards(spec, V.Vocabulary()):
        for panel in board.all_panels():
            for metric in {m for q in panel.queries for m in q.metrics}:
                assert metric.help in panel.description, (board.uid, panel.title, metric.key)


def test_rate_interval_in_every_rate(boards: dict[str, dict[str, Any]]) -> None:
    """target-rate-interval-rule ($__range only for one value over the whole time range)."""
    for path, board in boards.items():
        for panel, target in _prom_targets(board):
            for m in RANGE_FUNCTION.finditer(target["expr"]):
                allowed = {"$__rate_interval"} | ({"$__range"} if target["instant"] else set())
                assert m.group("range") in allowed, f"{path}: {panel['title']!r}: {m.group(0)}"


def test_counters_only_inside_rate(spec: SLOFile) -> None:
    """target-counter-agg-rule: a counter is never read raw."""
    for uid, title, query in all_queries(spec, V.Vocabulary()):
        for metric in query.metrics:
            if metric.kind is V.Kind.COUNTER or metric.kind is V.Kind.HISTOGRAM:
                for m in re.finditer(re.escape(metric.name), query.expr):
                    before = query.expr[: m.start()]
                    assert re.search(r"(rate|increase)\($", before), (uid, title, query.expr)


def test_no_raw_engine_metric_names(boards: dict[str, dict[str, Any]]) -> None:
    """Queries read canonical series only (the coverage reasons in "no value" texts and descriptions
    may name an engine's own metrics: they explain why a signal is missing)."""
    for path, board in boards.items():
        queries = [t.get("expr") or t.get("rawSql") or "" for p in _data_panels(board) for t in p.get("targets", [])]
        queries += [v["query"] for v in _variables(board).values() if v["type"] == "query"]
        for query in queries:
            for prefix in RAW_ENGINE_PREFIXES:
                assert prefix not in query, f"{path} queries {prefix!r}: {query}"


def test_query_metrics_are_the_names_in_the_expression(spec: SLOFile) -> None:
    known = {m.name: m for m in V.ALL_METRICS}
    for uid, title, query in all_queries(spec, V.Vocabulary()):
        names = {n for n in CANONICAL_NAME.findall(query.expr)}
        names = {n if n in known else n + "_total" if n + "_total" in known else n for n in names}
        assert names <= set(known), (uid, title, names - set(known))
        assert {known[n] for n in names} == set(query.metrics), (uid, title, query.expr)
        if uid == slos.UID:
            assert not query.metrics
        if query.per_engine:
            assert re.search(rf"by \([^)]*\b{V.LABEL_ENGINE}\b", query.expr), (uid, title, query.expr)


def test_percentiles_use_canonical_buckets(spec: SLOFile) -> None:
    for uid, title, query in all_queries(spec, V.Vocabulary()):
        if "histogram_quantile" in query.expr:
            assert "sum by (le, engine, model" in query.expr, (uid, title)
            assert all(m.kind is V.Kind.HISTOGRAM for m in query.metrics)
            assert all(f"{m.name}_bucket" in query.expr for m in query.metrics)


def test_slo_dashboard_covers_every_slo(spec: SLOFile) -> None:
    board = next(d for d in dashboards(spec, V.Vocabulary()) if d.uid == slos.UID)
    exprs = [q.expr for p in board.all_panels() for q in p.queries]
    for slo in spec.slos:
        mine = [e for e in exprs if f'{V.SLO_LABEL}="{slo.name}"' in e]
        assert any(e.startswith(f"1 - {V.slo_error_ratio('5m')}") for e in mine), slo.name
        assert any(V.SLO_OBJECTIVE_RECORD in e for e in mine)
        assert any(V.SLO_BUDGET_REMAINING_RECORD in e for e in mine)
        assert any(V.ALERT_SLO_BURN in e and 'alertstate="firing"' in e for e in mine)
        for window in alert_windows():
            assert any(e.startswith(V.slo_error_ratio(window) + "{") and V.SLO_ERROR_BUDGET_RECORD in e for e in mine)


def test_requests_dashboard_reads_the_collector_table(boards: dict[str, dict[str, Any]]) -> None:
    from inferwatch.collector.store.tables import REQUEST_TABLE, TABLE_NAME

    board = boards[f"{requests.UID}.json"]
    sql = [t["rawSql"] for p in _data_panels(board) for t in p.get("targets", []) if t.get("rawSql")]
    assert sql and all(f"FROM {TABLE_NAME}" in s for s in sql)
    assert any("percentile_disc(0.99) WITHIN GROUP" in s for s in sql)
    columns = set(REQUEST_TABLE.columns.keys())
    for s in sql:
        select = s.split("FROM")[0]
        for word in re.findall(r"\b[a-z_]+\b", select):
            if "_" in word and word not in ("percentile_disc", "start_time"):
                assert word in columns or word.startswith("p99_") or word.startswith("__"), word
    assert any(t.get("expr") for p in _data_panels(board) for t in p.get("targets", []))


def test_provisioning_files(files: dict[str, str], boards: dict[str, dict[str, Any]]) -> None:
    ds = yaml.safe_load(files[DATASOURCES_FILE])
    by_type = {d["type"]: d for d in ds["datasources"]}
    assert by_type[M.PROMETHEUS_TYPE]["url"] == "http://prometheus:9090"
    assert by_type[M.PROMETHEUS_TYPE]["uid"] == M.PROMETHEUS_UID
    assert by_type[M.POSTGRES_TYPE]["uid"] == M.POSTGRES_UID
    for board in boards.values():
        for var in _variables(board).values():
            if var["type"] == "datasource":
                assert var["current"]["value"] == by_type[var["query"]]["uid"]
    providers = yaml.safe_load(files[DASHBOARDS_PROVIDER_FILE])["providers"]
    assert providers[0]["type"] == "file" and providers[0]["options"]["path"]


def test_layout_wraps_and_rows_start_lines() -> None:
    p = M.Panel("a", "d", "s", (), M.TIMESERIES, 16, 4)
    placed = M.layout([M.Row("r"), p, p, M.Row("s"), p])
    assert [(x.x, x.y) for x in placed] == [(0, 0), (0, 1), (0, 5), (0, 9), (0, 10)]


def test_wrap() -> None:
    assert wrap("a bb ccc", 4) == ["a bb", "ccc"]
    assert wrap("abcdefgh", 3) == ["abc", "def", "gh"]


def test_multi_query_tables_name_their_columns(spec: SLOFile, boards: dict[str, dict[str, Any]]) -> None:
    """Each instant query of a Prometheus table is one column, named by its legend; units match the names."""
    for board in dashboards(spec, V.Vocabulary()):
        panels = {p["title"]: p for p in _data_panels(boards[f"{board.uid}.json"])}
        for panel in board.all_panels():
            if panel.kind != M.TABLE or panel.sql or len(panel.queries) < 2:
                continue
            organize = next(t for t in panels[panel.title]["transformations"] if t["id"] == "organize")
            renamed = organize["options"]["renameByName"]
            assert sorted(renamed) == [f"Value #{t['refId']}" for t in panels[panel.title]["targets"]]
            assert list(renamed.values()) == [q.legend for q in panel.queries]
            assert {name for name, _ in panel.column_units} <= set(renamed.values()), panel.title


# --- coverage: an empty panel says why, in Grafana ------------------------------------------------
def exporter_bucketless() -> dict[str, set[str]]:
    """engine -> canonical histograms its exporter fills from a sum and a count only (no buckets)."""
    out: dict[str, set[str]] = {}
    for adapter in builtin_registry():
        rows = (*adapter.rows, *adapter.hook_rows)
        out[adapter.name] = {r.metric.key for r in rows if r.sum_only} - {r.metric.key for r in rows if not r.sum_only}
    return out


def test_profiles_know_which_histograms_have_no_buckets() -> None:
    """The engine profiles' bucketless histograms are exactly those the exporters map from sum and count."""
    profiles = builtin_profiles()
    assert {e: set(profiles[e].bucketless) for e in V.ENGINES} == exporter_bucketless()


def _expected_gaps(query: M.Query) -> dict[str, set[str]]:
    """engine -> reasons it answers ``query`` with nothing: the coverage matrix (exporters' view), the
    histograms its exporter maps without buckets, and the labels the engine's series lack."""
    matrix = coverage_matrix(builtin_registry())
    bucketless = exporter_bucketless()
    profiles = builtin_profiles()
    out: dict[str, set[str]] = {}
    for engine in V.ENGINES:
        profile = profiles[engine]
        labels = {profile.unlabelled[label] for label in query.labels if label in profile.unlabelled}
        per_metric = []
        for m in query.metrics:
            reasons = set(labels)
            if matrix[engine].get(m.key, "").startswith("unsupported: "):
                reasons.add(matrix[engine][m.key].removeprefix("unsupported: "))
            if m.key in bucketless[engine] and f"{m.name}_bucket" in query.expr:
                reasons.add(profile.bucketless[m.key])
            per_metric.append(reasons)
        if query.any_of:  # one part per metric: empty only when every part is
            gaps = set().union(*per_metric) if per_metric and all(per_metric) else set()
        else:
            gaps = set().union(labels, *per_metric)
        if gaps:
            out[engine] = gaps
    return out


def test_every_data_panel_says_why_it_is_empty(spec: SLOFile, boards: dict[str, dict[str, Any]]) -> None:
    """fieldConfig.defaults.noValue names every engine that leaves the panel empty, with the coverage
    matrix's reason, and otherwise says "no data yet": the two are never the same text."""
    profiles = builtin_profiles()
    for board in dashboards(spec, V.Vocabulary()):
        rendered = {p["title"]: p for p in _data_panels(boards[f"{board.uid}.json"])}
        for panel in board.all_panels():
            if panel.kind == M.TEXT:
                continue
            text = rendered[panel.title]["fieldConfig"]["defaults"].get("noValue")
            assert text, (board.uid, panel.title)
            needs = [_expected_gaps(q) for q in panel.queries if q.metrics or q.labels]
            if panel.signals:  # recording rules: a latency SLO's read the histogram's buckets, the headroom's not
                reads = " ".join(f"{m.name}_bucket" for m in panel.signals) if panel.signal_buckets else ""
                needs.append(_expected_gaps(M.Query(reads, "", panel.signals, False)))
            empty_for = {e for e in V.ENGINES if needs and all(e in gaps for gaps in needs)}
            for engine in V.ENGINES:
                mention = f"Not exposed by {profiles[engine].title}:"
                if engine in empty_for:
                    assert mention in text, (board.uid, panel.title, engine)
                    for reason in set().union(*(gaps[engine] for gaps in needs)):
                        assert reason in text, (board.uid, panel.title, engine, reason)
                else:
                    assert mention not in text, (board.uid, panel.title, engine)
            if not empty_for:
                assert "Not exposed by" not in text
            idle = panel.idle or (SQL_NO_DATA if panel.sql else M.NO_DATA_YET)
            assert text.lower().endswith(idle.lower()), (board.uid, panel.title, text)
            if empty_for:
                assert "Not exposed by" in text.split("Any other engine:")[0]


def test_partly_empty_panels_say_so_in_the_description(spec: SLOFile) -> None:
    profiles = builtin_profiles()
    seen = 0
    for board in dashboards(spec, V.Vocabulary()):
        for panel in board.all_panels():
            gaps = [_expected_gaps(q) for q in panel.queries if q.metrics or q.labels]
            for engine in V.ENGINES:
                hit = [engine in g for g in gaps]
                if any(hit) and not all(hit):
                    seen += 1
                    assert f"Partly empty for {profiles[engine].title}:" in panel.description, (panel.title, engine)
    assert seen, "no panel is partly empty for an engine: the check proves nothing"


def test_dashboard_code_names_no_engine() -> None:
    """Generic dashboard code learns about engines from the core's profiles only: no string in it (but
    docstrings) spells an engine's name."""
    names = {n.lower() for n in V.ENGINES}
    word = re.compile(r"[a-z0-9]+")
    for path in sorted((ROOT / "inferwatch" / "dashboards").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found = names & set(word.findall(node.value.lower()))
                assert not found, f"{path.relative_to(ROOT)}:{node.lineno} names {sorted(found)}"


# --- PromQL validity: every expression through real promtool --------------------------------------
def _promtool_expr(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$__interval", "1m")
    return re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)


def test_every_expression_parses_in_promtool(spec: SLOFile, boards: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    exprs: list[str] = [q.expr for _, _, q in all_queries(spec, V.Vocabulary())]
    exprs += [t["expr"] for b in boards.values() for _, t in _prom_targets(b)]
    exprs += [
        v["query"].removeprefix("label_values(").rsplit(",", 1)[0]
        for b in boards.values()
        for v in _variables(b).values()
        if v["type"] == "query"
    ]
    unique = sorted(set(exprs))
    rules = {
        "groups": [
            {
                "name": "inferwatch-dashboards",
                "rules": [
                    {"record": f"dashboard:query_{i}:check", "expr": _promtool_expr(e)} for i, e in enumerate(unique)
                ],
            }
        ]
    }
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(unique)} rules found" in result.stdout
