"""GPU prices as data: the ``cost:`` section of the SLO file, and how a price is chosen for a GPU.

A price is US dollars per GPU-hour. It is set once as a default (``gpu_hour_usd``) and may be set per
GPU model (the ``gpu_model`` label of the ``llm_gpu_*`` series, the board's product name such as
``NVIDIA H100 80GB HBM3``) and per pool (the ``pool`` label, an exporter target's ``gpus.pool``).
**Precedence: pool > GPU model > default.** A pool is what a team rents or reserves, at its own rate
whatever the boards in it; a GPU model's list price applies to the GPUs of no priced pool; the
default prices everything else, so that no GPU is left out of a model's cost (a model whose replicas
were half priced would show half its cost per token).

The rules built from these prices live in :mod:`inferwatch.alerts.cost_rules`; ``docs/cost.md`` states
the formulas. Without a ``cost:`` section no cost rule is generated.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from inferwatch.core import vocabulary as V

MAX_PRICED = 200
"""Prices per GPU model and per pool, each at most: every price is one term of the hourly-cost rule."""
MAX_LABEL_VALUE = 200
"""Characters of a priced ``gpu_model`` or ``pool`` value, at most."""
_STEP = re.compile(r"^(\d+)([smh])$")
_STEP_SECONDS = {"s": 1, "m": 60, "h": 3600}
_WINDOW_SECONDS = {"m": 60, "h": 3600, "d": 86400}


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"a price is a number of US dollars per GPU-hour, such as 3.5 (no quotes, no $), got {value!r}"
        )
    return value


def _price(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a price is a finite number of US dollars per GPU-hour above 0, got {value}")
    return value


Price = Annotated[float, BeforeValidator(_number), AfterValidator(_price)]
"""US dollars per GPU-hour: a number (not a string, not a boolean), finite and above 0."""


def _label_values(value: dict[str, float], what: str) -> dict[str, float]:
    if len(value) > MAX_PRICED:
        raise ValueError(f"at most {MAX_PRICED} prices per {what}, got {len(value)}")
    for key in value:
        if not key or len(key) > MAX_LABEL_VALUE:
            raise ValueError(f"a {what} is 1 to {MAX_LABEL_VALUE} characters, got {key!r}")
        if any(not c.isprintable() for c in key):
            raise ValueError(f"the {what} {key!r} holds a control character")
    return value


def _seconds(duration: str) -> int:
    m = re.match(r"^(\d+)([smhd])$", duration)
    if not m:
        raise ValueError(f"{duration!r} is not a Prometheus duration like 1h")
    return int(m.group(1)) * {**_STEP_SECONDS, **_WINDOW_SECONDS}[m.group(2)]


class CostSettings(BaseModel):
    """The ``cost:`` section: GPU prices, and the window the cost per token is measured over."""

    model_config = ConfigDict(extra="forbid")

    gpu_hour_usd: Price
    """the default price of one GPU for one hour (every GPU of no priced pool and no priced model)."""
    gpu_models: dict[str, Price] = Field(default_factory=dict)
    """price by ``gpu_model`` label value (exactly as the GPU source names the board)."""
    pools: dict[str, Price] = Field(default_factory=dict)
    """price by ``pool`` label value; wins over the GPU model's price."""
    window: str = "1h"
    """the tokens, the idle time and the good fraction are measured over this window; one of the windows
    the SLO error ratios are recorded over (the goodput cost reads the ratio of the same window)."""
    step: str = "1m"
    """the cost rules' evaluation interval, and the resolution at which the idle time and the hourly
    cost are sampled over the window."""

    @field_validator("gpu_models")
    @classmethod
    def _gpu_models(cls, value: dict[str, float]) -> dict[str, float]:
        return _label_values(value, V.LABEL_GPU_MODEL)

    @field_validator("pools")
    @classmethod
    def _pools(cls, value: dict[str, float]) -> dict[str, float]:
        return _label_values(value, V.LABEL_POOL)

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        if value not in V.SLO_WINDOWS:
            raise ValueError(
                f"window {value!r}: use one of {', '.join(V.SLO_WINDOWS)} (the windows the SLO error ratios "
                "are recorded over; the goodput cost reads the ratio of its own window)"
            )
        return value

    @field_validator("step")
    @classmethod
    def _step(cls, value: str) -> str:
        m = _STEP.match(value)
        if not m or int(m.group(1)) == 0:
            raise ValueError(f"step {value!r} is not a Prometheus duration like 1m (s, m or h, above 0)")
        return value

    @model_validator(mode="after")
    def _steps_fit(self) -> CostSettings:
        if _seconds(self.step) * 2 > _seconds(self.window):
            raise ValueError(f"step {self.step} must be at most half the window {self.window}")
        return self

    def price_terms(self) -> list[tuple[str, str, float]]:
        """(label, value, price) of every specific price, in precedence order: pools, then GPU models
        (each sorted by value, so the generated rules do not depend on the file's order)."""
        pools = [(V.LABEL_POOL, k, self.pools[k]) for k in sorted(self.pools)]
        models = [(V.LABEL_GPU_MODEL, k, self.gpu_models[k]) for k in sorted(self.gpu_models)]
        return pools + models

    def price_for(self, gpu_model: str = "", pool: str = "") -> float:
        """The price of one GPU of ``gpu_model`` in ``pool`` (``""``: the label is absent), by precedence:
        what the rules compute, for the docs and the tests to check against."""
        if pool in self.pools:
            return self.pools[pool]
        if gpu_model in self.gpu_models:
            return self.gpu_models[gpu_model]
        return self.gpu_hour_usd
