"""What each install costs: disk, distributions, and the idle memory of the exporter and the proxy.

Builds the wheel of this checkout and installs it into a fresh virtualenv per install (from the
package index pip is configured with): the full install (``[all]``), ``[exporter]`` alone,
``[proxy]`` alone and the core (plain ``pip install inferwatch``). For each it measures:

- site-packages: the bytes of its files, in MB (10^6 bytes); pip and setuptools, which every new
  virtualenv carries, are left out;
- distributions: the installed distributions, inferwatch included (pip and setuptools not);
- exporter RSS: ``inferwatch exporter serve`` of that install scraping a simulated vLLM: VmRSS of
  its process after one scrape of its /metrics and ``--idle`` seconds (default 5) without any;
- proxy RSS: ``inferwatch proxy`` of that install in front of the simulated vLLM: VmRSS after one
  completion request through it and ``--idle`` seconds idle.

The simulated vLLM runs from the interpreter that runs this script (the checkout's virtualenv).
Takes about a minute; prints a Markdown table (docs/deploy.md, "Installing one part").

    python -m bench.install_sizes [--install all --install exporter ...] [--idle 5]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from inferwatch.core import vocabulary as V
from tests.conftest import free_port
from tests.support.stack import Processes, simulator_cmd, stop_groups
from tests.support.wheelenv import build_wheel, clean_env, install

MODEL = "sim-model"
INSTALLS: dict[str, str] = {"all": "[all]", "exporter": "[exporter]", "proxy": "[proxy]", "core": ""}
"""Install name -> the extras after the wheel's path."""
RUNS: dict[str, tuple[str, ...]] = {"all": ("exporter", "proxy"), "exporter": ("exporter",), "proxy": ("proxy",)}
"""The parts whose idle memory is measured in each install."""
TOOLING = ("pip", "setuptools", "wheel", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")
"""What every new virtualenv holds before anything is installed: left out of the counts."""
LIST_DISTRIBUTIONS = "import importlib.metadata as m; print(*sorted({d.metadata['Name'] for d in m.distributions()}))"


@dataclass(frozen=True)
class Measured:
    install: str
    site_packages_bytes: int
    distributions: int
    rss_bytes: dict[str, int]


def site_packages(env_dir: Path) -> Path:
    return next((env_dir / "lib").glob("python*/site-packages"))


def _tooling(name: str) -> bool:
    base = name.split("-", 1)[0] if name.endswith(".dist-info") else name
    return name in TOOLING or base in TOOLING


def site_packages_bytes(env_dir: Path) -> int:
    total = 0
    for entry in site_packages(env_dir).iterdir():
        if _tooling(entry.name):
            continue
        paths = entry.rglob("*") if entry.is_dir() else [entry]
        total += sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())
    return total


def distributions(env_dir: Path) -> list[str]:
    """The distributions installed in ``env_dir``, as their own Python lists them."""
    out = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", LIST_DISTRIBUTIONS],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    )
    return [name for name in out.stdout.split() if name.lower() not in TOOLING]


def rss_bytes(pid: int) -> int:
    """VmRSS of a running process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextlib.contextmanager
def part(env_dir: Path, cwd: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``inferwatch ARGS`` of the virtualenv ``env_dir``, in a session of its own; stopped on exit."""
    proc = subprocess.Popen(
        [str(env_dir / "bin" / "inferwatch"), *args],
        cwd=cwd,
        env=clean_env(HOME=str(cwd)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        stop_groups([proc], grace=15)
        if proc.stderr is not None:
            proc.stderr.close()


def wait_http(proc: subprocess.Popen[bytes], url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}: {err[-2000:]}")
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


def exporter_rss(env_dir: Path, cwd: Path, engine_url: str, idle: float) -> int:
    port = free_port()
    args = ("exporter", "serve", "--target", engine_url, "--engine", "vllm", "--listen", f"127.0.0.1:{port}")
    with part(env_dir, cwd, *args, "--log-level", "warning") as proc:
        wait_http(proc, f"http://127.0.0.1:{port}/healthz")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert metrics.status_code == 200 and V.EXPORTER_UP.name in metrics.text, metrics.text[:500]
        time.sleep(idle)
        return rss_bytes(proc.pid)


def proxy_rss(env_dir: Path, cwd: Path, engine_url: str, idle: float) -> int:
    port, mport = free_port(), free_port()
    args = ("proxy", "--upstream", engine_url, "--engine", "vllm", "--listen", f"127.0.0.1:{port}")
    with part(env_dir, cwd, *args, "--metrics-listen", f"127.0.0.1:{mport}", "--log-level", "warning") as proc:
        wait_http(proc, f"http://127.0.0.1:{mport}/healthz")
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": MODEL, "prompt": "hi", "max_tokens": 4},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text[:500]
        time.sleep(idle)
        return rss_bytes(proc.pid)


def measure(installs: list[str], idle: float) -> list[Measured]:
    results = []
    with tempfile.TemporaryDirectory(prefix="inferwatch-install-sizes-") as tmp:
        base = Path(tmp)
        wheel = build_wheel(base / "dist")
        procs = Processes(logs=base / "logs")
        try:
            sim_port = free_port()
            procs.spawn("sim", [*simulator_cmd("vllm", sim_port, model=MODEL, speed=1.0), "--load", "0"])
            engine_url = f"http://127.0.0.1:{sim_port}"
            procs.wait_http("sim", engine_url + "/metrics")
            for name in installs:
                env_dir = install(wheel, INSTALLS[name], base / name, clean_env())
                cwd = base / f"{name}-cwd"
                cwd.mkdir()
                rss: dict[str, int] = {}
                for what in RUNS.get(name, ()):
                    run = exporter_rss if what == "exporter" else proxy_rss
                    rss[what] = run(env_dir, cwd, engine_url, idle)
                results.append(Measured(name, site_packages_bytes(env_dir), len(distributions(env_dir)), rss))
        finally:
            procs.close()
    return results


def table(results: list[Measured]) -> str:
    def mb(n: int | None) -> str:
        return "-" if n is None else f"{n / 1e6:.1f}"

    lines = [
        "| install | site-packages (MB) | distributions | exporter RSS idle (MB) | proxy RSS idle (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in results:
        what = f"`inferwatch{INSTALLS[m.install]}`"
        lines.append(
            f"| {what} | {mb(m.site_packages_bytes)} | {m.distributions} "
            f"| {mb(m.rss_bytes.get('exporter'))} | {mb(m.rss_bytes.get('proxy'))} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install", action="append", choices=list(INSTALLS), help="repeatable; default: all four")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before reading VmRSS")
    args = parser.parse_args()
    print(table(measure(args.install or list(INSTALLS), args.idle)))


if __name__ == "__main__":
    main()
