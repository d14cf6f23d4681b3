"""The simulated GPUs beneath a simulated engine: activity, clocks, power, temperature, energy, XID.

Engine- and exporter-neutral: :mod:`inferwatch.simulator.dcgm` renders this state in NVIDIA
dcgm-exporter's dialect. The GPUs observe the serving model's steps (an engine-loop observer) and
integrate them over one-second samples, as DCGM samples its fields: the page shows the last complete
sample, so everything is a function of the simulated clock and the seed, never of when it is read.

How the load moves the GPU (an H100 SXM board, figures of the dcgm-exporter fixtures):

- a step's GPU time is its fixed cost (reading the weights: memory-bound), its prefill tokens
  (matrix work: tensor-heavy) and its decoding sequences' attention (reading their KV: memory-bound);
  the host's share of a step (``EngineParams.host_step``) and the gaps between steps leave it idle.
  So utilisation and engine activity rise with the duty cycle and the running batch, decode shows
  DRAM activity high and tensor activity lower, prefill the reverse;
- power runs from idle (115 W with a CUDA context) towards the board's peak with activity. Above the
  power limit the clock drops (from boost, 1980 MHz, in 15 MHz steps) until the draw fits: the
  ``power_cap`` clock-event reason, power-violation time, and every later step's GPU work takes
  ``boost / clock`` times longer (the scale the serving model asks for, :meth:`SimulatedGpus.time_scale`);
- temperature follows power with a one-minute time constant; energy integrates power;
- the framebuffer is what the engine preallocated (its ``gpu_memory_utilization`` of the board) plus
  a little activation memory: near-constant, whatever the load;
- with tensor parallelism every GPU does the same work (each with a small fixed offset of its own).

**UUIDs.** GPU ``i`` of the simulator of ``engine`` on ``port`` is
``GPU-`` + ``uuid5(NAMESPACE_URL, "inferwatch-sim://<engine>:<port>/gpu/<i>")`` (:func:`sim_gpu_uuid`):
stable across restarts, distinct between simulators, so an exporter target can name its GPUs before
the simulator starts.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import astuple, dataclass, field

from inferwatch.simulator.profiles import GpuProfile
from inferwatch.simulator.scheduler import Sequence, StepReport

BOARD_MODEL = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "580.95.05"
BOOST_CLOCK_MHZ = 1980
MIN_CLOCK_MHZ = 600
CLOCK_STEP_MHZ = 15
MEMORY_CLOCK_MHZ = 2619
IDLE_POWER_W = 115.0
PEAK_POWER_W = 700.0
"""what the board would draw with every unit busy at boost clock."""
FB_TOTAL_MIB = 81559
FB_RESERVED_MIB = 531
ACTIVATION_MIB = 256
"""framebuffer the engine allocates beyond its preallocation while it runs batches."""
CONTEXT_MIB = 190
"""what the preallocation falls short of ``gpu_memory_utilization`` x total (as in the fixtures)."""
SAMPLE_SECONDS = 1.0
THERMAL_TAU_SECONDS = 60.0
BULK_IDLE_SAMPLES = 4
"""idle samples in a row past which the rest of an idle stretch is closed in one go."""
MAX_GPUS = 8
PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
"""the PCI buses of an HGX H100 board's eight GPUs, in NVML order."""
MEMORY_FRACTION = {"vllm": 0.92, "sglang": 0.88}
"""the framebuffer share each engine preallocates (vLLM's as its simulated cache_config_info says);
0.90 for the others."""
DEFAULT_MEMORY_FRACTION = 0.90

CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_POWER_CAP = 0x4
"""NVML's clock-event reason bits the simulated GPUs raise."""


def sim_gpu_uuid(engine: str, port: int, index: int) -> str:
    """The UUID of GPU ``index`` of the simulator of ``engine`` on ``port`` (see the module's docstring)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"inferwatch-sim://{engine}:{port}/gpu/{index}"))


@dataclass(frozen=True)
class GpuConfig:
    """The simulated GPUs of one simulated engine."""

    engine: str
    port: int
    profile: GpuProfile
    count: int = 1
    seed: int = 0
    xid: int = 0
    """the XID the last GPU reports (0: none)."""
    xid_after: float = 30.0
    hostname: str = "sim-gpu-node"
    model_name: str = BOARD_MODEL
    driver: str = DRIVER_VERSION
    opt_in_fields: bool = True
    """the source exports the fields an operator opts in to (clock-event reasons, power limit, throttle
    time, SM activity), not only the default ones."""
    profiling: bool = True
    """the source has profiling (engine, SM, tensor, DRAM activity); without it those are absent."""

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_GPUS:
            raise ValueError(f"GPUs per simulated engine: 1 to {MAX_GPUS}, not {self.count}")
        if self.xid < 0 or self.xid_after < 0:
            raise ValueError("the XID and its delay cannot be negative")


@dataclass
class Activity:
    """Time-averaged activity over one sample (ratios 0-1) and the power it draws at boost clock."""

    busy: float = 0.0
    """a kernel was running (NVML's utilisation)."""
    engine: float = 0.0
    sm: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    power: float = 0.0
    """0-1 of the way from idle to peak power, at boost clock."""

    def add(self, other: Activity, weight: float) -> None:
        self.busy += other.busy * weight
        self.engine += other.engine * weight
        self.sm += other.sm * weight
        self.tensor += other.tensor * weight
        self.dram += other.dram * weight
        self.power += other.power * weight

    def scaled(self, factor: float) -> Activity:
        """Every ratio times ``factor``, at most 1."""
        return Activity(*(min(1.0, v * factor) for v in astuple(self)))

    def empty(self) -> bool:
        return self.busy == 0.0


def step_activity(report: StepReport) -> Activity:
    """A step's activity, averaged over its duration (host share and all)."""
    duration = report.duration
    gpu = report.gpu_weights + report.gpu_prefill + report.gpu_decode
    if duration <= 0 or gpu <= 0:
        return Activity()
    w, p, d = report.gpu_weights, report.gpu_prefill, report.gpu_decode
    # how well the batch fills the GPU: small batches leave SMs idle and launch gaps between kernels
    fill = min(1.0, (report.decode_seqs + report.prefill_tokens / 128) / 16)
    sm = (w * (0.25 + 0.6 * fill) + p * 0.92 + d * 0.85) / gpu
    tensor = (w * (0.05 + 0.35 * fill) + p * 0.78 + d * 0.2) / gpu
    dram = (w * 0.85 + p * 0.3 + d * 0.85) / gpu
    share = gpu / duration
    return Activity(
        busy=share,
        engine=share * (0.70 + 0.28 * fill),
        sm=share * sm,
        tensor=share * tensor,
        dram=share * dram,
        power=share * min(1.0, 0.25 + 0.35 * sm + 0.3 * tensor + 0.2 * dram),
    )


@dataclass
class GpuReading:
    """One GPU as its last complete sample left it (what a GPU source's page shows)."""

    index: int
    uuid: str
    pci_bus_id: str
    activity: Activity
    sm_clock_mhz: int
    power_w: float
    power_limit_w: float
    temperature_c: float
    memory_temperature_c: float
    energy_mj: int
    power_violation_ns: int
    clock_events: int
    fb_used_mib: int
    fb_free_mib: int
    fb_reserved_mib: int
    pcie_tx_bytes: int
    pcie_rx_bytes: int
    xid: int = 0


@dataclass
class _Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    gain: float
    """this GPU's fixed share of the common work (tensor-parallel ranks are never quite equal)."""
    heat: float
    """degrees this GPU runs above the others (its place in the airflow)."""
    clock: int = BOOST_CLOCK_MHZ
    power: float = IDLE_POWER_W
    temperature: float = 0.0
    memory_temperature: float = 0.0
    energy_mj: float = 0.0
    power_violation_ns: int = 0
    clock_events: int = CLOCK_EVENT_GPU_IDLE
    activity: Activity = field(default_factory=Activity)


class SimulatedGpus:
    """The GPUs of one simulated engine: an observer of its steps, and the time scale of its steps."""

    def __init__(self, config: GpuConfig, start: float) -> None:
        self.config = config
        self.profile = config.profile
        self.start = start
        self._bin_start = start
        self._acc = Activity()
        frac = MEMORY_FRACTION.get(config.engine, DEFAULT_MEMORY_FRACTION)
        self.prealloc_mib = round(FB_TOTAL_MIB * frac) - CONTEXT_MIB
        rng = random.Random(f"{config.engine}:{config.port}:{config.seed}")
        self.gpus: list[_Gpu] = []
        for i in range(config.count):
            g = _Gpu(
                index=i,
                uuid=sim_gpu_uuid(config.engine, config.port, i),
                pci_bus_id=f"00000000:{PCI_BUSES[i]:02X}:00.0",
                gain=rng.uniform(0.985, 1.015),
                heat=rng.uniform(0.0, 3.0),
                energy_mj=rng.uniform(2e11, 3.2e11),
            )
            g.temperature, g.memory_temperature = self._temperatures(g, IDLE_POWER_W)
            self.gpus.append(g)
        self.pending_start: Callable[[], float | None] = lambda: None
        """the start of the engine's step in flight (its GPU work is not counted yet)."""

    # -- the serving model's side ---------------------------------------------------------------
    def on_submit(self, seq: Sequence) -> None:
        return None

    def on_step(self, report: StepReport) -> None:
        rates = step_activity(report)
        if rates.empty():
            self.advance(report.end)
            return
        t = report.start
        self.advance(t)
        while t < report.end:
            seg_end = min(report.end, self._bin_start + SAMPLE_SECONDS)
            self._acc.add(rates, seg_end - t)
            t = seg_end
            self.advance(t)

    def time_scale(self, t: float) -> float:
        """How much longer GPU work takes at ``t`` than at boost clock (the slowest GPU gates a step)."""
        self.advance(t)
        return BOOST_CLOCK_MHZ / min(g.clock for g in self.gpus)

    def set_profile(self, profile: GpuProfile) -> None:
        self.profile = profile

    # -- sampling -----------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Close every sample that ends by ``t``."""
        while self._bin_start + SAMPLE_SECONDS <= t:
            idle_bins = int((t - self._bin_start) // SAMPLE_SECONDS)
            if self._acc.empty() and idle_bins > BULK_IDLE_SAMPLES and self._settled_idle():
                self._close_idle(idle_bins)
            else:
                self._close()

    def _settled_idle(self) -> bool:
        return all(g.clock == BOOST_CLOCK_MHZ and g.activity.empty() for g in self.gpus)

    def _close(self) -> None:
        sample = self._acc.scaled(1 / SAMPLE_SECONDS)
        limit = self.profile.power_limit
        for g in self.gpus:
            g.activity = act = sample.scaled(g.gain)
            ratio = g.clock / BOOST_CLOCK_MHZ
            g.power = min(IDLE_POWER_W + (PEAK_POWER_W - IDLE_POWER_W) * act.power * ratio * ratio, limit * 0.9992)
            if g.clock < BOOST_CLOCK_MHZ:
                g.power_violation_ns += round(SAMPLE_SECONDS * 1e9)
            g.energy_mj += g.power * SAMPLE_SECONDS * 1000
            self._relax(g, SAMPLE_SECONDS)
            g.clock = self._next_clock(act.power, limit)
            g.clock_events = (CLOCK_EVENT_POWER_CAP if g.clock < BOOST_CLOCK_MHZ else 0) | (
                CLOCK_EVENT_GPU_IDLE if act.empty() else 0
            )
        self._acc = Activity()
        self._bin_start += SAMPLE_SECONDS

    def _close_idle(self, bins: int) -> None:
        """``bins`` idle samples at once: clocks at boost, idle power, temperatures relaxing."""
        for g in self.gpus:
            g.activity = Activity()
            g.power = IDLE_POWER_W
            g.clock_events = CLOCK_EVENT_GPU_IDLE
            g.energy_mj += IDLE_POWER_W * bins * SAMPLE_SECONDS * 1000
            self._relax(g, bins * SAMPLE_SECONDS)
        self._bin_start += bins * SAMPLE_SECONDS

    @staticmethod
    def _next_clock(power: float, limit: float) -> int:
        """The clock whose draw fits under ``limit`` for the activity just seen (power ~ clock squared)."""
        headroom = limit - IDLE_POWER_W
        demand = (PEAK_POWER_W - IDLE_POWER_W) * power
        if demand <= headroom:
            return BOOST_CLOCK_MHZ
        mhz = BOOST_CLOCK_MHZ * math.sqrt(max(headroom, 0.0) / demand)
        return max(MIN_CLOCK_MHZ, min(BOOST_CLOCK_MHZ, int(mhz // CLOCK_STEP_MHZ) * CLOCK_STEP_MHZ))

    def _temperatures(self, g: _Gpu, power: float) -> tuple[float, float]:
        """The steady-state GPU and memory temperatures at ``power`` watts."""
        return 30.0 + g.heat + 0.06 * (power - IDLE_POWER_W), 36.0 + g.heat + 0.065 * (power - IDLE_POWER_W)

    def _relax(self, g: _Gpu, seconds: float) -> None:
        target, memory_target = self._temperatures(g, g.power)
        keep = math.exp(-seconds / THERMAL_TAU_SECONDS)
        g.temperature = target + (g.temperature - target) * keep
        g.memory_temperature = memory_target + (g.memory_temperature - memory_target) * keep

    # -- reading ------------------------------------------------------------------------------
    def xid_at(self) -> float | None:
        """When the last GPU reports its XID (``None``: never)."""
        xid = self.config.xid or self.profile.xid
        if not xid:
            return None
        after = self.config.xid_after if self.config.xid else self.profile.xid_after
        return self.start + after

    def read(self, now: float) -> list[GpuReading]:
        """Every GPU as of the last sample complete at ``now`` (the step in flight is not counted yet)."""
        pending = self.pending_start()
        self.advance(now if pending is None else min(now, pending))
        xid_at = self.xid_at()
        xid = (self.config.xid or self.profile.xid) if xid_at is not None and now >= xid_at else 0
        out = []
        for g in self.gpus:
            act = g.activity
            used = self.prealloc_mib + round(ACTIVATION_MIB * act.engine)
            out.append(
                GpuReading(
                    index=g.index,
                    uuid=g.uuid,
                    pci_bus_id=g.pci_bus_id,
                    activity=act,
                    sm_clock_mhz=g.clock,
                    power_w=g.power,
                    power_limit_w=self.profile.power_limit,
                    temperature_c=g.temperature,
                    memory_temperature_c=g.memory_temperature,
                    energy_mj=int(g.energy_mj),
                    power_violation_ns=g.power_violation_ns,
                    clock_events=g.clock_events,
                    fb_used_mib=used,
                    fb_free_mib=FB_TOTAL_MIB - FB_RESERVED_MIB - used,
                    fb_reserved_mib=FB_RESERVED_MIB,
                    pcie_tx_bytes=round(180_000 + 4_000_000 * act.engine),
                    pcie_rx_bytes=round(40_000 + 9_600_000 * act.engine),
                    xid=xid if g.index == len(self.gpus) - 1 else 0,
                )
            )
        return out
