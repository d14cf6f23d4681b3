"""Alert content inside other people's markup: which URLs may become links, and Slack's escaping.

Whatever an alert carries (its name, labels, annotations, the URLs in them) is written by whoever can
make Alertmanager send a notification, so it is shown as text and never as markup: the incident page
HTML-escapes it (:func:`html.escape`, quotes included, so it stays inside an attribute too), and a
Slack message escapes it by Slack's rules (:func:`slack_text`), so ``<!channel>``, ``<!here>``,
``<@U123>`` and ``<url|text>`` from an alert arrive as those characters. JSON receivers get the
strings as they are.

The link rule (:func:`web_url`): only an absolute ``http://`` or ``https://`` URL becomes a link, on
the page and in Slack; anything else (``javascript:``, ``data:``, a relative path, a scheme hidden
behind white space or control characters) is shown as text.
"""

from __future__ import annotations

import re
from typing import Final

WEB_URL: Final = re.compile(r"https?://[^\s\x00-\x1f\x7f]+", re.IGNORECASE)
"""an absolute http(s) URL without white space or control characters (a browser drops or strips some of
those before it reads the scheme: ``java\\tscript:`` is ``javascript:`` to it)."""
SLACK_LINK_BAR: Final = "\N{BROKEN BAR}"
"""replaces ``|`` in a Slack link's text: Slack ends the URL at the first ``|`` of ``<url|text>``."""


def web_url(url: str | None) -> str | None:
    """``url`` when it may become a link (an absolute http or https URL, see :data:`WEB_URL`), else None."""
    if url is None or WEB_URL.fullmatch(url) is None:
        return None
    return url


def slack_text(text: str) -> str:
    """``text`` escaped by Slack's rules: ``&``, ``<`` and ``>`` as ``&amp;``, ``&lt;`` and ``&gt;`` (the
    only three Slack decodes), so no mention, channel ping or link can be made of it."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_link(url: str | None, text: str) -> str:
    """A Slack link ``<url|text>`` when ``url`` may be a link (:func:`web_url`), else ``text: url`` as text.

    In the URL, ``|``, ``<`` and ``>`` are percent-encoded (they would end it) and ``&`` is escaped;
    the text is escaped and its ``|`` shown as :data:`SLACK_LINK_BAR`.
    """
    label = slack_text(text.replace("|", SLACK_LINK_BAR))
    target = web_url(url)
    if target is None:
        return f"{label}: {slack_text(url or '')}"
    href = target.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E")
    return f"<{slack_text(href)}|{label}>"
