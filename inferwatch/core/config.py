"""Configuration: settings from the environment, and what several components share.

Nothing here is read at import time; callers build :class:`InferwatchSettings` and pass the result
on explicitly. (The exporter's target file is ``inferwatch.exporters.targets``.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferwatch.core import vocabulary as V

SimEngine = Literal["vllm", "tgi", "trtllm", "triton", "sglang", "llamacpp"]


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says where and why."""


class InferwatchSettings(BaseSettings):
    """Process-wide settings (environment variables prefixed ``INFERWATCH_``)."""

    model_config = SettingsConfigDict(env_prefix="INFERWATCH_", extra="ignore")

    slo_thresholds: dict[str, list[float]] = Field(
        default_factory=dict,
        description="Extra canonical bucket boundaries per histogram key, e.g. "
        '{"time_to_first_token": [0.3]}, so that SLO thresholds are exact buckets.',
    )

    def vocabulary(self) -> V.Vocabulary:
        vocab = V.Vocabulary()
        for key, bounds in self.slo_thresholds.items():
            try:
                spec = V.metric_by_key(key)
            except KeyError as exc:
                raise ConfigError(str(exc.args[0])) from None
            vocab = vocab.with_boundaries(spec, bounds)
        return vocab


def parse_listen(listen: str) -> tuple[str, int]:
    """``127.0.0.1:9400`` -> ``("127.0.0.1", 9400)``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"listen address must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
