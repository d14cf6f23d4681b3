"""Scale-out of metrics (issue 14): Prometheus and sharded vmagents into VictoriaMetrics, the rules in vmalert.

Everything runs on 127.0.0.1 with Debian's binaries (``prometheus``, ``promtool``,
``prometheus-alertmanager``, and from ``victoria-metrics``: ``victoria-metrics``, ``vmagent``,
``vmalert``)::

    11 targets ─┬─> Prometheus: prometheus.yml of inferwatch.stack (file_sd targets, remote_write;
                │   its alerting section left out), alerts/generated/rules.yml
                │      └──remote_write──> VictoriaMetrics "prom"
                └─> 3 vmagents, one cluster (each target scraped by one member), the same scrape
                    configs ──remote write──> VictoriaMetrics "vm" <──reads, writes recordings── vmalert
                    (the same rules.yml) ──alerts──> Alertmanager (generated alertmanager.yml) ──> webhook

**The fleet is deterministic.** Every counter and histogram bucket of a target grows linearly with
wall-clock time (value = requests/s x share x (t - t0)), computed when it is scraped, so whoever
scrapes it whenever sees the same line. Nine targets serve the canonical exposition themselves (as an
exporter does); two are real ``inferwatch exporter`` processes in front of a synthetic vLLM page (its
names taken from the vLLM adapter's mapping rows; the exporter's output is the same canonical page).

**History.** Prometheus' ``rate(x[5m])`` of a series younger than five minutes is its slope scaled
by the part of the window its samples cover, VictoriaMetrics' the slope itself: the absolute rates
a recording rule may keep (e.g. the error and event rates over 5 minutes) would differ tenfold
after half a minute, and a ratio of a series with history to one without (the headroom rules'
histogram sums by their counts) would differ as much until the live samples fill its window. So
the last ``HISTORY_S`` seconds of every engine series are written into both stores before they
scrape, one sample a second, the same samples (``promtool tsdb create-blocks-from openmetrics`` for
Prometheus, ``/api/v1/import/prometheus`` for VictoriaMetrics, with the label of the vmagent that owns
the target). From then on both 5-minute windows are full, and for a linear series Prometheus'
extrapolation to the window's edges is exact.

**Parity.** Each recording of rules.yml in a group evaluated at least every 30 s must exist in both,
with the same labels, for every model, from an evaluation after the scrapers started; slower groups
(a 5m period group) are compared when both have evaluated them. Tolerances, relative:

- ratios (``...:ratio...`` recordings) and constants, for the models whose replicas all have the same
  shares (``chat``, ``code``, ``burning``): ``EXACT_TOLERANCE``. Whatever scaling a pipeline applies to
  a rate applies alike to a target's buckets, count and error counter (one page, one timestamp) and
  cancels in the ratio; the error ratios must also equal the shares the fleet was built with. What
  remains is rounding: VictoriaMetrics keeps about 12 significant digits of a sample, and a latency
  SLI subtracts the bucket's rate from the count's, losing log10(1 / share) more (3 for 0.1 %),
  ~1e-9 (4.4e-10 measured); any real disagreement (another window, a lost series, extrapolation) is
  >= 1e-3. The tolerance, 1e-5, leaves room for a query that reads a target's bucket and count from
  two scrapes (their values are computed a few microseconds apart after the scrape's timestamp:
  seen once as 6.5e-6, before VictoriaMetrics' latency offset was raised to 5 s) and stays a
  hundred times under any real disagreement. Remote-written samples must match to
  ``FORWARDING_TOLERANCE``;
- ratios built on other recordings of their own group (e.g. a burn rate recorded from the 5-minute
  error ratio, itself recorded from the error and event rates): ``CHAINED_TOLERANCE`` = 1e-3. vmalert
  reads a rule's inputs from VictoriaMetrics, where the recordings of the evaluation under way arrive
  only after the remote-write flush: such a recording first has a value one evaluation (30 s) later
  per level, and may divide a rate of this evaluation by one of the previous (each known to a few ms
  over 300 s, ~1e-5). The test waits for those evaluations (``recordings_timeout``);
- ratios for ``mixed``, whose replicas differ in their shares (as in a real fleet): over windows
  longer than the history Prometheus weighs each replica's rate by the time its samples cover, which
  differs between replicas only by their last scrape (< 1.1 s of >= 360 s): under 0.4 %, times
  max|share - ratio| / ratio (0.25) < 0.1 % on the ratio: ``MIXED_TOLERANCE`` = 1 %;
- absolute rates over windows within the history: ``RATE_TOLERANCE`` = 1 %: a live value is computed
  a few milliseconds after the timestamp its scraper gives it, and Prometheus extrapolates by half
  an interval when a scrape is late (0.5 s of 300 s, 0.2 %). Longer windows are not compared.

``burning`` fails 20x faster than the availability SLO allows: the burn-rate alerts of that SLO
(every window pair) fire for it in Prometheus and in vmalert alike, and nothing else fires;
vmalert's alerts must reach Alertmanager and the page its webhook (Prometheus' alerts are read from
its API, so that Alertmanager hears vmalert only and the timings are vmalert's). Every process
started here is stopped at the end; logs are printed when something fails. Set
``INFERWATCH_TEST_ARTIFACTS`` to keep the measured figures (``scale-metrics.json``).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts.generate import generate as generate_alerts
from inferwatch.core import vocabulary as V
from inferwatch.core.slo import BURN_PAIRS, load
from inferwatch.stack import EXPORTERS_JOB, Exporter, Layout, exporter_targets, prometheus_config
from tests.conftest import ROOT, free_port, require_tool
from tests.support.scale_fleet import (
    CANONICAL,
    ENGINE_UPTIME_S,
    EXACT_MODELS,
    FLEET,
    HISTORY_S,
    READY_TIMEOUT_S,
    ROUTE_TIMINGS,
    RULES,
    SCRAPERS,
    SHARD_LABEL,
    SLO_FILE,
    WEBHOOK_PATH,
    Arrivals,
    Dialect,
    Key,
    Replica,
    Scale,
    canonical_dialect,
    count_series,
    engine_dialect,
    eventually,
    exposition,
    history,
    keep_figures,
    serving,
    share,
    shown_command,
    vmagent_targets,
)
from tests.support.scale_rules import (
    CHAINED_TOLERANCE,
    EXACT_TOLERANCE,
    FORWARDING_TOLERANCE,
    MIXED_TOLERANCE,
    RATE_TOLERANCE,
    Samples,
    expected_alerts,
    exporter_series,
    fast,
    firing,
    incomplete,
    lag_by_depth,
    parse_time,
    recorded,
    recording_of,
    recordings_of_rules,
    recordings_timeout,
    relative,
    rule_groups,
    tolerance,
)
from tests.support.sink import running_sink
from tests.support.stack import Processes, alertmanager_cmd, exporter_cmd, prometheus_cmd
from tests.support.victoria import (
    HEALTH_PATH,
    VICTORIA_METRICS,
    VMAGENT,
    VMALERT,
    WRITE_PATH,
    import_prometheus,
    labelled_values,
    query,
    require_binary,
    victoria_metrics_cmd,
    vmagent_cmd,
    vmalert_check_rules,
    vmalert_cmd,
)


# --- the stack, started once for the module ------------------------------------------------------
@pytest.fixture(scope="module")
def scale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scale]:
    prometheus_bin, promtool = require_tool("prometheus"), require_tool("promtool")
    alertmanager_bin = require_tool("prometheus-alertmanager")
    vm_bin, vmagent_bin, vmalert_bin = (require_binary(n) for n in (VICTORIA_METRICS, VMAGENT, VMALERT))
    tmp = tmp_path_factory.mktemp("scale")
    vocabulary = V.Vocabulary()
    spec = load(SLO_FILE, vocabulary)
    t0 = time.time() - ENGINE_UPTIME_S
    procs = Processes(tmp / "logs", cwd=ROOT)
    figures: dict[str, Any] = {"commands": {}}
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(running_sink())
        stack.callback(procs.close)  # after the watcher and the pages stop, before the sink goes
        targets: dict[str, Replica] = {}
        for replica in FLEET:
            dialect = canonical_dialect if replica.dialect == CANONICAL else engine_dialect(replica.dialect)

            def render(r: Replica = replica, d: Dialect = dialect) -> str:
                return exposition(r, spec, vocabulary, d, r.rate * (time.time() - t0))

            page = stack.enter_context(serving(render))
            if replica.dialect == CANONICAL:
                targets[page] = replica
                continue
            address = f"127.0.0.1:{free_port()}"
            procs.spawn(f"exporter-{replica.name}", exporter_cmd(replica.dialect, f"http://{page}", address))
            targets[address] = replica

        vm_prometheus, vm = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
        for name, url in (("vm-prometheus", vm_prometheus), ("vm", vm)):
            cmd = victoria_metrics_cmd(vm_bin, tmp / name, int(url.rsplit(":", 1)[1]))
            procs.spawn(name, cmd)
            figures["commands"]["victoria-metrics"] = shown_command(cmd, tmp)

        am_port = free_port()
        alertmanager = f"http://127.0.0.1:{am_port}"
        routed = spec.alerts.model_copy(update={"webhook_url": sink.url + WEBHOOK_PATH, **ROUTE_TIMINGS})
        am_config = tmp / "alertmanager.yml"
        am_config.write_text(
            generate_alerts(spec.model_copy(update={"alerts": routed}), vocabulary)["alertmanager.yml"]
        )
        procs.spawn("alertmanager", alertmanager_cmd(alertmanager_bin, am_config, tmp / "alertmanager", am_port))

        prom_port = free_port()
        prometheus = f"http://127.0.0.1:{prom_port}"
        layout = Layout(
            exporters=tuple(Exporter(address) for address in targets),
            prometheus=f"127.0.0.1:{prom_port}",
            alertmanager=f"127.0.0.1:{am_port}",
            collector=f"127.0.0.1:{free_port()}",  # no collector here: that target is down
            scrape_interval="1s",
            evaluation_interval="1s",
            remote_write=vm_prometheus + WRITE_PATH,
        )
        config_dir = tmp / "prometheus"
        (config_dir / "targets").mkdir(parents=True)
        config = config_dir / "prometheus.yml"
        generated = prometheus_config(layout)
        del generated["alerting"]  # Alertmanager hears vmalert only
        config.write_text(yaml.safe_dump(generated, sort_keys=False))
        (config_dir / "targets" / "exporters.yml").write_text(yaml.safe_dump(exporter_targets(layout)))
        shutil.copyfile(RULES, config_dir / "rules.yml")

        for name, url in (("vm-prometheus", vm_prometheus), ("vm", vm)):
            procs.wait_http(name, url + HEALTH_PATH, READY_TIMEOUT_S)
        procs.wait_http("alertmanager", f"{alertmanager}/-/ready", READY_TIMEOUT_S)
        for address, replica in targets.items():
            if replica.dialect != CANONICAL:
                procs.wait_http(f"exporter-{replica.name}", f"http://{address}/metrics", READY_TIMEOUT_S)

        # history, part 1: into Prometheus' storage before it starts
        end = float(int(time.time()))
        times = [end - HISTORY_S + i for i in range(HISTORY_S)]
        openmetrics = tmp / "history.om"
        openmetrics.write_text(history(targets, spec, vocabulary, t0, times, lambda _: {}, openmetrics=True))
        data = tmp / "prometheus-data"
        created = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert created.returncode == 0, created.stdout + created.stderr

        # on SIGTERM Prometheus waits up to --storage.remote.flush-deadline (1 min) for VictoriaMetrics,
        # which is stopping too
        prom_cmd = [*prometheus_cmd(prometheus_bin, config, data, prom_port), "--storage.remote.flush-deadline=2s"]
        procs.spawn("prometheus", prom_cmd)
        started = {"prometheus": time.time()}
        figures["commands"]["prometheus"] = shown_command(prom_cmd, tmp)
        vmagents = []
        for member in range(SCRAPERS):
            port = free_port()
            vmagents.append(f"http://127.0.0.1:{port}")
            cmd = vmagent_cmd(
                vmagent_bin,
                config,
                tmp / f"vmagent-{member}",
                port,
                vm + WRITE_PATH,
                members=SCRAPERS,
                member=member,
                labels={SHARD_LABEL: str(member)},
            )
            procs.spawn(f"vmagent-{member}", cmd)
            figures["commands"][f"vmagent-{member}"] = shown_command(cmd, tmp)
        procs.wait_http("prometheus", f"{prometheus}/-/ready", READY_TIMEOUT_S)
        for member, url in enumerate(vmagents):
            procs.wait_http(f"vmagent-{member}", url + HEALTH_PATH, READY_TIMEOUT_S)

        # history, part 2: into VictoriaMetrics, labelled with the vmagent that scrapes each target
        def assigned() -> dict[str, str] | None:
            owners = {address: str(m) for m, url in enumerate(vmagents) for address in vmagent_targets(url)}
            return owners if set(owners) == set(targets) else None

        owners = eventually(assigned, READY_TIMEOUT_S, lambda: "the vmagents do not list every target")
        text = history(targets, spec, vocabulary, t0, times, lambda a: {SHARD_LABEL: owners[a]}, openmetrics=False)
        import_prometheus(vm, text)
        written = len(text.splitlines()) // HISTORY_S
        eventually(
            lambda: count_series(vm, f'{{job="{EXPORTERS_JOB}"}}', end - 1) == written,
            READY_TIMEOUT_S,
            lambda: f"the history ({written} series) is not searchable in VictoriaMetrics",
        )
        figures["history"] = {"seconds": HISTORY_S, "series": written, "samples": written * HISTORY_S}

        vmalert_port = free_port()
        vmalert = f"http://127.0.0.1:{vmalert_port}"
        cmd = vmalert_cmd(vmalert_bin, [RULES], vmalert_port, datasource=vm, remote_write=vm, notifier=alertmanager)
        procs.spawn("vmalert", cmd)
        started[VMALERT] = time.time()
        figures["commands"]["vmalert"] = shown_command(cmd, tmp)
        procs.wait_http("vmalert", vmalert + HEALTH_PATH, READY_TIMEOUT_S)

        def scraped() -> bool:
            up = f'up{{job="{EXPORTERS_JOB}"}} == 1'
            return len(query(prometheus, up)) == len(targets) and len(query(vm, up)) == len(targets)

        eventually(scraped, READY_TIMEOUT_S, lambda: procs.log("prometheus") + procs.log("vm"))
        figures["setup_s"] = round(time.monotonic() - began, 1)
        arrivals = Arrivals(alertmanager, vmalert)
        watcher = threading.Thread(target=arrivals.run, daemon=True)
        watcher.start()
        stack.callback(watcher.join, 5)
        stack.callback(arrivals.stop.set)

        yield Scale(
            procs=procs,
            prometheus=prometheus,
            vm_prometheus=vm_prometheus,
            vm=vm,
            vmagents=vmagents,
            vmalert=vmalert,
            alertmanager=alertmanager,
            sink=sink,
            targets=targets,
            owners=owners,
            scraping=time.time(),
            started=started,
            arrivals=arrivals,
            spec=spec,
            figures=figures,
        )
        keep_figures(figures)


# --- the tests ------------------------------------------------------------------------------------
def test_vmalert_accepts_the_generated_rules(tmp_path: Path) -> None:
    """``vmalert -dryRun`` parses every expression of rules.yml with MetricsQL and every template."""
    vmalert = require_binary(VMALERT)
    result = vmalert_check_rules(vmalert, [RULES])
    assert result.returncode == 0, result.stdout + result.stderr
    # the check is real: a broken expression and an unknown template function are refused
    rules = [r for g in rule_groups() for r in g["rules"]]
    record = next(r for r in rules if "record" in r)
    alert = next(r for r in rules if "alert" in r)
    broken = {
        "bad-expr.yml": {**record, "expr": record["expr"] + " by"},
        "bad-template.yml": {**alert, "annotations": {"summary": "{{ $value | nosuch }}"}},
    }
    for name, rule in broken.items():
        (tmp_path / name).write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
        refused = vmalert_check_rules(vmalert, [tmp_path / name])
        assert refused.returncode != 0, f"{name} was accepted:\n{refused.stdout}{refused.stderr}"


def test_prometheus_remote_writes_the_fleet_to_victoria_metrics(scale: Scale) -> None:
    state: dict[str, Any] = {}

    def same() -> dict[Key, float] | None:
        state["prometheus"], state["victoria"] = exporter_series(scale.prometheus), exporter_series(scale.vm_prometheus)
        ok = len(state["prometheus"]) == len(scale.targets) and state["prometheus"] == state["victoria"]
        return state["prometheus"] if ok else None

    per_instance = eventually(
        same, READY_TIMEOUT_S, lambda: f"{state}\n{scale.logs('prometheus', 'vm-prometheus')}", every=1.0
    )
    assert {dict(k)["instance"] for k in per_instance} == set(scale.targets)
    scale.figures["prometheus_remote_write"] = {"targets": len(per_instance), "series": int(sum(per_instance.values()))}


def test_each_target_is_scraped_by_exactly_one_vmagent(scale: Scale) -> None:
    job = f'job="{EXPORTERS_JOB}"'
    state: dict[str, Any] = {}

    def members() -> dict[str, set[str]] | None:
        got = query(scale.vm, f"count by (instance, {SHARD_LABEL}) (up{{{job}}} == 1)")
        by_instance: dict[str, set[str]] = {}
        for s in got:
            by_instance.setdefault(s["metric"]["instance"], set()).add(s["metric"][SHARD_LABEL])
        state["members"] = by_instance
        return by_instance if set(by_instance) == set(scale.targets) else None

    names = [f"vmagent-{i}" for i in range(SCRAPERS)]
    by_instance = eventually(members, READY_TIMEOUT_S, lambda: f"{state}\n{scale.logs('vm', *names)}")
    assert all(len(m) == 1 for m in by_instance.values()), f"a target scraped by several vmagents: {by_instance}"
    owner = {instance: next(iter(m)) for instance, m in by_instance.items()}
    assert owner == scale.owners  # the members' own lists of targets, at start
    for member, url in enumerate(scale.vmagents):  # and now
        assert vmagent_targets(url) == {i for i, m in owner.items() if m == str(member)}, member

    # nothing was lost: the sharded store holds every series Prometheus holds, per target
    def complete() -> dict[Key, float] | None:
        state["prometheus"], state["victoria"] = exporter_series(scale.prometheus), exporter_series(scale.vm)
        return state["victoria"] if state["victoria"] == state["prometheus"] else None

    per_instance = eventually(complete, READY_TIMEOUT_S, lambda: str(state))
    series = labelled_values(query(scale.vm, f"count by ({SHARD_LABEL}) ({{{job}}})"))
    scale.figures["sharding"] = {
        "scrapers": SCRAPERS,
        "targets": len(owner),
        "targets_per_member": {m: sum(1 for o in owner.values() if o == m) for m in sorted(set(owner.values()))},
        "series_per_member": {dict(k)[SHARD_LABEL]: int(v) for k, v in sorted(series.items())},
        "series_per_target": sorted({int(v) for v in per_instance.values()}),
    }


def test_recording_rules_agree(scale: Scale) -> None:
    rules = recordings_of_rules()
    quick = fast(rules)
    # Prometheus' evaluations must have live samples within a scrape interval of them (before its first
    # scrape it would extrapolate from the end of the history); VictoriaMetrics' slopes need no such thing
    fresh_after = {"prometheus": scale.scraping, "victoria": 0.0}
    state: dict[str, Any] = {}

    def lacking(side: str) -> list[str]:
        got = {k: v for k, v in state.get(side, {}).items() if recording_of(k, rules) in quick}
        return incomplete(got, quick, fresh_after[side])

    def ready() -> tuple[Samples, Samples, float] | None:
        at = time.time()
        state["prometheus"], state["victoria"] = recorded(scale.prometheus, at, rules), recorded(scale.vm, at, rules)
        ok = not lacking("prometheus") and not lacking("victoria")
        return (state["prometheus"], state["victoria"], at) if ok else None

    def missing() -> str:
        lines = []
        for side in ("prometheus", "victoria"):
            found = lacking(side)
            lines += [f"{side}: {len(state.get(side, {}))} series; {len(found)} problems:", *found[:20]]
        return "\n".join(lines) + "\n" + scale.logs("vmalert", "vm")

    prom, vm, at = eventually(ready, recordings_timeout(rules), missing, every=1.0)
    fast_keys = {k for k in set(prom) | set(vm) if recording_of(k, rules) in quick}
    assert fast_keys <= set(prom) & set(vm), (
        f"only Prometheus: {sorted(fast_keys - set(vm))}\nonly vmalert: {sorted(fast_keys - set(prom))}"
    )

    slos = {slo.name: slo for slo in scale.spec.slos}
    error_ratios = {V.SLO_PERIOD_ERROR_RATIO_RECORD, *(V.slo_error_ratio(w) for w in V.SLO_WINDOWS)}
    worst: dict[str, dict[str, float]] = {}
    problems, skipped = [], set()
    for key in sorted(set(prom) & set(vm)):
        labels = dict(key)
        rule, model = recording_of(key, rules), labels.get(V.LABEL_MODEL)
        p, v = prom[key][-1][1], vm[key][-1][1]
        allowed = tolerance(rule, model)
        if allowed is None:
            skipped.add(rule.name)
            continue
        diff = relative(p, v)
        group = f"{rule.kind}, {'mixed' if model == 'mixed' else 'depth ' + str(rule.depth)}"
        worst.setdefault(rule.name, {})[group] = max(worst.get(rule.name, {}).get(group, 0.0), diff)
        if not math.isfinite(p) or diff > allowed:
            problems.append(f"{labels}: Prometheus {p!r}, vmalert {v!r} (relative difference {diff:.3g})")
        if rule.name in error_ratios and model in EXACT_MODELS:
            designed = share(next(r for r in FLEET if r.model == model), slos[labels[V.SLO_LABEL]])
            for who, got in (("Prometheus", p), ("vmalert", v)):
                if relative(got, designed) > allowed:
                    problems.append(f"{labels}: {who} {got!r}, the fleet was built for {designed!r}")
    assert not problems, "\n".join(problems)

    # Prometheus' own recordings reached VictoriaMetrics through remote_write unchanged
    def forwarded() -> Samples | None:
        got = recorded(scale.vm_prometheus, at, rules)
        return got if set(got) >= {k for k in prom if k in fast_keys} else None

    copy = eventually(forwarded, READY_TIMEOUT_S, lambda: "Prometheus' recordings are missing in VictoriaMetrics")
    forwarding = 0.0
    for key, values in copy.items():
        mine = dict(prom.get(key, []))
        for t, value in values:
            if t in mine:
                forwarding = max(forwarding, relative(value, mine[t]))
            else:
                assert t < at - 110 or not mine, f"{dict(key)}: a sample at {t} that Prometheus does not have"
    assert forwarding <= FORWARDING_TOLERANCE, forwarding

    compared = set(prom) & set(vm)
    scale.figures["parity"] = {
        "recordings_in_rules": len(rules),
        "series_compared": len(compared) - sum(1 for k in compared if recording_of(k, rules).name in skipped),
        "not_evaluated_during_test": sorted(
            {r.label for r in rules if r not in quick} - {recording_of(k, rules).label for k in compared}
        ),
        "not_compared_window_longer_than_history": sorted(skipped),
        "first_value_after_group_start_s_by_depth": {
            side: lag_by_depth(recorded(base, at, rules, "10m"), rules)
            for side, base in (("prometheus", scale.prometheus), ("vmalert", scale.vm))
        },
        "max_depth": max(r.depth for r in quick),
        "max_evaluation_gap_s": round(max(abs(prom[k][-1][0] - vm[k][-1][0]) for k in compared), 3),
        "max_relative_difference": {n: {k: float(f"{d:.3g}") for k, d in w.items()} for n, w in sorted(worst.items())},
        "remote_write_max_relative_difference": forwarding,
        "tolerance": {
            "exact": EXACT_TOLERANCE,
            "chained": CHAINED_TOLERANCE,
            "mixed": MIXED_TOLERANCE,
            "rate": RATE_TOLERANCE,
        },
    }


def test_a_burn_alert_from_vmalert_reaches_alertmanager(scale: Scale) -> None:
    expected = expected_alerts(scale.spec)
    assert len(expected) == len(BURN_PAIRS), expected  # the availability SLO of the burning model, every pair
    ours = scale.arrivals

    def arrived() -> dict[Key, tuple[float, dict[str, Any]]] | None:
        got = ours.of(VMALERT)
        return got if set(got) >= expected else None

    timeout = recordings_timeout(recordings_of_rules())
    at_am = eventually(arrived, timeout, lambda: f"{ours.of(VMALERT)}\n{scale.logs('vmalert')}")
    assert set(at_am) == expected
    assert all(a["labels"].get("alertgroup") for _, a in at_am.values())  # vmalert names its group

    vmalert_firing = firing(scale.vmalert)
    assert set(vmalert_firing) == expected

    def prometheus_fires() -> dict[Key, dict[str, Any]] | None:
        got = firing(scale.prometheus)
        return got if set(got) >= expected else None

    prom_firing = eventually(prometheus_fires, timeout, lambda: str(firing(scale.prometheus)))
    assert set(prom_firing) == expected, "Prometheus and vmalert fire different alerts"

    # the pages go on to the webhook (the tickets of the same SLO and model are inhibited by them)
    def notified() -> tuple[float, dict[str, Any]] | None:
        for got in list(scale.sink.received):
            for alert in got.body.get("alerts", []) if isinstance(got.body, dict) else []:
                if str(alert.get("generatorURL", "")).startswith(scale.vmalert):
                    return got.at, alert
        return None

    webhook_at, notified_alert = eventually(notified, READY_TIMEOUT_S, lambda: str(scale.sink.received))
    assert notified_alert["labels"][V.SEVERITY_LABEL] == V.SEVERITY_PAGE

    assert not ours.of("prometheus"), "Alertmanager got alerts from something else than vmalert"

    active = {k: parse_time(a["activeAt"]) for k, a in vmalert_firing.items()}
    first_at_am = min(t for t, _ in at_am.values())
    scale.figures["alert"] = {
        "alerts": sorted(f"{dict(k)[V.LONG_WINDOW_LABEL]}/{dict(k)[V.SHORT_WINDOW_LABEL]}" for k in expected),
        "prometheus_start_to_firing_s": round(
            min(parse_time(a["activeAt"]) for a in prom_firing.values()) - scale.started["prometheus"], 1
        ),
        "vmalert_start_to_firing_s": round(min(active.values()) - scale.started[VMALERT], 1),
        "start_to_firing_s_by_window_pair": {
            f"{dict(k)[V.LONG_WINDOW_LABEL]}/{dict(k)[V.SHORT_WINDOW_LABEL]}": {
                "prometheus": round(parse_time(prom_firing[k]["activeAt"]) - scale.started["prometheus"], 1),
                VMALERT: round(active[k] - scale.started[VMALERT], 1),
            }
            for k in sorted(expected)
        },
        "vmalert_firing_to_alertmanager_s": round(max(at_am[k][0] - active[k] for k in expected), 2),
        "vmalert_start_to_alertmanager_s": round(first_at_am - scale.started[VMALERT], 1),
        "alertmanager_to_webhook_s": round(webhook_at - first_at_am, 2),
    }
