"""Benchmark: the exporter's full cycle against prometheus_client's parser, in one run.

The payload is the real vLLM 0.32.0 capture replicated for 8 data-parallel engines x 4 models; an
SGLang page is measured too (the 44cedc2 fixture with two data-parallel groups whose TP ranks all
record, written from SGLang's source, replicated for 16 models: the adapter drops the rank copies).
Baseline: ``prometheus_client.parser.text_string_to_metric_families`` parsing that text (fully
consumed). Measured: inferwatch's parse + translate + render of the same text. Target: the full
cycle takes at most 0.5x the baseline. Prints both times and the ratio; exits 1 when the target is
missed. Each side is timed as the best of several rounds, interleaved, to damp machine noise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext
from inferwatch.exporters.render import render
from inferwatch.exporters.runtime import with_health
from tests.support.synth import replicate

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "tests" / "fixtures" / "engines" / "vllm" / "0.32.0-cpu" / "metrics-final.txt"
SGLANG_PAGE = ROOT / "tests" / "fixtures" / "engines" / "sglang" / "44cedc2-dp2-all-schedulers" / "metrics.txt"
TARGET_RATIO = 0.5


def build_payload(engines: int = 8, models: int = 4) -> str:
    return replicate(CAPTURE.read_text(), engines, [f"model-{i}" for i in range(models)])


def build_sglang_payload(models: int = 16) -> str:
    """The SGLang page once per model (its series carry ``model_name``, its ranks are already in it)."""
    return replicate(SGLANG_PAGE.read_text(), 1, [f"model-{i}" for i in range(models)])


def baseline(text: str) -> int:
    n = 0
    for fam in text_string_to_metric_families(text):
        n += len(fam.samples)
    return n


def full_cycle(text: str) -> str:
    registry = builtin_registry()
    adapter = registry.detect(text)
    assert adapter is not None
    ctx = TranslateContext(engine=adapter.name, vocabulary=V.Vocabulary())
    snap = adapter.open().translate(text, ctx)
    return render(with_health(snap, "bench", adapter.name, {}, 0.0), ctx.vocabulary)


def best_of(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="rounds per side (best is kept)")
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--models", type=int, default=4)
    args = parser.parse_args()

    failed = False
    # The specified payload, and the same engines with twice the models (over 20,000 sample lines).
    for engines, models in ((args.engines, args.models), (args.engines, args.models * 2)):
        ratio = measure(build_payload(engines, models), f"vLLM, {engines} DP engines x {models} models", args.rounds)
        failed |= ratio > TARGET_RATIO
    sglang_models = args.models * 4
    ratio = measure(
        build_sglang_payload(sglang_models), f"SGLang, 2 DP groups x 2 TP ranks x {sglang_models} models", args.rounds
    )
    failed |= ratio > TARGET_RATIO
    if failed:
        print("FAIL: target ratio missed", file=sys.stderr)
        return 1
    print("OK")
    return 0


def measure(text: str, what: str, rounds: int) -> float:
    lines = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
    parsed_samples = baseline(text)
    out = full_cycle(text)
    out_lines = sum(1 for ln in out.splitlines() if ln and not ln.startswith("#"))
    base_times, ours_times = [], []
    for _ in range(rounds):  # interleave the two sides so that noise hits both alike
        base_times.append(best_of(lambda: baseline(text), 1))
        ours_times.append(best_of(lambda: full_cycle(text), 1))
    base, ours = min(base_times), min(ours_times)
    ratio = ours / base
    print(f"payload: {what}, {lines} sample lines, {len(text) / 1e6:.2f} MB")
    print(f"  baseline, prometheus_client parser:    {base * 1000:8.1f} ms ({parsed_samples} samples)")
    print(f"  inferwatch parse + translate + render: {ours * 1000:8.1f} ms ({out_lines} canonical samples)")
    print(f"  ratio: {ratio:.3f} (target <= {TARGET_RATIO})")
    return ratio


if __name__ == "__main__":
    sys.exit(main())
