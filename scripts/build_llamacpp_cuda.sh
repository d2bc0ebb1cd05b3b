#!/usr/bin/env bash
# CUDA build of llama.cpp's llama-server and llama-quantize (Ninja, only those two targets,
# Hopper sm_90 by default) from the trimmed sources of scripts/fetch_llamacpp_source.sh.
# Needs CMake, Ninja, a C++ compiler and nvcc; no network when the tarball is given.
# Idempotent: a finished build whose stamp (source digest + flags) matches is reused.
#   usage: scripts/build_llamacpp_cuda.sh [SOURCE_TARBALL]
#   env:   LLAMACPP_DIR        where src/, build/ and bin/ go (resources/llamacpp-cuda)
#          CUDA_ARCHITECTURES  CMAKE_CUDA_ARCHITECTURES (90: H100/H200)
#          JOBS                parallel compile jobs (all cores)
#          GGML_CUDA           ON; OFF builds the same for the CPU, to rehearse without a GPU
# The executables and their shared libraries land together in $LLAMACPP_DIR/bin and find
# each other through an $ORIGIN rpath, so that folder can be packed and used elsewhere on
# the same kind of machine. Prints the folder on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${LLAMACPP_DIR:-resources/llamacpp-cuda}
cuda=${GGML_CUDA:-ON}
archs=${CUDA_ARCHITECTURES:-90}
jobs=${JOBS:-$(nproc)}
src_tar=${1:-}
[ -n "$src_tar" ] || src_tar=$(bash scripts/fetch_llamacpp_source.sh "$dir" | tail -1)
[ -s "$src_tar" ] || { echo "no llama.cpp source tarball at $src_tar" >&2; exit 1; }

label=$(basename "$src_tar" .tar.gz)
label=${label#llama.cpp-src-}
flags=(
    -G Ninja -DCMAKE_BUILD_TYPE=Release
    -DGGML_CUDA="$cuda" -DGGML_NATIVE=OFF # portable x86-64 (AVX2) host code: the binaries travel
    -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF # the web UI would be downloaded
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="$label"
)
if [ "$cuda" = ON ]; then
    flags+=(-DCMAKE_CUDA_ARCHITECTURES="$archs" -DGGML_CUDA_NCCL=OFF) # one GPU per engine
fi
stamp="$(sha256sum "$src_tar" | cut -c1-16) ${flags[*]}"
bin="$dir/bin"

if [ -x "$bin/llama-server" ] && [ "$(cat "$bin/BUILD_STAMP" 2>/dev/null)" = "$stamp" ] &&
    "$bin/llama-server" --version >/dev/null 2>&1; then
    echo "reusing the llama.cpp build in $bin" >&2
    echo "$bin"
    exit 0
fi

started=$SECONDS
if [ "$(cat "$dir/src/.gridbench-tarball" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dir/src" "$dir/build"
    mkdir -p "$dir/src"
    tar -xzf "$src_tar" -C "$dir/src" --strip-components=1
    echo "$stamp" > "$dir/src/.gridbench-tarball"
fi
echo "configuring llama.cpp ($label, GGML_CUDA=$cuda, archs $archs)" >&2
cmake -S "$dir/src" -B "$dir/build" "${flags[@]}" > "$dir/cmake-configure.log" 2>&1 || {
    tail -40 "$dir/cmake-configure.log" >&2
    exit 1
}
echo "building llama-server and llama-quantize with $jobs jobs" >&2
cmake --build "$dir/build" --target llama-server llama-quantize -j "$jobs" > "$dir/cmake-build.log" 2>&1 || {
    tail -60 "$dir/cmake-build.log" >&2
    exit 1
}

rm -rf "$bin.partial"
mkdir -p "$bin.partial"
cp -a "$dir/build/bin/llama-server" "$dir/build/bin/llama-quantize" "$bin.partial/"
cp -a "$dir/build/bin/"lib*.so* "$bin.partial/"
echo "$stamp" > "$bin.partial/BUILD_STAMP"
rm -rf "$bin"
mv "$bin.partial" "$bin"
"$bin/llama-server" --version >&2
echo "built $bin in $((SECONDS - started)) s" >&2
echo "$bin"
