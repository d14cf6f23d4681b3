"""The notify file (``inferwatch collector serve --notify-config FILE``): where incidents are sent.

Each receiver has a URL, a format (``json``: :class:`~inferwatch.collector.incidents.messages.IncidentMessage`;
``slack``: its Slack incoming-webhook form), label matchers, an optional bearer token (inline or from
an environment variable) and its own timeout and attempt limit; ``retry`` is the backoff shared by all.
Errors name the file, the line and the field; a ``token_env`` missing from the environment is one.

Matchers follow Alertmanager: ``match`` compares label values exactly, ``match_re`` full-matches a
regular expression, a missing label is the empty string, and a receiver without matchers gets everything.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from inferwatch.core import vocabulary as V
from inferwatch.core.yamlfile import FieldError, YAMLSyntaxError, load_located

_RECEIVER_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VALUE_ERROR = "Value error, "


class NotifyConfigError(ValueError):
    """The notify file is invalid (the message names the file, line and field), or a token is missing."""


def _label_names(value: dict[str, str]) -> dict[str, str]:
    for k in value:
        if not V.is_label_name(k):
            raise FieldError((k,), f"{k!r} is not a label name")
    return value


class Receiver(BaseModel):
    """One destination of incident messages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    format: Literal["json", "slack"]
    match: dict[str, str] = Field(default_factory=dict, description="label: exact value")
    match_re: dict[str, str] = Field(default_factory=dict, description="label: regular expression (full match)")
    token: str | None = Field(None, min_length=1, repr=False, description="sent as Authorization: Bearer")
    token_env: str | None = Field(None, description="environment variable holding the token")
    timeout_seconds: float = Field(5, gt=0, le=60)
    max_attempts: int = Field(10, ge=1)

    _patterns: dict[str, re.Pattern[str]] = PrivateAttr(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RECEIVER_NAME.match(value):
            raise ValueError(f"{value!r}: use 1 to 64 lowercase letters, digits, '-' and '_'")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        # the URL is not repeated in the message: a Slack webhook URL is a secret
        if value != value.strip() or any(c.isspace() for c in value):
            raise ValueError("the URL contains white space")
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https"):
            raise ValueError("expected an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("the URL has no host")
        try:
            parts.port  # noqa: B018 (validates the port)
        except ValueError:
            raise ValueError("the URL's port is not a number from 0 to 65535") from None
        return value

    @field_validator("match")
    @classmethod
    def _match(cls, value: dict[str, str]) -> dict[str, str]:
        return _label_names(value)

    @field_validator("match_re")
    @classmethod
    def _match_re(cls, value: dict[str, str]) -> dict[str, str]:
        for k, pattern in _label_names(value).items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise FieldError((k,), f"{pattern!r} is not a regular expression: {exc}") from None
        return value

    @field_validator("token_env")
    @classmethod
    def _token_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _one_token(self) -> Receiver:
        if self.token is not None and self.token_env is not None:
            raise FieldError(("token_env",), "give token or token_env, not both")
        return self

    def model_post_init(self, context: Any, /) -> None:
        self._patterns = {k: re.compile(p) for k, p in self.match_re.items()}

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether every matcher accepts ``labels`` (a missing label is ``""``)."""
        if any(labels.get(k, "") != v for k, v in self.match.items()):
            return False
        return all(p.fullmatch(labels.get(k, "")) is not None for k, p in self._patterns.items())

    def bearer(self, environ: Mapping[str, str]) -> str | None:
        """The bearer token, or None without one; :class:`NotifyConfigError` when ``token_env`` is unset."""
        if self.token is not None:
            return self.token
        if self.token_env is None:
            return None
        value = environ.get(self.token_env)
        if not value:
            raise NotifyConfigError(f"receiver {self.name}: the environment variable {self.token_env} is not set")
        return value


class RetryPolicy(BaseModel):
    """Exponential backoff: ``initial_seconds * factor ** (attempts - 1)``, at most ``max_seconds``, ± ``jitter``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    initial_seconds: float = Field(1, gt=0)
    factor: float = Field(2, ge=1)
    max_seconds: float = Field(300, gt=0, description="also bounds a receiver's Retry-After")
    jitter: float = Field(0.2, ge=0, lt=1, description="fraction of the delay, drawn uniformly in ±jitter")

    @model_validator(mode="after")
    def _bounds(self) -> RetryPolicy:
        if self.max_seconds < self.initial_seconds:
            raise FieldError(("max_seconds",), "must not be smaller than initial_seconds")
        return self

    def delay(self, attempts: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt (1-based); never above ``max_seconds``."""
        try:
            base = min(self.max_seconds, self.initial_seconds * self.factor ** max(attempts - 1, 0))
        except OverflowError:
            base = self.max_seconds
        spread = base * self.jitter
        return max(0.0, min(self.max_seconds, base + rng.uniform(-spread, spread)))


class NotifyConfig(BaseModel):
    """The notify file: receivers (unique names) and the retry policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    receivers: list[Receiver] = Field(default_factory=list)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)

    @model_validator(mode="after")
    def _unique(self) -> NotifyConfig:
        seen: set[str] = set()
        for i, r in enumerate(self.receivers):
            if r.name in seen:
                raise FieldError(("receivers", i, "name"), f"two receivers are named {r.name!r}")
            seen.add(r.name)
        return self

    def receiver(self, name: str) -> Receiver | None:
        return next((r for r in self.receivers if r.name == name), None)


def _at(source: str, line: int | None) -> str:
    return f"{source} line {line}" if line is not None else source


def parse_notify_config(text: str, source: str, environ: Mapping[str, str] | None = None) -> NotifyConfig:
    """Validate a notify file's text; every ``token_env`` must be set in ``environ`` (default: the process's)."""
    env = os.environ if environ is None else environ
    try:
        located = load_located(text)
    except YAMLSyntaxError as exc:
        raise NotifyConfigError(f"{_at(source, exc.line)}: not valid YAML: {exc.problem}") from None
    if not isinstance(located.data, dict):
        raise NotifyConfigError(f"{source}: expected a mapping with 'receivers:'")
    try:
        config = NotifyConfig.model_validate(located.data)
    except ValidationError as exc:
        msgs = [
            f"{_at(source, p.line)}: {p.field}: {p.message.removeprefix(_VALUE_ERROR)}" for p in located.problems(exc)
        ]
        raise NotifyConfigError("\n".join(msgs)) from None
    missing = []
    for i, r in enumerate(config.receivers):
        if r.token_env is not None and not env.get(r.token_env):
            loc = ("receivers", i, "token_env")
            missing.append(
                f"{_at(source, located.line_for(loc))}: receivers.{i}.token_env: "
                f"the environment variable {r.token_env} is not set (receiver {r.name})"
            )
    if missing:
        raise NotifyConfigError("\n".join(missing))
    return config


def load_notify_config(path: Path | str, environ: Mapping[str, str] | None = None) -> NotifyConfig:
    """Read and validate the notify file at ``path`` (see :func:`parse_notify_config`)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise NotifyConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_notify_config(text, str(path), environ)
