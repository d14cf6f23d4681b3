"""What every command shares: the error console, clean failures and the process-wide settings."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from inferwatch.core.config import ConfigError, InferwatchSettings

err = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


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
