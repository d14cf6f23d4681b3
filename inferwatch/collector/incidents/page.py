"""The incident page (``/incidents/{id}``): server-rendered HTML, no JavaScript, readable on a phone.

What fired and since when, the diagnosis with its evidence, the slowest requests with their phase
breakdown, the remedy, and links to the dashboards and the runbook; then the alerts, the timeline
and where the notifications went.

The page runs nothing, whatever the alerts say: every value is HTML-escaped (quotes too, for the values in
attributes), a URL becomes a link only when it is an absolute http or https URL
(:func:`~inferwatch.collector.incidents.markup.web_url`; anything else is shown as text), and the route sends
:data:`CONTENT_SECURITY_POLICY`: nothing but the page's own ``<style>`` element, allowed by its hash, so
the page has no ``style`` attribute (the phase bars' colours and widths are classes), no script, no image.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from datetime import UTC, datetime
from html import escape
from typing import Final

from inferwatch.collector.diagnosis.report import Finding
from inferwatch.collector.incidents.markup import web_url
from inferwatch.collector.incidents.views import IncidentDetail
from inferwatch.collector.schemas import RequestDetail

FLAG: Final = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*(?:[= ][a-z0-9.]+(?=\)))?")
"""an engine's command-line flag in a remedy (with its value when one closes the parentheses)."""
PHASE_COLOURS: Final = {"queue": "#e53935", "prefill": "#fb8c00", "decode": "#1e88e5", "other": "#9e9e9e"}
STYLE: Final = (
    """
*{box-sizing:border-box}body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;
color:#1b1b1b;background:#f6f7f9}main{max-width:760px;margin:0 auto;padding:12px}
h1{font-size:1.3em;margin:.2em 0 .4em}h2{font-size:1.05em;margin:1.4em 0 .5em;border-bottom:1px solid #ddd}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;color:#fff;font-size:.8em;font-weight:600}
.firing{background:#d32f2f}.resolved{background:#2e7d32}.warning{background:#f9a825;color:#222}
.critical{background:#d32f2f}.card{background:#fff;border:1px solid #e0e0e0;border-radius:8px;padding:10px 12px;
margin:8px 0}.muted{color:#666;font-size:.9em}code{font-size:.82em;word-break:break-all;background:#f1f3f5;
padding:1px 3px;border-radius:3px}ul{padding-left:1.2em;margin:.3em 0}.bar{display:flex;height:12px;
border-radius:3px;overflow:hidden;margin:4px 0}.bar span{display:block;height:100%}
.remedy{background:#e3f2fd;border-left:4px solid #1e88e5}table{border-collapse:collapse;width:100%;font-size:.9em}
td,th{text-align:left;padding:3px 6px;border-bottom:1px solid #eee;vertical-align:top}.flag{white-space:nowrap}
a{color:#1565c0}.labels span{display:inline-block;background:#eceff1;border-radius:4px;padding:0 6px;margin:2px;
font-size:.85em}
"""
    + "".join(
        f".phase-{name}{{background:{colour}}}.key-{name}{{color:{colour}}}" for name, colour in PHASE_COLOURS.items()
    )
    + "".join(f".w{i}{{width:{i}%}}" for i in range(101))
)
"""the page's only style: the phase bars' colours and widths (whole percent) are classes of it."""
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; "
    f"style-src 'sha256-{base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""the incident page's policy: its ``<style>`` element (by hash) and nothing else; it may not be framed."""


def _ago(when: datetime, now: datetime) -> str:
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def _time(when: datetime | None) -> str:
    return "—" if when is None else escape(when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))


def _labels(labels: dict[str, str]) -> str:
    return (
        '<div class="labels">'
        + "".join(f"<span>{escape(k)}={escape(v)}</span>" for k, v in sorted(labels.items()))
        + "</div>"
    )


def _link(url: str | None, text: str) -> str:
    """A link to ``url`` when it is an http(s) URL; otherwise the text and the URL, as text.

    ``rel="noreferrer"`` as well as the ``Referrer-Policy`` header: the page's address holds its signed key.
    """
    target = web_url(url)
    if target is None:
        return f'{escape(text)}: <code>{escape(url or "")}</code> <span class="muted">(not an http(s) URL)</span>'
    return f'<a rel="noreferrer" href="{escape(target)}">{escape(text)}</a>'


def _width(share: float | None) -> int:
    """A phase's share as a whole percent from 0 to 100 (the ``w<n>`` class of its bar)."""
    if share is None or not math.isfinite(share):
        return 0
    return min(100, max(0, round(100 * share)))


def _remedy(text: str) -> str:
    """The escaped remedy with each flag kept on one line (a phone would break ``--max-num-seqs`` at its dashes)."""
    return FLAG.sub(lambda m: f'<span class="flag">{m.group(0)}</span>', escape(text))


def _finding(finding: Finding) -> str:
    sev = escape(finding.severity.value)
    evidence = "".join(
        f"<li>{escape(e.description)}: <b>{escape(_value(e.value, e.unit))}</b>"
        f"{' (' + escape(e.threshold) + ')' if e.threshold else ''}<br><code>{escape(e.query)}</code></li>"
        for e in finding.evidence
    )
    remedies = "".join(f"<li>{_remedy(r)}</li>" for r in finding.remedies)
    return (
        f'<div class="card"><span class="badge {sev}">{sev}</span> <b>{escape(finding.symptom.value)}</b> '
        f'<span class="muted">{escape(finding.engine)} / {escape(finding.model)} @ {escape(finding.instance)}</span>'
        f"<p>{escape(finding.summary)}</p><p><b>Likely cause:</b> {escape(finding.cause)}</p>"
        f'<div class="card remedy"><b>Remedy</b><ul>{remedies}</ul></div>'
        f"<details><summary>Evidence</summary><ul>{evidence}</ul></details></div>"
    )


def _value(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.3g} {unit}".strip()


def _request(req: RequestDetail) -> str:
    shares = req.phases.model_dump()
    bar = "".join(
        f'<span class="phase-{name} w{_width(shares[name]["share"])}" title="{name}"></span>'
        for name in PHASE_COLOURS
        if name in shares
    )
    parts = ", ".join(
        f"{name} {shares[name]['share']:.0%}" for name in PHASE_COLOURS if shares.get(name, {}).get("share") is not None
    )
    e2e = f"{req.request_duration:.2f} s" if req.request_duration is not None else "?"
    ttft = f", TTFT {req.time_to_first_token:.2f} s" if req.time_to_first_token is not None else ""
    return (
        f'<div class="card"><code>{escape(req.request_id or req.trace_id)}</code> '
        f'<span class="muted">{escape(req.engine)} {escape(req.model or "")}</span><br>'
        f'e2e {escape(e2e)}{escape(ttft)}<div class="bar">{bar}</div>'
        f'<span class="muted">{escape(parts)}</span></div>'
    )


def render(detail: IncidentDetail, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    status = escape(detail.status)
    enrichment = detail.enrichment
    findings = enrichment.findings if enrichment else []
    top = findings[0] if findings else None
    body = [
        f"<h1>{escape(detail.title)}</h1>",
        f'<p><span class="badge {status}">{status.upper()}</span> '
        f"{escape(detail.severity or '')} · opened {_time(detail.opened_at)} ({escape(_ago(detail.opened_at, now))})"
        + (f" · resolved {_time(detail.resolved_at)}" if detail.resolved_at else "")
        + f" · {detail.firing_alerts} of {detail.alerts} alerts firing</p>",
        _labels(detail.labels),
    ]
    if top is not None:
        body.append(
            f'<div class="card remedy"><b>What to do first:</b> {_remedy(top.remedies[0]) if top.remedies else ""}'
            f'<br><span class="muted">{escape(top.summary)}</span></div>'
        )
    body.append("<h2>Diagnosis</h2>")
    if detail.enrichment_state == "pending":
        body.append('<p class="muted">The diagnosis is running; reload in a few seconds.</p>')
    elif enrichment is not None and enrichment.error:
        body.append(f'<p class="muted">No diagnosis: {escape(enrichment.error)}</p>')
    elif not findings:
        body.append('<p class="muted">The diagnosis found nothing abnormal for these labels.</p>')
    body += [_finding(f) for f in findings[:5]]
    if enrichment is not None and enrichment.example_requests:
        body.append("<h2>Slowest requests</h2>")
        legend = " ".join(f'<span class="key-{name}">■</span> {name}' for name in PHASE_COLOURS)
        body.append(f'<p class="muted">{legend}</p>')
        body += [_request(r) for r in enrichment.example_requests]
    links = []
    if enrichment is not None and enrichment.runbook_url:
        links.append(f"<li>{_link(enrichment.runbook_url, 'Runbook')}</li>")
    if enrichment is not None:
        links += [f"<li>{_link(d.url, d.title)}</li>" for d in enrichment.dashboards]
    if links:
        body.append("<h2>Links</h2><ul>" + "".join(links) + "</ul>")
    body.append("<h2>Alerts</h2><table><tr><th>alert</th><th>state</th><th>since</th></tr>")
    for alert in detail.alert_list:
        summary = alert.annotations.get("summary") or alert.annotations.get("description") or ""
        body.append(
            f'<tr><td><b>{escape(alert.alertname)}</b><br><span class="muted">{escape(summary)}</span>'
            f"{_labels(alert.labels)}</td><td>{escape(alert.status)}</td><td>{_time(alert.starts_at)}</td></tr>"
        )
    body.append("</table><h2>Timeline</h2><table>")
    body += [
        f"<tr><td>{_time(e.at)}</td><td>{escape(e.kind)}</td><td>{escape(e.detail)}</td></tr>" for e in detail.timeline
    ]
    body.append("</table>")
    if detail.deliveries:
        body.append(
            "<h2>Notifications sent</h2><table><tr><th>receiver</th><th>event</th><th>state</th><th>tries</th></tr>"
        )
        for d in detail.deliveries:
            error = (
                f'<br><span class="muted">{escape(d.last_error)}</span>'
                if d.last_error and d.state != "delivered"
                else ""
            )
            body.append(
                f"<tr><td>{escape(d.receiver)} ({escape(d.format)})</td><td>{escape(d.event)}</td>"
                f"<td>{escape(d.state)}{error}</td><td>{d.attempts}</td></tr>"
            )
        body.append("</table>")
    body.append(f'<p class="muted">inferwatch incident {detail.id} · page generated {_time(now)}</p>')
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(detail.title)} · inferwatch</title><style>{STYLE}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>"
    )
