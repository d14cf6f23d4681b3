"""Collector settings (``INFERWATCH_COLLECTOR_*`` environment variables or command-line options)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferwatch.collector.otlp import DEFAULT_MAX_BODY
from inferwatch.core import resources
from inferwatch.core.config import ConfigError, parse_listen

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w``."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"invalid duration {text!r}: use a number and one of s, m, h, d, w (e.g. 7d)")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


class CollectorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFERWATCH_COLLECTOR_", extra="ignore")

    database_url: str | None = Field(None, description="SQLAlchemy URL; default: SQLite file under data_dir.")
    data_dir: Path = Field(
        default_factory=lambda: resources.default_data_dir() / "collector",
        description="Where the SQLite database and the spool live (default: the inferwatch data directory, "
        "$INFERWATCH_DATA_DIR or ~/.local/share/inferwatch, then collector/).",
    )
    listen: str = "127.0.0.1:4318"
    grpc_listen: str | None = "127.0.0.1:4317"
    max_body_bytes: int = Field(DEFAULT_MAX_BODY, gt=0)
    queue_limit: int = Field(100_000, gt=0)
    batch_size: int = Field(512, gt=0)
    retention: str | None = Field(None, description="Delete requests older than this (e.g. 7d).")
    ingest_tokens: list[str] = Field(default_factory=list, description="Bearer tokens allowed to send OTLP.")
    read_tokens: list[str] = Field(default_factory=list, description="Bearer tokens allowed to read the API.")
    insecure: bool = Field(False, description="Allow a non-loopback listen address without tokens.")

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if value:
            parse_duration(value)
        return value

    def url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'inferwatch.db').as_posix()}"

    def retention_delta(self) -> timedelta | None:
        return parse_duration(self.retention) if self.retention else None

    def spool_path(self) -> Path:
        return self.data_dir / "spool.jsonl"

    def check_exposure(self) -> None:
        """Refuse a non-loopback listen address without tokens (unless ``insecure``)."""
        for addr in (self.listen, self.grpc_listen):
            if not addr:
                continue
            host, _ = parse_listen(addr)
            loopback = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
            if not loopback and not self.insecure and not (self.ingest_tokens and self.read_tokens):
                raise ConfigError(
                    f"refusing to listen on {addr} without ingest and read tokens; set them or pass --insecure"
                )
