"""The notify file: it loads with defaults, its errors name the line and the field (never a URL), a missing
token variable is named; receivers' matchers, the retry backoff and Retry-After. The outbox that delivers by
it: ``tests/test_notify_outbox.py``."""

from __future__ import annotations

import random
from datetime import timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from inferwatch.collector.incidents.notify import (
    NotifyConfigError,
    Receiver,
    RetryPolicy,
    load_notify_config,
    parse_notify_config,
)
from inferwatch.collector.incidents.outbox import retry_after_seconds
from tests.support.notify_outbox import T0, TOKEN

# --- the notify file -------------------------------------------------------------------------------------------------

GOOD = """\
receivers:
  - name: oncall-slack
    url: https://hooks.example.com/services/T000/B000/XXXX
    format: slack
    match: {severity: page}
  - name: incident-bot
    url: http://incident-bot.internal:8080/inferwatch
    format: json
    token_env: INCIDENT_BOT_TOKEN
"""


def test_notify_file_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "notify.yaml"
    path.write_text(GOOD)
    config = load_notify_config(path, {"INCIDENT_BOT_TOKEN": TOKEN})
    slack, bot = config.receivers
    assert (slack.name, slack.format, slack.match, slack.timeout_seconds, slack.max_attempts) == (
        "oncall-slack",
        "slack",
        {"severity": "page"},
        5,
        10,
    )
    assert config.retry == RetryPolicy(initial_seconds=1, factor=2, max_seconds=300, jitter=0.2)
    assert slack.bearer({}) is None
    assert bot.bearer({"INCIDENT_BOT_TOKEN": TOKEN}) == TOKEN
    inline = Receiver(name="a", url="http://h", format="json", token=TOKEN)
    assert TOKEN not in repr(config) and TOKEN not in repr(inline) and inline.bearer({}) == TOKEN
    assert config.receiver("incident-bot") is bot and config.receiver("gone") is None
    assert parse_notify_config("retry: {factor: 3}\n", "n.yaml", {}).receivers == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GOOD.replace("http://incident-bot", "ftp://incident-bot"),
            "notify.yaml line 7: receivers.1.url: expected an http",
        ),
        (
            GOOD.replace("https://hooks.example.com/", "https:///"),
            "notify.yaml line 3: receivers.0.url: the URL has no host",
        ),
        (GOOD.replace(":8080/", ":80800/"), "notify.yaml line 7: receivers.1.url: the URL's port"),
        (
            GOOD.replace("match: {severity: page}", 'match_re: {model: "lla(ma"}'),
            "notify.yaml line 5: receivers.0.match_re.model: 'lla(ma' is not a regular expression",
        ),
        (
            GOOD.replace("match: {severity: page}", 'match: {"bad-label": x}'),
            "notify.yaml line 5: receivers.0.match.bad-label: 'bad-label' is not a label name",
        ),
        (
            GOOD.replace("format: json", "format: xml"),
            "notify.yaml line 8: receivers.1.format: Input should be 'json' or",
        ),
        (
            GOOD.replace("incident-bot\n", "oncall-slack\n"),
            "notify.yaml line 6: receivers.1.name: two receivers are named",
        ),
        (GOOD.replace("name: oncall-slack", "name: OnCall"), "notify.yaml line 2: receivers.0.name: 'OnCall': use"),
        (
            GOOD + "    token: inline\n",
            "notify.yaml line 9: receivers.1.token_env: give token or token_env, not both",
        ),
        (GOOD + "    colour: red\n", "notify.yaml line 10: receivers.1.colour: Extra inputs are not permitted"),
        (GOOD + "    timeout_seconds: 61\n", "notify.yaml line 10: receivers.1.timeout_seconds: Input should be less"),
        (GOOD + "    max_attempts: 0\n", "notify.yaml line 10: receivers.1.max_attempts: Input should be greater"),
        (
            GOOD.replace("    url: http://incident", "    uri: http://incident"),
            "notify.yaml line 7: receivers.1.uri: Extra",
        ),
        (
            GOOD + "retry: {initial_seconds: 10, max_seconds: 5}\n",
            "notify.yaml line 10: retry.max_seconds: must not be",
        ),
        (GOOD + "retries: 3\n", "notify.yaml line 10: retries: Extra inputs are not permitted"),
        ("receivers:\n  - name: a\n    url: [http\n", "notify.yaml line 4: not valid YAML"),
        ("- a\n", "notify.yaml: expected a mapping with 'receivers:'"),
    ],
)
def test_notify_file_errors_name_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(NotifyConfigError) as exc:
        parse_notify_config(text, "notify.yaml", {"INCIDENT_BOT_TOKEN": TOKEN})
    assert expected in str(exc.value), str(exc.value)


def test_notify_file_missing_token_env_names_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "notify.yaml"
    path.write_text(GOOD)
    with pytest.raises(NotifyConfigError) as exc:
        load_notify_config(path, {})
    assert str(exc.value) == (
        f"{path} line 9: receivers.1.token_env: the environment variable INCIDENT_BOT_TOKEN is not set "
        "(receiver incident-bot)"
    )
    with pytest.raises(NotifyConfigError, match="INCIDENT_BOT_TOKEN is not set"):
        load_notify_config(path, {"INCIDENT_BOT_TOKEN": ""})
    with pytest.raises(NotifyConfigError, match="cannot read"):
        load_notify_config(tmp_path / "absent.yaml", {})


def test_no_url_in_errors() -> None:
    """A Slack webhook URL is a secret: a bad one is not quoted back."""
    with pytest.raises(NotifyConfigError) as exc:
        parse_notify_config(GOOD.replace("https://hooks", "htps://hooks"), "n.yaml", {"INCIDENT_BOT_TOKEN": "x"})
    assert "XXXX" not in str(exc.value)


def test_matching() -> None:
    r = Receiver(name="r", url="http://h", format="json", match={"severity": "page"}, match_re={"model": "llama-.*"})
    assert r.matches({"severity": "page", "model": "llama-3"})
    assert not r.matches({"severity": "ticket", "model": "llama-3"})
    assert not r.matches({"severity": "page", "model": "my-llama-3"})  # a full match, not a search
    assert not r.matches({"severity": "page"})  # a missing label is ""
    assert Receiver(name="all", url="http://h", format="json").matches({})
    absent = Receiver(name="a", url="http://h", format="json", match={"team": ""}, match_re={"env": "|prod"})
    assert absent.matches({}) and absent.matches({"env": "prod"}) and not absent.matches({"team": "x"})


def test_backoff() -> None:
    policy = RetryPolicy(initial_seconds=1, factor=2, max_seconds=60, jitter=0)
    assert [policy.delay(n, random.Random(0)) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert policy.delay(100_000, random.Random(0)) == 60
    jittered = RetryPolicy(jitter=0.2)
    delays = [jittered.delay(3, random.Random(seed)) for seed in range(200)]
    assert min(delays) >= 3.2 and max(delays) <= 4.8 and len(set(delays)) > 100


def test_retry_after() -> None:
    assert retry_after_seconds("30", T0) == 30
    assert retry_after_seconds(format_datetime(T0 + timedelta(seconds=90), usegmt=True), T0) == 90
    assert retry_after_seconds(format_datetime(T0 - timedelta(seconds=90), usegmt=True), T0) == 0
    assert retry_after_seconds("soon", T0) is None
    assert retry_after_seconds(None, T0) is None
