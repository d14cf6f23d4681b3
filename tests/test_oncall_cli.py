"""`inferwatch checklist`, `capacity`, `diagnose` and `slos` as users type them (no upstream needed here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferwatch.cli import app
from inferwatch.core.checklist import CHECKLIST
from tests.conftest import free_port

runner = CliRunner(env={"COLUMNS": "80"})


def test_capacity_the_worked_13b_example() -> None:
    result = runner.invoke(
        app,
        [
            "capacity",
            "--layers",
            "40",
            "--kv-heads",
            "40",
            "--head-dim",
            "128",
            "--max-model-len",
            "2048",
            "--batch",
            "10",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "16,777,216,000 B = 16.8 GB" in result.stdout
    assert "800.00 KiB" in result.stdout  # per token
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_capacity_from_config_json_as_json(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
                "max_position_embeddings": 131072,
            }
        )
    )
    args = ["capacity", str(cfg), "--gpu-memory", "80GiB", "--max-model-len", "8192", "--kv-dtype", "fp8", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert plan["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 1  # fp8: one byte per element
    assert plan["weights_estimated"] is True and plan["kv_tokens"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["capacity", "--layers", "40"], "give all of --layers"),
        (["capacity"], "give a config.json"),
        (["capacity", "/nonexistent/config.json"], "cannot read"),
        (["capacity", "--layers", "2", "--kv-heads", "2", "--head-dim", "32", "--kv-dtype", "fp7"], "kv_dtype"),
        (["capacity", "--layers", "2", "--kv-heads", "2", "--head-dim", "32", "--gpu-memory", "lots"], "--gpu-memory"),
        (["checklist"], "give --launch"),
        (["checklist", "--launch", "vllm serve m --max-num-seqs many"], "--max-num-seqs: expected an integer"),
        (["checklist", "--launch", "ollama serve"], "cannot tell which engine"),
        (["diagnose"], "no Prometheus URL and no exporter URL"),
        (["diagnose", "--exporter", "localhost:9400"], "exporter URL must be"),
        (["diagnose", "--prometheus", "localhost:9090"], "--prometheus must be an http"),
        (["diagnose", "--prometheus", "http://127.0.0.1:9", "--window", "ten"], "window must be"),
    ],
)
def test_errors_are_clear(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_unreachable_prometheus_names_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["diagnose", "--prometheus", url, "--timeout", "2"])
    assert result.exit_code == 2 and url in result.stderr
    slos = runner.invoke(app, ["slos", "--prometheus", url, "--timeout", "2"])
    assert slos.exit_code == 2 and url in slos.stderr


def test_checklist_from_a_launch_line_alone() -> None:
    line = "vllm serve Qwen/Qwen2.5-7B-Instruct --max-num-seqs 512 --gpu-memory-utilization 0.7 -tp 3"
    result = runner.invoke(app, ["checklist", "--launch", line, "--gpu", "H100"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "FAIL  Is GPU memory utilization high enough?" in out
    assert "--gpu-memory-utilization" in out
    assert "PASS  Is continuous batching on?" in out
    assert "FAIL  Is the tensor-parallel split sensible?" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    as_json = json.loads(runner.invoke(app, ["checklist", "--launch", line, "--json"]).stdout)
    assert as_json["source"] == "launch" and len(as_json["targets"][0]["items"]) == len(CHECKLIST)


def test_help_explains_each_command() -> None:
    for command in ("diagnose", "checklist", "capacity", "slos"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0
        assert max(len(line) for line in result.stdout.splitlines()) <= 80
