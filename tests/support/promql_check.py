"""One PromQL expression checked by ``promtool test rules`` on synthetic series."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml


def expr_test(
    promtool: str, tmp_path: Path, expr: str, series: list[tuple[str, str]], rows: list[dict[str, object]]
) -> None:
    """``expr`` at 10m, over ``series`` (name{labels}, promtool's values notation) sampled every minute,
    must give exactly ``rows`` (``{"labels": ..., "value": ...}``)."""
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [{"expr": expr, "eval_time": "10m", "exp_samples": rows}],
            }
        ],
    }
    path = tmp_path / "expr-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
