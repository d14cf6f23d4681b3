"""Engine adapters, registered explicitly (one module per engine)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from inferwatch.exporters.engines import llamacpp, sglang, tgi, triton, trtllm, vllm
from inferwatch.exporters.mapping import EngineAdapter, Fetch, ScrapeError


@dataclass
class EngineRegistry:
    """Adapters by engine name, in detection order."""

    adapters: dict[str, EngineAdapter] = field(default_factory=dict)

    def register(self, adapter: EngineAdapter) -> None:
        if adapter.name in self.adapters:
            raise ValueError(f"engine {adapter.name!r} registered twice")
        self.adapters[adapter.name] = adapter

    def get(self, name: str) -> EngineAdapter:
        try:
            return self.adapters[name]
        except KeyError:
            known = ", ".join(self.adapters)
            raise KeyError(f"unknown engine {name!r}; known engines: {known}") from None

    def names(self) -> list[str]:
        return list(self.adapters)

    def __iter__(self) -> Iterator[EngineAdapter]:
        return iter(self.adapters.values())

    def detect(self, payload: str) -> EngineAdapter | None:
        """Identify the engine that produced ``payload``; ``None`` when it cannot be told (empty body).

        A JSON payload goes to the first adapter that claims it, Prometheus text to the first whose
        markers it contains."""
        stripped = payload.lstrip()
        if stripped[:1] in ("[", "{"):
            try:
                body = json.loads(stripped)
            except ValueError:
                return None
            return next((a for a in self if a.claims_json is not None and a.claims_json(body)), None)
        for adapter in self.adapters.values():
            if any(marker in payload for marker in adapter.detect_markers) or any(
                stripped.startswith(m.lstrip("\n")) for m in adapter.detect_markers
            ):
                return adapter
        return None

    def detect_empty(self, get: Fetch) -> EngineAdapter | None:
        """The engine behind an empty metrics body (some serve one before their first request): the
        first adapter whose info endpoint, read with ``get``, confirms it."""
        for adapter in self:
            if adapter.claims_info is None or adapter.info_path is None:
                continue
            try:
                body = json.loads(get(adapter.info_path))
            except (ScrapeError, ValueError):
                continue
            if adapter.claims_info(body):
                return adapter
        return None


def builtin_registry() -> EngineRegistry:
    """A registry with vLLM, TGI, Triton and TensorRT-LLM (detection tries them in this order)."""
    registry = EngineRegistry()
    registry.register(vllm.ADAPTER)
    registry.register(tgi.ADAPTER)
    registry.register(triton.ADAPTER)
    # before trtllm, whose engine_type=" marker SGLang's series also carry
    registry.register(sglang.ADAPTER)
    registry.register(trtllm.ADAPTER)
    registry.register(llamacpp.ADAPTER)
    return registry
