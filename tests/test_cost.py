"""The SLO file's ``cost:`` section and the cost rules built from it: validation errors that name line and
field, the price precedence, what is generated with and without it, and hostile label values.

tests/alerts/cost.yaml holds the rules to hand-computed dollars with promtool.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferwatch.alerts.cost_rules import promql_string
from inferwatch.alerts.generate import generate
from inferwatch.core import vocabulary as V
from inferwatch.core.pricing import CostSettings
from inferwatch.core.slo import SLOFile, SLOFileError, parse
from tests.conftest import require_tool

BASE = """service: s
slos:
  - name: ttft
    objective: 99
    indicator: {latency: {metric: time_to_first_token, threshold_seconds: 0.5}}
    group_by: [model]
"""
COST_RECORDS = (
    V.GPU_COUNT_RECORD,
    V.COST_GPU_HOURLY_RECORD,
    V.COST_PER_MILLION_GENERATION_RECORD,
    V.COST_PER_MILLION_PROMPT_RECORD,
    V.COST_GOODPUT_PER_MILLION_RECORD,
    V.COST_IDLE_HOURLY_RECORD,
)


def _spec(text: str) -> SLOFile:
    return parse(text, "slos.yaml", V.Vocabulary())


def _records(spec: SLOFile) -> dict[str, list[dict[str, Any]]]:
    doc = yaml.safe_load(generate(spec, V.Vocabulary())["rules.yml"])
    out: dict[str, list[dict[str, Any]]] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                out.setdefault(rule["record"], []).append({**rule, "group": group["name"]})
    return out


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("cost:\n  gpu_hour_usd: 0\n", ":8: cost.gpu_hour_usd: Value error, a price is a finite number"),
        ("cost:\n  gpu_hour_usd: -2.5\n", "above 0, got -2.5"),
        ("cost:\n  gpu_hour_usd: .inf\n", "finite number of US dollars per GPU-hour above 0, got inf"),
        ("cost:\n  gpu_hour_usd: .nan\n", "got nan"),
        ("cost:\n  gpu_hour_usd: '$3.50'\n", "such as 3.5 (no quotes, no $), got '$3.50'"),
        ("cost:\n  gpu_hour_usd: yes\n", "got True"),
        ("cost:\n  gpu_models: {A: 2}\n", ":8: cost.gpu_hour_usd: Field required"),
        (
            "cost:\n  gpu_hour_usd: 2\n  gpu_models:\n    NVIDIA H100 80GB HBM3: 0\n",
            ":10: cost.gpu_models.NVIDIA H100 80GB HBM3: Value error, a price",
        ),
        ("cost:\n  gpu_hour_usd: 2\n  pools: {reserved: -1}\n", ":9: cost.pools.reserved:"),
        ("cost:\n  gpu_hour_usd: 2\n  pools: {'': 3}\n", "a pool is 1 to 200 characters, got ''"),
        ('cost:\n  gpu_hour_usd: 2\n  gpu_models: {"a\\nb": 3}\n', "the gpu_model 'a\\nb' holds a control character"),
        ("cost:\n  gpu_hour_usd: 2\n  window: 45m\n", ":9: cost.window: Value error, window '45m': use one of 5m, 30m"),
        ("cost:\n  gpu_hour_usd: 2\n  step: 0m\n", "step '0m' is not a Prometheus duration"),
        ("cost:\n  gpu_hour_usd: 2\n  window: 5m\n  step: 3m\n", "step 3m must be at most half the window 5m"),
        ("cost:\n  gpu_hour_usd: 2\n  currency: EUR\n", ":9: cost.currency: Extra inputs are not permitted"),
        ("alerts:\n  gpu_throttle_min_ratio: 2\n", "alerts.gpu_throttle_min_ratio"),
        ("alerts:\n  gpu_throttled_for: soon\n", "alerts.gpu_throttled_for"),
    ],
)
def test_bad_cost_sections_name_the_problem(extra: str, fragment: str) -> None:
    with pytest.raises(SLOFileError) as exc:
        _spec(BASE + extra)
    assert fragment in str(exc.value)


def test_too_many_prices_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 200 prices per pool"):
        CostSettings(gpu_hour_usd=1, pools={f"p{i}": 1.0 for i in range(201)})


def test_a_pool_price_wins_over_a_model_price_which_wins_over_the_default() -> None:
    cost = CostSettings(gpu_hour_usd=2, gpu_models={"H100": 4}, pools={"reserved": 3})
    assert cost.price_for(gpu_model="H100", pool="reserved") == 3
    assert cost.price_for(gpu_model="A100", pool="reserved") == 3
    assert cost.price_for(gpu_model="H100", pool="spot") == 4
    assert cost.price_for(gpu_model="H100") == 4
    assert cost.price_for(gpu_model="A100", pool="spot") == 2
    assert cost.price_for() == 2


def test_without_a_cost_section_no_cost_rule_is_generated() -> None:
    records = _records(_spec(BASE))
    assert not set(COST_RECORDS) & set(records)
    assert records  # the SLO's own records are there


def test_the_hourly_cost_is_one_term_per_price_in_precedence_order() -> None:
    # the file lists the model prices before the pools, unsorted: the rule does not depend on it
    spec = _spec(BASE + "cost:\n  gpu_hour_usd: 1.25\n  gpu_models: {B: 4, A: 3.5}\n  pools: {z: 2, y: 0.0000001}\n")
    (rule,) = _records(spec)[V.COST_GPU_HOURLY_RECORD]
    count = V.GPU_COUNT_RECORD
    assert rule["expr"].splitlines() == [
        f'{count}{{service="s",pool="y"}} * 0.0000001',
        f'or {count}{{service="s",pool="z"}} * 2',
        f'or {count}{{service="s",gpu_model="A"}} * 3.5',
        f'or {count}{{service="s",gpu_model="B"}} * 4',
        f'or {count}{{service="s"}} * 1.25',
    ]
    assert rule["labels"] == {V.SLO_SERVICE_LABEL: "s"}


def test_three_groups_each_reading_the_one_before() -> None:
    records = _records(_spec(BASE + "cost:\n  gpu_hour_usd: 2\n"))
    groups = {name: records[name][0]["group"] for name in COST_RECORDS}
    assert groups[V.GPU_COUNT_RECORD] == "inferwatch-cost-s-1-gpus"
    assert groups[V.COST_GPU_HOURLY_RECORD] == "inferwatch-cost-s-2-hourly"
    per_model = set(COST_RECORDS) - {V.GPU_COUNT_RECORD, V.COST_GPU_HOURLY_RECORD}
    assert {groups[name] for name in per_model} == {"inferwatch-cost-s-3-per-model"}
    assert V.GPU_COUNT_RECORD in records[V.COST_GPU_HOURLY_RECORD][0]["expr"]
    for name in per_model:
        assert V.COST_GPU_HOURLY_RECORD in records[name][0]["expr"]


def test_the_window_reaches_the_rates_the_subqueries_and_the_slo_ratio() -> None:
    records = _records(_spec(BASE + "cost:\n  gpu_hour_usd: 2\n  window: 30m\n  step: 30s\n"))
    goodput = records[V.COST_GOODPUT_PER_MILLION_RECORD][0]
    assert f"rate({V.GENERATION_TOKENS.name}[30m])" in goodput["expr"]
    assert "[30m:30s]" in goodput["expr"]
    assert f'{V.slo_error_ratio("30m")}{{service="s",slo=~"ttft"}}' in goodput["expr"]
    assert "[30m:30s]" in records[V.COST_IDLE_HOURLY_RECORD][0]["expr"]


def test_the_goodput_cost_reads_the_latency_slos_grouped_by_model_only() -> None:
    text = (
        BASE
        + "  - name: e2e\n    objective: 99\n"
        + "    indicator: {latency: {metric: request_duration, threshold_seconds: 20.48}}\n"
        + "  - name: fleet-ttft\n    objective: 99\n"
        + "    indicator: {latency: {metric: time_to_first_token, threshold_seconds: 0.5}}\n"
        + "  - name: availability\n    objective: 99.9\n    indicator: {errors: {}}\n    group_by: [model]\n"
        + "cost:\n  gpu_hour_usd: 2\n"
    )
    (goodput,) = _records(_spec(text))[V.COST_GOODPUT_PER_MILLION_RECORD]
    # ttft is grouped by model; e2e and fleet-ttft are not (no model to attribute), availability is no latency
    assert 'slo=~"ttft"}' in goodput["expr"]
    errors_only = _spec(
        "service: s\nslos:\n  - name: availability\n    objective: 99.9\n    indicator: {errors: {}}\n"
        "    group_by: [model]\ncost:\n  gpu_hour_usd: 2\n"
    )
    records = _records(errors_only)
    assert V.COST_GOODPUT_PER_MILLION_RECORD not in records
    assert V.COST_PER_MILLION_GENERATION_RECORD in records


def test_promql_string_escapes_quotes_and_backslashes() -> None:
    assert promql_string('a"b\\c') == '"a\\"b\\\\c"'
    assert promql_string("NVIDIA H100 80GB HBM3") == '"NVIDIA H100 80GB HBM3"'


def test_hostile_label_values_are_matched_literally_by_promtool(tmp_path: Path) -> None:
    """A GPU model with quotes and a backslash, a pool that looks like a regex and a template (``.*``,
    ``$1``): each prices exactly its own GPUs, and Prometheus reads the rules."""
    promtool = require_tool("promtool")
    odd_model, odd_pool = 'Odd "GPU" \\ 1', "$1.*"
    cost = {"gpu_hour_usd": 2, "gpu_models": {odd_model: 5}, "pools": {odd_pool: 7}}
    text = BASE + yaml.safe_dump({"cost": cost}, sort_keys=False)
    (tmp_path / "rules.yml").write_text(generate(_spec(text), V.Vocabulary())["rules.yml"])
    base = 'engine="vllm",model="m",instance="a:9400",gpu="0"'
    util = V.GPU_UTILIZATION.name

    def series(uuid: str, **labels: str) -> dict[str, str]:
        extra = "".join(f",{k}={promql_string(v)}" for k, v in labels.items())
        return {"series": f'{util}{{{base},gpu_uuid="{uuid}"{extra}}}', "values": "1x10"}

    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("u1", gpu_model=odd_model),  # the odd model's price: 5
                    series("u2", gpu_model="Odd GPU 1"),  # not the odd model: the default, 2
                    series("u3", gpu_model="X", pool=odd_pool),  # the odd pool: 7
                    series("u4", gpu_model="X", pool="p1.x"),  # matches ``$1.*`` as a regex, not literally: 2
                ],
                "promql_expr_test": [
                    {
                        "expr": f"sort(sum by (gpu_model, pool) ({V.COST_GPU_HOURLY_RECORD}))",
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": '{gpu_model="Odd GPU 1"}', "value": 2},
                            {"labels": '{gpu_model="X",pool="p1.x"}', "value": 2},
                            {"labels": f"{{gpu_model={promql_string(odd_model)}}}", "value": 5},
                            {"labels": f'{{gpu_model="X",pool={promql_string(odd_pool)}}}', "value": 7},
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "hostile.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    checked = subprocess.run(
        [promtool, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = subprocess.run(
        [promtool, "test", "rules", "hostile.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
