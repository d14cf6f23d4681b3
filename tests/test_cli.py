"""The command line as users run it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, load_exporter_config, parse_listen
from inferwatch.exporters.engines import vllm as vllm_engine
from tests.conftest import ENGINE_FIXTURES
from tests.helpers import value

REAL = ENGINE_FIXTURES / "vllm" / "0.32.0-cpu" / "metrics-final.txt"
runner = CliRunner()


def test_translate_real_capture() -> None:
    result = runner.invoke(app, ["exporter", "translate", str(REAL)])
    assert result.exit_code == 0, result.output
    assert value(result.stdout, V.PROMPT_TOKENS.name) == 5610.0
    assert value(result.stdout, V.EXPORTER_UP.name, target="metrics-final.txt") == 1.0


def test_translate_stdin_with_labels_and_model() -> None:
    result = runner.invoke(
        app,
        ["exporter", "translate", "-", "--model", "llama", "--label", "replica=a"],
        input=REAL.read_text(),
    )
    assert result.exit_code == 0, result.output
    assert value(result.stdout, V.PROMPT_TOKENS.name, model="llama", replica="a") == 5610.0


def test_translate_explain(tmp_path: Path) -> None:
    result = runner.invoke(app, ["exporter", "translate", str(REAL), "--explain"])
    assert result.exit_code == 0
    assert "unmapped families: none" in result.stderr
    assert "inexact buckets:" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "payload is empty"),
        ("<html>nope</html>", "no known engine"),
        (f'{vllm_engine.RUNNING_GAUGE}{{engine="0"}} abc\n', "not a valid payload"),
        (f"{vllm_engine.RUNNING_GAUGE} 1\n<html>\n", "not a valid payload"),
    ],
)
def test_translate_errors_are_clear(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "scrape.txt"
    f.write_text(content)
    result = runner.invoke(app, ["exporter", "translate", str(f)])
    assert result.exit_code == 2
    assert message in result.stderr


def test_translate_missing_file() -> None:
    result = runner.invoke(app, ["exporter", "translate", "/nonexistent/scrape.txt"])
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_help_explains() -> None:
    result = runner.invoke(app, ["exporter", "serve", "--help"])
    assert result.exit_code == 0
    assert "--target" in result.stdout and "--config" in result.stdout
    assert "no stale canonical series" in " ".join(result.stdout.split())


def test_serve_needs_a_target() -> None:
    result = runner.invoke(app, ["exporter", "serve"])
    assert result.exit_code == 2 and "--target" in result.stderr


def test_config_file_errors_name_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text("targets:\n  - url: ftp://x\n    labels: {engine: x}\n")
    with pytest.raises(ConfigError) as exc:
        load_exporter_config(cfg)
    assert "targets.0.url" in str(exc.value) and "targets.0.labels" in str(exc.value)
    cfg.write_text("targets: [\n")
    with pytest.raises(ConfigError, match="line"):
        load_exporter_config(cfg)
    cfg.write_text("targets:\n  - {url: 'http://a:1'}\n  - {url: 'http://b:1'}\n")
    with pytest.raises(ConfigError, match="identical series"):
        load_exporter_config(cfg)
    cfg.write_text(
        "targets:\n  - {url: 'http://a:1', labels: {replica: a}}\n  - {url: 'http://b:1', labels: {replica: b}}\n"
    )
    assert len(load_exporter_config(cfg).targets) == 2


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    with pytest.raises(ConfigError):
        parse_listen("9400")
