"""Write tests/alerts/headroom.yaml: promtool unit tests of the headroom rules on replicas built by hand.

Run ``python -m tests.alerts.make_headroom`` after changing the scenario; tests/test_headroom_rules.py
fails when the file differs from what this writes.

The engine: TPOT(N) = a + b N with a = 20 ms and b = 2 ms per running request, no queue wait, 130 prompt
tokens prefilled at 2 ms each (0.26 s), 11 output tokens, so a request spends
R(N) = TTFT(N) + 10 TPOT(N) = 0.44 + 0.022 N seconds and a replica running N requests serves N / R(N)
per second. Under the default SLO file the TPOT SLO (p99 <= 0.1 s; no buckets are fed, so the mean is
held to it) breaks first, at N* = (0.1 - a) / b = 40, where the rate is 40 / 1.32 = 30.3 per second.

* llama-8b runs 8 and 12 requests by turns (5 minutes each): N0 = 10, R(10) = 0.66 s, so its limit is
  (40 / 1.32) / (10 / 0.66) = 2.0x its load: ``llm:headroom_ratio`` reads 2.0 and one replica holds it.
* qwen-7b runs 40 and 52 by turns: N0 = 46, past the TPOT edge, so its headroom is under 1, two
  replicas are needed, and the low-headroom alert fires once it has been low for 15 minutes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from inferwatch.core import vocabulary as V

HERE = Path(__file__).resolve().parent
OUT = HERE / "headroom.yaml"
A, B, PROMPT, PREFILL_PER_TOKEN, OUTPUTS = 0.02, 0.002, 130, 0.002, 11
SCRAPE = 15
REGIME = 20  # samples of one batch level (5 minutes)
REGIMES = 16  # 80 minutes
INSTANCE = "10.0.0.7:9400"
REPLICAS = {"llama-8b": (8, 12), "qwen-7b": (40, 52), "mistral-7b": (8, 12)}
NO_TTFT = "mistral-7b"
"""a replica like TGI's: no prefill (nor TTFT) histogram, its residence measured end to end minus queue."""
WITH_E2E = ("llama-8b", NO_TTFT)


def residence(n: float) -> float:
    ttft = PROMPT * PREFILL_PER_TOKEN + B * (n - 10)  # TTFT's slope in N is b (no queue wait)
    return ttft + (OUTPUTS - 1) * (A + B * n)


def _labels(model: str, extra: str = "") -> str:
    return f'{{engine="vllm",model="{model}",instance="{INSTANCE}",job="inferwatch-exporter"{extra}}}'


def _gauge(levels: list[float]) -> str:
    return " ".join(f"{level:g}x{REGIME - 1}" for level in levels)


def _counter(increments: list[float]) -> str:
    """A counter growing by ``increments[k]`` per scrape in regime ``k`` (promtool's a+bxn segments)."""
    parts, value = [], 0.0
    for k, inc in enumerate(increments):
        start = value if k == 0 else value + inc
        parts.append(f"{start:.6f}+{inc:.6f}x{REGIME - 1}")
        value = start + inc * (REGIME - 1)
    return " ".join(parts)


KV_CAPACITY, KV_USAGE = 100_000, 0.05
"""llama-8b's KV cache: 500 tokens per running request at N0 = 10, room for Q = 200 requests. The running
count's variance over its mean grows like the residence time, D = R(N) / R(0) = 1 + 0.05 N, so the first
preemption (z = 3) comes at N + 3 sqrt(N (1 + 0.05 N)) = 200, N = 115.8, far past the TPOT limit."""


def series(model: str, low: int, high: int) -> list[dict[str, str]]:
    levels = [float(low if k % 2 == 0 else high) for k in range(REGIMES)]
    rates = [n / residence(n) for n in levels]
    per_scrape = [r * SCRAPE for r in rates]

    def counter(name: str, per_request: list[float] | float, extra: str = "") -> dict[str, str]:
        each = per_request if isinstance(per_request, list) else [per_request] * REGIMES
        return {
            "series": f"{name}{_labels(model, extra)}",
            "values": _counter([c * e for c, e in zip(per_scrape, each, strict=True)]),
        }

    tpot = V.TIME_PER_OUTPUT_TOKEN.name
    return [
        {"series": f"{V.REQUESTS_RUNNING.name}{_labels(model)}", "values": _gauge(levels)},
        {"series": f"{V.REQUESTS_WAITING.name}{_labels(model)}", "values": _gauge([0.0] * REGIMES)},
        counter(V.REQUESTS.name, 1.0, f',{V.LABEL_OUTCOME}="{V.OUTCOME_STOP}"'),
        counter(V.PROMPT_TOKENS.name, float(PROMPT)),
        counter(V.GENERATION_TOKENS.name, float(OUTPUTS)),
        counter(f"{tpot}_sum", [A + B * n for n in levels]),
        counter(f"{tpot}_count", 1.0),
        counter(f"{V.REQUEST_QUEUE.name}_sum", 0.0),
        counter(f"{V.REQUEST_QUEUE.name}_count", 1.0),
        *(
            [
                counter(f"{V.REQUEST_PREFILL.name}_sum", PROMPT * PREFILL_PER_TOKEN),
                counter(f"{V.REQUEST_PREFILL.name}_count", 1.0),
            ]
            if model != NO_TTFT
            else []
        ),
        *(
            [
                # end-to-end seconds: the batch is then read by Little's law (e2e minus queue seconds per
                # second), which gives the same N as the gauge here; qwen-7b has no e2e and reads the gauge
                counter(f"{V.REQUEST_DURATION.name}_sum", [residence(n) for n in levels]),
                counter(f"{V.REQUEST_DURATION.name}_count", 1.0),
            ]
            if model in WITH_E2E
            else []
        ),
        *(
            [
                {"series": f"{V.KV_CACHE_USAGE.name}{_labels(model)}", "values": _gauge([KV_USAGE] * REGIMES)},
                {"series": f"{V.KV_CACHE_CAPACITY.name}{_labels(model)}", "values": _gauge([KV_CAPACITY] * REGIMES)},
            ]
            if model == "llama-8b"
            else []
        ),
    ]


def _between(expr: str, low: float, high: float) -> str:
    return f"({expr} > bool {low:g}) * ({expr} < bool {high:g})"


def document() -> dict[str, Any]:
    inputs = [s for model, (low, high) in REPLICAS.items() for s in series(model, low, high)]
    common = {V.LABEL_ENGINE: "vllm", "instance": INSTANCE, V.SLO_SERVICE_LABEL: "llm-serving"}
    ratio = V.HEADROOM_RATIO_RECORD

    def near(record: str, value: float, slo: str | None = None) -> dict[str, Any]:
        labels = {**common, "model": "llama-8b", **({V.SLO_LABEL: slo} if slo else {})}
        sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
        expr = f"{record}{{{sel}}}"
        if value == 0:
            return {
                "expr": expr,
                "eval_time": "70m",
                "exp_samples": [{"labels": _flat({record: None, **labels}), "value": 0}],
            }
        low, high = sorted((value * 0.97, value * 1.03))
        return {
            "expr": _between(expr, low, high),
            "eval_time": "70m",
            "exp_samples": [{"labels": _flat(labels), "value": 1}],
        }

    r = V.headroom_record
    load = sum(n / residence(n) for n in REPLICAS["llama-8b"]) / 2
    ttft_intercept = PROMPT * PREFILL_PER_TOKEN - B * 10
    by_hand = [
        near(r("tpot_slope"), B),
        near(r("tpot_intercept"), A),
        near(r("current_batch"), 10),
        near(r("served_requests_per_second"), load),
        near(V.LOAD_REQUESTS_PER_SECOND_RECORD, load),
        near(r("prompt_tokens"), PROMPT),
        near(r("output_tokens"), OUTPUTS),
        near(r("queue_seconds"), 0),
        near(r("prefill_seconds_per_token"), PREFILL_PER_TOKEN),
        near(r("ttft_intercept"), ttft_intercept),
        near(r("ttft_slope"), B),
        near(r("e2e_intercept"), ttft_intercept + (OUTPUTS - 1) * A),
        near(r("e2e_slope"), B + (OUTPUTS - 1) * B),
        near(r("residence_intercept"), ttft_intercept + (OUTPUTS - 1) * A),
        near(r("residence_slope"), OUTPUTS * B),
        near(r("kv_tokens_per_request"), KV_USAGE * KV_CAPACITY / 10),
        near(r("kv_capacity_tokens"), KV_CAPACITY),
        near(V.HEADROOM_LIMIT_CONCURRENCY_RECORD, 40, "tpot-100ms"),
        near(V.HEADROOM_LIMIT_CONCURRENCY_RECORD, 115.8, V.HEADROOM_KV_LIMIT),
        near(V.HEADROOM_LIMIT_RATE_RECORD, 2 * load, "tpot-100ms"),
        # TTFT(N) = 0.24 + 0.002 N reaches 0.5 s at N = 130; e2e, at 20.48 s, far beyond
        near(V.HEADROOM_LIMIT_CONCURRENCY_RECORD, 130, "ttft-500ms"),
    ]
    # the fit's points, one a minute: from 70m to 75m the replica runs 8 requests
    points = [
        {**near(r("batch"), 8), "eval_time": "74m"},
        {**near(r("tpot_mean"), A + B * 8), "eval_time": "74m"},
        {**near(r("batch_tpot"), 8 * (A + B * 8)), "eval_time": "74m"},
        {**near(r("batch_squared"), 64), "eval_time": "74m"},
        {**near(r("tpot_squared"), (A + B * 8) ** 2), "eval_time": "74m"},
        # no buckets were fed: no quantile-to-mean ratio (the mean is held to the threshold)
        {"expr": f'{r("quantile_ratio")}{{model="llama-8b"}}', "eval_time": "70m", "exp_samples": []},
    ]
    checks = [
        *by_hand,
        *points,
        {
            "expr": _between(f'{V.CAPACITY_REQUESTS_PER_SECOND_RECORD}{{model="llama-8b"}}', 1.94 * load, 2.06 * load),
            "eval_time": "70m",
            "exp_samples": [
                {"labels": _flat({**common, "model": "llama-8b", V.LABEL_LIMITING_SLO: "tpot-100ms"}), "value": 1}
            ],
        },
        {
            "expr": _between(f'{ratio}{{model="llama-8b"}}', 1.94, 2.06),
            "eval_time": "70m",
            "exp_samples": [
                {"labels": _flat({**common, "model": "llama-8b", V.LABEL_LIMITING_SLO: "tpot-100ms"}), "value": 1}
            ],
        },
        {
            "expr": _between(f'{V.CAPACITY_CONCURRENCY_RECORD}{{model="llama-8b"}}', 38, 42),
            "eval_time": "70m",
            "exp_samples": [
                {"labels": _flat({**common, "model": "llama-8b", V.LABEL_LIMITING_SLO: "tpot-100ms"}), "value": 1}
            ],
        },
        {
            "expr": _between(f'{ratio}{{model="qwen-7b"}}', 0.93, 0.99),
            "eval_time": "70m",
            "exp_samples": [
                {"labels": _flat({**common, "model": "qwen-7b", V.LABEL_LIMITING_SLO: "tpot-100ms"}), "value": 1}
            ],
        },
        {
            "expr": f"{V.REPLICAS_NEEDED_RECORD}",
            "eval_time": "70m",
            "exp_samples": [
                {
                    "labels": _flat(
                        {V.REPLICAS_NEEDED_RECORD: None, "model": "llama-8b", V.SLO_SERVICE_LABEL: "llm-serving"}
                    ),
                    "value": 1,
                },
                {
                    "labels": _flat(
                        {V.REPLICAS_NEEDED_RECORD: None, "model": "mistral-7b", V.SLO_SERVICE_LABEL: "llm-serving"}
                    ),
                    "value": 1,
                },
                {
                    "labels": _flat(
                        {V.REPLICAS_NEEDED_RECORD: None, "model": "qwen-7b", V.SLO_SERVICE_LABEL: "llm-serving"}
                    ),
                    "value": 2,
                },
            ],
        },
        # mistral-7b has no TTFT curve: its residence is the measured one, 20 / (13.0 + 17.0) = 0.666 s at
        # N0 = 10, its non-decode part (0.666 - 10 x 0.04) held at 0.266 s: R(40) = 0.266 + 10 x 0.1, and
        # the TPOT limit's rate is (40 / 1.266) / (10 / 0.666) = 2.10x the load (± 5 %: the rules' points
        # straddle the regime changes, and this ratio moves with the slope, 2.2 ms per request there)
        {
            "expr": _between(f'{ratio}{{model="{NO_TTFT}"}}', 2.0, 2.2),
            "eval_time": "70m",
            "exp_samples": [
                {"labels": _flat({**common, "model": NO_TTFT, V.LABEL_LIMITING_SLO: "tpot-100ms"}), "value": 1}
            ],
        },
        {
            "expr": f'{V.HEADROOM_LIMIT_CONCURRENCY_RECORD}{{model="{NO_TTFT}",slo="ttft-500ms"}}',
            "eval_time": "70m",
            "exp_samples": [],
        },
        near(r("residence_seconds"), 20 / (2 * load)),
    ]
    return {
        "rule_files": ["../../alerts/generated/rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "headroom: a replica at half its TPOT limit reads 2.0; one past the edge reads < 1 and alerts",
                "interval": f"{SCRAPE}s",
                "input_series": inputs,
                "promql_expr_test": checks,
                "alert_rule_test": [
                    # the ratio exists once the fit has two batch levels (10m) and the levels below it
                    # have run; 15 minutes later the alert fires
                    {"eval_time": "20m", "alertname": V.ALERT_HEADROOM_LOW, "exp_alerts": []},
                    {"eval_time": "70m", "alertname": V.ALERT_HEADROOM_LOW, "exp_alerts": [_fired()]},
                ],
            }
        ],
    }


def _fired() -> dict[str, Any]:
    where = f"vllm qwen-7b on {INSTANCE}"
    return {
        "exp_labels": {
            V.SEVERITY_LABEL: V.SEVERITY_TICKET,
            V.LABEL_ENGINE: "vllm",
            V.LABEL_MODEL: "qwen-7b",
            "instance": INSTANCE,
            V.LABEL_LIMITING_SLO: "tpot-100ms",
            V.SLO_SERVICE_LABEL: "llm-serving",
        },
        "exp_annotations": {
            "summary": "A replica is near the load at which its first SLO breaks.",
            "description": f"{where} can take 0.96x its current load before tpot-100ms breaks (alert below 1.25x; "
            "under 1 it is over the edge). The burn-rate alerts follow if the load keeps growing. Check "
            f"{V.REPLICAS_NEEDED_RECORD} for the model and add replicas, or shed load at the router; "
            "`inferwatch headroom` shows each limit and its evidence.",
            "runbook_url": f"alerts/runbooks.md#{V.ALERT_HEADROOM_LOW.lower()}",
        },
    }


def _flat(labels: Mapping[str, str | None]) -> str:
    name = next((k for k, v in labels.items() if v is None), "")
    rest = ",".join(f'{k}="{v}"' for k, v in labels.items() if v is not None)
    return f"{name}{{{rest}}}"


def main() -> None:
    OUT.write_text(yaml.safe_dump(document(), sort_keys=False, width=200))


if __name__ == "__main__":
    main()


def expand(values: str) -> list[float]:
    """promtool's values notation as this file writes it (``a+bxn`` and ``axn`` segments) -> the samples."""
    out: list[float] = []
    for token in values.split():
        head, count = token.rsplit("x", 1)
        start, _, step = head.partition("+")
        out += [float(start) + float(step or 0) * j for j in range(int(count) + 1)]
    return out


def openmetrics(end: float) -> str:
    """Every input series of the scenario, its last sample at ``end`` (unix seconds), for promtool's backfill."""
    series = document()["tests"][0]["input_series"]
    lines = []
    for item in series:
        name = item["series"].split("{", 1)[0]
        values = expand(item["values"])
        start = end - SCRAPE * (len(values) - 1)
        lines.append(f"# TYPE {name} unknown")
        lines += [f"{item['series']} {v:.9g} {start + SCRAPE * i:.3f}" for i, v in enumerate(values)]
    return "\n".join([*lines, "# EOF", ""])
