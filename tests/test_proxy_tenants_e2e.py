"""The acceptance test of tenants: 1,000 requests from 50 API keys through the real ``inferwatch proxy
--tenant-top 10`` in front of a simulated vLLM, its spans into a real collector.

The metrics carry exactly 11 tenant values (the first 10 keys' hashes, as no ranking falls within the test,
and ``other``), whose requests add up to 1,000; the collector stores every tenant (50) and
``/api/v1/usage?group_by=tenant`` counts each key's requests. Then every output the test can reach is searched
for each of the 50 keys: the proxy's /metrics, its log (at debug), the spans it sent (the OTLP bodies), the
collector's API answers, log and data directory (database and spool files). None holds one.

Processes (stopped at the end), all on 127.0.0.1 with free ports; the spans go through a recording relay in
this process on their way to the collector.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import secrets
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx

from inferwatch.core import vocabulary as V
from tests.conftest import free_port
from tests.helpers import samples, value
from tests.support.httpserver import serving
from tests.support.proxy_harness import MODEL, start_sim
from tests.support.stack import INFERWATCH, Processes, collector_cmd

KEYS = 50
REQUESTS = 1000
TOP = 10


def tenant_of(secret: bytes, key: str) -> str:
    """The documented tenant id: HMAC-SHA256 of the key under the secret, 16 hex digits."""
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:16]


async def send_all(url: str, keys: list[str], concurrency: int = 32) -> None:
    """One request per key in ``keys``: completions, half of them streamed."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def one(i: int, key: str) -> None:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": i % 2 == 0}
            async with gate:
                r = await client.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text

        await asyncio.gather(*(one(i, key) for i, key in enumerate(keys)))


def test_1000_requests_from_50_keys_give_11_tenant_values_and_no_key_anywhere(procs: Processes, tmp_path: Path) -> None:
    rng = random.Random(34)
    keys = [f"sk-iw-{secrets.token_hex(16)}" for _ in range(KEYS)]
    secret = secrets.token_bytes(32)
    key_file = tmp_path / "tenant.key"
    key_file.write_bytes(secret.hex().encode() + b"\n")
    secret_used = secret.hex().encode()  # the file's bytes less the newline
    # the first 10 keys arrive first (one request each, in turn): first come, they keep their values
    order = keys[:TOP] + rng.choices(keys, weights=[1 + (i % 7) for i in range(KEYS)], k=REQUESTS - KEYS)
    rest = order[TOP:] + keys[TOP:]  # every key sends at least one request
    rng.shuffle(rest)
    order = order[:TOP] + rest
    assert len(order) == REQUESTS and set(order) == set(keys)

    # the collector, and a relay that keeps every span body the proxy sends before passing it on
    port, grpc_port = free_port(), free_port()
    data = tmp_path / "collector"
    procs.spawn("collector", collector_cmd(port, grpc_port, data))
    collector = f"http://127.0.0.1:{port}"
    procs.wait_http("collector", collector + "/healthz")
    bodies: list[bytes] = []
    lock = threading.Lock()

    class Relay(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                bodies.append(raw)
            r = httpx.post(
                collector + "/v1/traces", content=raw, headers={"Content-Type": self.headers["Content-Type"]}
            )
            self.send_response(r.status_code)
            self.send_header("Content-Type", r.headers.get("content-type", "application/x-protobuf"))
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        def log_message(self, format: str, *args: object) -> None:
            pass

    sim = start_sim(procs, "vllm")
    with serving(Relay) as relay:
        proxy_port = free_port()
        cmd = [
            *INFERWATCH, "proxy", "--listen", f"127.0.0.1:{proxy_port}", "--upstream", sim, "--engine", "vllm",
            "--tenant-top", str(TOP), "--tenant-key-file", str(key_file),
            "--otlp-endpoint", f"http://{relay}/v1/traces", "--log-level", "debug",
        ]  # fmt: skip
        procs.spawn("proxy", cmd)
        url = f"http://127.0.0.1:{proxy_port}"
        procs.wait_http("proxy", url + "/healthz")
        t0 = time.monotonic()
        asyncio.run(send_all(url, order[:TOP], concurrency=1))
        asyncio.run(send_all(url, order[TOP:]))
        took = time.monotonic() - t0
        metrics = httpx.get(url + "/metrics").text
        # every span stored: the proxy exports every second
        deadline = time.monotonic() + 60
        while True:
            page = httpx.get(collector + "/api/v1/requests", params={"side": "proxy", "limit": 1}).json()
            if page["count"] >= REQUESTS or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert page["count"] == REQUESTS, page["count"]
        procs.stop("proxy")  # its last words in the log, its last spans sent
    print(f"{REQUESTS} requests through the proxy in {took:.1f} s")

    # -- the metrics: exactly 11 tenant values, adding up to every request
    ids = {key: tenant_of(secret_used, key) for key in keys}
    values: set[str] = set()
    for name, labels, _ in samples(metrics):
        if name.startswith("llm_client_"):
            assert V.LABEL_TENANT in labels, name  # on every series, counters and histograms
            values.add(labels[V.LABEL_TENANT])
    assert values == {ids[k] for k in keys[:TOP]} | {V.TENANT_OTHER}
    assert len(values) == TOP + 1
    sent = Counter(order)
    total = value(metrics, V.CLIENT_REQUESTS.name)
    assert total == REQUESTS
    for key in keys[:TOP]:
        assert value(metrics, V.CLIENT_REQUESTS.name, tenant=ids[key]) == sent[key]
        assert value(metrics, V.CLIENT_REQUEST_DURATION.name + "_count", tenant=ids[key]) == sent[key]
    assert value(metrics, V.CLIENT_REQUESTS.name, tenant=V.TENANT_OTHER) == sum(sent[k] for k in keys[TOP:])

    # -- the collector: every tenant, each key's requests
    rows = httpx.get(collector + "/api/v1/requests", params={"side": "proxy", "limit": 1000}).text
    assert Counter(row["tenant"] for row in json.loads(rows)["data"]) == Counter(ids[k] for k in order)
    usage = httpx.get(collector + "/api/v1/usage", params={"group_by": "tenant"})
    assert usage.status_code == 200
    groups = {g["key"]: g for g in usage.json()["groups"]}
    assert len(groups) == KEYS and {ids[k]: groups[ids[k]]["requests"] for k in keys} == {ids[k]: sent[k] for k in keys}
    assert all(groups[ids[k]]["generation_tokens"] == 2 * sent[k] for k in keys)
    usage_csv = httpx.get(collector + "/api/v1/usage", params={"format": "csv"}).text
    assert usage_csv.count("\r\ngroup,") == KEYS
    procs.stop("collector")

    # -- no key anywhere the test can reach
    with lock:
        spans = b"".join(bodies)
    assert spans and all(ids[k].encode() in spans for k in keys)  # the spans carry every tenant...
    log = (procs.logs / "proxy.log").read_bytes()
    assert b"inferwatch proxy on" in log and b"tenants: hashed API key" in log
    stored = b"".join(p.read_bytes() for p in sorted(data.rglob("*")) if p.is_file())
    assert any(ids[k].encode() in stored for k in keys)  # the rows reached the disk
    texts: dict[str, bytes] = {
        "proxy /metrics": metrics.encode(),
        "proxy log": log,
        "spans sent": spans,
        "collector rows": rows.encode(),
        "collector usage": usage.content + usage_csv.encode(),
        "collector log": (procs.logs / "collector.log").read_bytes(),
        "collector data directory": stored,
    }
    for key in keys:
        for where, text in texts.items():
            assert key.encode() not in text, f"an API key in the {where}"
            assert key.removeprefix("sk-iw-").encode() not in text, f"an API key in the {where}"
    assert secret_used not in b"".join(texts.values())  # nor the secret
