"""``inferwatch generate``: Prometheus rules, Alertmanager routing, runbooks and Grafana dashboards.

Every command writes only under ``--out`` (and ``--sketches`` when given); nothing lands in the
current directory by surprise. Without ``--slo`` the SLO file that ships with inferwatch is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from inferwatch.cli.common import err, fail, load_settings, needs_extra
from inferwatch.core import resources

if TYPE_CHECKING:
    from inferwatch.core import vocabulary as V
    from inferwatch.core.slo import SLOFile

generate_app = typer.Typer(
    help="Generate monitoring artifacts from the vocabulary and SLO files.", no_args_is_help=True
)

SloOption = Annotated[
    Path | None,
    typer.Option(help="SLO file (YAML). Default: the SLOs that ship with inferwatch (TTFT, TPOT, e2e, errors)."),
]
OutOption = Annotated[Path, typer.Option(help="Directory to write into (created when missing).")]
CheckOption = Annotated[bool, typer.Option(help="Do not write: exit 1 when the files on disk differ.")]


def _load_slos(slo: Path | None, vocab: V.Vocabulary) -> tuple[SLOFile, str]:
    from inferwatch.core.slo import SLOFileError, load

    try:
        path = slo if slo is not None else resources.default_slo_path()
        return load(path, vocab), path.name
    except (SLOFileError, resources.ResourceError) as exc:
        raise fail(str(exc)) from None


def _write(files: dict[Path, bytes], check: bool, command: str) -> None:
    """Write ``files``, or with ``check`` list those that differ from the disk and exit 1."""
    stale = []
    for path, content in sorted(files.items()):
        if check:
            if not path.is_file() or path.read_bytes() != content:
                stale.append(str(path))
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        except OSError as exc:
            raise fail(f"cannot write {path}: {exc.strerror}") from None
        err.print(f"wrote {path}")
    if stale:
        raise fail(f"stale generated files (run `inferwatch generate {command}`): " + ", ".join(stale), code=1)
    if check:
        err.print(f"{len(files)} generated files are up to date")


@generate_app.command("alerts")
def generate_alerts(out: OutOption, slo: SloOption = None, check: CheckOption = False) -> None:
    """Prometheus recording rules, burn-rate and saturation alerts, Alertmanager routing and runbooks.

    Writes rules.yml, alertmanager.yml and runbooks.md into --out (deterministic, "generated, do
    not edit"). Latency thresholds must be canonical bucket boundaries (INFERWATCH_SLO_THRESHOLDS
    adds some).
    """
    from inferwatch.alerts.generate import generate  # the core's libraries only: no extra

    vocab = load_settings().vocabulary()
    spec, source = _load_slos(slo, vocab)
    files = generate(spec, vocab, source=source)
    _write({out / name: content.encode() for name, content in files.items()}, check, "alerts")


@generate_app.command("dashboards")
def generate_dashboards(
    out: OutOption,
    slo: SloOption = None,
    check: CheckOption = False,
    sketches: Annotated[
        Path | None, typer.Option(help="Also write a PNG layout sketch of each dashboard into this directory.")
    ] = None,
) -> None:
    """Grafana dashboards (JSON, via grafanalib) and provisioning files, from the vocabulary and SLOs.

    Import the JSON into any Grafana, or mount the provisioning folder; datasources are template
    variables, so nothing refers to a particular Grafana's uids.
    """
    with needs_extra("generate", "generate dashboards"):
        from inferwatch.dashboards.generate import generate
        from inferwatch.dashboards.layout_png import sketches as draw

    vocab = load_settings().vocabulary()
    spec, _ = _load_slos(slo, vocab)
    files: dict[Path, bytes] = {out / name: content.encode() for name, content in generate(spec, vocab).items()}
    if sketches is not None:
        files.update({sketches / name: png for name, png in draw(spec, vocab).items()})
    _write(files, check, "dashboards")


@generate_app.command("stack")
def generate_stack(
    out: OutOption,
    slo: SloOption = None,
    check: CheckOption = False,
    remote_write: Annotated[
        str | None, typer.Option(help="Also send every sample to this remote-write URL (e.g. VictoriaMetrics).")
    ] = None,
    scrape_interval: Annotated[str, typer.Option(help="How often Prometheus scrapes and evaluates rules.")] = "15s",
) -> None:
    """The compose stack's own files: Prometheus' config and exporter targets, the stack's Alertmanager
    config (delivering to the collector), and the collector's notify file.

    The rules, runbooks, dashboards and Grafana provisioning are those of `generate alerts` and
    `generate dashboards`: docker-compose.yml mounts them from where those commands write them
    (inferwatch/alerts/generated/, inferwatch/dashboards/generated/), so generate those from the same
    --slo file. The addresses are the compose network's (prometheus:9090, alertmanager:9093,
    collector:4318, exporter-ENGINE:9400); a target file beside prometheus/targets/exporters.yml adds
    exporters to scrape.
    """
    from dataclasses import replace

    with needs_extra("generate", "generate stack"):
        from inferwatch.stack import COMPOSE_LAYOUT, own_files

    vocab = load_settings().vocabulary()
    spec, _ = _load_slos(slo, vocab)
    layout = replace(
        COMPOSE_LAYOUT,
        remote_write=remote_write,
        scrape_interval=scrape_interval,
        evaluation_interval=scrape_interval,
    )
    _write({out / name: content for name, content in own_files(spec, vocab, layout).items()}, check, "stack")


def _pairs(values: list[str] | None, flag: str) -> tuple[tuple[str, str], ...] | None:
    """``k=v`` flags as pairs (None when none was given)."""
    if not values:
        return None
    pairs = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise fail(f"{flag} expects KEY=VALUE, got {value!r}")
        pairs.append((key, val))
    return tuple(pairs)


@generate_app.command("kubernetes")
def generate_kubernetes(
    out: OutOption,
    slo: SloOption = None,
    check: Annotated[bool, typer.Option("--check", help="Do not write: exit 1 when the files on disk differ.")] = False,
    namespace: Annotated[
        str,
        typer.Option(
            metavar="NS", help="Namespace of the collector and the monitoring objects (set in kustomization.yaml)."
        ),
    ] = "inferwatch",
    engine: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ENGINE",
            help="vllm, tgi, trtllm or triton: write its sidecar patches and example (repeatable; default: all four).",
        ),
    ] = None,
    prometheus_operator_labels: Annotated[
        list[str] | None,
        typer.Option(
            metavar="K=V",
            help="A label on the PodMonitors, PrometheusRule and AlertmanagerConfig, which the Prometheus Operator "
            "selects by (repeatable; default: release with the value kube-prometheus-stack).",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(metavar="IMAGE", help="The inferwatch image of every container (default: inferwatch:VERSION)."),
    ] = None,
    grafana_label: Annotated[
        str,
        typer.Option(
            metavar="K=V", help="The label Grafana's dashboard sidecar watches, on the dashboards' ConfigMaps."
        ),
    ] = "grafana_dashboard=1",
    grafana_operator: Annotated[
        bool,
        typer.Option("--grafana-operator", help="Also write a GrafanaDashboard (grafana-operator) for each dashboard."),
    ] = False,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="The Prometheus the collector's diagnosis reads (default: kube-prometheus-stack's, in the "
            "namespace monitoring).",
        ),
    ] = None,
    gpu_source: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="Join each engine pod's GPUs: its exporter reads this dcgm-exporter URL and keeps the GPUs "
            "dcgm-exporter labels with its pod (e.g. http://$(HOST_IP):9400/metrics, where the DaemonSet listens "
            "on the node; HOST_IP, POD_NAME and POD_NAMESPACE come from the downward API). docs/gpu.md.",
        ),
    ] = None,
) -> None:
    """Kubernetes manifests: the collector, exporter and proxy sidecars, PodMonitors, the
    PrometheusRule, an AlertmanagerConfig and the dashboards as ConfigMaps.

    Plain YAML and a kustomization.yaml: `kubectl apply -k OUT` applies the collector, the
    monitoring objects and the dashboards, once the Secret inferwatch-collector (keys
    database-url, ingest-token, read-token) exists. OUT/sidecars/ holds kustomize Components
    adding the exporter or proxy to your engine Deployments, OUT/examples/ example engines,
    OUT/autoscaling/ a KEDA ScaledObject or an HPA with prometheus-adapter rules per engine,
    scaling on the replicas each model needs (docs/headroom.md). The PrometheusRule holds the rules
    `generate alerts` writes for the same --slo file.
    """
    from dataclasses import replace

    from inferwatch.core import vocabulary as Vocab

    with needs_extra("generate", "generate kubernetes"):
        from inferwatch.kubernetes.kube_objects import KubeOptions
        from inferwatch.kubernetes.manifests import generate

    unknown = sorted(set(engine or ()) - set(Vocab.ENGINES))
    if unknown:
        raise fail(f"--engine: unknown {', '.join(unknown)} (one of {', '.join(Vocab.ENGINES)})")
    (label,) = _pairs([grafana_label], "--grafana-label") or ()
    options = KubeOptions(namespace=namespace, grafana_label=label, grafana_operator=grafana_operator)
    if prometheus_url:
        options = replace(options, prometheus_url=prometheus_url)
    if engine:
        options = replace(options, engines=tuple(e for e in Vocab.ENGINES if e in engine))
    if labels := _pairs(prometheus_operator_labels, "--prometheus-operator-labels"):
        options = replace(options, prometheus_operator_labels=labels)
    if image:
        options = replace(options, image=image)
    if gpu_source:
        if not gpu_source.startswith(("http://", "https://")):
            raise fail(f"--gpu-source must start with http:// or https://, got {gpu_source!r}")
        options = replace(options, gpu_source=gpu_source)
    vocab = load_settings().vocabulary()
    spec, _ = _load_slos(slo, vocab)
    _write({out / name: content for name, content in generate(spec, vocab, options).items()}, check, "kubernetes")
