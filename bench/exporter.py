"""Benchmark: the exporter's full cycle against prometheus_client's parser, in one run.

The payload is the real vLLM 0.32.0 capture replicated for 8 data-parallel engines x 4 models; an
SGLang page is measured too (the 44cedc2 fixture with two data-parallel groups whose TP ranks all
record, written from SGLang's source, replicated for 16 models: the adapter drops the rank copies).
Baseline: ``prometheus_client.parser.text_string_to_metric_families`` parsing that text (fully
consumed). Measured: inferwatch's parse + translate + render of the same text by one target's
session, as the exporter runs it scrape after scrape (its memo warm: the page keeps its shape; the
first, cold cycle is printed too). Target: the cycle takes at most 0.1x the baseline. Its work is
checked: the output equals a translation without memo byte for byte, and for every canonical family
fed by a plain rename (no unit change, no label pivot) with as many series as its source, the sum of
the served values (histograms: ``_count`` and ``_sum``) equals the baseline's sum of the source's.
Prints both times and the ratio; exits 1 when the target or a check is missed. Each side is timed as
the best of several rounds, interleaved, to damp machine noise.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from inferwatch.core import vocabulary as V
from inferwatch.exporters.engines import builtin_registry
from inferwatch.exporters.mapping import TranslateContext, translate_text
from inferwatch.exporters.render import render
from inferwatch.exporters.runtime import with_health
from tests.support.synth import replicate

ROOT = Path(__file__).resolve().parent.parent
CAPTURE = ROOT / "tests" / "fixtures" / "engines" / "vllm" / "0.32.0-cpu" / "metrics-final.txt"
SGLANG_PAGE = ROOT / "tests" / "fixtures" / "engines" / "sglang" / "44cedc2-dp2-all-schedulers" / "metrics.txt"
TARGET_RATIO = 0.1


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


class Cycle:
    """One target's session, as the exporter keeps it between scrapes: parse + translate + render."""

    def __init__(self, text: str) -> None:
        adapter = builtin_registry().detect(text)
        assert adapter is not None
        self.adapter = adapter
        self.session = adapter.open()
        self.ctx = TranslateContext(engine=adapter.name, vocabulary=V.Vocabulary())

    def __call__(self, text: str) -> str:
        snap = self.session.translate(text, self.ctx)
        return render(with_health(snap, "bench", self.adapter.name, {}, 0.0), self.ctx.vocabulary)

    def reference(self, text: str) -> str:
        """The same cycle without memo (a fresh session's hook, no memo)."""
        snap = translate_text(self.adapter, text, self.ctx, self.adapter.open().extend)
        return render(with_health(snap, "bench", self.adapter.name, {}, 0.0), self.ctx.vocabulary)


def _sums(text: str) -> dict[str, tuple[int, float]]:
    """Series count and value sum per sample name, by prometheus_client's parser."""
    out: dict[str, tuple[int, float]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            n, total = out.get(sample.name, (0, 0.0))
            out[sample.name] = (n + 1, total + sample.value)
    return out


def check(cycle: Cycle, text: str, out: str) -> list[str]:
    """What is wrong with ``out`` (see the module docstring); empty when right."""
    problems = []
    if out != cycle.reference(text):
        problems.append("the output differs from a translation without memo")
    source, served = _sums(text), _sums(out)
    compared = 0
    for row in cycle.adapter.rows:
        if row.divisor != 1.0 or row.match or row.const or row.values or row.sum_only:
            continue
        name = row.metric.name
        pairs = [(f"{s}_count", f"{name}_count") for s in row.sources] + [
            (f"{s}_sum", f"{name}_sum") for s in row.sources
        ]
        if row.metric.kind is not V.Kind.HISTOGRAM:
            pairs = [(s, name) for s in row.sources]
        for src, canon in pairs:
            if src not in source or served.get(canon, (0, 0.0))[0] != source[src][0]:
                continue
            compared += 1
            if not math.isclose(source[src][1], served[canon][1], rel_tol=1e-9):
                problems.append(f"{canon} sums to {served[canon][1]!r}, its source {src} to {source[src][1]!r}")
    if not compared:
        problems.append("no canonical family could be compared with its source")
    return problems


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
        print("FAIL: target ratio or check missed", file=sys.stderr)
        return 1
    print("OK")
    return 0


def measure(text: str, what: str, rounds: int) -> float:
    """The ratio for ``text``, or infinity when the output is wrong."""
    lines = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
    parsed_samples = baseline(text)
    cycle = Cycle(text)
    cold = best_of(lambda: cycle(text), 1)
    out = cycle(text)
    problems = check(cycle, text, out)
    out_lines = sum(1 for ln in out.splitlines() if ln and not ln.startswith("#"))
    base_times, ours_times = [], []
    for _ in range(rounds):  # interleave the two sides so that noise hits both alike
        base_times.append(best_of(lambda: baseline(text), 1))
        ours_times.append(best_of(lambda: cycle(text), 3))
    base, ours = min(base_times), min(ours_times)
    ratio = ours / base
    print(f"payload: {what}, {lines} sample lines, {len(text) / 1e6:.2f} MB")
    print(f"  baseline, prometheus_client parser:    {base * 1000:8.1f} ms ({parsed_samples} samples)")
    print(f"  inferwatch parse + translate + render: {ours * 1000:8.1f} ms ({out_lines} canonical samples)")
    print(f"    (the first cycle, memo cold:         {cold * 1000:8.1f} ms)")
    print(f"  ratio: {ratio:.3f} (target <= {TARGET_RATIO})")
    for problem in problems:
        print(f"  wrong: {problem}")
    return math.inf if problems else ratio


if __name__ == "__main__":
    sys.exit(main())
