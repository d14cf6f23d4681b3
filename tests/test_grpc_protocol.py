"""OTLP/gRPC as the OTLP specification has it: INVALID_ARGUMENT for a message that does not decode,
UNAUTHENTICATED without ``Bearer <token>``, RESOURCE_EXHAUSTED and UNAVAILABLE with a
``google.rpc.RetryInfo`` (without which OTLP clients do not retry RESOURCE_EXHAUSTED), and a port
that a second collector cannot share."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import grpc
import pytest
from fastapi.testclient import TestClient
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from inferwatch.collector.api.app import create_app
from inferwatch.collector.ingest import grpc_server
from inferwatch.collector.ingest.otlp import PROTOBUF
from inferwatch.collector.ingest.pipeline import CollectorMetrics, Ingestor, IngestResult
from inferwatch.collector.ingest.prepare import PreparedExport
from inferwatch.collector.settings import CollectorSettings
from tests.conftest import ROOT, free_port

CAPTURE = ROOT / "tests" / "fixtures" / "otlp" / "vllm-0.32.0-cpu"
METHOD = f"/{grpc_server.SERVICE}/Export"


def export_raw(address: str, body: bytes, metadata: Sequence[tuple[str, str]] = (), timeout: float = 20) -> bytes:
    """One Export call with ``body`` sent as it is (no client-side serialization); the raw answer."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        answer: bytes = call(body, metadata=tuple(metadata), timeout=timeout)
        return answer


def rpc_error(address: str, body: bytes, metadata: Sequence[tuple[str, str]] = ()) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as exc:
        export_raw(address, body, metadata)
    return cast(grpc.RpcError, exc.value)


def code(error: grpc.RpcError) -> grpc.StatusCode:
    result: grpc.StatusCode = error.code()
    return result


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    """A collector with an ingest token, its OTLP/gRPC address."""
    listen = f"127.0.0.1:{free_port()}"
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=listen, ingest_tokens=["tok"])
    with TestClient(create_app(settings)):
        yield listen


def test_a_malformed_message_is_invalid_argument(address: str) -> None:
    """It used to be INTERNAL ("Exception deserializing request!"), which clients may retry forever."""
    auth = [("authorization", "Bearer tok")]
    for body in (b"\xff\xff\xff", b"\x0a\xff\xff\xff\x0f", b"\x0a\x02\x0a\xff"):
        error = rpc_error(address, body, auth)
        assert code(error) == grpc.StatusCode.INVALID_ARGUMENT
        assert "ExportTraceServiceRequest" in error.details()
    good = (CAPTURE / "0001.pb").read_bytes()
    assert ExportTraceServiceResponse.FromString(export_raw(address, good, auth)) == ExportTraceServiceResponse()
    assert export_raw(address, b"", auth) == b""  # an empty export is a valid (empty) message


def test_only_a_bearer_token_of_the_ingest_scope_passes(address: str) -> None:
    body = ExportTraceServiceRequest().SerializeToString()
    for metadata in (
        [],
        [("authorization", "tok")],
        [("authorization", "Bearer other")],
        [("authorization", "Basic tok")],
    ):
        assert code(rpc_error(address, body, metadata)) == grpc.StatusCode.UNAUTHENTICATED, metadata
    for value in ("Bearer tok", "bearer tok", "Bearer  tok "):
        assert export_raw(address, body, [("authorization", value)]) == b""


def retry_delay(error: grpc.RpcError, expected: grpc.StatusCode) -> float:
    """The RetryInfo delay from ``grpc-status-details-bin``; checks ``google.rpc.retryinfo-bin`` agrees."""
    trailing = dict(error.trailing_metadata())
    status = status_pb2.Status.FromString(trailing[grpc_server.STATUS_DETAILS_KEY])
    assert status.code == expected.value[0] and status.message
    (detail,) = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    alone = error_details_pb2.RetryInfo.FromString(trailing[grpc_server.RETRY_INFO_KEY])
    assert alone == info
    return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)


def test_resource_exhausted_carries_retry_info(tmp_path: Path) -> None:
    """Without RetryInfo, OTLP-spec clients drop an export answered RESOURCE_EXHAUSTED."""
    listen = f"127.0.0.1:{free_port()}"
    settings = CollectorSettings(data_dir=tmp_path, grpc_listen=listen, queue_limit=1)
    spans = (CAPTURE / "0006.pb").read_bytes()  # several llm_request spans: more than the queue holds
    with TestClient(create_app(settings)):
        error = rpc_error(listen, spans)
        assert code(error) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert retry_delay(error, grpc.StatusCode.RESOURCE_EXHAUSTED) == grpc_server.RETRY_DELAY_SECONDS


@dataclass
class ScriptedIngestor:
    """Answers each export with the next of ``results`` (then accepts); records the exports."""

    results: list[IngestResult]
    metrics: CollectorMetrics = field(default_factory=CollectorMetrics)
    calls: list[float] = field(default_factory=list)

    def prepare(self, body: bytes, content_type: str | None, encoding: str | None) -> Future[PreparedExport]:
        done: Future[PreparedExport] = Future()
        done.set_result(PreparedExport(PROTOBUF, spans=1))
        return done

    def has_room(self) -> bool:
        return True

    def commit(self, prepared: PreparedExport) -> IngestResult:
        self.calls.append(time.monotonic())
        return self.results.pop(0) if self.results else IngestResult(1, 0)


def refused(message: str, database: bool) -> IngestResult:
    return IngestResult(0, 1, message, backpressure=True, unavailable=database)


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[tuple[str, ScriptedIngestor]]:
    listen = f"127.0.0.1:{free_port()}"
    ingestor = ScriptedIngestor([])
    server = grpc_server.start_grpc_server(
        CollectorSettings(data_dir=tmp_path, grpc_listen=listen), cast(Ingestor, ingestor)
    )
    try:
        yield listen, ingestor
    finally:
        server.stop(None).wait()


def test_database_down_is_unavailable_with_retry_info(scripted: tuple[str, ScriptedIngestor]) -> None:
    address, ingestor = scripted
    ingestor.results.append(refused("database unreachable, retry later", database=True))
    error = rpc_error(address, b"")
    assert code(error) == grpc.StatusCode.UNAVAILABLE
    assert retry_delay(error, grpc.StatusCode.UNAVAILABLE) == grpc_server.RETRY_DELAY_SECONDS


def test_the_official_exporter_retries_after_the_retry_delay(scripted: tuple[str, ScriptedIngestor]) -> None:
    """OpenTelemetry's gRPC exporter (vLLM's, TGI's) sends the export again once the RetryInfo delay passed."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    address, ingestor = scripted
    ingestor.results.append(refused("write queue full, retry later", database=False))
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span("llm_request").end()
    exporter = OTLPSpanExporter(endpoint=address, insecure=True, timeout=30)
    try:
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        provider.shutdown()
    assert len(ingestor.calls) == 2
    assert ingestor.calls[1] - ingestor.calls[0] >= grpc_server.RETRY_DELAY_SECONDS * 0.9  # a lower bound only


def test_a_second_collector_cannot_bind_the_same_port(tmp_path: Path) -> None:
    """With gRPC's default SO_REUSEPORT both started, and the kernel split the exports between them (19/21)."""
    listen = f"127.0.0.1:{free_port()}"
    first = CollectorSettings(data_dir=tmp_path / "a", grpc_listen=listen)
    second = CollectorSettings(data_dir=tmp_path / "b", grpc_listen=listen)
    with TestClient(create_app(first)):
        with pytest.raises(OSError, match=r"cannot listen on .* for OTLP/gRPC"), TestClient(create_app(second)):
            pass
        body = (CAPTURE / "0001.pb").read_bytes()
        export_raw(listen, body)  # the first still serves


def test_a_taken_port_fails_the_cli_with_a_clear_error(tmp_path: Path) -> None:
    """``inferwatch collector serve`` exits non-zero, naming the address, when its gRPC port is taken."""
    import subprocess
    import sys

    listen = f"127.0.0.1:{free_port()}"
    with TestClient(create_app(CollectorSettings(data_dir=tmp_path / "a", grpc_listen=listen))):
        cmd = [sys.executable, "-m", "inferwatch", "collector", "serve", "--listen", f"127.0.0.1:{free_port()}"]
        cmd += ["--grpc-listen", listen, "--data-dir", str(tmp_path / "b")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-2000:]
    assert f"cannot listen on {listen} for OTLP/gRPC" in output, output[-2000:]
    assert "did not start" in output
