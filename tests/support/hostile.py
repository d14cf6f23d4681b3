"""Hostile alert content, and an audit of the HTML a page made of it, for the incident-page security tests.

Every script payload has one visible side effect, tagged by the payload that caused it: it sets
``document.title`` to ``PWNED-<tag>`` and appends an element with the id ``pwned-<tag>``. A browser that
ran any of them shows it in the title or the DOM (:data:`PROBE` reads both back). The JavaScript uses
backticks only, so one payload fits in a double-quoted, a single-quoted or an unquoted attribute.

:func:`audit` parses a page with the standard library's HTML parser (the way a browser tokenises it)
and lists what a page made of alert content must never hold: a tag outside those the page emits, an
event-handler or ``style`` attribute, a link or source whose scheme is not ``http``/``https``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Final

from inferwatch.collector.diagnosis.report import Evidence, Finding
from inferwatch.collector.incidents.messages import AlertSummary, DashboardLink, Enrichment
from inferwatch.collector.incidents.views import Delivery, IncidentDetail, TimelineEntry
from inferwatch.collector.schemas import RequestDetail
from inferwatch.core.symptoms import Status, Symptom


def js(tag: str) -> str:
    """The side effect of payload ``tag``: a title and an element a probe can find."""
    return (
        f"document.title=`PWNED-{tag}`;"
        f"document.documentElement.appendChild(document.createElement(`p`)).id=`pwned-{tag}`"
    )


MARKUP: Final = {
    "script": f"<script>{js('script')}</script>",
    "img": f'<img src=x onerror="{js("img")}">',
    "svg": f"<svg onload={js('svg').replace(';', ',')}>",
    "svg-script": f"<svg><script>{js('svg-script')}</script></svg>",
    "iframe": f'<iframe srcdoc="<script>parent.{js("iframe")}</script>"></iframe>',
    "dquote": f'" autofocus onfocus="{js("dquote")}" x="',
    "squote": f"' autofocus onfocus='{js('squote')}' x='",
    "close-tag": f'</span></td></tr></table></main><details open ontoggle="{js("close-tag")}">',
    "style": f"</style><script>{js('style')}</script>",
    "title": f"</title><script>{js('title')}</script>",
    "comment": f"--><script>{js('comment')}</script><!--",
    "slack": "<!channel> <!here> <@U123> <http://evil.example|click me> & done",
}
"""text payloads: each is placed in labels, annotations and names."""
ALL_MARKUP: Final = " ".join(MARKUP.values())
NOW: Final = datetime.now(UTC).replace(microsecond=0)

URLS: Final = {
    "javascript": f"javascript:{js('javascript')}//",
    "javascript-case": f"JaVaScRiPt:{js('javascript-case')}//",
    "javascript-space": f" \tjavascript:{js('javascript-space')}//",
    "javascript-entity": f"&#106;avascript:{js('javascript-entity')}//",
    "data": f"data:text/html,<script>{js('data')}</script>",
    "data-svg": f"data:image/svg+xml,<svg onload={js('data-svg').replace(';', ',')}>",
    "vbscript": "vbscript:msgbox(1)",
    "relative": "/incidents/1?next=javascript:alert(1)",
    "breakout": f'https://ok.example/"autofocus/onfocus="{js("breakout")}"x="',
    "breakout-squote": f"https://ok.example/'autofocus/onfocus='{js('breakout-squote')}'x='",
}
"""URLs a link must not be made of, except the ``breakout`` ones: http URLs (without white space) that try
to leave their attribute."""

SAFE_TAGS: Final = frozenset(
    [
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "main",
        "h1",
        "h2",
        "p",
        "span",
        "div",
        "b",
        "br",
        "ul",
        "li",
        "a",
        "table",
        "tr",
        "td",
        "th",
        "code",
        "details",
        "summary",
    ]
)
SAFE_ATTRIBUTES: Final = frozenset({"lang", "charset", "name", "content", "class", "href", "title", "rel"})
WEB_SCHEMES: Final = ("http://", "https://")

PROBE: Final = """JSON.stringify({
  title: document.title,
  pwned: Array.from(document.querySelectorAll('[id^="pwned"]'), e => e.id),
  anchors: Array.from(document.querySelectorAll('a[href]'), a => a.getAttribute('href')),
  sources: Array.from(document.querySelectorAll('[src],[srcdoc],[action],[formaction],[data]'), e => e.outerHTML),
  tags: Array.from(new Set(Array.from(document.querySelectorAll('*'), e => e.localName))),
  handlers: Array.from(document.querySelectorAll('*')).flatMap(
    e => Array.from(e.attributes).filter(a => a.name.startsWith('on')).map(a => e.localName + ' ' + a.name)),
  badge: (e => e ? getComputedStyle(e).backgroundColor : null)(document.querySelector('.badge.firing')),
  bars: Array.from(document.querySelectorAll('.bar'), b => Array.from(b.children,
    s => Math.round(100 * s.getBoundingClientRect().width / b.getBoundingClientRect().width))),
  text: document.body ? document.body.innerText : '',
})"""
"""read back in the page: what ran (title, ``pwned-*`` elements), every link, the tags and handlers, and the
firing badge's computed colour and the phase bars' widths in percent (the page's own stylesheet applied under
its policy)."""


@dataclass
class Audit:
    """What :func:`audit` found; ``problems`` is empty for a page that runs nothing."""

    problems: list[str] = field(default_factory=list)
    hrefs: list[str] = field(default_factory=list)
    text: str = ""
    styles: list[str] = field(default_factory=list)


class _Auditor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found = Audit()
        self._chunks: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in SAFE_TAGS:
            self.found.problems.append(f"<{tag}> element")
        for name, value in attrs:
            if name not in SAFE_ATTRIBUTES:
                self.found.problems.append(f"<{tag} {name}=...> attribute")
            if name == "href":
                self.found.hrefs.append(value or "")
                if not (value or "").lower().startswith(WEB_SCHEMES):
                    self.found.problems.append(f"<{tag} href={value!r}>: not an http(s) link")
        self._in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.found.styles.append(data)
        else:
            self._chunks.append(data)

    def handle_comment(self, data: str) -> None:
        self.found.problems.append(f"a comment: {data[:60]!r}")


def audit(page: str) -> Audit:
    """Parse ``page``: its problems, its links, its text (entities decoded) and its ``<style>`` contents."""
    parser = _Auditor()
    parser.feed(page)
    parser.close()
    parser.found.text = "".join(parser._chunks)
    return parser.found


def hostile_request() -> RequestDetail:
    phase = {"seconds": 0.5, "share": 0.25}
    return RequestDetail.model_validate(
        {
            "id": 1,
            "trace_id": MARKUP["img"],
            "span_id": "0" * 16,
            "request_id": MARKUP["script"],
            "engine": MARKUP["dquote"],
            "model": MARKUP["svg"],
            "instance": None,
            "service": None,
            "start_time": NOW,
            "end_time": NOW,
            "time_to_first_token": 0.1,
            "ttft_derived": False,
            "time_per_output_token": None,
            "request_duration": 2.0,
            "request_queue": 0.5,
            "request_prefill": 0.5,
            "request_decode": 0.5,
            "prompt_tokens": None,
            "generation_tokens": None,
            "prefix_cache_hit_tokens": None,
            "finish_reason": MARKUP["squote"],
            "error": None,
            "n": None,
            "max_tokens": None,
            "temperature": None,
            "lora_adapter": None,
            "attributes": {"x": MARKUP["script"]},
            "received_at": NOW,
            "phases": {"queue": phase, "prefill": phase, "decode": phase, "other": phase},
        }
    )


def hostile_finding() -> Finding:
    return Finding(
        symptom=Symptom.PREEMPTIONS,
        severity=Status.CRITICAL,
        engine=MARKUP["script"],
        model=MARKUP["img"],
        instance=MARKUP["dquote"],
        summary=MARKUP["svg"],
        cause=MARKUP["close-tag"],
        remedies=[f"--max-num-seqs {MARKUP['squote']}", MARKUP["title"]],
        evidence=[
            Evidence(
                signal="x",
                description=MARKUP["comment"],
                value=1.0,
                unit="s",
                threshold=MARKUP["style"],
                query=ALL_MARKUP,
            )
        ],
        runbook="preemptions",
    )


def hostile_detail(runbook: str | None = URLS["javascript"], dashboards: list[str] | None = None) -> IncidentDetail:
    labels = {f"label_{i}": v for i, v in enumerate(MARKUP.values())}
    summary = AlertSummary(
        alertname=ALL_MARKUP,
        status="firing",
        severity=MARKUP["squote"],
        labels=labels,
        annotations={"summary": ALL_MARKUP, "runbook_url": URLS["javascript"]},
        starts_at=NOW,
        ends_at=None,
        generator_url=URLS["data"],
    )
    urls = list(URLS.values()) if dashboards is None else dashboards
    enrichment = Enrichment(
        source=MARKUP["script"],
        findings=[hostile_finding()],
        example_requests=[hostile_request()],
        runbook_url=runbook,
        dashboards=[DashboardLink(title=MARKUP["img"], url=u) for u in urls],
        error=None,
    )
    delivery = Delivery(
        id=1,
        receiver=MARKUP["dquote"],
        format="slack",
        event=MARKUP["script"],
        state="dead",
        attempts=3,
        max_attempts=3,
        created_at=NOW,
        next_attempt_at=None,
        delivered_at=None,
        last_status=500,
        last_error=ALL_MARKUP,
        attempt_log=[],
    )
    return IncidentDetail(
        id=7,
        status="firing",
        title=ALL_MARKUP,
        severity=MARKUP["svg"],
        labels=labels,
        opened_at=NOW - timedelta(minutes=3),
        updated_at=NOW,
        resolved_at=None,
        alerts=1,
        firing_alerts=1,
        top_finding=MARKUP["img"],
        enrichment_state="done",
        enrichment=enrichment,
        alert_list=[summary],
        timeline=[TimelineEntry(at=NOW, kind=MARKUP["script"], detail=ALL_MARKUP, forwarded=True)],
        deliveries=[delivery],
    )
