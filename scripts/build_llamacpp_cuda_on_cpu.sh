#!/usr/bin/env bash
# The CUDA build of scripts/build_llamacpp_cuda.sh (sm_90), made on a CPU machine where pip
# reaches PyPI and packed as scripts/run_gpu_study.sh takes a carried build: building on the
# GPU machine costs its scarce time (5 min on 16 cores); here it takes about 32 min on 2 cores.
# The CUDA toolchain is NVIDIA's PyPI wheels, 13.0 like the GPU machine's toolkit and driver
# (580: a newer nvcc may emit code that driver rejects), laid out as a toolkit CMake accepts:
# lib64, unversioned .so links, and lib/stubs/libcuda.so, a stub of the driver API made from
# cuda.h (no wheel ships one; the GPU machine's driver provides the real libcuda.so.1).
# Needs pip, unzip, gcc/g++ (CUDA 13 takes gcc <= 15), CMake and Ninja; no GPU.
# Carry the build with OUTDIR's source tarball (scripts/prepare_device_carry.sh puts both in
# one carry folder): BUILD_STAMP holds that tarball's digest, and the GPU machine uses the
# build only when they match.
# Idempotent: the toolkit, a build whose stamp matches and a tarball newer than it are kept.
#   usage: scripts/build_llamacpp_cuda_on_cpu.sh [OUTDIR]      (default .device-carry)
#   env:   CUDA_PIP_PREFIX  where wheels/ and the toolkit cuda-13.0/ go (/opt/cuda-pip)
#          LLAMACPP_DIR     the build's folder (resources/llamacpp-cuda-oncpu)
#          JOBS             parallel compile jobs (all cores)
# Prints OUTDIR/llamacpp-cuda-bin.tar.gz on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${CUDA_PIP_PREFIX:-/opt/cuda-pip}
outdir=${1:-.device-carry}
export LLAMACPP_DIR=${LLAMACPP_DIR:-resources/llamacpp-cuda-oncpu}
cuda=$prefix/cuda-13.0
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
    nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14)

if [ ! -x "$cuda/bin/nvcc" ]; then
    echo "laying out a CUDA 13.0 toolkit from PyPI wheels in $cuda" >&2
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$prefix/wheels" "${wheels[@]}" >&2
    rm -rf "$cuda.partial"
    for wheel in "${wheels[@]}"; do
        unzip -qo "$prefix/wheels/$(echo "${wheel%%==*}" | tr - _)-${wheel##*==}-"*.whl \
            'nvidia/cu13/*' -d "$cuda.partial"
    done
    t=$cuda.partial/nvidia/cu13
    ln -s lib "$t/lib64"
    for lib in cudart cublas cublasLt; do ln -s "lib$lib.so.13" "$t/lib/lib$lib.so"; done
    mkdir "$t/lib/stubs"
    echo '#include <cuda.h>' | gcc -E -P -I"$t/include" -x c - | tr '\n' ' ' |
        grep -oE '\bCUresult +cu[A-Za-z0-9_]+ *\(' | sort -u |
        sed -E 's/^CUresult +(cu[A-Za-z0-9_]+).*/int \1(void) { return 34; } \/* CUDA_ERROR_STUB_LIBRARY *\//' \
            > "$t/lib/stubs/libcuda.c"
    gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$t/lib/stubs/libcuda.so" "$t/lib/stubs/libcuda.c"
    ln -s libcuda.so "$t/lib/stubs/libcuda.so.1" # lets llama-server --version run here
    mv "$t" "$cuda"
    rm -rf "$cuda.partial"
fi

src=$(bash scripts/fetch_llamacpp_source.sh "$outdir" | tail -1)
PATH=$cuda/bin:$PATH CUDACXX=$cuda/bin/nvcc CUDAToolkit_ROOT=$cuda \
    LD_LIBRARY_PATH=$cuda/lib:$cuda/lib/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    bash scripts/build_llamacpp_cuda.sh "$src" > /dev/null

tarball=$outdir/llamacpp-cuda-bin.tar.gz
if [ ! "$tarball" -nt "$LLAMACPP_DIR/bin/BUILD_STAMP" ]; then
    rm -f "$tarball".part-* # run_gpu_study.sh unpacks llamacpp-cuda-bin.tar.gz* as one stream
    tar -czf "$outdir/partial-llamacpp-cuda-bin.tar.gz" -C "$LLAMACPP_DIR" bin
    mv "$outdir/partial-llamacpp-cuda-bin.tar.gz" "$tarball"
fi
echo "packed $tarball ($(du -h "$tarball" | cut -f1))" >&2
echo "$tarball"
