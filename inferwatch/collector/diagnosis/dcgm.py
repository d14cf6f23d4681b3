"""What the diagnosis tells an operator to turn on in NVIDIA dcgm-exporter, in its own field names.

The GPU findings judge from the canonical ``llm_gpu_*`` families; when a family is missing, the answer
names the dcgm-exporter field that feeds it, since that is what the operator adds to the exporter's
counters CSV (``-f``, or the Helm chart's ``metrics-configmap.yaml``). The field names are the source's
dialect, spelled only in modules named ``dcgm.py`` (``tests/test_drift.py``); the translation itself is
:mod:`inferwatch.exporters.gpus.dcgm`.
"""

from __future__ import annotations

from typing import Final

NO_GPU: Final = "no GPU series for this target: give its exporter target a gpus: section (docs/gpu.md)"
CANNOT_TELL_THROTTLE: Final = (
    "cannot tell: add DCGM_FI_DEV_CLOCKS_EVENT_REASONS to dcgm-exporter's counters (or uncomment "
    "DCGM_FI_DEV_POWER_VIOLATION and DCGM_FI_DEV_THERMAL_VIOLATION): the GPU source exports no "
    "clock-event reasons and no throttle time"
)
NO_GPU_EVIDENCE: Final = (
    "GPU evidence missing (no GPU series for this target: give its exporter target a gpus: section, "
    "docs/gpu.md, to tell the causes apart)"
)
NO_PROFILING: Final = (
    "the GPU source exports no profiling fields (DCGM_FI_PROF_DRAM_ACTIVE, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: "
    "DCGM's profiling module, which needs a datacenter GPU and SYS_ADMIN for dcgm-exporter), so how the "
    "decode is bound cannot be told"
)
