"""The wheel of this checkout in fresh virtualenvs: built once, installed with extras, run with an
environment that cannot point the virtualenv's Python back at the checkout.

Shared by the wheel tests (tests/test_wheel.py) and the install-size benchmark (bench/install_sizes.py);
failures raise :class:`WheelError` with pip's own last words, for each caller to skip, fail or report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 900


class WheelError(RuntimeError):
    """pip could not build or install the wheel (often: no package index reachable)."""


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a virtualenv's Python at the checkout or its settings."""
    drop = ("INFERWATCH_", "XDG_", "PYTHON", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built into ``out`` (pip, isolated build, no dependencies)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise WheelError(f"cannot build the wheel (is the package index reachable?): {done.stderr[-2000:]}")
    return next(out.glob("inferwatch-*.whl"))


def install(wheel: Path, extras: str, env_dir: Path, env: dict[str, str]) -> Path:
    """A fresh virtualenv at ``env_dir`` holding ``wheel`` with ``extras`` (``[all]``, ``[exporter]``, '')."""
    venv.create(env_dir, with_pip=True)
    done = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}{extras}"],
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_S,
        env=env,
    )
    if done.returncode != 0:
        raise WheelError(f"cannot install the wheel{extras}'s dependencies: {done.stderr[-2000:]}")
    return env_dir
