"""What every command shares: the error console, clean failures and the process-wide settings."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from inferwatch.core.config import ConfigError, InferwatchSettings

err = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


@contextlib.contextmanager
def needs_extra(extra: str, command: str, also: tuple[str, ...] = ()) -> Iterator[None]:
    """Around a command's lazy imports of its component: a library of the install extra ``extra`` that is
    missing fails the command in one line naming the extra, not a traceback. ``also``: modules the command's
    child processes import, checked (not imported) first.

        with needs_extra("collector", "collector serve"):
            from inferwatch.collector.api.app import create_app
    """
    for name in also:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            raise _missing_extra(extra, command, name)
    try:
        yield
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] == "inferwatch":
            raise  # a module of ours is missing: a broken install or a bug, not an extra
        raise _missing_extra(extra, command, exc.name) from None


def _missing_extra(extra: str, command: str, module: str) -> typer.Exit:
    return fail(
        f"inferwatch {command} needs the '{extra}' extra: pip install 'inferwatch[{extra}]' "
        f"(no module named {module!r})"
    )


def parse_labels(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise fail(f"--label expects NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def load_settings() -> InferwatchSettings:
    try:
        settings = InferwatchSettings()
        settings.vocabulary()
    except (ConfigError, ValueError) as exc:
        raise fail(f"invalid INFERWATCH_* settings: {exc}") from None
    return settings


QUIET_LOGGERS = ("httpx", "httpcore")
"""HTTP clients that log every request at INFO (with its URL, which may hold a secret): warnings only."""


def setup_logging(level: str) -> None:
    """Log to stderr at ``level``: one line per state change of ours, not one per HTTP request."""
    import logging

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))


def reflow(text: str | None) -> str | None:
    """Join the hard-wrapped lines of each paragraph, so the help screen wraps them to the terminal.

    Typer keeps single line breaks of a docstring: a paragraph wrapped at 100 columns in the source
    comes out ragged on an 80-column terminal. Paragraphs that are lists or marked with ``\\b`` keep
    their lines."""
    if not text:
        return text
    out = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.strip("\n").split("\n")
        keep = paragraph.startswith("\b") or any(line.lstrip().startswith(("- ", "* ", "$ ")) for line in lines)
        out.append(paragraph if keep else " ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def reflow_help(command: Any) -> Any:
    """Reflow the help of ``command`` (a Click command built by Typer, which vendors its own Click:
    hence duck typing), its options and every subcommand (see :func:`reflow`)."""
    if command.help:
        command.help = reflow(inspect.cleandoc(command.help))
    for param in command.params:
        if getattr(param, "help", None):
            param.help = reflow(param.help)
    for sub in (getattr(command, "commands", None) or {}).values():
        reflow_help(sub)
    return command


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``choice`` names (``auto``: uvloop when installed; None: asyncio's own). The proxy's
    ``--loop``; the collector runs on ``auto`` (uvloop: less CPU per OTLP export, docs/collector.md)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise fail("--loop uvloop: uvloop is not installed (pip install uvloop, or --loop asyncio)") from None
        return None
    return uvloop.new_event_loop
