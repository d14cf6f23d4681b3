"""The simulated GPUs' page in NVIDIA dcgm-exporter's dialect (4.5.3-4.8.2), served at ``/dcgm/metrics``.

The shape is the one of the fixtures ``tests/fixtures/gpu/dcgm-exporter/4.5.3-4.8.2/`` (their SOURCE.md
says where each fact comes from): every family as ``# HELP``, ``# TYPE`` and one sample per GPU in GPU
order, families in ascending DCGM field ID, no blank lines; labels ``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION`` (then ``err_code``, ``err_msg`` on an
XID); int64 fields as integers (percent for ``*_UTIL``, MiB for ``FB_*``, mJ for the energy, ns for the
violation counters), double fields with six decimals (the ``DCGM_FI_PROF_*`` ratios, power).

Besides the image's default counters the page has the fields an operator opts in to, as the
throttled fixture does: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` (bitmask), ``DCGM_FI_DEV_POWER_MGMT_LIMIT``,
``DCGM_FI_DEV_POWER_VIOLATION`` / ``THERMAL_VIOLATION`` and ``DCGM_FI_PROF_SM_ACTIVE``
(``GpuConfig.opt_in_fields=False`` leaves them out; ``profiling=False`` drops every ``DCGM_FI_PROF_*``
family, as on a board or a pod without DCGM's profiling module). ``DCGM_FI_DEV_XID_ERRORS`` appears only
once an XID happened, with a sample for that GPU alone. Not simulated: ``DCGM_EXP_*`` fields, MIG,
Kubernetes pod labels.

A real dcgm-exporter is a process of its own (``:9400/metrics`` by default, one per GPU host); the
simulator serves its GPUs' page beside the engine's API so that one process is both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferwatch.simulator.gpus import MEMORY_CLOCK_MHZ, GpuReading, SimulatedGpus

PATH = "/dcgm/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

XID_MESSAGES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    48: "Double Bit ECC Error",
    79: "GPU has fallen off the bus",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
}
"""The XIDs the simulator can raise, with dcgm-exporter's ``err_msg`` for each (``xid_errors.go``)."""

DEFAULT, OPT_IN, PROFILING, PROFILING_OPT_IN = "default", "opt-in", "profiling", "profiling opt-in"


@dataclass(frozen=True)
class Field:
    """One DCGM field as dcgm-exporter renders it."""

    field_id: int
    name: str
    kind: str
    help: str
    value: Callable[[GpuReading], float | int | None]
    """``None``: no sample for that GPU (a blank value)."""
    double: bool = False
    group: str = DEFAULT


def _pct(ratio: float) -> int:
    return max(0, min(100, round(ratio * 100)))


FIELDS: tuple[Field, ...] = (
    Field(100, "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    Field(101, "DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda r: MEMORY_CLOCK_MHZ),
    Field(
        112,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        lambda r: r.clock_events,
        group=OPT_IN,
    ),
    Field(
        140, "DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda r: round(r.memory_temperature_c)
    ),
    Field(150, "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda r: round(r.temperature_c)),
    Field(155, "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda r: r.power_w, double=True),
    Field(
        156,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda r: r.energy_mj,
    ),
    Field(
        160,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "gauge",
        "Power management limit (in W).",
        lambda r: r.power_limit_w,
        double=True,
        group=OPT_IN,
    ),
    Field(202, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda r: 0),
    Field(203, "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda r: _pct(r.activity.busy)),
    Field(
        204,
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda r: _pct(0.85 * r.activity.dram),
    ),
    Field(206, "DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda r: 0),
    Field(207, "DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda r: 0),
    Field(
        230,
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        lambda r: r.xid or None,
    ),
    Field(
        240,
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in ns).",
        lambda r: r.power_violation_ns,
        group=OPT_IN,
    ),
    Field(
        241,
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        lambda r: 0,
        group=OPT_IN,
    ),
    Field(251, "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda r: r.fb_free_mib),
    Field(252, "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda r: r.fb_used_mib),
    Field(
        253, "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", lambda r: r.fb_reserved_mib
    ),
    Field(
        393,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        lambda r: 0,
    ),
    Field(
        394,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        lambda r: 0,
    ),
    Field(395, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", lambda r: 0),
    Field(
        449,
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        lambda r: 0,
    ),
    Field(526, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", lambda r: 0),
    Field(
        1001,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda r: r.activity.engine,
        double=True,
        group=PROFILING,
    ),
    Field(
        1002,
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned (in %).",
        lambda r: r.activity.sm,
        double=True,
        group=PROFILING_OPT_IN,
    ),
    Field(
        1004,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda r: r.activity.tensor,
        double=True,
        group=PROFILING,
    ),
    Field(
        1005,
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda r: r.activity.dram,
        double=True,
        group=PROFILING,
    ),
    Field(
        1009,
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
        lambda r: r.pcie_tx_bytes,
        group=PROFILING,
    ),
    Field(
        1010,
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
        "in bytes per second.",
        lambda r: r.pcie_rx_bytes,
        group=PROFILING,
    ),
)
"""The fields of the page, in ascending field ID (dcgm-exporter's order)."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _wanted(field: Field, opt_in: bool, profiling: bool) -> bool:
    if field.group in (PROFILING, PROFILING_OPT_IN) and not profiling:
        return False
    return opt_in or field.group not in (OPT_IN, PROFILING_OPT_IN)


def render(gpus: SimulatedGpus, now: float) -> str:
    """The page at simulated time ``now``: the last complete sample of every GPU."""
    config = gpus.config
    readings = gpus.read(now)
    host, model, driver = _escape(config.hostname), _escape(config.model_name), _escape(config.driver)
    labels = {
        r.index: (
            f'gpu="{r.index}",UUID="{r.uuid}",pci_bus_id="{r.pci_bus_id}",device="nvidia{r.index}",'
            f'modelName="{model}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="{driver}"'
        )
        for r in readings
    }
    lines: list[str] = []
    for field in FIELDS:
        if not _wanted(field, config.opt_in_fields, config.profiling):
            continue
        samples = []
        for r in readings:
            value = field.value(r)
            if value is None:
                continue
            extra = ""
            if field.field_id == 230:
                extra = f',err_code="{r.xid}",err_msg="{_escape(XID_MESSAGES.get(r.xid, "Unknown Error"))}"'
            text = f"{float(value):.6f}" if field.double else str(int(value))
            samples.append(f"{field.name}{{{labels[r.index]}{extra}}} {text}")
        if samples:  # a family without samples has no HELP/TYPE either
            lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} {field.kind}", *samples]
    return "\n".join(lines) + "\n"
