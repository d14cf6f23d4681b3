"""Configuration: settings from the environment and the exporter's target file.

Nothing here is read at import time; callers build :class:`InferwatchSettings` (or load an
:class:`ExporterConfig`) and pass the result on explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferwatch.core import vocabulary as V

EngineChoice = Literal["auto", "vllm", "tgi", "trtllm", "triton"]
SimEngine = Literal["vllm", "tgi", "trtllm", "triton"]


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


class TargetConfig(BaseModel):
    """One engine the exporter scrapes."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Engine base URL (http://host:8000) or its full metrics URL.")
    engine: EngineChoice = "auto"
    name: str | None = Field(None, description="Value of the `target` label on health series (default: url).")
    model: str | None = Field(None, description="Override the model label (TGI and Triton have none).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every series.")
    timeout_seconds: float = Field(5.0, gt=0)
    max_batch_total_tokens: int | None = Field(
        None, gt=0, description="TGI: KV-cache capacity in tokens, to derive the KV-cache usage ratio."
    )
    json_poll_interval_seconds: float = Field(
        1.0, gt=0, description="trtllm-serve: how often to drain the JSON iteration stats."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {value!r}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not V.is_label_name(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a valid Prometheus label name")
            if name in V.LABEL_ORDER or name == V.LABEL_LE:
                raise ValueError(f"label {name!r} is set by inferwatch itself and cannot be overridden")
        return value

    @property
    def label(self) -> str:
        return self.name or self.url


class ExporterConfig(BaseModel):
    """The exporter's configuration file (YAML)."""

    model_config = ConfigDict(extra="forbid")

    listen: str = "127.0.0.1:9400"
    targets: list[TargetConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> ExporterConfig:
        seen: dict[tuple[object, ...], str] = {}
        names: set[str] = set()
        for t in self.targets:
            if t.label in names:
                raise ValueError(f"two targets are named {t.label!r}; give each a distinct name")
            names.add(t.label)
            if len(self.targets) > 1:
                ident = (t.engine if t.engine != "auto" else None, t.model, tuple(sorted(t.labels.items())))
                if ident in seen:
                    raise ValueError(
                        f"targets {seen[ident]!r} and {t.label!r} would produce identical series; give them "
                        "distinct labels (e.g. labels: {replica: a}) or models"
                    )
                seen[ident] = t.label
        return self


def parse_listen(listen: str) -> tuple[str, int]:
    """``127.0.0.1:9400`` -> ``("127.0.0.1", 9400)``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"listen address must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def load_exporter_config(path: Path) -> ExporterConfig:
    """Read and validate an exporter YAML file; errors name the file and the field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with 'targets', got {type(raw).__name__}")
    try:
        return ExporterConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {loc}: {err['msg']}")
        raise ConfigError(f"{path}: invalid exporter configuration:\n" + "\n".join(lines)) from None
