"""The exporter's configuration: the targets it scrapes (a YAML file, or the command line).

A target names its engine (or ``auto``) and may carry engine options by name; which options exist
is the engines' business, so engine names and options are checked against the registry the caller
passes in (:func:`target_errors`, :func:`load_exporter_config`). Nothing is read at import time.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator, model_validator

from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.fetching import DEFAULT_REDIRECT_POLICY, RedirectPolicy
from inferwatch.exporters.mapping import EngineAdapter, OptionValues

AUTO = "auto"
"""the engine of a target whose engine is detected from its payload."""
DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""32 MiB: a real vLLM page with 8 data-parallel engines x 8 models is 2 MB."""
DEFAULT_MAX_SAMPLES = 200_000
"""sample lines per page: that vLLM page has 23,000."""

Problem = tuple[str, str]
"""(where, what): a dotted location such as ``targets.0.options.NAME``, and the message."""


DEFAULT_GPU_TIMEOUT_SECONDS = 2.0


def http_url(value: str) -> str:
    """``value`` when it is an http(s) URL; else ValueError saying so (an engine's or a GPU source's url)."""
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"url must start with http:// or https://, got {value!r}")
    return value


class GpuSourceConfig(BaseModel):
    """Where the GPUs of one engine target are described (NVIDIA dcgm-exporter's page) and which of its
    GPUs are this target's: by UUID (preferred: NVML's index order may differ from CUDA's), by host and
    index, or on Kubernetes by the pod that holds them (dcgm-exporter labels each GPU with its pod)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="The GPU source's metrics URL (dcgm-exporter: http://HOST:9400/metrics).")
    uuids: list[str] = Field(default_factory=list, description="This target's GPUs by UUID (GPU-...).")
    host: str | None = Field(None, description="With indices: the GPUs' host as the source names it.")
    indices: list[int] = Field(default_factory=list, description="With host: this target's GPUs by NVML index.")
    pod: str | None = Field(
        None, description="Kubernetes: the GPUs held by this pod (default: $POD_NAME when pod_from_env)."
    )
    namespace: str | None = Field(None, description="Kubernetes: the pod's namespace (default: $POD_NAMESPACE).")
    pod_from_env: bool = Field(
        False, description="Kubernetes: take pod and namespace from $POD_NAME and $POD_NAMESPACE (downward API)."
    )
    pool: str | None = Field(None, description="The GPU pool, as the `pool` label (prices may be set per pool).")
    timeout_seconds: float = Field(
        DEFAULT_GPU_TIMEOUT_SECONDS, gt=0, description="Deadline of one read of the GPU source."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)

    @model_validator(mode="after")
    def _one_selection(self) -> GpuSourceConfig:
        by_host = self.host is not None or bool(self.indices)
        ways = [bool(self.uuids), by_host, self.pod is not None or self.pod_from_env]
        if sum(ways) != 1:
            raise ValueError("name this target's GPUs one way: uuids, or host and indices, or pod (or pod_from_env)")
        if (self.host is None) != (not self.indices):
            raise ValueError("host and indices go together")
        return self


class TargetConfig(BaseModel):
    """One engine the exporter scrapes."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Engine base URL (http://host:8000) or its full metrics URL.")
    engine: str = Field(AUTO, description="The engine's name (`inferwatch exporter engines`), or auto to detect it.")
    name: str | None = Field(None, description="Value of the `target` label on health series (default: url).")
    model: str | None = Field(None, description="Override the model label (for engines whose metrics carry none).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on every series.")
    timeout_seconds: float = Field(
        DEFAULT_TIMEOUT_SECONDS,
        gt=0,
        description="Deadline of one whole scrape of the engine: every request (metrics, info, JSON stats), "
        "connect to last byte.",
    )
    max_body_bytes: int = Field(
        DEFAULT_MAX_BODY_BYTES, gt=0, description="Largest response body read from the engine, after decompression."
    )
    max_samples: int = Field(DEFAULT_MAX_SAMPLES, gt=0, description="Most sample lines accepted in one page.")
    follow_redirects: RedirectPolicy = Field(
        DEFAULT_REDIRECT_POLICY,
        description="Which redirects of the engine are followed: same-origin (to the target's scheme, host and "
        "port), none, or any; a refused redirect makes the scrape fail with reason redirect.",
    )
    options: dict[str, JsonValue] = Field(
        default_factory=dict, description="Engine options by name (`inferwatch exporter engines` lists them)."
    )
    gpus: GpuSourceConfig | None = Field(
        None, description="The GPUs this engine runs on, joined to its series as llm_gpu_* (docs/gpu.md)."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return http_url(value)

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

    def options_for(self, adapter: EngineAdapter) -> dict[str, JsonValue]:
        """The options ``adapter`` gets for this target."""
        return session_options(self.engine, adapter, self.options)


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
                ident = (t.engine if t.engine != AUTO else None, t.model, tuple(sorted(t.labels.items())))
                if ident in seen:
                    raise ValueError(
                        f"targets {seen[ident]!r} and {t.label!r} would produce identical series; give them "
                        "distinct labels (e.g. labels: {replica: a}) or models"
                    )
                seen[ident] = t.label
        return self


def session_options(engine: str, adapter: EngineAdapter, options: OptionValues) -> dict[str, JsonValue]:
    """The options ``adapter`` gets: all of them for a named engine; for ``auto``, those it takes."""
    return dict(options) if engine != AUTO else adapter.own_options(options)


def engine_problems(engine: str, options: OptionValues, registry: EngineRegistry) -> list[Problem]:
    """What is wrong with a target's ``engine`` and ``options`` (locations relative to the target).

    A named engine validates all the options; an ``auto`` target may carry options of any engine,
    each validated by every engine that takes it (the detected engine gets its own)."""
    if engine != AUTO:
        try:
            adapter = registry.get(engine)
        except KeyError as exc:
            return [("engine", str(exc.args[0]))]
        return _option_problems(adapter, options)
    problems: dict[Problem, None] = {}
    for name, value in options.items():
        owners = [a for a in registry if name in a.options.model_fields]
        if not owners:
            known = ", ".join(option_names(registry))
            problems[(f"options.{name}", f"no engine takes this option (engine options: {known})")] = None
        for adapter in owners:
            problems.update(dict.fromkeys(_option_problems(adapter, {name: value})))
    return list(problems)


def _option_problems(adapter: EngineAdapter, options: OptionValues) -> list[Problem]:
    try:
        adapter.options.model_validate(options)
    except ValidationError as exc:
        takes = ", ".join(adapter.options.model_fields) or "none"
        return [
            (
                _loc(("options", *err["loc"])),
                f"not an option of {adapter.name} (its options: {takes})"
                if err["type"] == "extra_forbidden"
                else f"{err['msg']} ({adapter.name} option)",
            )
            for err in exc.errors()
        ]
    return []


def option_names(registry: EngineRegistry) -> list[str]:
    """Every option some engine takes."""
    return sorted({name for adapter in registry for name in adapter.options.model_fields})


def target_errors(config: ExporterConfig, registry: EngineRegistry) -> list[Problem]:
    """Engines and options of ``config``'s targets that the registry rejects."""
    return [
        (f"targets.{i}.{loc}", msg)
        for i, target in enumerate(config.targets)
        for loc, msg in engine_problems(target.engine, target.options, registry)
    ]


def _loc(parts: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


def load_exporter_config(path: Path, registry: EngineRegistry) -> ExporterConfig:
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
        config = ExporterConfig.model_validate(raw)
    except ValidationError as exc:
        options = set(option_names(registry))
        problems = []
        for err in exc.errors():
            hint = ""
            if err["type"] == "extra_forbidden" and len(err["loc"]) == 3 and err["loc"][2] in options:
                hint = " (an engine option: put it under the target's options:)"
            problems.append((_loc(err["loc"]), err["msg"] + hint))
    else:
        problems = target_errors(config, registry)
    if problems:
        lines = [f"  {loc}: {msg}" for loc, msg in problems]
        raise ConfigError(f"{path}: invalid exporter configuration:\n" + "\n".join(lines))
    return config
