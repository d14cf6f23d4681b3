"""What a receiver gets: the enriched incident (format ``json``) and its Slack rendering (``slack``).

:class:`IncidentMessage` is the documented JSON schema (``docs/alerts.md``); ``/openapi.json`` has it
too, as the incident read API returns its parts. A JSON receiver gets every string as the alert said it;
the Slack rendering escapes every text by Slack's rules (:mod:`~inferwatch.collector.incidents.markup`), so
the only links and mentions in it are the links built here: the incident page, an http(s) runbook, the
dashboards.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from inferwatch.collector.diagnosis.report import Finding
from inferwatch.collector.incidents.markup import slack_link, slack_text, web_url
from inferwatch.collector.schemas import RequestDetail

SCHEMA = "inferwatch.incident/v1"
Event = Literal["firing", "updated", "resolved"]


class DashboardLink(BaseModel):
    title: str
    url: str


class AlertSummary(BaseModel):
    alertname: str
    status: Literal["firing", "resolved"]
    severity: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None
    generator_url: str | None


class Enrichment(BaseModel):
    """What the collector adds to an alert: the diagnosis for its labels and where to look."""

    source: str | None = Field(None, description="where the diagnosis read its signals (prometheus, exporters)")
    findings: list[Finding] = Field(default_factory=list, description="most severe first")
    example_requests: list[RequestDetail] = Field(
        default_factory=list, description="the slowest matching requests since the alert started"
    )
    runbook_url: str | None = None
    dashboards: list[DashboardLink] = Field(default_factory=list)
    error: str | None = Field(None, description="why the diagnosis could not run (no upstream, unreachable)")


class IncidentMessage(BaseModel):
    schema_: str = Field(SCHEMA, alias="schema")
    event: Event = Field(description="firing: the incident opened; updated: more alerts fire; resolved: all ended")
    incident_id: int
    status: Literal["firing", "resolved"]
    title: str
    severity: str | None
    labels: dict[str, str]
    opened_at: datetime
    resolved_at: datetime | None
    summary: str
    alerts: list[AlertSummary]
    enrichment: Enrichment
    top_finding: Finding | None
    remedy: str | None = Field(description="the top finding's first remedy, in the engine's own terms")
    incident_url: str | None = Field(description="the incident page")

    model_config = {"populate_by_name": True}

    def json_body(self) -> dict[str, Any]:
        body: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        return body


SEVERITY_COLOURS = {"page": "#d32f2f", "critical": "#d32f2f", "ticket": "#f9a825", "warning": "#f9a825"}
RESOLVED_COLOUR = "#2e7d32"
DEFAULT_COLOUR = "#616161"


def slack_body(message: IncidentMessage) -> dict[str, Any]:
    """A Slack incoming-webhook message: title, severity colour, summary, top finding, remedy, links.

    Every text is escaped (:func:`~inferwatch.collector.incidents.markup.slack_text`); the links are
    :func:`~inferwatch.collector.incidents.markup.slack_link`, so a URL that is not http(s) is shown as text.
    """
    resolved = message.event == "resolved"
    colour = RESOLVED_COLOUR if resolved else SEVERITY_COLOURS.get(message.severity or "", DEFAULT_COLOUR)
    state = "RESOLVED" if resolved else (message.severity or "firing").upper()
    title = slack_text(f"[{state}] {message.title}")
    fields: list[dict[str, Any]] = []
    finding = message.top_finding
    if finding is not None and not resolved:
        where = f"{finding.engine} / {finding.model} @ {finding.instance}"
        fields.append(
            {
                "title": slack_text(f"Finding: {finding.symptom.value} ({finding.severity.value})"),
                "value": slack_text(f"{finding.summary}\n{where}"),
                "short": False,
            }
        )
        fields.append({"title": "Likely cause", "value": slack_text(finding.cause), "short": False})
    if message.remedy and not resolved:
        fields.append({"title": "Remedy", "value": slack_text(message.remedy), "short": False})
    if message.enrichment.example_requests and not resolved:
        slowest = message.enrichment.example_requests[0]
        e2e = f"{slowest.request_duration:.2f} s" if slowest.request_duration is not None else "?"
        value = slack_text(f"{slowest.request_id or slowest.trace_id}: {e2e}")
        fields.append({"title": "Slowest request", "value": value, "short": True})
    links = []
    if message.incident_url:
        links.append(slack_link(message.incident_url, "Incident page"))
    if message.enrichment.runbook_url:
        links.append(slack_link(message.enrichment.runbook_url, "Runbook"))
    links += [slack_link(d.url, d.title) for d in message.enrichment.dashboards]
    if links:
        fields.append({"title": "Links", "value": " · ".join(links), "short": False})
    attachment: dict[str, Any] = {
        "color": colour,
        "title": title,
        "text": slack_text(message.summary),
        "fields": fields,
        "footer": f"inferwatch incident {message.incident_id}",
        "ts": int((message.resolved_at if resolved and message.resolved_at else message.opened_at).timestamp()),
    }
    if web_url(message.incident_url):
        attachment["title_link"] = message.incident_url
    return {"text": title, "attachments": [attachment]}
