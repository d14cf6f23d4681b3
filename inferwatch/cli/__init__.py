"""The ``inferwatch`` command line: the top layer, which wires the components together.

One module per command group (:mod:`~inferwatch.cli.exporter`, :mod:`~inferwatch.cli.collector`,
:mod:`~inferwatch.cli.generate`, :mod:`~inferwatch.cli.simulate`); each imports the component it
drives only when the command runs, so ``inferwatch --help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from inferwatch import __version__
from inferwatch.cli.collector import collector_app, db_app
from inferwatch.cli.common import load_settings, reflow_help
from inferwatch.cli.exporter import exporter_app
from inferwatch.cli.generate import generate_app
from inferwatch.cli.headroom_command import headroom
from inferwatch.cli.oncall import register as register_oncall
from inferwatch.cli.proxy import proxy
from inferwatch.cli.simulate import demo, simulate

app = typer.Typer(
    help="inferwatch: observability and SLO monitoring for self-hosted LLM inference fleets.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(exporter_app, name="exporter")
app.add_typer(collector_app, name="collector")
app.add_typer(db_app, name="db")
app.add_typer(generate_app, name="generate")
register_oncall(app)
app.command()(headroom)
app.command()(simulate)
app.command()(proxy)
app.command()(demo)


@app.command()
def version() -> None:
    """Print the inferwatch version."""
    typer.echo(__version__)


@app.command("vocabulary")
def vocabulary_cmd(
    markdown: Annotated[bool, typer.Option(help="Print the reference page as Markdown.")] = False,
) -> None:
    """List the canonical metrics: names, types, units, labels and bucket layouts."""
    from rich.table import Table

    from inferwatch.core import vocabulary as V
    from inferwatch.core.reference import markdown as render_markdown

    vocab = load_settings().vocabulary()
    if markdown:
        sys.stdout.write(render_markdown(vocab))
        return
    table = Table(title="canonical vocabulary")
    for col in ("name", "type", "unit", "labels", "buckets"):
        table.add_column(col)
    for spec in V.ALL_METRICS:
        buckets = " ".join(vocab.le_strings(spec)) if spec.kind is V.Kind.HISTOGRAM else ""
        table.add_row(spec.name, spec.kind.value, spec.unit, " ".join(spec.labels), buckets)
    Console(width=200).print(table)


def main() -> None:
    reflow_help(typer.main.get_command(app))()
