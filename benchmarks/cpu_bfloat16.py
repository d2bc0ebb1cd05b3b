"""bfloat16 against float32 on this CPU, for the draft recipe's `dtype` (docs/draft-training.md):
a matmul of the CI head's shape and one Muon update (PyTorch's Newton-Schulz, in bfloat16,
against the draft worker's float32 one), each as a ratio to float32's matmul measured in the
same run. Run it with the draft interpreter (torch), once as the CPU is and once with torch's
and oneDNN's kernels held to AVX2, as on a CPU without AVX-512:

    .venv-vllm-cpu/bin/python benchmarks/cpu_bfloat16.py [--as-avx2]

Measured on an AMD EPYC with AVX512-BF16, 2 threads (2026-12-07), against float32's matmul
(4.9 ms; 5.5 ms on AVX2 kernels): bfloat16's matmul 0.2x as the CPU is, 51x on AVX2 kernels;
PyTorch's Muon update 3.2x and 471x; the worker's float32 update 12x and 11x.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPE = (576, 1536)  # SmolLM2-135M's hidden size by its MLP's: the CI heads' largest weights
NS = ((3.4445, -4.775, 2.0315), 5, 1e-7)  # PyTorch Muon's coefficients, steps and eps


def best_of(repeats: int, work) -> float:
    """The fastest of ``repeats`` runs, in seconds: the least disturbed by the machine."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def measure() -> None:
    import torch
    from torch.optim import _muon

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from gridbench.drafts import worker

    torch.set_num_threads(2)
    flags = Path("/proc/cpuinfo").read_text().split()
    native = [flag for flag in ("avx512_bf16", "amx_bf16", "bf16") if flag in flags]
    kernels = torch.backends.cpu.get_cpu_capability()
    print(f"bfloat16 instructions: {', '.join(native) or 'none'}; ATen kernels: {kernels}")
    grad = torch.randn(SHAPE)
    left, right = grad, torch.randn(SHAPE[::-1])
    reference = best_of(5, lambda: left @ right)
    print(f"reference, float32 matmul {SHAPE[0]}x{SHAPE[1]}x{SHAPE[0]}: {reference * 1e3:.1f} ms")
    bf_left, bf_right = left.bfloat16(), right.bfloat16()
    pytorchs = _muon._zeropower_via_newtonschulz
    worker._orthogonalise_in_float32()
    results = {
        "bfloat16 matmul": best_of(5, lambda: bf_left @ bf_right),
        "Muon update, PyTorch's (bfloat16)": best_of(2, lambda: pytorchs(grad, *NS)),
        "Muon update, the worker's float32": best_of(2, lambda: _muon._zeropower_via_newtonschulz(grad, *NS)),
    }
    for name, seconds in results.items():
        print(f"{name}: {seconds * 1e3:.1f} ms, {seconds / reference:.1f}x the reference")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as-avx2", action="store_true", help="hold torch's and oneDNN's kernels to AVX2")
    args = parser.parse_args()
    if args.as_avx2:  # read by torch when it loads: a new interpreter
        env = os.environ | {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
        return subprocess.run([sys.executable, __file__], env=env, check=False).returncode
    measure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
