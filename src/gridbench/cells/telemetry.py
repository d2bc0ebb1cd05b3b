"""GPU telemetry over a cell's measurement, through NVML (the ``nvidia-ml-py`` bindings).

Read-only: NVML is only queried (power, utilisation, memory used, clocks, temperature,
throttle reasons, the energy counter); gridbench never sets a power cap or locks a clock.

A background thread samples the engine's GPUs every ``interval_s`` while the cell measures; the
device's total-energy counter is read before and after (exact joules where the GPU has one,
Volta and later). ``summarize`` (pure) turns the samples into the provenance's ``Telemetry``;
the series is written beside the cell's raw result. Where NVML or a GPU is missing, the record
holds no values and says why (``reason``): never zeros.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

from gridbench.util.files import atomic_write_text

DEFAULT_INTERVAL_S = 0.1
# NVML's clocks-event (throttle) reason bits, as nvml.h names them
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant; a value NVML would not give is None."""

    t_s: float  # seconds since the window opened
    gpu: str  # the GPU's UUID
    power_w: float | None
    gpu_util_pct: float | None
    mem_used_mib: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    temperature_c: float | None
    throttle_reasons: int | None


@dataclass(frozen=True)
class Telemetry:
    """What a cell's provenance records of its GPUs over the measurement; without NVML or a
    GPU, ``reason`` says why and every value is None."""

    reason: str | None = None
    gpus: tuple[str, ...] = ()
    samples: int = 0
    window_s: float | None = None
    energy_j: float | None = None  # the energy counter's difference, summed over the GPUs
    energy_j_integrated: float | None = None  # sampled power integrated (trapezoids)
    power_w_mean: float | None = None  # summed over the GPUs, averaged over the samples
    power_w_max: float | None = None
    gpu_util_pct_mean: float | None = None
    mem_used_mib_peak: float | None = None
    sm_clock_mhz_mean: float | None = None
    mem_clock_mhz_mean: float | None = None
    temperature_c_max: float | None = None
    throttle_reasons: tuple[str, ...] = ()  # every reason seen in any sample
    series: str | None = None  # the samples' file (JSON lines)


def absent(reason: str) -> Telemetry:
    return Telemetry(reason=reason)


def _values(samples: Sequence[GpuSample], key: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, key)) is not None]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def integrate_energy_j(samples: Sequence[GpuSample]) -> float | None:
    """Sampled power integrated over time, per GPU by trapezoids, summed; None with fewer
    than two power readings of a GPU."""
    total, any_gpu = 0.0, False
    for gpu in dict.fromkeys(s.gpu for s in samples):
        points = [(s.t_s, s.power_w) for s in samples if s.gpu == gpu and s.power_w is not None]
        for (t0, p0), (t1, p1) in itertools.pairwise(points):
            total += (t1 - t0) * (p0 + p1) / 2
            any_gpu = True
    return total if any_gpu else None


def _summed_power(samples: Sequence[GpuSample]) -> list[float]:
    """Total power of the GPUs at each sampling instant."""
    by_t: dict[float, float] = {}
    for s in samples:
        if s.power_w is not None:
            by_t[s.t_s] = by_t.get(s.t_s, 0.0) + s.power_w
    return list(by_t.values())


def throttle_names(masks: Sequence[int]) -> tuple[str, ...]:
    seen = 0
    for mask in masks:
        seen |= mask
    return tuple(name for bit, name in THROTTLE_REASONS.items() if seen & bit)


def summarize(
    samples: Sequence[GpuSample], gpus: Sequence[str], energy_j: float | None, window_s: float
) -> Telemetry:
    """The provenance's record of a window's samples and its energy counter's difference."""
    if not samples:
        return Telemetry(reason="no sample was taken over the measurement", gpus=tuple(gpus))
    power = _summed_power(samples)
    temperatures = _values(samples, "temperature_c")
    memory = _values(samples, "mem_used_mib")
    return Telemetry(
        gpus=tuple(gpus),
        samples=len(samples),
        window_s=round(window_s, 3),
        energy_j=energy_j,
        energy_j_integrated=integrate_energy_j(samples),
        power_w_mean=_mean(power),
        power_w_max=max(power) if power else None,
        gpu_util_pct_mean=_mean(_values(samples, "gpu_util_pct")),
        mem_used_mib_peak=max(memory) if memory else None,
        sm_clock_mhz_mean=_mean(_values(samples, "sm_clock_mhz")),
        mem_clock_mhz_mean=_mean(_values(samples, "mem_clock_mhz")),
        temperature_c_max=max(temperatures) if temperatures else None,
        throttle_reasons=throttle_names([int(v) for v in _values(samples, "throttle_reasons")]),
    )


# --- the edge: NVML -----------------------------------------------------------------------


def _read(call: Callable[[], Any], scale: float = 1.0) -> float | None:
    """One NVML query, None where this GPU or driver does not support it."""
    import pynvml

    try:
        return float(call()) * scale
    except pynvml.NVMLError:
        return None


def sample_gpu(handle: Any, uuid: str, t_s: float) -> GpuSample:
    import pynvml as n

    util = _read(lambda: n.nvmlDeviceGetUtilizationRates(handle).gpu)
    return GpuSample(
        t_s=round(t_s, 4),
        gpu=uuid,
        power_w=_read(lambda: n.nvmlDeviceGetPowerUsage(handle), 1e-3),
        gpu_util_pct=util,
        mem_used_mib=_read(lambda: n.nvmlDeviceGetMemoryInfo(handle).used, 1 / 2**20),
        sm_clock_mhz=_read(lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM)),
        mem_clock_mhz=_read(lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_MEM)),
        temperature_c=_read(lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU)),
        throttle_reasons=_int_or_none(_read(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(handle))),
    )


def _int_or_none(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _energy_mj(handles: Sequence[Any]) -> float | None:
    """The GPUs' total-energy counters summed (millijoules); None where one has none."""
    import pynvml

    readings = [_read(partial(pynvml.nvmlDeviceGetTotalEnergyConsumption, h)) for h in handles]
    return None if any(r is None for r in readings) else sum(r for r in readings if r is not None)


class NvmlSampler:
    """Samples the GPUs named by UUID in a background thread between ``__enter__`` and
    ``__exit__``; ``telemetry(series)`` then writes the series and returns the record. NVML
    missing (no driver, no GPU) or no GPU named: the record says why, and nothing is sampled."""

    def __init__(self, gpu_uuids: Sequence[str], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.uuids = tuple(gpu_uuids)
        self.interval_s = interval_s
        self.samples: list[GpuSample] = []
        self.reason: str | None = None
        self._handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._window_s = 0.0
        self._energy: tuple[float | None, float | None] = (None, None)

    def __enter__(self) -> NvmlSampler:
        self.reason = self._open()
        self._t0 = time.monotonic()
        if self.reason is None:
            self._energy = (_energy_mj(self._handles), None)
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def _open(self) -> str | None:
        try:
            import pynvml
        except ImportError as err:  # an install without nvidia-ml-py
            return f"NVML unavailable: {err}"
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            return f"NVML unavailable: {err}"
        if not self.uuids:
            pynvml.nvmlShutdown()
            return "the engine holds no GPU"
        try:
            self._handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in self.uuids]
        except pynvml.NVMLError as err:
            pynvml.nvmlShutdown()
            return f"NVML has no GPU {', '.join(self.uuids)}: {err}"
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            t_s = time.monotonic() - self._t0
            self.samples.extend(sample_gpu(h, u, t_s) for h, u in zip(self._handles, self.uuids, strict=True))
            self._stop.wait(self.interval_s)

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._window_s = time.monotonic() - self._t0
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        t_s = time.monotonic() - self._t0  # a last sample closes the window
        self.samples.extend(sample_gpu(h, u, t_s) for h, u in zip(self._handles, self.uuids, strict=True))
        self._energy = (self._energy[0], _energy_mj(self._handles))
        import pynvml

        pynvml.nvmlShutdown()

    def telemetry(self, series: Path | None = None) -> Telemetry:
        """The window's record; its samples written to ``series`` (JSON lines) when given."""
        if self.reason is not None:
            return absent(self.reason)
        before, after = self._energy
        energy_j = (after - before) / 1000 if before is not None and after is not None else None
        record = summarize(self.samples, self.uuids, energy_j, self._window_s)
        if series is None:
            return record
        atomic_write_text(series, "".join(json.dumps(asdict(s)) + "\n" for s in self.samples))
        return replace(record, series=str(series))
