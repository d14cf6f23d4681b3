"""Files inferwatch reads at run time, and where it writes by default.

Everything read at run time (the collector's Alembic migrations, the default SLO file) is package
data of the installed ``inferwatch`` distribution and is found through :mod:`importlib.resources`,
never relative to a source checkout or the working directory. What inferwatch writes by default
goes to one documented data directory (:func:`default_data_dir`).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Final

PACKAGE: Final = "inferwatch"
MIGRATIONS: Final = "migrations"
DEFAULT_SLO_FILE: Final = ("alerts", "slos.yaml")
DATA_DIR_ENV: Final = "INFERWATCH_DATA_DIR"
APP_DIR: Final = "inferwatch"


class ResourceError(RuntimeError):
    """A file that ships with inferwatch is missing: the installation is incomplete."""


def package_path(*parts: str) -> Path:
    """The installed file or directory ``inferwatch/<parts>`` as a filesystem path.

    Raises :class:`ResourceError` when it is absent (a broken install) or not on a filesystem
    (inferwatch imported from a zip archive: Alembic needs real files).
    """
    ref = resources.files(PACKAGE).joinpath(*parts)
    if not isinstance(ref, Path):
        raise ResourceError(
            f"inferwatch's {'/'.join(parts)} is not on a filesystem ({ref}); install the wheel unzipped"
        )
    if not ref.exists():
        raise ResourceError(f"inferwatch's {'/'.join(parts)} is missing (expected {ref}); reinstall inferwatch")
    return ref


def migrations_dir() -> Path:
    """The collector's Alembic script directory (``env.py``, ``script.py.mako``, ``versions/``)."""
    path = package_path(MIGRATIONS)
    if not (path / "env.py").is_file():
        raise ResourceError(f"the collector's migrations are incomplete (no env.py in {path}); reinstall inferwatch")
    return path


def default_slo_path() -> Path:
    """The SLO file that ships with inferwatch (TTFT, TPOT, end-to-end latency and availability)."""
    return package_path(*DEFAULT_SLO_FILE)


def default_data_dir(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """Where inferwatch keeps data when not told otherwise.

    ``$INFERWATCH_DATA_DIR`` if set, else ``$XDG_DATA_HOME/inferwatch``, else
    ``~/.local/share/inferwatch``; never the current directory.
    """
    env = os.environ if environ is None else environ
    if env.get(DATA_DIR_ENV):
        return Path(env[DATA_DIR_ENV]).expanduser()
    xdg = env.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / APP_DIR
