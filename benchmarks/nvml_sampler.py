"""The NVML sampler's own cost: CPU seconds per sample (gridbench.cells.telemetry.NvmlSampler).

Runs the sampler over every GPU of this host for ``--seconds`` at ``--interval`` and reports the
process's CPU time per sample (user + system, less the same idle wait without the sampler) and
the samples per second it reached. On a host without NVML or a GPU it says so and exits 2:
nothing is measured there.

    python benchmarks/nvml_sampler.py --seconds 20 --interval 0.1 [--out results/nvml_sampler.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from gridbench.cells.telemetry import NvmlSampler


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def gpu_uuids() -> list[str] | str:
    """Every GPU's UUID, or why NVML gives none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # ImportError or NVMLError: the benchmark reports it
        return f"NVML unavailable: {err}"
    try:
        count = pynvml.nvmlDeviceGetCount()
        return [str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
    finally:
        pynvml.nvmlShutdown()


def _or_absent(value: float | None) -> float | str:
    return "absent" if value is None else value


def measure(uuids: list[str], seconds: float, interval_s: float) -> dict[str, float | int | str]:
    start = cpu_s()
    time.sleep(seconds)
    idle = cpu_s() - start
    start, wall = cpu_s(), time.monotonic()
    with NvmlSampler(uuids, interval_s) as sampler:
        time.sleep(seconds)
    busy, wall = cpu_s() - start, time.monotonic() - wall
    record = sampler.telemetry()
    samples = len(sampler.samples)
    return {
        "gpus": len(uuids),
        "interval_s": interval_s,
        "seconds": round(wall, 3),
        "samples": samples,
        "samples_per_s": round(samples / wall, 2),
        "cpu_s_per_sample": (busy - idle) / samples if samples else float("nan"),
        "cpu_share_of_one_core": round((busy - idle) / wall, 5),
        "energy_j": record.energy_j if record.energy_j is not None else "absent",
        "energy_j_integrated": record.energy_j_integrated
        if record.energy_j_integrated is not None
        else "absent",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    uuids = gpu_uuids()
    if isinstance(uuids, str) or not uuids:
        print(f"not measured: {uuids or 'no GPU'}", file=sys.stderr)
        return 2
    result = measure(uuids, args.seconds, args.interval)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
