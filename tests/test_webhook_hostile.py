"""Hostile and malformed input on Alertmanager's webhook: every case answers 4xx naming the problem, never 5xx.

The cases the issue measured (bodies nested 100,000 and 5,000 levels deep, a ``truncatedAlerts`` past any
integer column, alert times in 1970 and 9999, an alert without ``alertname``), the limits on the payload's
strings and lists, text the stores cannot hold (NUL, lone surrogates: stored as U+FFFD), and a property-based
fuzz of the route against the real app: arbitrary JSON values, mutated valid notifications, raw bytes; no
answer may be a server error, and valid notifications still open incidents. Each case runs on SQLite and on
PostgreSQL (which holds no NUL in text or JSON).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from inferwatch.collector.api.app import create_app
from inferwatch.collector.settings import CollectorSettings
from inferwatch.collector.store.tables import ALERTS_TABLE, NOTIFICATIONS_TABLE
from tests.conftest import postgres_schema
from tests.support.alertmanager import ZERO_TIME, alert, notification

WEBHOOK = "/api/v1/alerts/webhook"
JSON_HEADERS = {"content-type": "application/json"}
EXAMPLES = int(os.environ.get("INFERWATCH_FUZZ_EXAMPLES", "100"))
"""Examples per fuzz test and store (four tests, two stores); set ``INFERWATCH_FUZZ_EXAMPLES`` for a longer run."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=bool(os.environ.get("CI")),  # the same cases on every CI run, as in test_openapi_fuzz
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
UNIQUE = itertools.count()
"""Makes each generated valid notification a new alert in a new group (Hypothesis repeats its examples)."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The collector's app, server errors answered as statuses (500) rather than raised into the test."""
    data: Path = tmp_path_factory.mktemp(f"webhook-{request.param}")
    store = postgres_schema("iw_webhook") if request.param == "postgresql" else contextlib.nullcontext(None)
    with store as url:
        settings = CollectorSettings(data_dir=data, grpc_listen=None, database_url=url)
        with TestClient(create_app(settings), raise_server_exceptions=False) as c:
            yield c


def now() -> datetime:
    return datetime.now(UTC)


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def valid(labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A notification as Alertmanager sends it: one alert that started a minute ago, new in a new group."""
    n = next(UNIQUE)
    labels = labels or {}
    body = alert(
        "HostileInputTest", {"model": f"m{n}", "severity": "page", **labels}, starts=now() - timedelta(minutes=1)
    )
    body["fingerprint"] = f"{os.getpid():x}{n:08x}{body['fingerprint']}"[:64]
    note = notification([body], group={"alertname": "HostileInputTest", "model": f"m{n}"})
    note["groupKey"] += f"/{os.getpid()}-{n}"
    return note


def post(client: TestClient, body: bytes | dict[str, Any]) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(WEBHOOK, content=content, headers=JSON_HEADERS)


def count(client: TestClient, table: Any) -> int:
    with client.app.state.collector.engine.connect() as conn:  # type: ignore[attr-defined]
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def refused(client: TestClient, body: bytes | dict[str, Any], *words: str) -> str:
    """``body`` is answered 400 naming each of ``words``, and nothing is stored; the message."""
    before = count(client, NOTIFICATIONS_TABLE)
    r = post(client, body)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    detail = str(r.json()["detail"])
    for word in words:
        assert word in detail, detail
    assert count(client, NOTIFICATIONS_TABLE) == before
    return detail


def with_alert(**fields: Any) -> dict[str, Any]:
    note = valid()
    note["alerts"][0].update(fields)
    return note


# -- the issue's cases ----------------------------------------------------------------------------------------------


def test_the_issue_cases_answer_400(client: TestClient) -> None:
    """Three bodies answered 500: 100,000 nested arrays beside the version, an annotation of 5,000 nested
    arrays (RecursionError while parsing), and a ``truncatedAlerts`` no integer column holds."""
    deep = b'{"version":"4","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert "nest" in refused(client, deep)
    note = json.dumps(valid())
    nested = note.replace('"annotations": {', '"annotations": {"deep": ' + "[" * 5000 + "]" * 5000 + ", ", 1)
    assert "nest" in refused(client, nested.encode())
    refused(client, {**valid(), "truncatedAlerts": 10**30}, "truncatedAlerts")
    refused(client, {**valid(), "truncatedAlerts": 2**31}, "truncatedAlerts")
    assert post(client, {**valid(), "truncatedAlerts": 2**31 - 1}).status_code == 200


def test_alert_times_outside_the_window_are_refused(client: TestClient) -> None:
    """startsAt within [now - 10 years, now + 1 day]; endsAt the same or Alertmanager's zero time (unset)."""
    t = now()
    for starts in (5, "1970-01-01T00:00:05Z", "9999-12-31T23:59:59Z", iso(t + timedelta(days=2)), ZERO_TIME):
        refused(client, with_alert(startsAt=starts), "alerts.0.startsAt")
    # offsets that move the time past datetime's range (OverflowError once)
    for starts in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        refused(client, with_alert(startsAt=starts), "alerts.0.startsAt")
    refused(client, with_alert(status="resolved", endsAt="9999-12-31T23:59:59Z"), "alerts.0.endsAt")
    refused(client, with_alert(status="resolved", endsAt="1970-01-01T00:00:00Z"), "alerts.0.endsAt")
    # what Alertmanager sends: nanoseconds, an offset, an alert firing for years (a Watchdog), the zero endsAt
    for starts in (
        (t - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z"),
        (t - timedelta(hours=1)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00"),
        iso(t - timedelta(days=9 * 365)),
        iso(t + timedelta(hours=1)),  # the sender's clock a little ahead
    ):
        r = post(client, with_alert(startsAt=starts, endsAt=ZERO_TIME))
        assert r.status_code == 200 and r.json()["new_alerts"] == 1, r.text
    r = post(client, with_alert(status="resolved", startsAt=iso(t - timedelta(hours=2)), endsAt=iso(t)))
    assert r.status_code == 200, r.text


def test_an_alert_without_alertname_is_refused(client: TestClient) -> None:
    before = count(client, ALERTS_TABLE)
    refused(client, with_alert(labels={"model": "m", "severity": "page"}), "alerts.0:", "alertname")
    refused(client, with_alert(labels={"alertname": "", "model": "m"}), "alertname")
    second = valid()
    second["alerts"].append({**second["alerts"][0], "labels": {"instance": "x"}, "fingerprint": "f2"})
    refused(client, second, "alerts.1:", "alertname")
    assert count(client, ALERTS_TABLE) == before


def test_a_title_lists_ten_names_and_is_cut(client: TestClient) -> None:
    """A notification of many long-named alerts: the incident's title and the timeline list ten names, then
    how many more, and stay within 1,000 characters (were every name joined: 60 kB here)."""
    note = valid()
    first = note["alerts"][0]
    note["alerts"] = [
        {**first, "labels": {**first["labels"], "alertname": f"{i:02d}" + "n" * 1200}, "fingerprint": f"{i}"}
        for i in range(50)
    ]
    r = post(client, note)
    assert r.status_code == 200 and r.json()["new_alerts"] == 50, r.text
    detail = client.get(f"/api/v1/incidents/{r.json()['incidents'][0]}").json()
    assert len(detail["title"]) <= 1000 and detail["title"].startswith("00nnn")
    events = [e["detail"] for e in detail["timeline"] if e["forwarded"]]
    assert len(events) == 1 and len(events[0]) <= 1000 and events[0].startswith("50 alert(s) firing: 00n")
    short = valid()
    short["alerts"] = [
        {**first, "labels": {**first["labels"], "alertname": f"A{i}"}, "fingerprint": f"s{i}"} for i in range(12)
    ]
    r = post(client, short)
    title = client.get(f"/api/v1/incidents/{r.json()['incidents'][0]}").json()["title"]
    assert title.startswith("A0 + A1 + A10 + A11 + A2") and "+ 2 more (" in title, title


# -- limits and text ------------------------------------------------------------------------------------------------


def test_strings_and_lists_over_their_limits_are_refused(client: TestClient) -> None:
    base = valid()
    labels = base["alerts"][0]["labels"]
    refused(client, with_alert(labels={**labels, "x": "v" * 20_000}), "alerts.0.labels", "16384")
    refused(client, with_alert(labels={**labels, "n" * 2000: "v"}), "alerts.0.labels", "1024")
    refused(client, with_alert(annotations={"description": "d" * 70_000}), "alerts.0.annotations", "65536")
    refused(client, with_alert(labels={**labels, **{f"l{i}": "v" for i in range(300)}}), "alerts.0.labels", "256")
    refused(client, {**base, "receiver": "r" * 20_000}, "receiver")
    many = {**base, "alerts": [{**base["alerts"][0], "fingerprint": f"f{i}"} for i in range(1001)]}
    refused(client, many, "alerts", "1000")
    refused(client, json.dumps(base).encode("utf-16"), "UTF-8")
    refused(client, b'{"version": "4", "x": NaN}', "NaN")
    refused(client, {**base, "version": "v" * 100_000}, "unsupported payload version")
    assert len(refused(client, {**base, "version": ["x" * 100_000]})) < 400  # the message quotes a bounded part
    # up to the limits: stored
    big = with_alert(labels={**labels, "x": "v" * 16_384, "n" * 1024: "v"}, annotations={"description": "d" * 65_536})
    assert post(client, big).status_code == 200


def test_text_the_stores_cannot_hold_is_stored_as_replacement_characters(client: TestClient) -> None:
    """NUL (PostgreSQL holds none in text or JSON) and lone surrogates (no UTF-8 encoding): U+FFFD."""
    note = valid({"extra": "a\x00b\ud800c"})
    note["receiver"] = "recv\x00\udfff"
    note["alerts"][0]["annotations"]["k\x00\ud83d"] = "\x00"
    note["groupLabels"]["g\udc00"] = "\ud800"
    r = post(client, json.dumps(note).encode())  # json.dumps escapes both as \u0000 and \udXXX
    assert r.status_code == 200 and r.json()["new_alerts"] == 1, r.text
    with client.app.state.collector.engine.connect() as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            select(ALERTS_TABLE.c.labels, ALERTS_TABLE.c.annotations).where(
                ALERTS_TABLE.c.fingerprint == note["alerts"][0]["fingerprint"]
            )
        ).one()
        receiver = conn.execute(
            select(NOTIFICATIONS_TABLE.c.receiver).order_by(NOTIFICATIONS_TABLE.c.id.desc()).limit(1)
        ).scalar_one()
    assert row.labels["extra"] == "a\ufffdb\ufffdc" and row.annotations["k\ufffd\ufffd"] == "\ufffd"
    assert receiver == "recv\ufffd\ufffd"
    # a surrogate pair is one character, kept as it is
    pair = valid({"emoji": "\U0001f600"})
    assert post(client, pair).status_code == 200


# -- property-based fuzz --------------------------------------------------------------------------------------------

ODD_TEXT = st.text(
    st.one_of(
        st.characters(),
        st.integers(0xD800, 0xDFFF).map(chr),  # lone surrogates (st.characters leaves them out)
        st.sampled_from(["\x00", '"', "\\", "<", "\u202e", "\U0001f600"]),
    ),
    max_size=40,
)
HUGE_INTS = st.integers(min_value=-(2**100), max_value=2**100) | st.sampled_from([2**31, 2**63, 10**30, -1])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | HUGE_INTS
    | st.floats(allow_nan=False, allow_infinity=False)
    | ODD_TEXT
    | st.sampled_from(["firing", "resolved", "4", ZERO_TIME, "9999-12-31T23:59:59Z", "1970-01-01T00:00:00Z"])
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ODD_TEXT, children, max_size=4),
    max_leaves=30,
)
ODD_TIMES = st.one_of(
    st.datetimes(timezones=st.builds(timezone, st.timedeltas(-timedelta(hours=23), timedelta(hours=23)))).map(
        lambda d: d.isoformat()
    ),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    ODD_TEXT,
    st.sampled_from(
        [ZERO_TIME, "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59.999999999-12:00", "1970-01-01T00:00:00Z", ""]
    ),
)
ODD_MAPS = st.dictionaries(ODD_TEXT, ODD_TEXT | JSON_VALUES, max_size=5)
HUGE_TEXT = st.integers(min_value=1, max_value=300_000).map(lambda n: "x" * n)
ALERT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(["firing", "resolved", "pending", ""]) | ODD_TEXT,
    "labels": ODD_MAPS,
    "annotations": ODD_MAPS,
    "startsAt": ODD_TIMES,
    "endsAt": ODD_TIMES,
    "generatorURL": ODD_TEXT | HUGE_TEXT,
    "fingerprint": ODD_TEXT | HUGE_TEXT,
}
NOTE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "version": st.sampled_from(["4", "3", 4, ""]) | ODD_TEXT,
    "groupKey": ODD_TEXT | HUGE_TEXT,
    "truncatedAlerts": HUGE_INTS | st.floats(),
    "status": st.sampled_from(["firing", "resolved"]) | ODD_TEXT,
    "receiver": ODD_TEXT | HUGE_TEXT,
    "groupLabels": ODD_MAPS,
    "commonLabels": ODD_MAPS,
    "commonAnnotations": ODD_MAPS,
    "externalURL": ODD_TEXT | HUGE_TEXT,
    "alerts": st.lists(JSON_VALUES, max_size=3),
}
DEEP = "__deep__"
"""Stands for a run of nested arrays, put in the serialised body (Python's own json cannot write one)."""


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, bool, str, Any]:
    """One change to a valid notification: a field dropped, given an odd value of its kind or any JSON value,
    nested deeply, or an odd label or annotation added."""
    in_alert = draw(st.booleans())
    fields = ALERT_FIELDS if in_alert else NOTE_FIELDS
    name = draw(st.sampled_from(sorted(fields)))
    kind = draw(st.sampled_from(["drop", "odd", "any", "deep", "label", "annotation"]))
    if kind == "odd":
        value: Any = draw(fields[name])
    elif kind == "any":
        value = draw(JSON_VALUES)
    elif kind == "deep":
        value = draw(st.integers(min_value=1, max_value=20_000))
    elif kind in ("label", "annotation"):
        value = (draw(ODD_TEXT | HUGE_TEXT), draw(ODD_TEXT | HUGE_TEXT | JSON_VALUES))
    else:
        value = None
    return kind, in_alert, name, value


def mutated(mutations: list[tuple[str, bool, str, Any]]) -> bytes:
    """A valid notification with ``mutations`` applied, serialised."""
    note = valid()
    depth = 0
    for kind, in_alert, name, value in mutations:
        alerts = note.get("alerts")
        alert_ok = isinstance(alerts, list) and alerts and isinstance(alerts[0], dict)
        target = alerts[0] if in_alert and alert_ok else note  # type: ignore[index]
        if kind == "drop":
            target.pop(name, None)
        elif kind in ("odd", "any"):
            target[name] = value
        elif kind == "deep":
            target[name], depth = DEEP, value
        else:
            where = target.get("labels" if kind == "label" else "annotations")
            if isinstance(where, dict):
                where[value[0]] = value[1]
    body = json.dumps(note)
    return body.replace(f'"{DEEP}"', "[" * depth + "]" * depth, 1).encode()


def store_of(client: TestClient) -> str:
    return str(client.app.state.collector.engine.dialect.name)  # type: ignore[attr-defined]


def answered(client: TestClient, body: bytes | dict[str, Any], tally: list[int]) -> Any:
    """Post ``body`` (counted in ``tally``); assert no server error."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(WEBHOOK, content=content, headers=JSON_HEADERS)
    tally[0] += 1
    assert r.status_code < 500, f"{r.status_code} for {content[:300]!r}: {r.text[:300]}"
    return r


def report(client: TestClient, what: str, tally: list[int]) -> None:
    print(f"\nwebhook fuzz, {what} on {store_of(client)}: {tally[0]} cases, 0 server errors")
    assert tally[0] >= EXAMPLES


def test_fuzz_any_json_value(client: TestClient) -> None:
    tally = [0]

    @FUZZ
    @given(JSON_VALUES)
    def run(doc: Any) -> None:
        answered(client, doc, tally)
        answered(client, {"version": "4", "alerts": doc}, tally)

    run()
    report(client, "JSON values", tally)


def test_fuzz_raw_bytes(client: TestClient) -> None:
    tally = [0]

    @FUZZ
    @given(st.binary(max_size=300), st.integers(min_value=0, max_value=2**16))
    def run(noise: bytes, cut: int) -> None:
        answered(client, noise, tally)
        real = bytearray(json.dumps(valid()).encode())
        real[cut % len(real) : cut % len(real) + len(noise)] = noise  # a valid body overwritten in part
        answered(client, bytes(real), tally)

    run()
    report(client, "raw bytes", tally)


def test_fuzz_mutated_notifications(client: TestClient) -> None:
    tally = [0]

    @FUZZ
    @given(st.lists(mutations(), min_size=1, max_size=3))
    def run(changes: list[tuple[str, bool, str, Any]]) -> None:
        answered(client, mutated(changes), tally)

    run()
    report(client, "mutated notifications", tally)


def test_fuzz_valid_notifications_open_incidents(client: TestClient) -> None:
    """Whatever the labels' text (any code point), annotations and times within the window, a firing
    notification of new alerts is stored and opens an incident."""
    tally = [0]

    @FUZZ
    @given(
        st.dictionaries(
            ODD_TEXT.filter(lambda k: k not in {"", "alertname", "model", "severity"}),
            ODD_TEXT,
            max_size=6,
        ),
        ODD_TEXT,
        st.integers(min_value=0, max_value=10 * 365 * 24 * 60 - 60),
        st.integers(min_value=1, max_value=5),
    )
    def run(labels: dict[str, str], summary: str, minutes_ago: int, alerts: int) -> None:
        note = valid(labels)
        first = note["alerts"][0]
        first["annotations"]["summary"] = summary
        first["startsAt"] = iso(now() - timedelta(minutes=minutes_ago))
        for i in range(1, alerts):
            note["alerts"].append({**first, "fingerprint": f"{first['fingerprint'][:60]}-{i}"})
        r = answered(client, note, tally)
        assert r.status_code == 200, r.text
        assert r.json()["new_alerts"] == alerts and len(r.json()["incidents"]) == 1

    run()
    report(client, "valid notifications", tally)
