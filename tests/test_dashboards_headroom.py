"""The Headroom row of the fleet and SLO dashboards: its records, thresholds from the SLO file, legends,
selectors and coverage texts."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.core import vocabulary as V
from inferwatch.core.engines import builtin_profiles
from inferwatch.core.slo import HeadroomRules, SLOFile, load
from inferwatch.dashboards import headroom_row
from inferwatch.dashboards import panels as M
from inferwatch.dashboards.boards import fleet, slos
from inferwatch.dashboards.generate import generate
from inferwatch.dashboards.registry import all_queries, dashboards
from tests.conftest import ROOT

SLO_FILE = ROOT / "inferwatch" / "alerts" / "slos.yaml"
BOARDS = (fleet.UID, slos.UID)
HEADROOM_RECORDS = {
    V.HEADROOM_RATIO_RECORD,
    V.CAPACITY_REQUESTS_PER_SECOND_RECORD,
    V.LOAD_REQUESTS_PER_SECOND_RECORD,
    V.REPLICAS_NEEDED_RECORD,
}
RECORD_NAME = re.compile(r"(?<![\w:])([a-zA-Z_]\w*:[\w:]+)")
"""a recording rule's name (``level:metric:operations``) in an expression."""


@pytest.fixture(scope="module")
def spec() -> SLOFile:
    return load(SLO_FILE, V.Vocabulary())


def _spec_with(tmp_path: Path, **rules: Any) -> SLOFile:
    """The default SLO file with ``headroom:`` settings, loaded from disk as a user's file would be."""
    doc = yaml.safe_load(SLO_FILE.read_text())
    doc["headroom"] = rules
    path = tmp_path / "slos.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load(path, V.Vocabulary())


def _rendered(spec: SLOFile | None) -> dict[str, dict[str, Any]]:
    return {
        path.removesuffix(".json"): json.loads(text)
        for path, text in generate(spec, V.Vocabulary()).items()
        if path.endswith(".json")
    }


def _row(board: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels after the Headroom row header, up to the next row."""
    panels = board["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == headroom_row.ROW_TITLE)
    out = []
    for p in panels[start + 1 :]:
        if p["type"] == "row":
            break
        out.append(p)
    return out


def _ratio_panel(board: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in _row(board) if V.HEADROOM_RATIO_RECORD in p["targets"][0]["expr"])


def _steps(panel: dict[str, Any]) -> list[tuple[Any, str]]:
    return [(s["value"], s["color"]) for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_both_boards_have_the_row_reading_the_records(spec: SLOFile) -> None:
    boards = _rendered(spec)
    for uid in BOARDS:
        row = _row(boards[uid])
        assert len(row) == 4, uid
        exprs = " ".join(t["expr"] for p in row for t in p["targets"])
        for record in HEADROOM_RECORDS:
            assert re.search(rf"\b{re.escape(record)}\b", exprs), (uid, record)
        types = {p["type"] for p in row}
        assert types == {"timeseries", "table"}, uid
        table = next(p for p in row if p["type"] == "table")
        assert all(V.LABEL_LIMITING_SLO in t["expr"] and t["instant"] for t in table["targets"]), uid
        for panel in row:
            assert "docs/headroom.md" in panel["description"], (uid, panel["title"])
            assert panel["gridPos"]["w"] == 12 and panel["gridPos"]["h"] == 8, (uid, panel["title"])
    # only these two boards carry it
    others = {
        uid for uid, board in boards.items() if any(p["title"] == headroom_row.ROW_TITLE for p in board["panels"])
    }
    assert others == set(BOARDS)


def test_headroom_panel_units_legends_and_thresholds(spec: SLOFile) -> None:
    boards = _rendered(spec)
    for uid in BOARDS:
        panel = _ratio_panel(boards[uid])
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["unit"] == M.UNIT_TIMES and defaults["min"] == 0
        assert _steps(panel) == [(None, "red"), (1.0, "orange"), (spec.headroom.low_ratio, "green")]
        assert defaults["custom"]["thresholdsStyle"]["mode"] != "off"
        legend = panel["targets"][0]["legendFormat"]
        assert legend == "{{engine}} {{model}} {{instance}} {{role}} {{limiting_slo}}", uid
        assert V.ALERT_HEADROOM_LOW in panel["description"]
        capacity = next(p for p in _row(boards[uid]) if p["title"].startswith("Capacity"))
        assert capacity["fieldConfig"]["defaults"]["unit"] == M.UNIT_REQPS
        assert [RECORD_NAME.findall(t["expr"]) for t in capacity["targets"]] == [
            [V.CAPACITY_REQUESTS_PER_SECOND_RECORD],
            [V.LOAD_REQUESTS_PER_SECOND_RECORD],
        ]
    # the other panels of the boards draw no thresholds
    others = [p for uid in BOARDS for p in boards[uid]["panels"] if p.get("type") == "timeseries"]
    drawn = [p["title"] for p in others if p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"]
    assert drawn == ["Headroom per replica", "Headroom per replica"]


def test_the_threshold_moves_with_low_ratio_in_the_slo_file(tmp_path: Path, spec: SLOFile) -> None:
    moved = _spec_with(tmp_path, low_ratio=1.6, step="30s")
    assert moved.headroom.low_ratio != spec.headroom.low_ratio
    boards = _rendered(moved)
    for uid in BOARDS:
        panel = _ratio_panel(boards[uid])
        assert _steps(panel) == [(None, "red"), (1.0, "orange"), (1.6, "green")], uid
        assert "Orange below 1.6 " in panel["description"], uid
        assert "steps of 30s" in panel["fieldConfig"]["defaults"]["noValue"], uid
    # without an SLO file the fleet board takes the defaults
    default = _ratio_panel(_rendered(None)[fleet.UID])
    assert _steps(default) == [(None, "red"), (1.0, "orange"), (HeadroomRules().low_ratio, "green")]


def test_fleet_row_follows_the_template_variables(spec: SLOFile) -> None:
    board = _rendered(spec)[fleet.UID]
    for panel in _row(board):
        for target in panel["targets"]:
            expr = target["expr"]
            if V.REPLICAS_NEEDED_RECORD in expr or expr.startswith("count by"):
                # per model: the record has no engine or instance
                assert '{model=~"$model"}' in expr, expr
            else:
                assert '{engine=~"$engine", model=~"$model", instance=~"$instance"}' in expr, expr


def test_slo_row_reads_this_slo_files_service(spec: SLOFile) -> None:
    board = _rendered(spec)[slos.UID]
    exprs = [t["expr"] for p in _row(board) for t in p["targets"]]
    for expr in exprs:
        assert "$" not in expr, expr  # the SLO board has no $engine/$model/$instance
        selectors = re.findall(r"\{[^}]*\}", expr)
        assert selectors and set(selectors) == {f'{{{V.SLO_SERVICE_LABEL}="{spec.service}"}}'}, expr
    other = _rendered(spec.model_copy(update={"service": "batch-tier"}))[slos.UID]
    assert all('="batch-tier"}' in t["expr"] for p in _row(other) for t in p["targets"])


def test_empty_headroom_says_why_without_bucket_reasons(spec: SLOFile) -> None:
    """The rules read the signals' sums and counts: an engine without a signal is named, one whose histogram
    lacks buckets only is not (its mean is there)."""
    profiles = builtin_profiles()
    boards = _rendered(spec)
    bucket_reasons = {
        profile.bucketless[m.key]
        for profile in profiles.values()
        for m in headroom_row.SIGNALS
        if m.key in profile.bucketless and m.key not in profile.unsupported
    }
    assert bucket_reasons, "no engine lacks only the buckets of a signal: the check proves nothing"
    for uid in BOARDS:
        for panel in _row(boards[uid]):
            text = panel["fieldConfig"]["defaults"]["noValue"]
            assert text.endswith(headroom_row.no_data(spec.headroom)[1:]), text
            for name, profile in profiles.items():
                lacks = [profile.unsupported[m.key] for m in headroom_row.SIGNALS if m.key in profile.unsupported]
                assert (f"Not exposed by {profile.title}:" in text) == bool(lacks), (uid, name)
                assert all(reason in text for reason in lacks)
            assert not any(reason in text for reason in bucket_reasons), (uid, panel["title"])


def test_dashboard_records_are_generated_rules(spec: SLOFile) -> None:
    """Every recording-rule name a dashboard query reads is recorded by ``generate alerts`` (the headroom
    records are exempt only while their rules have not landed in the generator at all)."""
    rules = yaml.safe_load(generate_alerts(spec, V.Vocabulary())["rules.yml"])
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    used = {name for _, _, q in all_queries(spec, V.Vocabulary()) for name in RECORD_NAME.findall(q.expr)}
    assert HEADROOM_RECORDS <= used and len(used - HEADROOM_RECORDS) > 0
    pending = HEADROOM_RECORDS if not HEADROOM_RECORDS & recorded else set()
    assert used - recorded <= pending, sorted(used - recorded - pending)


def test_headroom_code_spells_no_record_name() -> None:
    """Record and label names come from the vocabulary: no string of the dashboard code spells one."""
    names = {*HEADROOM_RECORDS, V.LABEL_LIMITING_SLO, V.HEADROOM_KV_LIMIT, V.ALERT_HEADROOM_LOW}
    for path in sorted((ROOT / "inferwatch" / "dashboards").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not {n for n in names if n in node.value}, f"{path.relative_to(ROOT)}:{node.lineno}"


def test_headroom_panels_keep_their_place(spec: SLOFile) -> None:
    """The row closes both boards (the panels before it keep their ids), two panels a line."""
    for board in dashboards(spec, V.Vocabulary()):
        if board.uid not in BOARDS:
            continue
        titles = [item.title for item in board.panels]
        start = titles.index(headroom_row.ROW_TITLE)
        assert len(titles) - start == 5, board.uid
        placed = M.layout(board.panels)[start + 1 :]
        assert [(p.x, p.w) for p in placed] == [(0, 12), (12, 12), (0, 12), (12, 12)]
