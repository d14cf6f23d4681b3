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
