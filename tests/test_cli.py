"""The command line as users run it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.core import vocabulary as V
from inferwatch.core.config import ConfigError, parse_listen
from inferwatch.exporters.engines import EngineRegistry
from inferwatch.exporters.engines import vllm as vllm_engine
from inferwatch.exporters.targets import load_exporter_config
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


def test_config_file_errors_name_the_field(tmp_path: Path, registry: EngineRegistry) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text("targets:\n  - url: ftp://x\n    labels: {engine: x}\n")
    with pytest.raises(ConfigError) as exc:
        load_exporter_config(cfg, registry)
    assert "targets.0.url" in str(exc.value) and "targets.0.labels" in str(exc.value)
    cfg.write_text("targets: [\n")
    with pytest.raises(ConfigError, match="line"):
        load_exporter_config(cfg, registry)
    cfg.write_text("targets:\n  - {url: 'http://a:1'}\n  - {url: 'http://b:1'}\n")
    with pytest.raises(ConfigError, match="identical series"):
        load_exporter_config(cfg, registry)
    cfg.write_text(
        "targets:\n  - {url: 'http://a:1', labels: {replica: a}}\n  - {url: 'http://b:1', labels: {replica: b}}\n"
    )
    assert len(load_exporter_config(cfg, registry).targets) == 2


@pytest.mark.parametrize(
    ("target", "messages"),
    [
        (
            "{url: 'http://a:1', engine: tgi, options: {max_batch_total_tokens: 0}}",
            ["targets.0.options.max_batch_total_tokens"],
        ),
        (
            "{url: 'http://a:1', engine: vllm, options: {max_batch_total_tokens: 1}}",
            ["targets.0.options.max_batch_total_tokens"],
        ),
        (
            "{url: 'http://a:1', options: {json_poll_interval_seconds: -1}}",
            ["targets.0.options.json_poll_interval_seconds"],
        ),
        ("{url: 'http://a:1', options: {nonsense: 1}}", ["targets.0.options.nonsense", "no engine takes"]),
        ("{url: 'http://a:1', engine: nonsense}", ["targets.0.engine", "unknown engine 'nonsense'"]),
        (
            "{url: 'http://a:1', max_batch_total_tokens: 1}",
            ["targets.0.max_batch_total_tokens", "under the target's options"],
        ),
    ],
)
def test_engine_and_options_errors_name_the_field(
    tmp_path: Path, registry: EngineRegistry, target: str, messages: list[str]
) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(f"targets:\n  - {target}\n")
    with pytest.raises(ConfigError) as exc:
        load_exporter_config(cfg, registry)
    for message in messages:
        assert message in str(exc.value)


def test_config_file_options(tmp_path: Path, registry: EngineRegistry) -> None:
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text("targets:\n  - {url: 'http://a:1', engine: tgi, options: {max_batch_total_tokens: 16384}}\n")
    (target,) = load_exporter_config(cfg, registry).targets
    assert target.options_for(registry.get(V.ENGINE_TGI)) == {"max_batch_total_tokens": 16384}


def test_engines_lists_engines_and_options(registry: EngineRegistry) -> None:
    result = runner.invoke(app, ["exporter", "engines"])
    assert result.exit_code == 0, result.output
    for adapter in registry:
        assert f"{adapter.name}: metrics at {adapter.default_path}" in result.stdout
        for name in adapter.options.model_fields:
            assert f"option {name} " in result.stdout


def test_translate_engine_options() -> None:
    tgi = ENGINE_FIXTURES / "tgi" / "3.3.7"
    args = ["exporter", "translate", str(tgi / "metrics.txt"), "--info", str(tgi / "info.json")]
    result = runner.invoke(app, [*args, "--engine-option", "max_batch_total_tokens=16384"])
    assert result.exit_code == 0, result.output
    assert value(result.stdout, V.KV_CACHE_CAPACITY.name) == 16384.0
    for bad, message in (
        ("max_batch_total_tokens=0", "--engine-option max_batch_total_tokens: Input should be greater than 0"),
        ("max_batch_total_tokens", "expects NAME=VALUE"),
        ("nonsense=1", "--engine-option nonsense: no engine takes this option"),
    ):
        result = runner.invoke(app, [*args, "--engine-option", bad])
        assert result.exit_code == 2 and message in " ".join(result.stderr.split()), result.stderr
    result = runner.invoke(app, [*args, "--engine", "nonsense"])
    assert result.exit_code == 2 and "--engine: unknown engine 'nonsense'" in result.stderr


def test_translate_json_stats() -> None:
    stats = ENGINE_FIXTURES / "trtllm" / "json-iteration-stats" / "metrics.json"
    result = runner.invoke(app, ["exporter", "translate", str(stats), "--explain"])
    assert result.exit_code == 0, result.output
    assert f"engine: {V.ENGINE_TRTLLM}" in result.stderr
    assert value(result.stdout, V.EXPORTER_UP.name, engine=V.ENGINE_TRTLLM) == 1.0


def test_serve_rejects_bad_engine_options() -> None:
    result = runner.invoke(
        app, ["exporter", "serve", "--target", "http://a:1", "--engine-option", "json_poll_interval_seconds=0"]
    )
    assert result.exit_code == 2 and "--engine-option json_poll_interval_seconds" in result.stderr


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    with pytest.raises(ConfigError):
        parse_listen("9400")


def _commands(command: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        out += _commands(sub, (*path, name))
    return out


def test_every_help_screen_fits_80_columns_and_wraps_its_prose(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Typer keeps a docstring's hard line breaks; ``main`` reflows them, or an 80-column terminal
    shows paragraphs cut in ragged halves (a line ending early, then a full one)."""
    import typer

    from inferwatch.cli.common import reflow_help

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    root = reflow_help(typer.main.get_command(app))
    paths = _commands(root)
    assert len(paths) > 15
    for path in paths:
        with pytest.raises(SystemExit) as done:
            root.main([*path, "--help"], prog_name="inferwatch")
        assert done.value.code == 0, path
        lines = capsys.readouterr().out.splitlines()
        assert max(len(line) for line in lines) <= 80, path
        boxed = ("│", "╭", "╰")
        prose = [line.rstrip() for line in lines if line.startswith(" ") and not line.strip().startswith(boxed)]
        for this, following in itertools.pairwise(prose):
            # a wrapped paragraph fills each line but its last; a short line followed by more of the
            # same paragraph is a hard break that was not reflowed
            if this.strip() and following.strip() and not following.strip().startswith(("-", "$", "•")):
                assert len(this) >= 50 or this.endswith((":", ".")), (path, this, following)
