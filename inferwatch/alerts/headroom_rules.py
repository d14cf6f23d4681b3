"""The headroom model (:mod:`inferwatch.core.headroom`) as Prometheus recording rules (pure functions).

``docs/headroom.md`` states the model; these rules compute it per replica ``(engine, model, instance,
role)`` from the canonical series, in seven groups evaluated every ``headroom.step``. A group never
reads a record of its own group (vmalert writes a group's results asynchronously; see
:func:`inferwatch.alerts.generate.slo_rules`), so each level reads the one before and the answer
trails the raw series by up to seven steps:

1. the window's inputs: the (batch, TPOT) points of the fit, one per step; the served rate and the
   load; the mean batch, prompt and output lengths, queue wait and prefill time per prompt token;
   the KV tokens held per running request and the KV capacity; each SLO's quantile-to-mean ratio;
2. the fit's slope ``b`` by least squares over the window's points, kept only where the model keeps
   it (enough points, a batch spread, a positive slope told apart from the noise, some traffic);
3. the curves: TPOT, TTFT, end-to-end and residence time, each ``intercept + slope x N``;
4. each limit's breaking batch (``slo`` = an SLO name, or ``kv_cache``);
5. each limit's breaking request rate (Little's law anchored on the served rate);
6. the first limit (``limiting_slo``): capacity in requests per second and in batch, headroom ratio;
7. replicas needed per model and role.

What the rules do not do that the API does: they cannot read the engine's concurrency cap (a label
of the engine info series, which PromQL cannot use as a number), and they answer nothing where the API
answers "unknown, because ...".
"""

from __future__ import annotations

from typing import Any

from inferwatch.core import vocabulary as V
from inferwatch.core.headroom_fit import FitSettings
from inferwatch.core.slo import SLO, SLOFile

BY = (V.LABEL_ENGINE, V.LABEL_MODEL, "instance", V.LABEL_ROLE)
"""One replica: Prometheus's ``instance`` is the exporter the replica is scraped through."""
MIN_RUNNING = 0.05
"""below this mean running batch a replica has no traffic to learn from (``HeadroomSettings``)."""
MODELLED = (V.TIME_TO_FIRST_TOKEN.key, V.TIME_PER_OUTPUT_TOKEN.key, V.REQUEST_DURATION.key)
SERVES = {
    V.TIME_TO_FIRST_TOKEN.key: f'{{{V.LABEL_ROLE}!="{V.ROLE_DECODE}"}}',
    V.TIME_PER_OUTPUT_TOKEN.key: f'{{{V.LABEL_ROLE}!="{V.ROLE_PREFILL}"}}',
    V.REQUEST_DURATION.key: f'{{{V.LABEL_ROLE}!~"{V.ROLE_PREFILL}|{V.ROLE_DECODE}"}}',
}
"""The replicas an SLO on each metric limits: a prefill replica does not decode, a decode one does not prefill."""


def _r(part: str, selector: str = "") -> str:
    return V.headroom_record(part) + selector


class _Exprs:
    """PromQL builders over one SLO file's window and step."""

    def __init__(self, spec: SLOFile) -> None:
        self.window = spec.headroom.window
        self.step = spec.headroom.step
        self.by = f"by ({', '.join(BY)})"
        self.on = f"on ({', '.join((*BY, V.SLO_SERVICE_LABEL))})"
        self.by_service = f"by ({', '.join((*BY, V.SLO_SERVICE_LABEL))})"
        self.on_slo = f"on ({', '.join((*BY, V.SLO_SERVICE_LABEL, V.SLO_LABEL))})"

    def sum_rate(self, name: str, window: str | None = None, selector: str = "") -> str:
        return f"sum {self.by} (rate({name}{selector}[{window or self.window}]))"

    def ratio(self, num: str, den: str) -> str:
        return f"{num}\n/\n{den}"

    def over(self, part: str, fn: str = "avg") -> str:
        return f"{fn}_over_time({_r(part)}[{self.window}])"

    # --- level 1: from the raw series ------------------------------------------------------------
    def in_service(self, window: str) -> str:
        """Requests in service by Little's law (end-to-end minus queue seconds per second), else the gauge's
        mean: engines sample the gauge between steps, which undercounts the time average."""
        e2e, queue = V.REQUEST_DURATION.name, V.REQUEST_QUEUE.name
        little = f"{self.sum_rate(f'{e2e}_sum', window)}\n- {self.sum_rate(f'{queue}_sum', window)}"
        gauge = f"sum {self.by} (avg_over_time({V.REQUESTS_RUNNING.name}[{window}]))"
        return f"clamp_min(\n{little},\n0\n)\nor\n{gauge}"

    def batch(self) -> str:
        return self.in_service(self.step)

    def tpot_mean(self) -> str:
        """The mean TPOT over a step, else the mean inter-token latency (an engine without the TPOT histogram)."""
        means = []
        for spec in (V.TIME_PER_OUTPUT_TOKEN, V.INTER_TOKEN_LATENCY):
            h = spec.name
            means.append(self.ratio(self.sum_rate(f"{h}_sum", self.step), self.sum_rate(f"{h}_count", self.step)))
        return f"(\n{means[0]}\n)\nor\n(\n{means[1]}\n)"

    def prefill_per_token(self) -> str:
        """Prefill seconds per prompt token; without a prefill histogram, (mean TTFT - mean queue) per request."""
        prompt = self.sum_rate(V.PROMPT_TOKENS.name)
        direct = self.ratio(self.sum_rate(f"{V.REQUEST_PREFILL.name}_sum"), prompt)
        ttft = self.mean_of(V.TIME_TO_FIRST_TOKEN)
        queue = self.mean_of(V.REQUEST_QUEUE)
        per_request = f"clamp_min(\n({ttft})\n- ({queue}),\n0\n)"
        fallback = f"{per_request}\n* {self.sum_rate(f'{V.TIME_TO_FIRST_TOKEN.name}_count')}\n/ {prompt}"
        return f"(\n{direct}\n)\nor\n(\n{fallback}\n)"

    def served(self) -> str:
        return self.sum_rate(V.REQUESTS.name)

    def load(self) -> str:
        growth = f"clamp_min(sum {self.by} (deriv({V.REQUESTS_WAITING.name}[{self.window}])), 0)"
        return f"{self.served()}\n+\n({growth} or {self.served()} * 0)"

    def mean_of(self, spec: V.MetricSpec, selector: str = "") -> str:
        sums = self.sum_rate(f"{spec.name}_sum", selector=selector)
        return self.ratio(sums, self.sum_rate(f"{spec.name}_count", selector=selector))

    def quantile_ratio(self, slo: SLO, quantile: str) -> str:
        lat = slo.indicator.latency
        assert lat is not None
        spec = lat.histogram()
        sel = _selector(slo.selector)
        by_le = f"by ({', '.join((*BY, V.LABEL_LE))})"
        q = f"histogram_quantile({quantile}, sum {by_le} (rate({spec.name}_bucket{sel}[{self.window}])))"
        return f"{q}\n/\n(\n{self.mean_of(spec, sel)}\n)"

    def residence_seconds(self) -> str:
        """Mean seconds a finished request spent in service (end to end minus queue)."""
        e2e, queue = V.REQUEST_DURATION.name, V.REQUEST_QUEUE.name
        spent = f"(\n{self.sum_rate(f'{e2e}_sum')}\n- {self.sum_rate(f'{queue}_sum')}\n)"
        return self.ratio(spent, self.served())

    def kv_tokens_per_request(self) -> str:
        kv, cap = V.KV_CACHE_USAGE.name, V.KV_CACHE_CAPACITY.name
        held = f"sum {self.by} (avg_over_time({kv}[{self.window}]) * max_over_time({cap}[{self.window}]))"
        return self.ratio(held, f"sum {self.by} (avg_over_time({V.REQUESTS_RUNNING.name}[{self.window}]))")

    # --- level 2: the fit ------------------------------------------------------------------------
    def slope(self, spec: SLOFile) -> str:
        fit = FitSettings(min_points=spec.headroom.min_points)
        x, y = self.over("batch"), self.over("tpot_mean")
        vx = f"({self.over('batch_squared')} - {x} ^ 2)"
        vy = f"({self.over('tpot_squared')} - {y} ^ 2)"
        cxy = f"({self.over('batch_tpot')} - {x} * {y})"
        spread = f"({self.over('batch', 'max')} - {self.over('batch', 'min')})"
        n = self.over("batch", "count")
        t = fit.min_slope_t
        # the slope is at least t standard errors above 0: b^2 (n - 2) var(x) >= t^2 (var(y) - cov^2 / var(x))
        return "\n".join(
            [
                f"({cxy} / {vx}) > 0",
                f"and {n} >= {fit.min_points}",
                f"and {spread} >= {fit.min_batch_spread:g}",
                f"and {spread} >= {fit.min_relative_spread:g} * {x}",
                f"and ({cxy} / {vx}) ^ 2 * ({n} - 2) * {vx} >= {t * t:g} * ({vy} - {cxy} ^ 2 / {vx})",
                f"and {_r('current_batch')} >= {MIN_RUNNING:g}",
            ]
        )

    # --- level 3: the curves (each inlines what it needs: no rule reads its own group) ------------
    def intercept(self) -> str:
        return f"({self.over('tpot_mean')} - {_r('tpot_slope')} * {self.over('batch')})"

    def t0(self) -> str:
        return f"({self.intercept()} + {_r('tpot_slope')} * {_r('current_batch')})"

    def ttft(self) -> tuple[str, str]:
        """``TTFT(N) = q TPOT(N) / T0 + P s + b (N - N0)``: (intercept, slope)."""
        b, q = _r("tpot_slope"), _r("queue_seconds")
        prefill = f"{_r('prompt_tokens')} * {_r('prefill_seconds_per_token')}"
        a, t0 = self.intercept(), self.t0()
        return (
            f"{q} * {a} / {t0}\n+ {prefill}\n- {b} * {_r('current_batch')}",
            f"{q} * {b} / {t0}\n+ {b}",
        )

    def decodes(self) -> str:
        return f"clamp_min({_r('output_tokens')} - 1, 0)"

    def e2e(self) -> tuple[str, str]:
        i, s = self.ttft()
        return f"{i}\n+ {self.decodes()} * {self.intercept()}", f"{s}\n+ {self.decodes()} * {_r('tpot_slope')}"

    def residence(self) -> tuple[str, str]:
        """Seconds a request spends in the replica at batch ``N``, by role (Little's law's W)."""
        unified = f'{{{V.LABEL_ROLE}!~"{V.ROLE_PREFILL}|{V.ROLE_DECODE}"}}'
        prefill, decode = f'{{{V.LABEL_ROLE}="{V.ROLE_PREFILL}"}}', f'{{{V.LABEL_ROLE}="{V.ROLE_DECODE}"}}'
        out = []
        for i in (0, 1):
            parts = [
                f"(\n{self.e2e()[i]}\n) and {_r('current_batch', unified)}",
                f"(\n{self.ttft()[i]}\n) and {_r('current_batch', prefill)}",
                f"{self.decodes()} * {(self.intercept(), _r('tpot_slope'))[i]} and {_r('current_batch', decode)}",
                f"(\n{self.measured_residence()[i]}\n) and {_r('current_batch', unified)}",
            ]
            out.append("(\n" + "\n)\nor\n(\n".join(parts) + "\n)")
        return out[0], out[1]

    def measured_residence(self) -> tuple[str, str]:
        """Without a TTFT curve (TGI): the measured residence, its non-decode part held constant."""
        decode0 = f"{self.decodes()} * {self.t0()}"
        first = f"clamp_min({_r('residence_seconds')} - {decode0}, 0)"
        return f"{first}\n+ {self.decodes()} * {self.intercept()}", f"{self.decodes()} * {_r('tpot_slope')}"

    # --- level 4: where each limit breaks ----------------------------------------------------------
    def slo_concurrency(self, slo: SLO, curve: str) -> str:
        lat = slo.indicator.latency
        assert lat is not None
        sel = SERVES[lat.metric]
        ratio = f'{_r("quantile_ratio")}{{{V.SLO_LABEL}="{slo.name}"}}'
        one = f"{_r(f'{curve}_intercept', sel)} * 0 + 1"
        target = f"{lat.threshold_seconds:g} / ({ratio} or {self.on} {one})"
        return (
            f"clamp_min(\n  ({target} - {self.on} {_r(f'{curve}_intercept', sel)})\n"
            f"  / {self.on} {_r(f'{curve}_slope', sel)},\n  0\n)"
        )

    def kv_concurrency(self, z: float) -> str:
        """``N`` where ``h (N + z sqrt(D N))`` fills the cache, ``D = 1 + (b / a) N`` for the residence curve
        ``a + b N`` (the API's :func:`inferwatch.core.headroom._kv_concurrency`): the smaller root of
        ``(1 - z^2 b / a) N^2 - (2 Q + z^2) N + Q^2``, as ``2 Q^2 / (B + sqrt(B^2 - 4 A Q^2))``."""
        q = f"({_r('kv_capacity_tokens')} / ({_r('kv_tokens_per_request')} > 0))"
        ri, rs = _r("residence_intercept"), _r("residence_slope")
        growth = f"(clamp_min({rs}, 0) / ({ri} > 0) or {_r('kv_tokens_per_request')} * 0)"
        a = f"(1 - {z * z:g} * {growth})"
        b = f"(2 * {q} + {z * z:g})"
        return f"2 * {q} ^ 2\n/\n(\n  {b}\n  + sqrt({b} ^ 2 - 4 * {a} * {q} ^ 2)\n)"

    # --- level 5: each limit's rate ----------------------------------------------------------------
    def limit_rate(self) -> str:
        n = V.HEADROOM_LIMIT_CONCURRENCY_RECORD
        ri, rs, n0 = _r("residence_intercept"), _r("residence_slope"), _r("current_batch")
        per_batch = f"(\n  ({_r('served_requests_per_second')} > 0) * ({ri} + {rs} * {n0}) / {n0}\n)"
        return (
            f"{n} * {self.on} group_left() {per_batch}\n/\n"
            f"(\n  {n} * {self.on} group_left() {rs}\n  + {self.on} group_left() {ri}\n)"
        )

    # --- level 6: the first limit ------------------------------------------------------------------
    def first(self) -> str:
        return f"bottomk {self.by_service} (1, {V.HEADROOM_LIMIT_RATE_RECORD})"

    def named(self, expr: str) -> str:
        """The ``slo`` label renamed ``limiting_slo``."""
        moved = f'label_replace(\n{expr},\n"{V.LABEL_LIMITING_SLO}", "$1", "{V.SLO_LABEL}", "(.*)"\n)'
        return f'label_replace(\n{moved},\n"{V.SLO_LABEL}", "", "{V.SLO_LABEL}", ".*"\n)'


def _selector(selector: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in selector.items()) + "}" if selector else ""


def modelled(spec: SLOFile) -> list[SLO]:
    """The SLO file's SLOs the headroom model covers (engine-side latency SLOs on TTFT, TPOT, e2e)."""
    out = []
    for slo in spec.slos:
        lat = slo.indicator.latency
        if lat is not None and lat.measured_at == "engine" and lat.metric in MODELLED:
            out.append(slo)
    return out


def _record(name: str, expr: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"record": name, "expr": expr, "labels": labels}


def headroom_groups(spec: SLOFile) -> list[dict[str, Any]]:
    """The seven rule groups (see the module docstring), named ``inferwatch-headroom-<service>-<n>-<what>``."""
    e = _Exprs(spec)
    service = {V.SLO_SERVICE_LABEL: spec.service}
    slos = modelled(spec)

    def rec(part: str, expr: str) -> dict[str, Any]:
        return _record(_r(part), expr, service)

    inputs = [
        rec("batch", e.batch()),
        rec("tpot_mean", e.tpot_mean()),
        rec("batch_tpot", f"(\n{e.batch()}\n)\n*\n(\n{e.tpot_mean()}\n)"),
        rec("batch_squared", f"(\n{e.batch()}\n) ^ 2"),
        rec("tpot_squared", f"(\n{e.tpot_mean()}\n) ^ 2"),
        rec("current_batch", e.in_service(e.window)),
        rec("served_requests_per_second", e.served()),
        _record(V.LOAD_REQUESTS_PER_SECOND_RECORD, e.load(), service),
        rec("prompt_tokens", e.ratio(e.sum_rate(V.PROMPT_TOKENS.name), e.served())),
        rec("output_tokens", e.ratio(e.sum_rate(V.GENERATION_TOKENS.name), e.served())),
        rec("queue_seconds", e.mean_of(V.REQUEST_QUEUE)),
        rec(
            "prefill_seconds_per_token",
            e.prefill_per_token(),
        ),
        rec("kv_tokens_per_request", e.kv_tokens_per_request()),
        rec("residence_seconds", e.residence_seconds()),
        rec(
            "kv_capacity_tokens",
            f"sum {e.by} (max_over_time({V.KV_CACHE_CAPACITY.name}[{e.window}]))",
        ),
    ]
    for slo in slos:
        quantile = f"{slo.objective / 100:g}"
        inputs.append(
            _record(_r("quantile_ratio"), e.quantile_ratio(slo, quantile), {**service, V.SLO_LABEL: slo.name})
        )
    ttft, e2e, residence = e.ttft(), e.e2e(), e.residence()
    curves = [
        rec("tpot_intercept", e.intercept()),
        rec("ttft_intercept", ttft[0]),
        rec("ttft_slope", ttft[1]),
        rec("e2e_intercept", e2e[0]),
        rec("e2e_slope", e2e[1]),
        rec("residence_intercept", residence[0]),
        rec("residence_slope", residence[1]),
    ]
    curve_of = {V.TIME_TO_FIRST_TOKEN.key: "ttft", V.TIME_PER_OUTPUT_TOKEN.key: "tpot", V.REQUEST_DURATION.key: "e2e"}
    limits = [
        _record(
            V.HEADROOM_LIMIT_CONCURRENCY_RECORD,
            e.slo_concurrency(slo, curve_of[slo.indicator.latency.metric]),  # type: ignore[union-attr]
            {**service, V.SLO_LABEL: slo.name},
        )
        for slo in slos
    ]
    limits.append(
        _record(
            V.HEADROOM_LIMIT_CONCURRENCY_RECORD,
            e.kv_concurrency(spec.headroom.kv_fluctuation_z),
            {**service, V.SLO_LABEL: V.HEADROOM_KV_LIMIT},
        )
    )
    first = e.first()
    capacity = [
        _record(V.CAPACITY_REQUESTS_PER_SECOND_RECORD, e.named(first), service),
        _record(
            V.CAPACITY_CONCURRENCY_RECORD,
            e.named(f"{V.HEADROOM_LIMIT_CONCURRENCY_RECORD}\nand {e.on_slo}\n{first}"),
            service,
        ),
        _record(
            V.HEADROOM_RATIO_RECORD,
            e.named(f"{first}\n/ {e.on} group_left()\n{V.LOAD_REQUESTS_PER_SECOND_RECORD}"),
            service,
        ),
    ]
    per_model = f"by ({V.LABEL_MODEL}, {V.LABEL_ROLE}, {V.SLO_SERVICE_LABEL})"
    needed = (
        f"clamp_min(\n  ceil(\n    sum {per_model} ({V.LOAD_REQUESTS_PER_SECOND_RECORD})\n"
        f"    / avg {per_model} ({V.CAPACITY_REQUESTS_PER_SECOND_RECORD})\n    - 1e-9\n  ),\n  1\n)"
    )
    levels = [
        ("1-inputs", inputs),
        ("2-fit", [rec("tpot_slope", e.slope(spec))]),
        ("3-curves", curves),
        ("4-limits", limits),
        ("5-rates", [_record(V.HEADROOM_LIMIT_RATE_RECORD, e.limit_rate(), service)]),
        ("6-capacity", capacity),
        ("7-replicas", [_record(V.REPLICAS_NEEDED_RECORD, needed, service)]),
    ]
    return [
        {"name": f"inferwatch-headroom-{spec.service}-{name}", "interval": spec.headroom.step, "rules": rules}
        for name, rules in levels
    ]
