"""GPU telemetry (gridbench.cells.telemetry): the summary of samples, and the sampler on a host
without NVML, where the record must say why it has no values (never zeros).

The sampling of a real GPU is not exercised here: no GPU and no NVML library on CI's machines."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gridbench import layout
from gridbench.aggregate.dataset import foreign_files
from gridbench.cells.telemetry import GpuSample, NvmlSampler, Telemetry, integrate_energy_j, summarize


def _nvml_loads() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


no_nvml = pytest.mark.skipif(_nvml_loads(), reason="this host has NVML: the absent path does not run")


@no_nvml
def test_without_nvml_the_record_says_why_and_holds_no_value(tmp_path):
    import pynvml

    with pytest.raises(pynvml.NVMLError):  # the real bindings, failing for real
        pynvml.nvmlInit()
    series = tmp_path / "depth_0.telemetry.jsonl"
    with NvmlSampler(["GPU-00000000-0000-0000-0000-000000000000"], interval_s=0.01) as sampler:
        pass
    record = sampler.telemetry(series)
    assert record.reason is not None and record.reason.startswith("NVML unavailable: ")
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(Telemetry)} | {"reason": None}
    assert all(v in (None, (), 0) for v in values.values()), values
    assert record.samples == 0 and record.energy_j is None and record.power_w_mean is None
    assert sampler.samples == [] and not series.exists()


def _samples(gpu: str, watts: float, n: int, dt: float = 0.1, **extra: float | int | None) -> list[GpuSample]:
    fields = {
        "gpu_util_pct": 90.0,
        "mem_used_mib": 1000.0,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 3201.0,
        "temperature_c": 50.0,
        "throttle_reasons": 0,
    } | extra
    return [GpuSample(round(i * dt, 4), gpu, watts, **fields) for i in range(n)]  # type: ignore[arg-type]


def test_steady_power_integrates_to_power_times_time():
    samples = _samples("A", 300.0, 21)  # 0 .. 2.0 s
    assert integrate_energy_j(samples) == pytest.approx(600.0)
    record = summarize(samples, ["A"], energy_j=601.5, window_s=2.0)
    assert record.energy_j_integrated == pytest.approx(600.0)
    assert record.energy_j == 601.5  # the counter's, kept apart from the integral
    assert record.power_w_mean == pytest.approx(300.0) and record.samples == 21


def test_two_gpus_sum_and_peaks_and_throttle_reasons_union():
    a = _samples("A", 200.0, 11, throttle_reasons=0x4)
    b = _samples("B", 100.0, 11, mem_used_mib=5000.0, temperature_c=70.0, throttle_reasons=0x40)
    record = summarize(a + b, ["A", "B"], energy_j=None, window_s=1.0)
    assert record.energy_j_integrated == pytest.approx(300.0)
    assert record.power_w_mean == pytest.approx(300.0) and record.power_w_max == pytest.approx(300.0)
    assert record.mem_used_mib_peak == 5000.0 and record.temperature_c_max == 70.0
    assert record.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert record.energy_j is None  # no counter: absent, not zero


def test_a_reading_nvml_would_not_give_is_left_out_not_zero():
    samples = _samples("A", 100.0, 3, temperature_c=None)
    record = summarize(samples, ["A"], energy_j=None, window_s=0.2)
    assert record.temperature_c_max is None
    assert summarize([], ["A"], None, 1.0).reason == "no sample was taken over the measurement"


def test_a_telemetry_series_is_a_cell_file_not_a_foreign_one(tmp_path):
    provenance = "results/raw/X/depth_0.provenance.json"
    series = tmp_path / layout.telemetry_series(provenance)
    series.parent.mkdir(parents=True)
    series.write_text("")
    (series.parent / "stray.txt").write_text("")
    assert series.name == "depth_0.telemetry.jsonl"
    assert foreign_files(Path(tmp_path)) == ["results/raw/X/stray.txt"]
