"""Where each inferwatch component listens and how it is started: the facts both packagings share.

The compose stack (``docker-compose.yml``, :mod:`inferwatch.stack`) and the Kubernetes manifests
(:mod:`inferwatch.kubernetes`) take their ports, probe paths, scrape job names, the image and the
containers' arguments from here, so a change in one place reaches both: ``tests/test_stack.py``
fails when the hand-written compose file disagrees, ``tests/test_kubernetes.py`` when a generated
manifest does. Pure data and small functions; nothing here reads a file or the environment.

Each path is the component's own route: the collector's ``/healthz``, ``/readyz`` and ``/metrics``
(``collector/api/routes/health.py``) and its webhook (``api/routes/webhooks.py`` under ``/api/v1``);
the exporter's (``exporters/server.py``); the proxy's (``proxy/server.py``, on ``--metrics-listen``
when given). ``tests/test_kubernetes_probes.py`` starts each component with the arguments built
here and asks every path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from inferwatch import __version__
from inferwatch.core import vocabulary as V

ALL_INTERFACES: Final = "0.0.0.0"
"""Every interface of a container (its ports are what is published or selected)."""
LOOPBACK: Final = "127.0.0.1"

COLLECTOR_HTTP_PORT: Final = 4318
"""OTLP/HTTP, the read API, the webhook, the probes and /metrics."""
COLLECTOR_GRPC_PORT: Final = 4317
"""OTLP/gRPC."""
EXPORTER_PORT: Final = 9400
POD_NAME_ENV: Final = "POD_NAME"
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
"""The pod's name and namespace from the downward API: an exporter joining its pod's GPUs reads them
(``--gpu-pod-from-env``), and the generated sidecars set them."""
"""The exporter's /metrics and probes (TGI's own ``--prometheus-port`` 9000 must stay free: docs/deploy.md)."""
PROXY_PORT: Final = 8080
"""Where the proxy takes the clients' requests (the ``proxy`` command's default port)."""
PROXY_METRICS_PORT: Final = 9401
"""The proxy's /metrics and probes, apart from the proxied port so that an engine's own /metrics passes through."""

HEALTH_PATH: Final = "/healthz"
"""Liveness: the process serves (collector, exporter, proxy)."""
READY_PATH: Final = "/readyz"
"""Readiness: the collector's database is at the migrations' head; the exporter's targets and the proxy's
upstream answer."""
METRICS_PATH: Final = "/metrics"
WEBHOOK_PATH: Final = "/api/v1/alerts/webhook"
"""Alertmanager's webhook on the collector (the ingest token authorises it)."""
TRACES_PATH: Final = "/v1/traces"

EXPORTERS_JOB: Final = "inferwatch-exporters"
COLLECTOR_JOB: Final = "inferwatch-collector"
PROXIES_JOB: Final = "inferwatch-proxies"
"""Prometheus' ``job`` label of each kind of target, the same in both packagings."""

IMAGE_NAME: Final = "inferwatch"
"""The Dockerfile's image (``docker build -t inferwatch .``)."""
CONTAINER_USER: Final = 10001
"""The Dockerfile's non-root user ``inferwatch``."""
CONTAINER_DATA_DIR: Final = "/home/inferwatch/data"
"""The Dockerfile's ``INFERWATCH_DATA_DIR``: the collector's spool (and SQLite file) under ``collector/``."""
DATA_DIR_ENV: Final = "INFERWATCH_DATA_DIR"


def default_image() -> str:
    """The image of this inferwatch: the Dockerfile's name, tagged with the package version."""
    return f"{IMAGE_NAME}:{__version__}"


@dataclass(frozen=True)
class EngineFacts:
    """An engine's defaults as its official container image runs it."""

    engine: str
    serving_port: int
    """the HTTP API the clients (and the proxy) use."""
    metrics_port: int
    metrics_path: str
    health_path: str
    """the engine's own readiness route."""
    image: str
    """the official image, at a version the exporter's fixtures cover (pin the one you run)."""
    explicit_path: bool
    """the exporter's target names the metrics path (a port other than the API's), not the base URL."""

    def exporter_target(self, host: str) -> str:
        """The exporter's ``--target`` for this engine at ``host`` (in a pod: ``localhost``)."""
        base = f"http://{host}:{self.metrics_port}"
        return base + self.metrics_path if self.explicit_path else base


def engine_facts(engine: str) -> EngineFacts:
    """The facts of one of :data:`~inferwatch.core.vocabulary.ENGINES` (KeyError for another)."""
    facts = {
        # vLLM's OpenAI server: API and /metrics on --port 8000. Image: 0.32.0, the release of the real captures
        # (tests/fixtures/engines/vllm/0.32.0-cpu); vLLM publishes each release as vllm/vllm-openai:v<version>
        # (vllm-project/vllm, .buildkite/scripts/publish-release-images.sh).
        V.ENGINE_VLLM: EngineFacts(V.ENGINE_VLLM, 8000, 8000, "/metrics", "/health", "vllm/vllm-openai:v0.32.0", False),
        # TGI: --port defaults to 3000 but its image sets PORT=80; /metrics on the same port. Image: 3.3.7, the
        # release the fixtures follow (tests/fixtures/engines/tgi/3.3.7); a release tag is pushed as <version>
        # (huggingface/text-generation-inference, tag v3.3.7, .github/workflows/build.yaml: type=semver).
        V.ENGINE_TGI: EngineFacts(
            V.ENGINE_TGI, 80, 80, "/metrics", "/health", "ghcr.io/huggingface/text-generation-inference:3.3.7", False
        ),
        # trtllm-serve: --port 8000; /prometheus/metrics with return_perf_metrics: true. Image: 1.3.0rc5, the
        # release of the trtllm_-prefixed Gen B metrics (tests/fixtures/engines/trtllm/gen-b; 1.0.0 predates
        # /prometheus/metrics); NVIDIA runs this tag with trtllm-serve --extra_llm_api_options in
        # NVIDIA/dgx-spark-playbooks, nvidia/trt-llm/README.md, and in the TensorRT-LLM quick start guide
        # (nvidia.github.io/TensorRT-LLM/quick-start-guide.html).
        V.ENGINE_TRTLLM: EngineFacts(
            V.ENGINE_TRTLLM,
            8000,
            8000,
            "/prometheus/metrics",
            "/health",
            "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc5",
            False,
        ),
        # Triton: HTTP 8000, gRPC 8001, metrics on their own port 8002. Image: 25.03 with the TensorRT-LLM
        # backend, the release the fixtures follow (tests/fixtures/engines/triton/25.03-trtllm); NVIDIA names
        # it in NVIDIA/TensorRT-LLM, examples/draft_target_model/README.md (TensorRT-LLM 0.18.0).
        V.ENGINE_TRITON: EngineFacts(
            V.ENGINE_TRITON,
            8000,
            8002,
            "/metrics",
            "/v2/health/ready",
            "nvcr.io/nvidia/tritonserver:25.03-trtllm-python-py3",
            True,
        ),
        # SGLang: --port defaults to 30000, /metrics on the same port with --enable-metrics
        # (python/sglang/srt/server_args.py). Image: 0.5.23, the newest release the fixtures follow
        # (tests/fixtures/engines/sglang/0.5.23); lmsysorg/sglang publishes each release as v<version>
        # (CUDA 13; docs/get-started/install.mdx, .github/workflows/release-docker.yml).
        V.ENGINE_SGLANG: EngineFacts(
            V.ENGINE_SGLANG, 30000, 30000, "/metrics", "/health", "lmsysorg/sglang:v0.5.23", False
        ),
        # llama.cpp's server: --port defaults to 8080, /metrics on the same port with --metrics
        # (common/arg.cpp). Image: the CUDA server build the fixtures follow
        # (tests/fixtures/engines/llamacpp/b11312-cpu, a real capture); ggml-org publishes server-cuda-b<build>.
        V.ENGINE_LLAMACPP: EngineFacts(
            V.ENGINE_LLAMACPP,
            8080,
            8080,
            "/metrics",
            "/health",
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312",
            False,
        ),
    }
    return facts[engine]


def address(host: str, port: int) -> str:
    return f"{host}:{port}"


def url(host: str, port: int, path: str = "") -> str:
    return f"http://{host}:{port}{path}"


def exporter_args(
    engine: str,
    target: str,
    listen: str = f"{ALL_INTERFACES}:{EXPORTER_PORT}",
    *,
    model: str | None = None,
    options: tuple[tuple[str, str], ...] = (),
) -> list[str]:
    """``inferwatch exporter serve`` for one engine: the arguments after the image's ``inferwatch`` entrypoint."""
    args = ["exporter", "serve", f"--engine={engine}", f"--listen={listen}", f"--target={target}"]
    if model is not None:
        args.append(f"--model={model}")
    args += [f"--engine-option={name}={value}" for name, value in options]
    return args


@dataclass(frozen=True)
class CollectorFlags:
    """The optional ``collector serve`` flags a packaging sets (each left out when None or False)."""

    database_url: str | None = None
    prometheus_url: str | None = None
    notify_config: str | None = None
    grafana_url: str | None = None
    public_url: str | None = None
    insecure: bool = False


def collector_args(host: str = ALL_INTERFACES, flags: CollectorFlags | None = None) -> list[str]:
    """``inferwatch collector serve`` on ``host``'s HTTP and gRPC ports, then ``flags`` in a fixed order."""
    flags = flags or CollectorFlags()
    args = [
        "collector",
        "serve",
        f"--listen={address(host, COLLECTOR_HTTP_PORT)}",
        f"--grpc-listen={address(host, COLLECTOR_GRPC_PORT)}",
    ]
    named = (
        ("--database-url", flags.database_url),
        ("--prometheus-url", flags.prometheus_url),
        ("--notify-config", flags.notify_config),
        ("--grafana-url", flags.grafana_url),
        ("--public-url", flags.public_url),
    )
    args += [f"{flag}={value}" for flag, value in named if value is not None]
    if flags.insecure:
        args.append("--insecure")
    return args


def migration_args() -> list[str]:
    """``inferwatch db upgrade``: the database URL comes from ``INFERWATCH_COLLECTOR_DATABASE_URL``."""
    return ["db", "upgrade"]


def proxy_args(
    engine: str,
    upstream: str,
    listen: str = f"{ALL_INTERFACES}:{PROXY_PORT}",
    metrics_listen: str = f"{ALL_INTERFACES}:{PROXY_METRICS_PORT}",
) -> list[str]:
    """``inferwatch proxy`` in front of ``upstream``, its /metrics and probes on ``metrics_listen``."""
    return [
        "proxy",
        f"--engine={engine}",
        f"--upstream={upstream}",
        f"--listen={listen}",
        f"--metrics-listen={metrics_listen}",
    ]
